// rdx: a TCP listener that accepts connections into a running worker. Every
// client's set-up (the exchange of exchange_and_connect, server side) runs
// without blocking: the acceptor's poll() reads what each client has sent,
// connects those whose messages are complete and hands them over, so one
// thread serves its clients on the worker while others are still arriving,
// and a silent or slow client holds only its own set-up, up to its deadline.
//
// The bytes on the wire are exchange_and_connect's: a client connects with
// it unchanged. The acceptor sends its own side's messages as soon as a
// client arrives (they do not depend on the client's), then reads the
// client's endpoint messages and settings block, connects, and meets the
// client at the barrier. With acceptor_options::check_preamble, only its
// preamble goes first: the client's preamble is read and judged before a
// connection is made for it (a stranger costs no queue pair), and a client
// may be handed out there, with no connection, for the application to answer. Not authenticated: a pre-shared
// key needs exchange_and_connect with exchange_options::auth (a blocking set-up).
#pragma once

#include <rdx/channel/acceptor_types.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/error.hpp>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace rdx {

//! Accepts clients over TCP into a worker without blocking. Move-only; used
//! on the worker's thread. Destroying it closes the sockets of set-ups in
//! progress and destroys their connections; those handed out are the caller's.
class acceptor {
public:
  //! Called once a client's connection exists, before anything is sent:
  //! returns the grants to offer it (made on that connection).
  using prepare_fn = std::function<std::vector<window_descriptor>(connection&, const std::string& peer)>;

  //! Accepts on `l` (made non-blocking; its backlog raised to SOMAXCONN);
  //! every client's connection is made on `w` with `attr`.
  //! @throws rdx::error for an empty worker or listener, or a failed epoll_create1.
  acceptor(worker& w, const protection_domain& pd, tcp::listener l, const connection_attr& attr,
           acceptor_options o = {}, prepare_fn prepare = {})
      : w_(&w), pd_(&pd), l_(std::move(l)), attr_(attr), o_(std::move(o)), prepare_(std::move(prepare)) {
    if (!w) {
      detail::throw_rdx(errc::invalid_argument, "acceptor: the worker is empty (moved from)");
    }
    if (l_.native_handle() < 0) {
      detail::throw_rdx(errc::invalid_argument, "acceptor: the listener is closed");
    }
    if (o_.max_pending == 0) {
      detail::throw_rdx(errc::invalid_argument, "acceptor: max_pending is 0");
    }
    tcp::detail::set_nonblocking(l_.native_handle(), true);
    (void)::listen(l_.native_handle(), SOMAXCONN);
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) {
      detail::throw_errno("epoll_create1", "acceptor", errno);
    }
    watch(l_.native_handle(), EPOLLIN, nullptr, EPOLL_CTL_ADD);
  }
  //! Takes o's listener, set-ups in progress and epoll descriptor; o is left empty.
  acceptor(acceptor&& o) noexcept
      : w_(o.w_),
        pd_(o.pd_),
        l_(std::move(o.l_)),
        attr_(o.attr_),
        o_(std::move(o.o_)),
        prepare_(std::move(o.prepare_)),
        ep_(std::exchange(o.ep_, -1)),
        setups_(std::move(o.setups_)),
        done_(std::move(o.done_)) {}
  acceptor& operator=(acceptor&&) = delete;
  acceptor(const acceptor&) = delete;
  acceptor& operator=(const acceptor&) = delete;
  ~acceptor() {
    if (ep_ >= 0) {
      ::close(ep_);
    }
  }

  //! A descriptor readable when a client arrives or a set-up has bytes to
  //! read (an epoll descriptor): give it to worker::watch(), or to the
  //! application's own loop, and call poll() when it is readable.
  [[nodiscard]] int fd() const noexcept { return ep_; }
  //! The port listened on.
  [[nodiscard]] std::uint16_t port() const noexcept { return l_.port(); }
  //! Set-ups in progress.
  [[nodiscard]] std::size_t pending() const noexcept { return setups_.size(); }

  //! Never blocks: accepts the clients waiting (up to max_pending set-ups at
  //! once), moves every set-up on with what its client has sent, fails those
  //! past their deadline, and returns one finished or failed set-up, if any.
  //! Call it until it returns nothing.
  [[nodiscard]] std::optional<accepted> poll() {
    if (done_.empty()) {
      step();
    }
    if (done_.empty()) {
      return std::nullopt;
    }
    accepted a = std::move(done_.front());
    done_.pop_front();
    return a;
  }

