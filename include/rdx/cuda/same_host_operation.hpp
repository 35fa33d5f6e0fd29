// rdx::cuda: one operation between same-host GPU peers (a write or read of
// a peer's GPU memory, or a notification awaited) and the ways to wait for
// it, with the shape of rdx::operation: it ends exactly once with an
// error_code; test, wait with a timeout or a deadline, cancel, co_await, and
// co_await bounded by a deadline and a stop token.
//
// Lifetime rules:
// - the caller owns an operation; it is movable except while a coroutine
//   awaits it;
// - destroying or canceling a pending copy never waits: the copy, already
//   queued on the GPU, runs on (the memory it names must stay valid until the
//   peer object is destroyed or the window over it is);
// - destroying the peer object first ends every pending operation with
//   errc::operation_aborted and resumes no coroutine.
//
// Operations come from rdx/cuda/same_host.hpp's peer and window.
#pragma once

#include <rdx/cuda/detail/op_node.hpp>
#include <rdx/cuda/detail/peer_state.hpp>
#include <rdx/error.hpp>

#include <chrono>
#include <coroutine>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <system_error>
#include <utility>

namespace rdx::cuda {

//! One operation between same-host peers; see the lifetime rules above. Threading: its peer's
//! (one thread at a time); a bounded await's stop_token may be stopped from any thread.
class peer_operation {
public:
  //! An empty operation: never done; wait() says errc::not_ready.
  peer_operation() noexcept = default;
  //! Takes over o, pending or not; o is left empty. Not while a coroutine awaits o.
  peer_operation(peer_operation&& o) noexcept { steal(o); }
  //! Ends this operation as destruction does, then takes over o.
  peer_operation& operator=(peer_operation&& o) noexcept {
    if (this != &o) {
      leave();
      steal(o);
    }
    return *this;
  }
  peer_operation(const peer_operation&) = delete;
  peer_operation& operator=(const peer_operation&) = delete;
  ~peer_operation() { leave(); }

  //! True once the operation ended (no polling).
  [[nodiscard]] bool done() const noexcept { return n_.done; }
  //! Empty on success; an rdx::errc (errc::out_of_range for a range outside the window,
  //! errc::rejected for a revoked grant or a right not granted, errc::peer_disconnected when the
  //! peer process went away, errc::operation_aborted when the peer object was destroyed,
  //! errc::operation_canceled, errc::timed_out, errc::limit_exceeded when depth copies are in
  //! flight) or a CUDA status. Meaningful once done().
  [[nodiscard]] std::error_code error() const noexcept { return n_.ec; }
  //! True when done() without an error.
  [[nodiscard]] bool ok() const noexcept { return n_.done && !n_.ec; }
  //! The tag of a received notification.
  [[nodiscard]] std::uint32_t tag() const noexcept { return n_.tag; }

  //! Polls the peer once without blocking. @return done().
  [[nodiscard]] bool test() const noexcept {
    if (n_.st != nullptr) {
      (void)n_.st->progress();
    }
    return n_.done;
  }
  //! Waits until done or timeout, polling. @return error() when done, else errc::timed_out (the
  //! operation stays pending).
  [[nodiscard]] std::error_code wait(
      std::chrono::nanoseconds timeout = std::chrono::seconds(30)) const noexcept {
    return wait_until(std::chrono::steady_clock::now() + timeout);
  }
  //! wait() until an absolute deadline.
  [[nodiscard]] std::error_code wait_until(std::chrono::steady_clock::time_point deadline) const noexcept {
    if (n_.st == nullptr && !n_.done) {
      return make_error_code(errc::not_ready);
    }
    while (!n_.done) {
      (void)n_.st->progress();
      if (!n_.done && std::chrono::steady_clock::now() >= deadline) {
        return make_error_code(errc::timed_out);
      }
    }
    return n_.ec;
  }
  //! Ends a pending operation now with errc::operation_canceled (a queued copy runs on).
  //! @return true when it was pending.
  bool cancel() noexcept {
    if (n_.st == nullptr) {
      return false;
    }
    n_.st->end_pending(n_, make_error_code(errc::operation_canceled));
    return true;
  }

