// rdx: a connection of K reliable queue pairs sharing one completion queue,
// the engine under windows (one-sided) and channels (two-sided). Its parts
// have files of their own: operation.hpp (the operation and its awaiters),
// send_queue.hpp (signaling and send-queue credits per queue pair),
// message_ring.hpp (receive buffers and flow-control credits), and
// detail/engine.hpp (posting, completion dispatch, deferral, deadlines,
// liveness and teardown). operation.hpp gives the lifetime rules; the
// threading rules follow.
//
// Threading: one thread at a time uses a connection and the operations
// started on it (checked in debug builds); a stop_token may be stopped from
// any thread. Different connections may live on different threads and share
// a context and a protection domain.
//
// More in rdx's design notes (share/doc/rdx/design.md): "Ownership",
// "Lifetimes, cancellation and time", "Dead peers", "Teardown", "Threading".
#pragma once

#include <rdx/channel/detail/engine_all.hpp>
#include <rdx/channel/operation.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>

namespace rdx {

//! K reliable queue pairs of one protection domain sharing one completion
//! queue sized for all of them, so no queue can overflow. Not movable:
//! operations and receive buffers point into it.
//!
//! Destruction: every queue pair goes to the error state and is drained
//! (bounded by connection_attr::drain_timeout), every pending operation ends
//! with errc::operation_aborted without resuming its coroutine, the queue
//! pairs are destroyed, and only then the memory they used is deregistered.
class connection : private detail::engine {
public:
  //! Creates the queue pairs (RESET -> INIT), the completion queue, and the
  //! registered message ring, staging and flow-control buffers; posts every
  //! receive. @throws rdx::error for settings out of range or a failed verb.
  explicit connection(const protection_domain& pd, const connection_attr& attr = {})
      : engine(nullptr, pd, attr) {}
  //! A connection on w: its queue pairs post their completions to w's shared
  //! queue (it reserves queue_pairs x send_depth + recv_depth + 1 entries
  //! there) and w's progress() drives it; its own progress(), wait() and
  //! test() drive the whole worker. In event mode fd() is the worker's.
  //! @throws rdx::error as above, errc::limit_exceeded when the worker's
  //! queue has no room left, errc::invalid_argument for a protection domain
  //! of another device, attr.events on a worker without events, or an empty
  //! (moved-from) worker.
  connection(worker& w, const protection_domain& pd, const connection_attr& attr = {})
      : engine(detail::check_worker(w.core_), pd, attr) {}
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection() { shut_down(); }

  //! The attributes it was made with.
  [[nodiscard]] const connection_attr& attributes() const noexcept { return attr_; }
  //! Queue pairs of the connection (attributes().queue_pairs).
  [[nodiscard]] std::uint32_t queue_pair_count() const noexcept { return attr_.queue_pairs; }
  //! Queue pair i, owned by the connection; not bounds-checked.
  [[nodiscard]] queue_pair& qp(std::size_t i) noexcept { return qps_[i]; }
  //! The one completion queue all its queue pairs share.
  [[nodiscard]] completion_queue& cq() noexcept { return cq_; }
  //! Largest message a channel on this connection carries, in bytes:
  //! attributes().message_size, less sealed_message_overhead when encrypted.
  [[nodiscard]] std::uint32_t message_size() const noexcept { return payload_size(); }
  //! True when its messages are sealed (connection_attr::encrypt).
  [[nodiscard]] bool encrypted() const noexcept { return attr_.encrypt; }
  //! Installs the seal of an encrypted connection (connection_attr::encrypt)
  //! before connect(): exchange_and_connect does it with keys from the
  //! authenticated set-up; call it only with keys agreed by other means.
  //! @throws rdx::error (errc::invalid_argument) on a connection without
  //!         encrypt or for no seal; errc::not_ready once connected.
  void seal_with(std::unique_ptr<message_seal> s) { engine::seal_with(std::move(s)); }

  //! What the peer needs to connect (send it through tcp exchange or any means).
  [[nodiscard]] connection_info local_info() const { return engine::local_info(); }
  //! Connects every queue pair to the peer's. rnr_retry 7 (infinite) is
  //! lowered to 6: credits keep a connection from ever meeting
  //! receiver-not-ready unless the peer is broken, and that must end;
  //! retry_cnt 7 is lowered to 6 too (Soft-RoCE retries forever at 7).
  //! @throws rdx::error when the peer's settings differ from ours (queue
  //! pairs, recv_depth, message_size) or a transition fails.
  void connect(const connection_info& peer, const connect_options& opt = {}) { engine::connect(peer, opt); }

