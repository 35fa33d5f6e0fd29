// rdx: what the TCP bootstrap's sockets share (rdx/connect/tcp_socket.hpp):
// deadlines in poll()'s terms, O_NONBLOCK, and name resolution with its
// errors.
#pragma once

#include <rdx/detail/address.hpp>
#include <rdx/error.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>

namespace rdx::tcp {

//! The clock of every bootstrap deadline.
using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace detail {

inline std::string seconds_text(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

[[noreturn]] inline void fail_errno(int err, const std::string& what) {
  throw error(std::error_code(err, std::generic_category()), what);
}
[[noreturn]] inline void fail_timeout(const std::string& what) {
  throw error(errc::timed_out, what);
}

//! Milliseconds left until `deadline`, clamped to what poll() accepts.
inline int poll_ms(clock::time_point deadline) noexcept {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - clock::now()).count();
  if (left <= 0) {
    return 0;
  }
  return static_cast<int>(std::min<long long>(left + 1, 1 << 30));
}

using rdx::detail::address_text;
using rdx::detail::host_port;

//! What fcntl(O_NONBLOCK) set-up failures are called in messages.
inline constexpr const char* nonblocking_call = "fcntl(O_NONBLOCK) on a TCP socket";

//! Sets or clears O_NONBLOCK on fd. @return 0, or fcntl's errno.
inline int change_nonblocking(int fd, bool on) noexcept {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK)) < 0) {
    return errno;
  }
  return 0;
}

inline void set_nonblocking(int fd, bool on) {
  if (const int err = change_nonblocking(fd, on); err != 0) {
    fail_errno(err, nonblocking_call);
  }
}

struct addrinfo_list {
  addrinfo* head = nullptr;
  addrinfo_list() = default;
  addrinfo_list(const addrinfo_list&) = delete;
  addrinfo_list& operator=(const addrinfo_list&) = delete;
  ~addrinfo_list() {
    if (head != nullptr) {
      ::freeaddrinfo(head);
    }
  }
};

//! getaddrinfo for a TCP socket into out. @return 0, or getaddrinfo's code.
inline int try_resolve(addrinfo_list& out, const char* host, std::uint16_t port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  const std::string service = std::to_string(port);
  return ::getaddrinfo(host, service.c_str(), &hints, &out.head);
}

//! The error of a failed try_resolve (code rc) for `what`.
[[noreturn]] inline void fail_resolve(int rc, const std::string& what) {
  throw error(errc::invalid_argument, what + ": cannot resolve address: " + ::gai_strerror(rc));
}

inline void resolve(addrinfo_list& out, const char* host, std::uint16_t port, int flags,
                    const std::string& what) {
  if (const int rc = try_resolve(out, host, port, flags); rc != 0) {
    fail_resolve(rc, what);
  }
}

}  // namespace detail
}  // namespace rdx::tcp