  //! co_await: ready at once when done, or when empty.
  [[nodiscard]] bool await_ready() const noexcept { return n_.done || n_.st == nullptr; }
  //! co_await: resumes inline in whichever call polls the peer when the operation ends.
  void await_suspend(std::coroutine_handle<> h) noexcept { n_.waiter = h; }
  //! co_await's result: error(), or errc::not_ready for an empty operation.
  [[nodiscard]] std::error_code await_resume() const noexcept {
    return n_.st == nullptr && !n_.done ? make_error_code(errc::not_ready) : n_.ec;
  }

  class bounded;
  //! co_await op.until(deadline, token): ends the operation with errc::timed_out at the deadline,
  //! or errc::operation_canceled when token is stopped, whichever comes first.
  [[nodiscard]] inline bounded until(std::chrono::steady_clock::time_point deadline,
                                     std::stop_token token = {}) noexcept;
  //! co_await op.within(timeout, token): until(now + timeout, token).
  [[nodiscard]] inline bounded within(std::chrono::nanoseconds timeout, std::stop_token token = {}) noexcept;
  //! co_await op.stop_on(token): no deadline, canceled by token.
  [[nodiscard]] inline bounded stop_on(std::stop_token token) noexcept;

  //! For rdx's same-host peer and window only: the record they start.
  [[nodiscard]] detail::op_node& node() noexcept { return n_; }

private:
  void leave() noexcept {
    if (n_.st != nullptr) {
      n_.st->end_pending(n_, make_error_code(errc::operation_aborted));
    }
  }
  void steal(peer_operation& o) noexcept {
    n_.st = o.n_.st;
    n_.ec = o.n_.ec;
    n_.waiter = o.n_.waiter;
    n_.bounded = o.n_.bounded;
    n_.prev = o.n_.prev;
    n_.next = o.n_.next;
    n_.slot = o.n_.slot;
    n_.tag = o.n_.tag;
    n_.done = o.n_.done;
    if (n_.st != nullptr) {
      n_.st->moved(o.n_, n_);
    }
    o.n_ = detail::op_node{};
  }
  detail::op_node n_;
};

//! The awaiter of op.until(), op.within() and op.stop_on(); listed by the peer while suspended.
class peer_operation::bounded {
public:
  //! Bounds op by deadline and token (made by until(), within() and stop_on()).
  bounded(peer_operation& op, std::chrono::steady_clock::time_point deadline, std::stop_token t) noexcept
      : op_(&op), token_(std::move(t)) {
    b_.op = &op.n_;
    b_.deadline = deadline;
  }
  bounded(const bounded&) = delete;
  bounded& operator=(const bounded&) = delete;
  ~bounded() { finish(); }
  //! co_await: ready when the operation is.
  [[nodiscard]] bool await_ready() const noexcept { return op_->await_ready(); }
  //! co_await: listed with the peer until the operation ends, the deadline passes or a stop.
  void await_suspend(std::coroutine_handle<> h) noexcept {
    op_->n_.waiter = h;
    op_->n_.bounded = &b_;
    op_->n_.st->list(b_);
    callback_.emplace(token_, stop_flag{&b_});
  }
  //! Drops the deadline and the stop callback, then gives the operation's error().
  [[nodiscard]] std::error_code await_resume() noexcept {
    finish();
    return op_->await_resume();
  }

private:
  // The stop callback only flags; the next progress pass acts.
  struct stop_flag {
    detail::bound_node* b;
    void operator()() const noexcept { b->stop_requested.store(true, std::memory_order_release); }
  };
  void finish() noexcept {
    callback_.reset();
    if (b_.st != nullptr) {
      b_.st->unlist(b_);
    }
    if (op_->n_.bounded == &b_) {
      op_->n_.bounded = nullptr;
    }
  }
  peer_operation* op_;
  std::stop_token token_;
  detail::bound_node b_;
  std::optional<std::stop_callback<stop_flag>> callback_;
};

inline peer_operation::bounded peer_operation::until(std::chrono::steady_clock::time_point deadline,
                                                     std::stop_token token) noexcept {
  return bounded(*this, deadline, std::move(token));
}
inline peer_operation::bounded peer_operation::within(std::chrono::nanoseconds timeout,
                                                      std::stop_token token) noexcept {
  return until(std::chrono::steady_clock::now() + timeout, std::move(token));
}
inline peer_operation::bounded peer_operation::stop_on(std::stop_token token) noexcept {
  return until(std::chrono::steady_clock::time_point::max(), std::move(token));
}

}  // namespace rdx::cuda
