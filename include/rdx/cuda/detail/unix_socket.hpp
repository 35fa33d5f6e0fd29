// rdx::cuda internals: the Unix-domain socket between two processes of one
// host. SOCK_SEQPACKET keeps each frame whole and carries a file descriptor
// beside it (SCM_RIGHTS), which is how a shareable GPU allocation crosses.
// Needs no CUDA.
#pragma once

#include <rdx/error.hpp>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace rdx::cuda::detail {

//! An owned file descriptor, closed once.
class unique_fd {
public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }
  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = -1;
  }

private:
  int fd_ = -1;
};

[[noreturn]] inline void throw_errno(const char* call, const std::string& what) {
  throw rdx::error(std::error_code(errno, std::system_category()), std::string(call) + " " + what);
}

//! Fills a sockaddr_un; a path starting with '@' names Linux's abstract namespace (no file).
inline socklen_t unix_address(const std::string& path, sockaddr_un& a) {
  std::memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path) {
    rdx::detail::throw_rdx(errc::invalid_argument, "unix socket path '" + path + "': empty or longer than " +
                                                       std::to_string(sizeof a.sun_path - 1) + " bytes");
  }
  std::memcpy(a.sun_path, path.data(), path.size());
  if (path[0] == '@') {
    a.sun_path[0] = '\0';
  }
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + (path[0] == '@' ? 0 : 1));
}

//! Two connected SOCK_SEQPACKET sockets (for a parent and the child it forks, or tests).
inline std::pair<unique_fd, unique_fd> seqpacket_pair() {
  int sv[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    throw_errno("socketpair", "(AF_UNIX, SOCK_SEQPACKET)");
  }
  return {unique_fd(sv[0]), unique_fd(sv[1])};
}

//! A listening SOCK_SEQPACKET socket at path (an existing file there is replaced).
inline unique_fd seqpacket_listen(const std::string& path) {
  sockaddr_un a{};
  const socklen_t len = unix_address(path, a);
  unique_fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s) {
    throw_errno("socket", "(AF_UNIX, SOCK_SEQPACKET)");
  }
  if (path[0] != '@') {
    ::unlink(path.c_str());
  }
  if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&a), len) != 0 || ::listen(s.get(), 16) != 0) {
    throw_errno("bind/listen", "on unix socket " + path);
  }
  return s;
}

//! Waits up to timeout for fd to become readable (true) or not (false).
inline bool wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    const int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (r >= 0) {
      return r > 0;
    }
    if (errno != EINTR) {
      throw_errno("poll", "on a unix socket");
    }
  }
}

//! Accepts one peer on a listening socket, waiting up to timeout.
inline unique_fd seqpacket_accept(int listener, std::chrono::milliseconds timeout) {
  if (!wait_readable(listener, timeout)) {
    rdx::detail::throw_rdx(errc::timed_out, "accept on a unix socket: no peer within the timeout");
  }
  unique_fd s(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (!s) {
    throw_errno("accept4", "on a unix socket");
  }
  return s;
}

//! Connects to a listening socket at path, retrying until timeout while nobody listens yet.
inline unique_fd seqpacket_connect(const std::string& path, std::chrono::milliseconds timeout) {
  sockaddr_un a{};
  const socklen_t len = unix_address(path, a);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    unique_fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!s) {
      throw_errno("socket", "(AF_UNIX, SOCK_SEQPACKET)");
    }
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&a), len) == 0) {
      return s;
    }
    if ((errno != ENOENT && errno != ECONNREFUSED) || std::chrono::steady_clock::now() >= deadline) {
      throw_errno("connect", "to unix socket " + path);
    }
    ::usleep(2000);
  }
}

//! Sends one frame of n bytes, with fd beside it when fd >= 0. Never blocks.
//! @return 0, EAGAIN when the socket's buffer is full, or another errno (EPIPE: the peer is gone).
inline int send_frame(int sock, const void* data, std::size_t n, int fd = -1) noexcept {
  iovec iov{const_cast<void*>(data), n};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  for (;;) {
    const ssize_t r = ::sendmsg(sock, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r == static_cast<ssize_t>(n)) {
      return 0;
    }
    if (r < 0 && errno == EINTR) {
      continue;
    }
    return r < 0 ? errno : EMSGSIZE;
  }
}

//! What one receive found.
struct frame_in {
  std::size_t bytes = 0;  //!< bytes of the frame (0: none waiting, or the peer closed)
  bool closed = false;    //!< the peer closed its end (or the socket failed)
  unique_fd fd;           //!< a descriptor that came with the frame
  int error = 0;          //!< errno when the socket failed
};

//! Receives one frame into buf without blocking. A frame larger than cap is truncated (its size is
//! reported as cap + 1, so the caller refuses it). Descriptors beyond the first are closed.
inline frame_in receive_frame(int sock, void* buf, std::size_t cap) noexcept {
  frame_in in;
  iovec iov{buf, cap};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t r = -1;
  do {
    r = ::recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      in.closed = true;
      in.error = errno;
    }
    return in;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (!in.fd) {
          in.fd = unique_fd(fd);
        } else {
          ::close(fd);
        }
      }
    }
  }
  if (r == 0) {
    in.closed = true;
    return in;
  }
  in.bytes = (m.msg_flags & MSG_TRUNC) != 0 ? cap + 1 : static_cast<std::size_t>(r);
  return in;
}

}  // namespace rdx::cuda::detail
