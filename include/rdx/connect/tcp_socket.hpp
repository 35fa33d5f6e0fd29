// rdx: the TCP bootstrap's sockets: a connected socket that sends and
// receives whole messages before a deadline, and a listener that accepts
// them. Every failure says what was attempted, with whom, and why.
#pragma once

#include <rdx/connect/authenticator.hpp>
#include <rdx/connect/detail/tcp_io.hpp>
#include <rdx/connect/wire.hpp>
#include <rdx/detail/address.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/endpoint.hpp>

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

namespace rdx::tcp {

//! Default time allowed for each bootstrap step.
inline constexpr milliseconds default_timeout{30000};

//! An owned TCP socket; closes on destruction. Move-only.
class socket {
public:
  socket() noexcept = default;
  //! Takes ownership of a connected socket descriptor.
  explicit socket(int fd, std::string peer = {}) noexcept : fd_(fd), peer_(std::move(peer)) {}
  //! Takes o's descriptor, peer name and recording hook; o is left closed.
  socket(socket&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)),
        peer_(std::move(o.peer_)),
        recorder_(std::exchange(o.recorder_, nullptr)) {}
  //! Closes this socket, then takes o's descriptor, peer name and hook; o is left closed.
  socket& operator=(socket&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
      peer_ = std::move(o.peer_);
      recorder_ = std::exchange(o.recorder_, nullptr);
    }
    return *this;
  }
  socket(const socket&) = delete;
  socket& operator=(const socket&) = delete;
  ~socket() { close(); }

  //! The descriptor, still owned (-1 when closed).
  [[nodiscard]] int native_handle() const noexcept { return fd_; }
  //! True while it owns a descriptor.
  [[nodiscard]] bool is_open() const noexcept { return fd_ >= 0; }
  //! is_open().
  explicit operator bool() const noexcept { return is_open(); }
  //! The peer as "host:port", for messages.
  [[nodiscard]] const std::string& peer() const noexcept { return peer_; }
  //! Gives up ownership of the descriptor.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  //! Closes the descriptor now (the destructor does it otherwise); a closed socket stays closed.
  void close() noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = -1;
  }

  //! From now on send_all and recv_exact report every byte they move to `a`
  //! (nullptr: to nobody), for an authenticator's transcript. It is const
  //! because it changes no state of the connection, so set-up code that holds
  //! a const socket can hook it. `a` must outlive the hook.
  void record_with(authenticator* a) const noexcept { recorder_ = a; }
  //! The authenticator that record_with() hooked in, or nullptr.
  [[nodiscard]] authenticator* recorder() const noexcept { return recorder_; }

  //! Hooks an authenticator into a socket for one scope, then restores the
  //! previous hook. A null authenticator unhooks the socket for the scope.
  class recording {
  public:
    //! Hooks a into s (record_with(a)) until this object is destroyed.
    recording(const socket& s, authenticator* a) noexcept : s_(s), previous_(s.recorder()) {
      s.record_with(a);
    }
    recording(const recording&) = delete;
    recording& operator=(const recording&) = delete;
    ~recording() { s_.record_with(previous_); }

  private:
    const socket& s_;
    authenticator* previous_;
  };

  //! Sends all of `data` before `deadline`.
  //! @throws rdx::error (errc::timed_out, or the errno of a failed send)
  void send_all(std::span<const std::byte> data, clock::time_point deadline,
                std::string_view what = "send") const {
    std::size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        if (recorder_ != nullptr) {
          recorder_->record(data.subspan(done, static_cast<std::size_t>(n)), true);
        }
        done += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wait(POLLOUT, deadline, what, done, data.size());
        continue;
      }
      detail::fail_errno(errno, std::string(what) + " to " + peer_);
    }
  }

  //! Receives exactly `data.size()` bytes before `deadline`.
  //! @throws rdx::error: errc::timed_out; errc::wire_format when the peer
  //!         closes the connection early; the errno of a failed recv.
  void recv_exact(std::span<std::byte> data, clock::time_point deadline,
                  std::string_view what = "receive") const {
    std::size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::recv(fd_, data.data() + done, data.size() - done, MSG_DONTWAIT);
      if (n > 0) {
        if (recorder_ != nullptr) {
          recorder_->record(data.subspan(done, static_cast<std::size_t>(n)), false);
        }
        done += static_cast<std::size_t>(n);
        continue;
      }
      if (n == 0) {
        throw error(errc::wire_format, std::string(what) + " from " + peer_ +
                                           ": peer closed the connection after " + std::to_string(done) +
                                           " of " + std::to_string(data.size()) + " bytes");
      }
      if (errno == EINTR) {
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait(POLLIN, deadline, what, done, data.size());
        continue;
      }
      detail::fail_errno(errno, std::string(what) + " from " + peer_);
    }
  }

  //! Sends one encoded endpoint message.
  void send_message(const endpoint& ep, std::span<const remote_descriptor> descriptors,
                    clock::time_point deadline) const {
    const auto bytes = wire::encode(ep, descriptors);
    send_all(bytes, deadline, "send endpoint");
  }

  //! Receives and decodes one endpoint message; refuses a bad header before
  //! reading the rest, so a foreign peer cannot make this side wait or allocate.
  [[nodiscard]] wire::message recv_message(clock::time_point deadline) const {
    std::vector<std::byte> buf(wire::header_size);
    recv_exact(buf, deadline, "receive endpoint");
    const wire::header h = wire::decode_header(buf);
    buf.resize(h.length);
    recv_exact(std::span(buf).subspan(wire::header_size), deadline, "receive endpoint");
    return wire::decode(buf);
  }