  //! Polls the completion queue once (no blocking), finishes what completed,
  //! posts what was deferred and now fits, ends bounded awaits whose deadline
  //! passed or whose stop was requested, and sends a liveness probe when
  //! receives have waited a keepalive interval on an idle connection.
  //! Coroutines waiting on operations that ended resume here, inline.
  //! @return completions handled.
  int progress() noexcept { return engine::progress(); }
  //! Drives progress until deadline (polling, or sleeping on the completion
  //! channel in wait_mode::events), or until the connection fails.
  //! @return errc::timed_out at the deadline, else failure_reason().
  std::error_code run_until(std::chrono::steady_clock::time_point deadline,
                            wait_mode mode = wait_mode::poll) noexcept {
    return engine::run_until(deadline, mode, nullptr);
  }
  //! Waits, bounded, until no posted work request is outstanding, so that
  //! the memory of detached operations may be freed. @return errc::timed_out.
  std::error_code drain(std::chrono::nanoseconds timeout = default_wait_timeout) noexcept {
    return engine::drain(timeout);
  }

  //! True once a work request failed or the peer broke the protocol: every
  //! pending operation ended with an error, every later one fails at once
  //! with errc::operation_failed; failure_reason() holds the first error.
  [[nodiscard]] bool failed() const noexcept { return failed_; }
  //! The first error that failed the connection; empty while not failed().
  [[nodiscard]] std::error_code failure_reason() const noexcept { return failure_; }
  //! failure_reason() in words, with what the peer sent when it broke the
  //! protocol ("protocol error: the peer's credit count says 1000 messages
  //! were consumed, but this side sent 0"), and what the device reported
  //! about it: an asynchronous event of its queue pairs, its port or the
  //! device ("...: the device reported PORT_ERR on port 1: the port left
  //! ACTIVE ..."), which may come a little after the failure. Empty while not failed.
  [[nodiscard]] std::string failure_message() const {
    if (!failed_) {
      return {};
    }
    std::string s = failure_.message();
    if (failure_text_[0] != '\0') {
      s += std::string(": ") + failure_text_;
    }
    if (device_text_[0] != '\0') {
      s += std::string(failure_text_[0] != '\0' ? "; " : ": ") + device_text_;
    }
    return s;
  }
  //! The longest time from a peer's death (process killed, link down) to the
  //! error of every pending operation, from the queue-pair timeouts given to
  //! connect() and the keepalive: 1.25 x keepalive + (retry_cnt + 1) x 4 x
  //! 4.096 us x 2^timeout (IBTA lets a NIC wait up to 4 times the timeout).
  [[nodiscard]] std::chrono::milliseconds detection_bound() const noexcept {
    return engine::detection_bound();
  }