private:
  enum class phase { preamble, endpoint_header, endpoint_body, settings_header, settings_body, barrier };
  struct setup {
    std::list<setup>::iterator self;
    tcp::socket sock;
    std::unique_ptr<connection> conn;
    std::chrono::steady_clock::time_point deadline;
    std::vector<std::byte> out;  // this side's bytes not yet sent
    std::size_t out_done = 0;
    std::vector<std::byte> in;  // the current step's bytes
    std::size_t have = 0;
    phase ph = phase::preamble;
    std::size_t qp = 0;  // endpoint message being read
    std::size_t nqp = 0;
    std::vector<wire::message> got;
    std::vector<std::byte> preamble;
    peer_offer offer;
    bool writing = false;     // EPOLLOUT asked for
    bool handed_out = false;  // check_preamble said hand_out
  };

  void watch(int fd, std::uint32_t events, setup* s, int op) const noexcept {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = s;
    (void)::epoll_ctl(ep_, op, fd, &ev);
  }

  void step() {
    epoll_event ev[64];
    const int n = ::epoll_wait(ep_, ev, 64, 0);
    bool listener_ready = false;
    for (int i = 0; i < n; ++i) {
      if (ev[i].data.ptr == nullptr) {
        listener_ready = true;
      } else {
        advance(*static_cast<setup*>(ev[i].data.ptr));
      }
    }
    if (listener_ready) {
      accept_waiting();
    }
    expire();
  }

  void accept_waiting() {
    while (setups_.size() < o_.max_pending) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd =
          ::accept4(l_.native_handle(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) {
          continue;
        }
        return;  // EAGAIN: nobody waits; EMFILE and the like: the clients stay in the backlog
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      setup& s = setups_.emplace_back();
      s.self = std::prev(setups_.end());
      s.sock = tcp::socket(fd, detail::address_text(reinterpret_cast<sockaddr*>(&ss)));
      s.deadline = std::chrono::steady_clock::now() + o_.timeout;
      try {
        start(s);
      } catch (const std::exception& e) {
        fail(s, e);
        continue;
      }
      watch(fd, EPOLLIN, &s, EPOLL_CTL_ADD);
      advance(s);
    }
  }

  // This side's preamble, and (unless the client's preamble is to be
  // checked first) its connection, grants and messages, sent at once.
  void start(setup& s) {
    s.out = o_.preamble;
    if (o_.peer_preamble_size == 0 || !o_.check_preamble) {
      begin_exchange(s);
    }
    if (o_.peer_preamble_size > 0) {
      expect(s, phase::preamble, o_.peer_preamble_size);
    } else {
      expect(s, phase::endpoint_header, wire::header_size);
    }
  }

  // The client's connection, its grants and this side's endpoint messages
  // and settings, queued behind what is still to be sent.
  void begin_exchange(setup& s) {
    s.conn = std::make_unique<connection>(*w_, *pd_, attr_);
    std::vector<window_descriptor> grants;
    if (prepare_) {
      grants = prepare_(*s.conn, s.sock.peer());
    }
    const connection_info info = s.conn->local_info();
    const detail::offer_messages mine = detail::make_offer_messages(info, grants, "acceptor");
    s.nqp = mine.descriptors.size();
    for (std::size_t i = 0; i < s.nqp; ++i) {
      const std::vector<std::byte> m = wire::encode(info.endpoints[i], mine.descriptors[i]);
      s.out.insert(s.out.end(), m.begin(), m.end());
    }
    s.out.insert(s.out.end(), mine.settings.begin(), mine.settings.end());
  }

  static void expect(setup& s, phase p, std::size_t bytes) {
    s.ph = p;
    s.in.assign(bytes, std::byte{});
    s.have = 0;
  }
  // The same step goes on: the header read so far stays at the front.
  static void extend(setup& s, phase p, std::size_t total) {
    s.ph = p;
    s.in.resize(total);
  }

  void advance(setup& s) {
    try {
      if (!flush(s)) {
        return;
      }
      for (;;) {
        while (s.have < s.in.size()) {
          const ssize_t n =
              ::recv(s.sock.native_handle(), s.in.data() + s.have, s.in.size() - s.have, MSG_DONTWAIT);
          if (n > 0) {
            s.have += static_cast<std::size_t>(n);
            continue;
          }
          if (n == 0) {
            throw error(errc::wire_format, "the client closed the connection " + where(s));
          }
          if (errno == EINTR) {
            continue;
          }
          if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return;
          }
          detail::throw_errno("recv", "set-up of " + s.sock.peer(), errno);
        }
        if (take(s)) {
          finish(s);
          return;
        }
        if (!flush(s)) {
          return;
        }
      }
    } catch (const std::exception& e) {
      fail(s, e);
    }
  }

  // The step's bytes are all here: decode them; true once the barrier is met.
  bool take(setup& s) {
    switch (s.ph) {
      case phase::preamble:
        s.preamble = std::move(s.in);
        if (!s.conn) {  // checked first
          switch (o_.check_preamble(s.preamble)) {
            case preamble_verdict::proceed: begin_exchange(s); break;
            case preamble_verdict::refuse:
              throw error(errc::rejected, "acceptor: the preamble of " + s.sock.peer() + " was refused");
            case preamble_verdict::hand_out: s.handed_out = true; return true;
          }
        }
        expect(s, phase::endpoint_header, wire::header_size);
        return false;
      case phase::endpoint_header:
        extend(s, phase::endpoint_body, wire::decode_header(s.in).length);
        return false;
      case phase::endpoint_body:
        s.got.push_back(wire::decode(s.in));
        if (++s.qp < s.nqp) {
          expect(s, phase::endpoint_header, wire::header_size);
        } else {
          expect(s, phase::settings_header, wire::settings_header_size);
        }
        return false;
      case phase::settings_header:
        extend(s, phase::settings_body, wire::settings_size(wire::settings_window_count(s.in)));
        return false;
      case phase::settings_body: {
        auto bad = [&](const std::string& what) {
          throw error(errc::wire_format, "acceptor: set-up of " + s.sock.peer() + ": " + what);
        };
        s.offer = detail::read_peer_offer(s.got, wire::decode_settings(s.in), bad);
        s.conn->connect(s.offer.info, o_.connect);
        s.out.push_back(tcp::barrier_byte);
        expect(s, phase::barrier, 1);
        return false;
      }
      case phase::barrier:
        if (s.in[0] != tcp::barrier_byte) {
          throw error(errc::wire_format, "acceptor: barrier from " + s.sock.peer() +
                                             ": unexpected byte, the client is out of step");
        }
        return true;
    }
    return false;
  }

  // Sends what is left of this side's bytes; false while the socket is full.
  bool flush(setup& s) {
    while (s.out_done < s.out.size()) {
      const ssize_t n = ::send(s.sock.native_handle(), s.out.data() + s.out_done, s.out.size() - s.out_done,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        s.out_done += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!s.writing) {
          watch(s.sock.native_handle(), EPOLLIN | EPOLLOUT, &s, EPOLL_CTL_MOD);
        }
        s.writing = true;
        return false;
      }
      detail::throw_errno("send", "set-up of " + s.sock.peer(), errno);
    }
    s.out.clear();
    s.out_done = 0;
    if (s.writing) {
      watch(s.sock.native_handle(), EPOLLIN, &s, EPOLL_CTL_MOD);
    }
    s.writing = false;
    return true;
  }

  void finish(setup& s) {
    watch(s.sock.native_handle(), 0, nullptr, EPOLL_CTL_DEL);
    accepted a;
    a.peer = s.sock.peer();
    a.conn = std::move(s.conn);
    a.offer = std::move(s.offer);
    a.preamble = std::move(s.preamble);
    a.socket = std::move(s.sock);
    a.handed_out = s.handed_out;
    done_.push_back(std::move(a));
    setups_.erase(s.self);
  }

  void fail(setup& s, const std::exception& e) {
    accepted a;
    a.peer = s.sock.peer();
    const auto* re = dynamic_cast<const std::system_error*>(&e);
    a.error = re != nullptr ? re->code() : make_error_code(errc::wire_format);
    a.message = e.what();
    a.conn = std::move(s.conn);
    if (s.sock.native_handle() >= 0) {
      watch(s.sock.native_handle(), 0, nullptr, EPOLL_CTL_DEL);
    }
    done_.push_back(std::move(a));
    setups_.erase(s.self);  // closes the socket: the client's exchange fails at once
  }

  void expire() {
    const auto now = std::chrono::steady_clock::now();
    for (auto it = setups_.begin(); it != setups_.end();) {
      setup& s = *it++;
      if (now < s.deadline) {
        continue;
      }
      const error e(make_error_code(errc::timed_out),
                    "acceptor: set-up of " + s.sock.peer() + " did not finish within " +
                        tcp::detail::seconds_text(o_.timeout) + ", " + where(s));
      fail(s, e);
    }
  }

  static std::string where(const setup& s) {
    std::string step;
    switch (s.ph) {
      case phase::preamble: step = "the application's preamble"; break;
      case phase::endpoint_header:
      case phase::endpoint_body:
        step = "endpoint message " + std::to_string(s.qp + 1) + " of " + std::to_string(s.nqp);
        break;
      case phase::settings_header:
      case phase::settings_body: step = "the connection settings"; break;
      case phase::barrier: step = "the barrier"; break;
    }
    return "while waiting for " + step + " (" + std::to_string(s.have) + " of " +
           std::to_string(s.in.size()) + " bytes received)";
  }

  worker* w_;
  const protection_domain* pd_;
  tcp::listener l_;
  connection_attr attr_;
  acceptor_options o_;
  prepare_fn prepare_;
  int ep_ = -1;
  std::list<setup> setups_;
  std::deque<accepted> done_;
};

}  // namespace rdx
