// rdx::detail: what a connection does with each completion: send-queue retirement, message and
// notification delivery (to a handler or to receives) with credit return, and the ready list
// (deadlines, the watchdog and failure: failure.hpp). A part of detail/engine_all.hpp.
#pragma once

#include <rdx/channel/detail/engine.hpp>

namespace rdx::detail {

template <int site>
inline void engine::dispatch(const completion& c) noexcept {
  if ((c.wr_id() & send_queue::wr_id_tag) != 0) {
    send_queue* q = sqs_.data();  // the completion is of one of its queue pairs: with one, no search
    for (std::uint32_t i = 1; nqp_ != 1 && (i > nqp_ || q->qp_num() != c.qp_num()); ++i, ++q) {
      if (i >= nqp_) {  // none of them (or none left after shut_down)
        return;
      }
    }
    const bool was_failed = failed_;
    q->retire(c, was_failed, [this](const sq_record& r, std::error_code ec) { retire(r, ec); });
    if (!c.ok() && !was_failed) {
      fail(c.error());
    }
    return;
  }
  if (!ring_.owns(c.wr_id())) {
    return;
  }
  const message_ring::arrival a = ring_.arrived(c);
  if (a >= message_ring::arrival::failed) [[unlikely]] {
    if (failed_) {
      return;
    }
    if (a == message_ring::arrival::overrun) {
      return fail_overrun();
    }
    return fail(c.error());
  }
  if (a == message_ring::arrival::message) {
    const auto i = static_cast<std::uint32_t>(c.wr_id());
    // The usual cases: no message waits before it, so it goes to the handler,
    // or to the oldest waiting receive, without a queue.
    if (ring_.messages_waiting() == 0 && !failed_ && ring_.peer_count_valid()) [[likely]] {
      if (handler_.call != nullptr) {
        if (notifications_.empty()) [[likely]] {
          return hand_one(i, c.byte_len());
        }
      } else if (!receives_.empty() && seal_ == nullptr) {
        return take_one(i, c.byte_len());
      }
    }
    ring_.queue_message(i);
  }
  if (!ring_.peer_count_valid()) {
    return fail_protocol();
  }
  if (handler_.call != nullptr && notifications_.empty() && !failed_) {
    return hand_over();  // no notification waits: the handler takes it now
  }
  deliver();
}

inline void engine::retire(const sq_record& r, std::error_code ec) noexcept {
  auto* op = static_cast<operation*>(r.owner);
  // The usual case: a window's write or read, or a send from registered memory (no slot
  // to free), on a connection that has not failed. closing_ is set only by shut_down(),
  // which fails the connection before it polls again.
  if (r.kind <= rec_op && !failed_) {
    if (op != nullptr) {
      finish_part(*op, ec);
    }
    return;
  }
  if (r.kind == rec_paced) {
    paced_done(r.aux, ec);
  }
  if (r.kind == rec_staged) {
    slots_.give_staging(r.aux);
  }
  if (r.kind == rec_atomic) {
    if (op != nullptr && !ec) {
      op->value_ = slots_.atomic_result(r.aux);
    }
    slots_.give_atomic(r.aux);
  }
  // Work flushed because the peer disconnected ends with that reason, not the flush.
  if (failed_ && failure_ == errc::peer_disconnected && ec == make_wc_error_code(IBV_WC_WR_FLUSH_ERR)) {
    ec = failure_;
  }
  if (op != nullptr) {
    finish_part(*op, closing_ ? make_error_code(errc::operation_aborted) : ec);
  }
}

inline void engine::finish_part(operation& op, std::error_code ec) noexcept {
  if (ec && !op.ec_) {
    op.ec_ = ec;
  }
  if (op.pending_ > 0) {
    --op.pending_;
  }
  if (op.pending_ == 0 && op.list_ != op_list::deferred) {
    complete(op);
  }
}

inline void engine::complete(operation& op) noexcept {
  op.done_ = true;
  if (!op.waiter_) {
    return;
  }
  if (closing_) {
    op.waiter_ = {};
  } else {
    ready_.push(op);
    if (worker_ != nullptr) {
      worker_->mark_ready(*this);
    }
  }
}

// Each is taken off the list first: a nested poll keeps the order; a destroyed sibling leaves it.
inline bool engine::resume_one() noexcept {
  if (ready_.empty() || closing_) {
    return false;
  }
  operation* op = ready_.pop();
  std::coroutine_handle<> h = std::exchange(op->waiter_, {});
  if (h) {
    h.resume();  // op, and on a worker this connection, may be gone after this
  }
  return true;
}

inline void engine::resume_ready() noexcept {
  while (resume_one()) {}
}

inline std::chrono::steady_clock::time_point engine::earliest_deadline(
    std::chrono::steady_clock::time_point until) const noexcept {
  for (const bounded_awaiter_base* a = bounded_; a != nullptr; a = a->next_) {
    until = std::min(until, a->deadline_);
  }
  return until;
}

// Hands queued messages (to the handler, else to waiting receives) and notifications, in order;
// the buffers they were copied out of are reposted together at the end (of the poll, if in one).
inline void engine::deliver() noexcept {
  if (handler_.call != nullptr) {
    hand_over();  // every message to the handler (handlers.hpp)
  }
  bool broken = false;  // a sealed message failed its check: the connection fails after the loop
  while (!receives_.empty() && ring_.messages_waiting() > 0) {
    operation& op = *receives_.pop();
    const std::uint32_t i = ring_.take_message();
    const std::uint32_t n = ring_.entry(i).bytes;
    if (seal_ != nullptr) {
      broken = !open_sealed(op, i, n) || broken;
      continue;
    }
    op.bytes_ = n;
    // Whole elements only; bytes (elem_size_ 1) need no division.
    const bool whole = op.elem_size_ == 1 || n % op.elem_size_ == 0;
    if (op.kind_ == op_kind::receive_view) {
      if (whole) {
        // Lent, not copied: the buffer is reposted when the view lets it go.
        op.dst_ = const_cast<std::byte*>(ring_.data(i));
        op.p_.slot = i;
        ring_.lend(i, &op);
        complete(op);
        continue;
      }
      op.ec_ = make_error_code(errc::limit_exceeded);
    } else if (n > op.dst_capacity_ || !whole || (op.exact_ && n != op.dst_capacity_)) {
      op.ec_ = make_error_code(errc::limit_exceeded);
    } else {
      std::memcpy(op.dst_, ring_.data(i), n);
    }
    consume(i);
    complete(op);
  }
  while (!notifications_.empty() && ring_.notifications_waiting() > 0) {
    operation& op = *notifications_.pop();
    const std::uint32_t i = ring_.take_notification();
    op.bytes_ = ring_.entry(i).bytes;
    op.value_ = ring_.entry(i).imm;
    consume(i);
    complete(op);
  }
  if (polling_ == 0 && ring_.queued() != 0) {
    repost_consumed();
  }
  if (broken && !failed_) {
    fail_integrity();  // delivers again, with failed_ set
    return;
  }
  if (failed_) {
    // Nothing more will arrive: waiting receives end with the failure.
    while (!receives_.empty()) {
      operation& op = *receives_.pop();
      op.ec_ = failure_;
      complete(op);
    }
    while (!notifications_.empty()) {
      operation& op = *notifications_.pop();
      op.ec_ = failure_;
      complete(op);
    }
  }
}

// The message in buffer i (n bytes), with none queued before it, to the
// oldest waiting receive, as deliver() would (inside a poll: the buffer's
// repost waits for the poll's end).
inline void engine::take_one(std::uint32_t i, std::uint32_t n) noexcept {
  operation& op = *receives_.pop();
  op.bytes_ = n;
  const bool whole = op.elem_size_ == 1 || n % op.elem_size_ == 0;
  if (op.kind_ == op_kind::receive_view) {
    if (whole) {
      op.dst_ = const_cast<std::byte*>(ring_.data(i));
      op.p_.slot = i;
      ring_.lend(i, &op);
      return complete(op);
    }
    op.ec_ = make_error_code(errc::limit_exceeded);
  } else if (n > op.dst_capacity_ || !whole || (op.exact_ && n != op.dst_capacity_)) {
    op.ec_ = make_error_code(errc::limit_exceeded);
  } else {
    std::memcpy(op.dst_, ring_.data(i), n);
  }
  consume(i);
  complete(op);
}

// A sealed message (attr_.encrypt), opened for op: in place for a view (the
// payload follows its sequence number in the lent buffer), else into the
// receive's memory, which never holds bytes that failed the check. Ends op.
inline bool engine::open_sealed(operation& op, std::uint32_t i, std::uint32_t n) noexcept {
  auto* m = const_cast<std::byte*>(ring_.data(i));
  const std::uint32_t plain = n >= sealed_message_overhead ? n - sealed_message_overhead : 0;
  op.bytes_ = plain;
  const bool whole = op.elem_size_ == 1 || plain % op.elem_size_ == 0;
  const bool view = op.kind_ == op_kind::receive_view;
  bool ok = true;
  if (!view && (plain > op.dst_capacity_ || (op.exact_ && plain != op.dst_capacity_))) {
    // Opened all the same (in place), so the sequence stays in step: the
    // receive fails for its size, the connection only for a bad message.
    ok = !seal_->open({m, n}, nullptr);
    op.ec_ = make_error_code(ok ? errc::limit_exceeded : errc::integrity_failed);
  } else if (std::error_code ec = seal_->open({m, n}, view ? nullptr : op.dst_)) {
    ok = false;
    op.ec_ = ec;
  } else if (!whole) {
    op.ec_ = make_error_code(errc::limit_exceeded);
  } else if (view) {
    op.dst_ = m + sealed_payload_offset;
    op.p_.slot = i;
    ring_.lend(i, &op);
    complete(op);
    return true;
  }
  consume(i);
  complete(op);
  return ok;
}

// A sealed message failed its check: it was not delivered, and nothing after
// it will be (the seal refuses every later one).
inline void engine::fail_integrity() noexcept {
  std::snprintf(failure_text_, sizeof failure_text_, "%s", seal_ != nullptr ? seal_->failure() : "");
  fail(make_error_code(errc::integrity_failed));
}

inline void engine::fail_sealed_window(const char* why) noexcept {
  if (failed_) {
    return;
  }
  std::snprintf(failure_text_, sizeof failure_text_, "%s", why);
  fail(make_error_code(errc::integrity_failed));
}

// A taken buffer (its message copied out or handed to a handler, or a view's
// given back), queued for its repost (repost_consumed): with a batch of them,
// or at once while views are about (message_ring::queue_taken).
inline void engine::consume(std::uint32_t i) noexcept {
  if (failed_) [[unlikely]] {
    return ring_.drop(i);  // a pool's buffer goes back, without its credit
  }
  ring_.queue_taken(i);
}

// Reposts the taken buffers with one doorbell and counts them; credits go
// back piggybacked on the next message, or by an RDMA write of the count once
// a quarter is owed. Only reposted buffers count: the peer's credits never
// run ahead of the receives posted (no receiver-not-ready).
inline void engine::repost_consumed() noexcept {
  if (ring_.pool() != nullptr) {
    ring_.flushed();
    return worker_->flush_pool();  // the pool's buffers, of every connection
  }
  if (failed_) {
    return;
  }
  std::uint32_t n = 0;
  const std::error_code ec = ring_.post_queued(qps_[0], n);
  ring_.count_consumed(n);
  if (ec) {
    return fail(ec);
  }
  if (ring_.report_due() && connected_) {
    report_credits();
  }
}

inline void engine::report_credits() noexcept {
  send_queue& q = sqs_[0];
  if (!q.has_room()) {
    return;  // no room now; progress() tries again
  }
  flat_wr w = ring_.credit_report(peer_credit_);
  if (!q.post(w, nullptr, rec_credit)) {
    ring_.reported();
  }
}

}  // namespace rdx::detail