  //! Work requests posted and not yet retired on queue pair i (never above send_depth).
  [[nodiscard]] std::uint32_t outstanding(std::size_t i = 0) const noexcept { return sqs_[i].outstanding(); }
  //! Signaled work requests posted so far (all queue pairs).
  [[nodiscard]] std::uint64_t signaled_count() const noexcept { return engine::signaled_count(); }
  //! Work requests posted so far (all queue pairs), signaled or not.
  [[nodiscard]] std::uint64_t posted_count() const noexcept { return engine::posted_count(); }
  //! ibv_post_send calls so far (all queue pairs): one per request posted
  //! alone, one per queue pair for the chunks of a striped transfer and for
  //! what a batch() posted.
  [[nodiscard]] std::uint64_t send_doorbells() const noexcept { return engine::send_doorbells(); }
  //! The pacing window (connection_attr::pacing): bytes allowed in flight,
  //! the chunk, the decreases so far and the bytes in flight now.
  [[nodiscard]] pacing_state pacing() const noexcept { return engine::pacing(); }
  //! Runs f, holding back every queue pair's doorbell: the work requests of
  //! the operations f starts (window writes, reads, atomics, sends,
  //! notifications) reach the NIC together when f returns or throws, with
  //! one ibv_post_send per queue pair, in the order they were started. A
  //! wait, test() or progress() inside f posts what is held first, so
  //! nothing waits for a request that never left. A send inside f is copied
  //! to staging (never inline from the caller's memory), as its post comes
  //! later. f must not destroy the connection. Nests.
  //! @throws whatever f throws (what f started is posted first).
  template <class F>
  void batch(F&& f) {
    engine::batch(std::forward<F>(f));
  }
  //! Receive buffers reposted after their messages were taken.
  [[nodiscard]] std::uint64_t receives_reposted() const noexcept { return ring_.reposted(); }
  //! ibv_post_recv calls that reposted them: one doorbell for every buffer
  //! taken in one poll of the completion queue.
  [[nodiscard]] std::uint64_t receive_doorbells() const noexcept { return ring_.repost_calls(); }
  //! Messages received and not yet taken.
  [[nodiscard]] std::uint32_t messages_waiting() const noexcept { return ring_.messages_waiting(); }
  //! Messages this side may still send before the peer returns credits.
  [[nodiscard]] std::uint32_t credits() const noexcept { return ring_.credits(); }
  //! Operations waiting for send-queue room, a credit or a staging buffer.
  [[nodiscard]] bool has_deferred() const noexcept { return !deferred_.empty(); }
  //! Makes sure the last work request posted on every queue pair produces a
  //! completion (posts a signaled zero-length write where none does).
  [[gnu::always_inline]] void cover() noexcept { cover_all(); }

  // --- event mode -------------------------------------------------------------

