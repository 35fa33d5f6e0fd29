// rdx::cm: an rdma_cm listener that accepts connections into a running
// worker without blocking its thread. poll() takes the requests that have
// come (from the listener, without waiting), starts each as cm::accept does
// (the request checked against the connection, the queue pairs at RTS, the
// grants bound, the replies sent), then reads the request's own event
// channel, which sits in the acceptor's epoll set, for ESTABLISHED on every
// queue pair, and hands the connection over with its rdma_cm link attached.
// One thread serves its clients on the worker while others are still
// arriving, and a client that is silent, gone or foreign fails only its own
// set-up, at once or at its deadline. Clients connect with cm::connect
// unchanged. The same shape as rdx::acceptor (rdx/channel/acceptor.hpp),
// which does this over the TCP bootstrap.
#pragma once

#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/cm/connect.hpp>
#include <rdx/cm/listener.hpp>
#include <rdx/error.hpp>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <iterator>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <sys/epoll.h>
#include <unistd.h>

namespace rdx::cm {

//! How a cm::acceptor sets up its clients.
struct acceptor_options {
  //! Each client's whole set-up, from its request leaving the listener to ESTABLISHED.
  std::chrono::milliseconds timeout{10000};
  connect_options connect{};  //!< the RTR and RTS settings of every queue pair
  //! Set-ups in progress at once; later requests wait in the listener and
  //! in the kernel's backlog (listen_options::backlog).
  std::size_t max_pending = 256;
};

//! Accepts rdx clients over rdma_cm into a worker without blocking.
//! Move-only; used on the worker's thread. Each set-up ends in an
//! rdx::accepted (its socket stays closed, its preamble empty). Destroying
//! the acceptor ends the set-ups in progress (their clients hear a reject or
//! a disconnect) and destroys their connections; those handed out are the
//! caller's.
class acceptor {
public:
  //! Called once a client's connection exists, before anything is sent:
  //! returns the grants to offer it (made on that connection; at most 7 fit
  //! in a reply).
  using prepare_fn = rdx::acceptor::prepare_fn;

  //! Accepts the requests of `l`; every client's connection is made on `w`
  //! with `attr` (the client's queue pairs, recv_depth and message_size must
  //! match it, else it is rejected with the reason).
  //! @throws rdx::error for an empty worker or listener, max_pending 0, or a failed epoll_create1.
  acceptor(worker& w, const protection_domain& pd, listener l, const connection_attr& attr,
           acceptor_options o = {}, prepare_fn prepare = {})
      : w_(&w), pd_(&pd), l_(std::move(l)), attr_(attr), o_(o), prepare_(std::move(prepare)) {
    if (!w) {
      rdx::detail::throw_rdx(errc::invalid_argument, "cm::acceptor: the worker is empty (moved from)");
    }
    if (l_.fd() < 0) {
      rdx::detail::throw_rdx(errc::invalid_argument, "cm::acceptor: the listener is empty (moved from)");
    }
    if (o_.max_pending == 0) {
      rdx::detail::throw_rdx(errc::invalid_argument, "cm::acceptor: max_pending is 0");
    }
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) {
      rdx::detail::throw_errno("epoll_create1", "cm::acceptor", errno);
    }
    listen_while_room();
  }
  //! Takes o's listener and set-ups; o is left to be destroyed.
  acceptor(acceptor&& o) noexcept
      : w_(o.w_),
        pd_(o.pd_),
        l_(std::move(o.l_)),
        attr_(o.attr_),
        o_(o.o_),
        prepare_(std::move(o.prepare_)),
        ep_(std::exchange(o.ep_, -1)),
        listening_(o.listening_),
        more_(o.more_),
        sweep_at_(o.sweep_at_),
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

  //! A descriptor readable when a request arrives or a set-up has an event
  //! to read (an epoll descriptor): give it to worker::watch(), or to the
  //! application's own loop, and call poll() when it is readable.
  [[nodiscard]] int fd() const noexcept { return ep_; }
  //! The port listened on.
  [[nodiscard]] std::uint16_t port() const noexcept { return l_.port(); }
  //! Set-ups in progress.
  [[nodiscard]] std::size_t pending() const noexcept { return setups_.size(); }
  //! Requests the listener rejected by itself (another version, malformed, incomplete).
  [[nodiscard]] std::uint64_t rejected() const noexcept { return l_.rejected(); }
  //! The peer and the reason of the last of those ("" before any).
  [[nodiscard]] const std::string& last_rejection() const noexcept { return l_.last_rejection(); }

  //! Never blocks: reads what each set-up's channel holds, hands the
  //! connections that reached ESTABLISHED to their links, takes the requests
  //! that came (up to max_pending set-ups at once) and starts them, fails
  //! those past their deadline, and returns one finished or failed set-up,
  //! if any. Call it until it returns nothing, and again when fd() is
  //! readable or a while later (deadlines are looked at here).
  //! @throws rdx::error only for the acceptor's own failure (its epoll
  //! descriptor, its listener's event channel); a client's failure is an accepted.
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
  struct setup {
    std::list<setup>::iterator self;
    std::string peer;
    std::unique_ptr<connection> conn;
    std::optional<detail::pending_accept> acc;  // destroyed before conn: its ids first
    clock::time_point deadline;
  };
  // How often the listener is asked even when its descriptor is quiet: it
  // rejects an rdx peer's incomplete group of requests only when asked.
  static constexpr std::chrono::milliseconds sweep{100};

