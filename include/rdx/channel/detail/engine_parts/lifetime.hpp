// rdx::detail: how operations leave a connection (withdrawn, detached, ended
// now, moved), bounded awaits, drain, and the connection's teardown: queue
// pairs to error, drained (bounded), every operation ended once with
// operation_aborted, no coroutine resumed, queue pairs destroyed before the
// memory they used. The rules: rdx's design notes (share/doc/rdx/design.md),
// "Lifetimes, cancellation and time", "Teardown". A part of
// detail/engine_all.hpp (include that).
#pragma once

#include <rdx/channel/detail/engine.hpp>

namespace rdx::detail {

// --- lifetimes ----------------------------------------------------------------------

inline void engine::withdraw(operation& op) noexcept {
  thread_check::scope guard(*thread_, "destroying or canceling an operation");
  if (op.list_ != op_list::none) {
    fifo_of(op.list_).erase(op);
  }
  release_slot(op.p_);
  if (op.pending_ != 0) {
    point_records(op, nullptr);
    op.pending_ = 0;
  }
}

// Points the send-queue records of op at to. One outstanding request (the
// usual case: a send, an atomic, an unstriped write) is found at once from
// the sequence number op kept; more are looked for in every send queue.
inline void engine::point_records(operation& op, operation* to) noexcept {
  if (op.pending_ == 1) {
    sq_record* r = sqs_[op.p_.qp].find(op.p_.seq);
    if (r != nullptr && r->owner == &op) {
      r->owner = to;
      return;
    }
  }
  for (auto& q : sqs_) {
    q.for_each_outstanding([&](sq_record& r) {
      if (r.owner == &op) {
        r.owner = to;
      }
    });
  }
}

inline void engine::end_now(operation& op, std::error_code ec) noexcept {
  withdraw(op);
  op.ec_ = ec;
  complete(op);
}

inline void engine::follow_move(operation& from, operation& to) noexcept {
  if (from.list_ != op_list::none) {
    fifo_of(from.list_).replace(from, to);
  }
  if (from.pending_ != 0) {
    point_records(from, &to);
  }
  if (from.bounded_ != nullptr) {
    from.bounded_->op_ = &to;
  }
}

inline void engine::add_bounded(bounded_awaiter_base& a) noexcept {
  if (bounded_ == nullptr && worker_ != nullptr) {
    worker_->bounded_changed(*this, true);
  }
  a.prev_ = nullptr;
  a.next_ = bounded_;
  if (bounded_ != nullptr) {
    bounded_->prev_ = &a;
  }
  bounded_ = &a;
}

inline void engine::remove_bounded(bounded_awaiter_base& a) noexcept {
  const bool had = bounded_ != nullptr;
  if (a.prev_ != nullptr) {
    a.prev_->next_ = a.next_;
  } else if (bounded_ == &a) {
    bounded_ = a.next_;
  }
  if (a.next_ != nullptr) {
    a.next_->prev_ = a.prev_;
  }
  a.prev_ = a.next_ = nullptr;
  a.conn_ = nullptr;
  if (had && bounded_ == nullptr && worker_ != nullptr) {
    worker_->bounded_changed(*this, false);
  }
}

inline std::error_code engine::drain(std::chrono::nanoseconds timeout) noexcept {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  cover_all();
  for (unsigned spins = 0;; ++spins) {
    if (!sends_outstanding()) {
      return {};
    }
    progress();
    if (spins % 64 == 63 && std::chrono::steady_clock::now() >= deadline) {
      return make_error_code(errc::timed_out);
    }
  }
}

// Queue pairs to error, drained (bounded), every operation ended with
// operation_aborted and no coroutine resumed; then the queue pairs go, and
// after them (member order) the memory they used.
inline void engine::shut_down() noexcept {
  closing_ = true;
  // Message views still holding ring buffers let go of them: their view()
  // is empty from now on, and their destruction does not touch the connection.
  ring_.recall_all([](void* h) {
    auto& v = *static_cast<operation*>(h);
    v.p_.slot = no_slot;
    v.dst_ = nullptr;
  });
  // A receive pool's buffers this connection holds go back to it, with the peer's credits.
  ring_.leave_pool();
  // First the peer loses every key: nothing it sends from now reaches memory.
  revoke_grants();
  while (bounded_ != nullptr) {
    bounded_awaiter_base& a = *bounded_;
    a.callback_.reset();  // waits for a stop callback running on another thread
    remove_bounded(a);
  }
  const std::error_code aborted = make_error_code(errc::operation_aborted);
  for (op_fifo* f : {&deferred_.list(), &receives_, &notifications_}) {
    while (!f->empty()) {
      operation& op = *f->pop();
      release_slot(op.p_);
      op.ec_ = aborted;
      if (op.pending_ == 0) {
        complete(op);
      }
    }
  }
  set_failed();
  if (!failure_) {
    failure_ = aborted;
  }
  to_error();
  // The peer hears DISCONNECTED now rather than after its retries run out.
  if (link_ != nullptr) {
    link_->disconnect();
  }
  const auto deadline = std::chrono::steady_clock::now() + attr_.drain_timeout;
  for (unsigned spins = 0;; ++spins) {
    if (ring_.posted() == 0 && !sends_outstanding()) {
      break;
    }
    poll_once();
    if (spins % 64 == 63 && std::chrono::steady_clock::now() >= deadline) {
      report_destroy_failure("connection: draining its queue pairs after error (drain_timeout)", ETIMEDOUT);
      break;
    }
  }
  for (auto& q : sqs_) {
    q.retire_all(aborted, [this](const sq_record& r, std::error_code ec) { retire(r, ec); });
  }
  while (!ready_.empty()) {
    ready_.pop()->waiter_ = {};
  }
  // Off the worker before the queue pairs go: what they leave in the shared
  // queue is dropped, and no list of the worker points here any more.
  if (worker_ != nullptr) {
    if (link_ != nullptr) {
      worker_->watch_fd(link_->fd(), false, this);
    }
    worker_->remove_connection(*this);
    if (ring_.pool() != nullptr) {
      worker_->flush_pool();
    }
  }
  sqs_.clear();
  nqp_ = 0;
  qps_.clear();
  link_.reset();
  if (wake_fd_ >= 0) {
    ::close(wake_fd_);
  }
  wake_fd_ = -1;
}

}  // namespace rdx::detail