  //! The completion channel's descriptor for an application's epoll loop
  //! (readable when a completion waits), or -1 without events.
  [[nodiscard]] int fd() const noexcept {
    if (worker_ != nullptr) {
      return worker_->fd();
    }
    return channel_ ? channel_->fd() : -1;
  }
  //! True when it was made on a worker (connection(worker&, ...)).
  [[nodiscard]] bool on_worker() const noexcept { return worker_ != nullptr; }
  //! Before blocking on fd(): makes sure every posted work request will
  //! produce a completion and arms the CQ. After fd() is readable call
  //! ack_event(), then progress(). @return errc::not_ready without events.
  [[nodiscard]] std::error_code arm() noexcept { return engine::arm(); }
  //! Takes the event that made fd() readable (non-blocking; nothing waits: ok).
  void ack_event() noexcept { engine::ack_event(); }
  //! Event mode: progress if anything completed, else arm and sleep on the
  //! channel up to timeout (shortened to the next deadline or keepalive),
  //! then progress. @return empty when something was handled or an event
  //! came; errc::timed_out; errc::not_ready without events.
  [[nodiscard]] std::error_code wait_event(std::chrono::milliseconds timeout) noexcept {
    return engine::wait_event(timeout);
  }

private:
  friend class operation;
  friend class detail::bounded_awaiter_base;
  friend struct detail::stop_flag;
  friend struct detail::start_access;
};

namespace detail {

// How windows and channels start operations on a connection; the start
// functions are not part of connection's public interface.
struct start_access {
  static operation make(connection& c) noexcept { return operation(c); }
  // An operation of kind k with its parameters, each field written once.
  static operation make(connection& c, op_kind k, const op_params& p) noexcept { return operation(c, k, p); }
  static engine& of(connection& c) noexcept { return c; }
};

inline bounded_awaiter_base::~bounded_awaiter_base() {
  callback_.reset();
  if (conn_ != nullptr) {
    static_cast<engine&>(*conn_).remove_bounded(*this);
  }
  if (op_ != nullptr && op_->bounded_ == this) {
    op_->bounded_ = nullptr;
  }
}

inline bool bounded_awaiter_base::await_ready() noexcept {
  if (op_->done_ || op_->conn_ == nullptr) {
    return true;
  }
  engine& e = *op_->conn_;
  if (token_.stop_requested()) {
    e.end_now(*op_, make_error_code(errc::operation_canceled));
    return true;
  }
  if (deadline_ <= std::chrono::steady_clock::now()) {
    e.end_now(*op_, make_error_code(errc::timed_out));
    return true;
  }
  return false;
}

inline void bounded_awaiter_base::await_suspend(std::coroutine_handle<> h) noexcept {
  op_->waiter_ = h;
  op_->bounded_ = this;
  conn_ = op_->conn_;
  engine& e = *conn_;
  e.add_bounded(*this);
  if (token_.stop_possible()) {
    callback_.emplace(token_, stop_flag{this});
  }
  e.cover_all();
}

inline void bounded_awaiter_base::finish() noexcept {
  callback_.reset();
  if (conn_ != nullptr) {
    static_cast<engine&>(*conn_).remove_bounded(*this);
  }
  conn_ = nullptr;
  if (op_->bounded_ == this) {
    op_->bounded_ = nullptr;
  }
}

inline void stop_flag::operator()() const noexcept {
  self->stop_requested_.store(true, std::memory_order_release);
  static_cast<engine&>(*self->conn_).signal_stop();
}

}  // namespace detail

// --- operation, needing the connection ----------------------------------------

inline operation::operation(operation&& o) noexcept {
  take_from(o);
}

inline void operation::release_lease() noexcept {
  if (holds_lease()) {
    static_cast<detail::engine&>(*conn_).release_view(*this);
  }
}

inline operation& operation::operator=(operation&& o) noexcept {
  if (this != &o) {
    release_lease();
    if (conn_ != nullptr && (!done_ || list_ != detail::op_list::none)) {
      static_cast<detail::engine&>(*conn_).withdraw(*this);
    }
    take_from(o);
  }
  return *this;
}

inline void operation::take_from(operation& o) noexcept {
  conn_ = o.conn_;
  ec_ = o.ec_;
  waiter_ = o.waiter_;
  bounded_ = o.bounded_;
  dst_ = o.dst_;
  p_ = o.p_;
  value_ = o.value_;
  pending_ = o.pending_;
  bytes_ = o.bytes_;
  dst_capacity_ = o.dst_capacity_;
  elem_size_ = o.elem_size_;
  kind_ = o.kind_;
  exact_ = o.exact_;
  done_ = o.done_;
  if (conn_ != nullptr && (o.list_ != detail::op_list::none || o.pending_ != 0 || o.bounded_ != nullptr)) {
    static_cast<detail::engine&>(*conn_).follow_move(o, *this);
  }
  // A message_view's ring buffer now belongs to this one.
  if (holds_lease()) {
    static_cast<detail::engine&>(*conn_).lend_to(*this);
  }
  o.conn_ = nullptr;
  o.waiter_ = {};
  o.bounded_ = nullptr;
  o.pending_ = 0;
  o.done_ = false;
  o.kind_ = detail::op_kind::none;
}

inline operation::~operation() {
  // done_ first: an operation that ended is usually all that is tested.
  if ((!done_ || list_ != detail::op_list::none || kind_ == detail::op_kind::receive_view) &&
      conn_ != nullptr) {
    leave();
  }
}

void operation::leave() noexcept {
  release_lease();
  if (!done_ || list_ != detail::op_list::none) {
    static_cast<detail::engine&>(*conn_).withdraw(*this);
  }
}

inline bool operation::test() noexcept {
  if (done_ || conn_ == nullptr) {
    return done_;
  }
  detail::engine& e = *conn_;
  e.cover_all();
  e.progress_covered();
  return done_;
}

inline std::error_code operation::wait(std::chrono::nanoseconds timeout, wait_mode mode) noexcept {
  if (done_) {
    return ec_;
  }
  return wait_until(std::chrono::steady_clock::now() + timeout, mode);
}

inline std::error_code operation::wait_until(std::chrono::steady_clock::time_point deadline,
                                             wait_mode mode) noexcept {
  if (done_) {
    return ec_;
  }
  if (conn_ == nullptr) {
    return make_error_code(errc::not_ready);
  }
  return static_cast<detail::engine&>(*conn_).run_until(deadline, mode, this);
}

inline bool operation::cancel() noexcept {
  if (done_ || conn_ == nullptr) {
    return false;
  }
  static_cast<detail::engine&>(*conn_).end_now(*this, make_error_code(errc::operation_canceled));
  return true;
}

inline void operation::await_suspend(std::coroutine_handle<> h) noexcept {
  waiter_ = h;
  // Someone must poll; the last posted request must produce a completion.
  static_cast<detail::engine&>(*conn_).cover_all();
}

}  // namespace rdx
