// rdx: a small blocking TCP bootstrap to exchange endpoints before RDMA
// traffic starts. Every step has a deadline; every failure says what was
// attempted, with whom, and why it failed.
#pragma once

#include <rdx/connect/tcp_socket.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

//! A small blocking TCP bootstrap that exchanges endpoints before RDMA traffic starts; every step
//! has a deadline.
namespace rdx::tcp {

namespace detail {

//! Where a tcp::connect failed, for the throwing form's message.
struct connect_failure {
  int gai = 0;                 //!< getaddrinfo's code when the host did not resolve
  const char* call = nullptr;  //!< a call that failed on a connected socket, else nullptr
};

//! tcp::connect's work: the connected socket, or ec set (and `at` saying where) and a closed socket.
[[nodiscard]] inline socket dial(std::string_view host, std::uint16_t port, milliseconds timeout,
                                 std::error_code& ec, connect_failure& at) {
  ec.clear();
  const std::string target = host_port(host, port);
  const auto deadline = clock::now() + timeout;
  const std::string h(host);
  milliseconds backoff{20};
  int last_err = ETIMEDOUT;
  for (;;) {
    addrinfo_list ai;
    if (const int rc = try_resolve(ai, h.c_str(), port, 0); rc != 0) {
      at.gai = rc;
      ec = make_error_code(errc::invalid_argument);
      return {};
    }
    for (addrinfo* a = ai.head; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
      if (fd < 0) {
        last_err = errno;
        continue;
      }
      int err = 0;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
          err = ETIMEDOUT;
          for (;;) {
            pollfd p{fd, POLLOUT, 0};
            const int rc = ::poll(&p, 1, poll_ms(deadline));
            if (rc < 0 && errno == EINTR) {
              continue;
            }
            if (rc > 0) {
              socklen_t len = sizeof err;
              if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
                err = errno;
              }
            }
            break;
          }
        }
      }
      if (err == 0) {
        if (const int e = change_nonblocking(fd, false); e != 0) {
          ::close(fd);
          at.call = nonblocking_call;
          ec.assign(e, std::generic_category());
          return {};
        }
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return socket(fd, target);
      }
      ::close(fd);
      // An attempt cut short by the deadline says less than a refusal seen
      // earlier ("is the server running?"): keep the more telling cause.
      if (err != ETIMEDOUT || last_err == ETIMEDOUT) {
        last_err = err;
      }
    }
    const auto now = clock::now();
    if (now >= deadline) {
      break;
    }
    std::this_thread::sleep_for(std::min<clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds{500});
  }
  ec.assign(last_err, std::generic_category());
  return {};
}

}  // namespace detail

//! Connects to `host:port`, retrying refused or unreachable attempts until
//! `timeout` has passed, so a client may start before its server.
//! @throws rdx::error with the last cause, e.g. "connect to 10.77.0.2:18515
//!         (retried for 30.0 s; is the server running?): Connection refused".
[[nodiscard]] inline socket connect(std::string_view host, std::uint16_t port,
                                    milliseconds timeout = default_timeout) {
  std::error_code ec;
  detail::connect_failure at;
  socket s = detail::dial(host, port, timeout, ec, at);
  if (!ec) {
    return s;
  }
  const std::string target = "connect to " + detail::host_port(host, port);
  if (at.gai != 0) {
    detail::fail_resolve(at.gai, target);
  }
  if (at.call != nullptr) {
    detail::fail_errno(ec.value(), at.call);
  }
  std::string what = target + " (retried for " + detail::seconds_text(timeout);
  const int last_err = ec.value();
  if (last_err == ECONNREFUSED) {
    what += "; is the server running?)";
  } else if (last_err == ETIMEDOUT) {
    what += "; is the host reachable?)";
  } else if (last_err == EHOSTUNREACH || last_err == ENETUNREACH) {
    what += "; check the address and the route)";
  } else {
    what += ")";
  }
  detail::fail_errno(last_err, what);
}
//! The same without throwing: ec is cleared on success, else set to the code the throwing form
//! carries (the last attempt's errno, e.g. std::errc::connection_refused; errc::invalid_argument
//! for a host that does not resolve) and the socket returned is closed. ec holds the code only,
//! not the message's text (the peer and the hint). Throws nothing but std::bad_alloc.
[[nodiscard]] inline socket connect(std::string_view host, std::uint16_t port, milliseconds timeout,
                                    std::error_code& ec) {
  detail::connect_failure at;
  return detail::dial(host, port, timeout, ec, at);
}
//! The same within default_timeout.
[[nodiscard]] inline socket connect(std::string_view host, std::uint16_t port, std::error_code& ec) {
  return connect(host, port, default_timeout, ec);
}

//! Sends this side's endpoint message and receives the peer's, both before
//! `deadline`. Both sides call it; the order of bytes on the wire does not
//! depend on the role.
[[nodiscard]] inline wire::message exchange(const socket& s, const endpoint& local,
                                            std::span<const remote_descriptor> descriptors,
                                            clock::time_point deadline) {
  s.send_message(local, descriptors, deadline);
  return s.recv_message(deadline);
}
//! The same, both before `timeout` has passed.
[[nodiscard]] inline wire::message exchange(const socket& s, const endpoint& local,
                                            std::span<const remote_descriptor> descriptors = {},
                                            milliseconds timeout = default_timeout) {
  return exchange(s, local, descriptors, clock::now() + timeout);
}

//! The byte each side of a barrier sends.
inline constexpr std::byte barrier_byte{0x52};

//! Waits until the peer has reached the same point: each side sends one byte
//! and waits for the peer's, before `deadline`. Use it after both queue pairs
//! are ready to receive, so the first message never meets a queue pair that is not.
inline void barrier(const socket& s, clock::time_point deadline) {
  const std::byte out = barrier_byte;
  s.send_all(std::span(&out, 1), deadline, "send barrier");
  std::byte in{};
  s.recv_exact(std::span(&in, 1), deadline, "wait for peer at barrier");
  if (in != out) {
    throw error(errc::wire_format, "barrier from " + s.peer() + ": unexpected byte, the peer is out of step");
  }
}
//! The same, before `timeout` has passed.
inline void barrier(const socket& s, milliseconds timeout = default_timeout) {
  barrier(s, clock::now() + timeout);
}

//! barrier() without waiting for the peer, for a loop that serves others
//! meanwhile: the first call sends this side's byte (`sent` records it), and
//! every call looks for the peer's. @return true once the peer's byte is in,
//! false while it has not come. @throws rdx::error: errc::wire_format for
//! another byte or the peer closing its end, errc::timed_out past the deadline.
inline bool try_barrier(const socket& s, bool& sent, clock::time_point deadline) {
  if (!sent) {
    s.send_all(std::span(&barrier_byte, 1), deadline, "send barrier");
  }
  sent = true;
  std::byte in{};
  const ssize_t n = ::recv(s.native_handle(), &in, 1, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    if (clock::now() > deadline) {
      throw error(errc::timed_out, "barrier with " + s.peer() + ": the peer did not come");
    }
    return false;
  }
  if (n < 0) {
    rdx::detail::throw_errno("recv", "barrier with " + s.peer(), errno);
  }
  if (n == 0) {
    throw error(errc::wire_format, "barrier with " + s.peer() + ": the peer closed its end first");
  }
  if (in != barrier_byte) {
    throw error(errc::wire_format, "barrier from " + s.peer() + ": unexpected byte, the peer is out of step");
  }
  return true;
}

}  // namespace rdx::tcp