private:
  void wait(short events, clock::time_point deadline, std::string_view what, std::size_t done,
            std::size_t total) const {
    for (;;) {
      pollfd p{fd_, events, 0};
      const int ms = detail::poll_ms(deadline);
      if (ms == 0) {
        detail::fail_timeout(std::string(what) + (events == POLLIN ? " from " : " to ") + peer_ +
                             ": timed out with " + std::to_string(done) + " of " + std::to_string(total) +
                             " bytes " + (events == POLLIN ? "received" : "sent"));
      }
      const int rc = ::poll(&p, 1, ms);
      if (rc < 0 && errno == EINTR) {
        continue;
      }
      if (rc < 0) {
        detail::fail_errno(errno, "poll on TCP socket to " + peer_);
      }
      if (rc > 0) {
        return;  // ready, or an error the next call will report
      }
    }
  }

  int fd_ = -1;
  std::string peer_;
  mutable authenticator* recorder_ = nullptr;
};

//! A listening TCP socket. Move-only.
class listener {
public:
  listener() noexcept = default;

  //! Listens on `port` (0: the OS picks one, see port()) of `host`, or of
  //! every local address when `host` is empty (IPv6 and IPv4 where possible).
  //! @throws rdx::error naming the address and the cause (e.g. EADDRINUSE).
  [[nodiscard]] static listener bind(std::string_view host, std::uint16_t port) {
    const std::string where =
        "listen on " + (host.empty() ? "port " + std::to_string(port) : detail::host_port(host, port));
    detail::addrinfo_list ai;
    const std::string h(host);
    detail::resolve(ai, host.empty() ? nullptr : h.c_str(), port, AI_PASSIVE, where);
    // With no host, prefer one dual-stack IPv6 socket, so IPv4 and IPv6
    // clients both reach it; otherwise the first address that binds.
    std::vector<addrinfo*> order;
    for (addrinfo* a = ai.head; a != nullptr; a = a->ai_next) {
      if (a->ai_family == AF_INET6) {
        order.push_back(a);
      }
    }
    for (addrinfo* a = ai.head; a != nullptr; a = a->ai_next) {
      if (a->ai_family != AF_INET6) {
        order.push_back(a);
      }
    }
    int last_err = EADDRNOTAVAIL;
    for (addrinfo* a : order) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last_err = errno;
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (a->ai_family == AF_INET6 && host.empty()) {
        const int zero = 0;
        ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      }
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
        listener l;
        l.fd_ = fd;
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
          l.port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
        }
        return l;
      }
      last_err = errno;
      ::close(fd);
    }
    std::string w = where;
    if (last_err == EADDRINUSE) {
      w += " (another program, or an earlier run, holds this port; choose another with -p)";
    }
    detail::fail_errno(last_err, w);
  }

  //! Takes o's descriptor and port; o is left closed.
  listener(listener&& o) noexcept : fd_(std::exchange(o.fd_, -1)), port_(o.port_) {}
  //! Closes this listener, then takes o's descriptor and port; o is left closed.
  listener& operator=(listener&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
      port_ = o.port_;
    }
    return *this;
  }
  listener(const listener&) = delete;
  listener& operator=(const listener&) = delete;
  ~listener() { close(); }

  //! The listening descriptor, still owned (-1 when closed).
  [[nodiscard]] int native_handle() const noexcept { return fd_; }
  //! The port listened on (the OS's pick when bound to port 0).
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  //! Stops listening now (the destructor does it otherwise).
  void close() noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = -1;
  }

  //! Waits up to `timeout` for one client.
  //! @throws rdx::error (errc::timed_out: "no client connected within ...")
  [[nodiscard]] socket accept(milliseconds timeout = default_timeout) const {
    std::error_code ec;
    const char* failed = nullptr;
    socket s = wait_for_client(timeout, ec, failed);
    if (!ec) {
      return s;
    }
    if (ec == errc::timed_out) {
      detail::fail_timeout("accept on port " + std::to_string(port_) + ": no client connected within " +
                           detail::seconds_text(timeout) +
                           " (is the client running and pointed at this host?)");
    }
    detail::fail_errno(ec.value(), failed + std::to_string(port_));
  }
  //! The same without throwing: ec is cleared when a client came, else set to the code the
  //! throwing form carries (errc::timed_out, or the errno of poll or accept4) and the socket
  //! returned is closed. ec holds the code only, not the message's text. Throws nothing but
  //! std::bad_alloc.
  [[nodiscard]] socket accept(milliseconds timeout, std::error_code& ec) const {
    const char* failed = nullptr;
    return wait_for_client(timeout, ec, failed);
  }
  //! The same within default_timeout.
  [[nodiscard]] socket accept(std::error_code& ec) const { return accept(default_timeout, ec); }

private:
  // accept's work: a client's socket, or ec set and `failed` naming the call
  // that failed ("poll on listening port ", "accept on port ") for the message.
  socket wait_for_client(milliseconds timeout, std::error_code& ec, const char*& failed) const {
    ec.clear();
    const auto deadline = clock::now() + timeout;
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      const int ms = detail::poll_ms(deadline);
      if (ms == 0) {
        ec = make_error_code(errc::timed_out);
        return {};
      }
      const int rc = ::poll(&p, 1, ms);
      if (rc < 0 && errno == EINTR) {
        continue;
      }
      if (rc < 0) {
        ec.assign(errno, std::generic_category());
        failed = "poll on listening port ";
        return {};
      }
      if (rc == 0) {
        continue;
      }
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) {
          continue;
        }
        ec.assign(errno, std::generic_category());
        failed = "accept on port ";
        return {};
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return socket(fd, detail::address_text(reinterpret_cast<sockaddr*>(&ss)));
    }
  }

  int fd_ = -1;
  std::uint16_t port_ = 0;
};

}  // namespace rdx::tcp