  void watch(int fd, int op, setup* s) const noexcept {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = s;
    (void)::epoll_ctl(ep_, op, fd, &ev);
  }

  void step() {
    epoll_event ev[64];
    const int n = ::epoll_wait(ep_, ev, 64, 0);
    if (n < 0 && errno != EINTR) {
      rdx::detail::throw_errno("epoll_wait", "cm::acceptor", errno);
    }
    bool listener_ready = more_ || clock::now() >= sweep_at_;
    for (int i = 0; i < n; ++i) {
      if (ev[i].data.ptr == nullptr) {
        listener_ready = true;
      } else {
        advance(*static_cast<setup*>(ev[i].data.ptr));
      }
    }
    if (listener_ready) {
      take_requests();
    }
    expire();
    listen_while_room();
  }

  // The listener's descriptor stays in the epoll set only while a set-up
  // can start, so a full acceptor is not woken again and again by it.
  void listen_while_room() noexcept {
    const bool room = setups_.size() < o_.max_pending;
    if (room == listening_) {
      return;
    }
    watch(l_.fd(), room ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, nullptr);
    listening_ = room;
    if (room) {
      more_ = true;  // the listener may hold requests already read from its channel
    }
  }

  void take_requests() {
    more_ = false;
    sweep_at_ = clock::now() + sweep;
    while (setups_.size() < o_.max_pending) {
      std::optional<request> r = l_.next(std::chrono::milliseconds{0});
      if (!r) {
        return;
      }
      start(std::move(*r));
    }
  }

  // What cm::accept does up to its replies; ESTABLISHED is read as it comes.
  void start(request r) {
    setup& s = setups_.emplace_back();
    s.self = std::prev(setups_.end());
    s.peer = r.peer();
    s.deadline = clock::now() + o_.timeout;
    try {
      detail::pending_accept::refuse_foreign(r);
      std::vector<window_descriptor> grants;
      try {
        s.conn = std::make_unique<connection>(*w_, *pd_, attr_);
        if (prepare_) {
          grants = prepare_(*s.conn, s.peer);
        }
      } catch (const std::exception& e) {
        r.reject(reject_reason::failed, e.what());  // the client reads why
        throw error(code_of(e), "cm::acceptor: set-up of " + s.peer + ": " + e.what());
      }
      s.acc.emplace(std::move(r), *s.conn, grants, options{.timeout = o_.timeout, .qp = o_.connect});
    } catch (const std::exception& e) {
      fail(s, e);
      return;
    }
    watch(s.acc->fd(), EPOLL_CTL_ADD, &s);
    advance(s);
  }

  void advance(setup& s) {
    try {
      if (!s.acc->take()) {
        return;
      }
      // Out of this epoll set before the channel becomes the link, which the worker watches.
      watch(s.acc->fd(), EPOLL_CTL_DEL, nullptr);
      accepted a;
      a.peer = s.peer;
      a.offer = s.acc->finish();
      a.conn = std::move(s.conn);
      done_.push_back(std::move(a));
      setups_.erase(s.self);
    } catch (const std::exception& e) {
      fail(s, e);
    }
  }

  void fail(setup& s, const std::exception& e) {
    accepted a;
    a.peer = s.peer;
    a.error = code_of(e);
    a.message = e.what();
    a.conn = std::move(s.conn);
    if (s.acc) {
      watch(s.acc->fd(), EPOLL_CTL_DEL, nullptr);
    }
    done_.push_back(std::move(a));
    setups_.erase(s.self);  // destroys the request's ids: the client hears it at once
  }

  void expire() {
    const auto now = clock::now();
    for (auto it = setups_.begin(); it != setups_.end();) {
      setup& s = *it++;
      if (now < s.deadline) {
        continue;
      }
      const error e(errc::timed_out,
                    "cm::acceptor: set-up of " + s.peer + ": " + std::to_string(s.acc->established()) +
                        " of " + std::to_string(s.acc->queue_pairs()) + " queue pairs ESTABLISHED within " +
                        std::to_string(o_.timeout.count()) +
                        " ms (acceptor_options::timeout): the client stopped or went away");
      fail(s, e);
    }
  }

  static std::error_code code_of(const std::exception& e) noexcept {
    const auto* se = dynamic_cast<const std::system_error*>(&e);
    return se != nullptr ? se->code() : make_error_code(errc::operation_failed);
  }

  worker* w_;
  const protection_domain* pd_;
  listener l_;
  connection_attr attr_;
  acceptor_options o_;
  prepare_fn prepare_;
  int ep_ = -1;
  bool listening_ = false;  // the listener's descriptor is in the epoll set
  bool more_ = false;       // ask the listener on the next step
  clock::time_point sweep_at_{};
  std::list<setup> setups_;
  std::deque<accepted> done_;
};

}  // namespace rdx::cm
