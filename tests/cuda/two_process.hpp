// Two processes of one host for the same-host tests and tools: the program
// starts itself again (a fresh exec, so neither process has touched CUDA
// across a fork) with "--child <role>" and one end of a SOCK_SEQPACKET
// socket pair as descriptor 10.
#pragma once

#include <rdx/cuda/detail/unix_socket.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace rdx_test {

inline constexpr int child_socket_fd = 10;

//! A started child and this process's end of the socket to it.
struct child_process {
  pid_t pid = -1;
  int socket = -1;  // owned by the caller once taken (same_host_peer::from_socket)
};

//! Starts this program again as "--child role"; the child finds its socket at child_socket_fd.
inline child_process spawn_child(const char* role) {
  auto [mine, theirs] = rdx::cuda::detail::seqpacket_pair();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, theirs.get(), child_socket_fd);
  char self[] = "/proc/self/exe";
  char child[] = "--child";
  std::string r = role;
  char* argv[] = {self, child, r.data(), nullptr};
  pid_t pid = -1;
  const int e = posix_spawn(&pid, self, &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (e != 0) {
    std::fprintf(stderr, "posix_spawn: %s\n", std::strerror(e));
    std::exit(1);
  }
  return {pid, mine.release()};
}

//! The child's exit status (its exit code, or 128 + signal), killing it after timeout.
inline int wait_child(pid_t pid, std::chrono::seconds timeout = std::chrono::seconds(120)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      (void)::waitpid(pid, &st, 0);
      std::fprintf(stderr, "child %d killed after %lld s\n", static_cast<int>(pid),
                   static_cast<long long>(timeout.count()));
      return 124;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace rdx_test
