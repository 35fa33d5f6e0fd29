// rdx::detail: what a connection does with each completion: send-queue retirement, message and
// notification delivery (to a handler or to receives) with credit return, the ready list, deadlines,
// stop requests and the liveness probe, and the first failure. A part of detail/engine_all.hpp.
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

// A taken buffer, queued for its repost (repost_consumed).
inline void engine::consume(std::uint32_t i) noexcept {
  if (failed_) {
    return ring_.drop(i);  // a pool's buffer goes back, without its credit
  }
  ring_.queue_repost(i);
}

// A buffer a handler took: reposted with a batch of them (message_ring::queue_handled).
inline void engine::consume_handled(std::uint32_t i) noexcept {
  if (failed_) [[unlikely]] {
    return ring_.drop(i);
  }
  ring_.queue_handled(i);
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

// Deadlines, stop requests and the liveness probe; now is empty when only
// stop requests are to be looked at.
inline void engine::housekeeping(std::chrono::steady_clock::time_point now) noexcept {
  stops_seen_ = stop_requests_.load(std::memory_order_acquire);
  for (bounded_awaiter_base* a = bounded_; a != nullptr;) {
    bounded_awaiter_base* next = a->next_;
    operation& op = *a->op_;
    if (!op.done_) {
      if (a->stop_requested_.load(std::memory_order_acquire)) {
        end_now(op, make_error_code(errc::operation_canceled));
      } else if (now != std::chrono::steady_clock::time_point{} && a->deadline_ <= now) {
        end_now(op, make_error_code(errc::timed_out));
      }
    }
    a = next;
  }
  // The device's events of its queue pairs (a worker looks for its connections itself).
  if (device_events_ != nullptr && now != std::chrono::steady_clock::time_point{}) {
    look_at_device(now);
  }
  if (link_ != nullptr && connected_ && !failed_ && now != std::chrono::steady_clock::time_point{} &&
      live_.link_due(now)) {
    if (std::error_code ec = link_->poll()) {
      // What the peer sent before it disconnected completed before its DREQ
      // left (a responder completes, then acknowledges): deliver it first.
      poll_once();
      if (failed_) {
        return;
      }
      std::snprintf(failure_text_, sizeof failure_text_, "%s sent DISCONNECTED (rdma_cm)", link_->peer());
      fail(ec);
      return;
    }
  }
  if (now == std::chrono::steady_clock::time_point{}) {
    return;
  }
  // Work posted unsignaled last (a credit report behind another, say) makes
  // no completion until covered: a loop that only calls progress() never
  // covers, and such a request would keep the probe from being sent and the
  // stall watchdog from seeing it. Covered here, it ends (or fails) by itself.
  cover_all();
  if (attr_.stall_timeout.count() > 0 && connected_ && !failed_) {
    check_stall(now);
    if (failed_) {
      return;
    }
  }
  if (attr_.keepalive.count() == 0) {
    return;
  }
  // Liveness: receives (or deferred sends) wait and nothing is in flight
  // that would notice a dead peer by itself.
  if (!connected_ || failed_ || !something_waits() || sqs_[0].outstanding() != 0) {
    live_.not_idle();
    return;
  }
  if (live_.probe_due(now, attr_.keepalive)) {
    (void)sqs_[0].probe();
  }
}

// The stall watchdog (connection_attr::stall_timeout): a queue pair awaits a
// completion, and none has come for stall_bound() since this was first seen.
// A working NIC completes or fails each request within detection_bound();
// one that does neither (a provider fault: Soft-RoCE's queue pair can stop
// answering under packet duplication) would leave every wait on it open.
inline void engine::check_stall(std::chrono::steady_clock::time_point now) noexcept {
  std::size_t q = sqs_.size();
  for (std::size_t i = 0; i < sqs_.size(); ++i) {
    if (sqs_[i].awaits_completion()) {
      q = i;
      break;
    }
  }
  if (q == sqs_.size()) {
    live_.not_stalled();
    return;
  }
  if (!live_.stalled(now, stall_bound())) {
    return;
  }
  // A completion that woke an event-mode sleep is not polled yet: take it first.
  if (poll_once() > 0 || failed_) {
    live_.not_stalled();
    return;
  }
  const auto ms = live_.stalled_for(now).count();
  std::snprintf(
      failure_text_, sizeof failure_text_,
      "no completion for %lld ms while queue pair %zu had %u posted requests to complete; the NIC neither "
      "completed nor failed them (a working one does within detection_bound(), %lld ms)",
      static_cast<long long>(ms), q, sqs_[q].outstanding(),
      static_cast<long long>(detection_bound().count()));
  fail(make_error_code(errc::no_progress));
}

// The first failure: every queue pair goes to error so that all posted work
// flushes; deferred operations end now, waiting receives once nothing is left.
inline void engine::fail(std::error_code ec) noexcept {
  if (failed_) {
    return;
  }
  set_failed();
  failure_ = ec;
  // A receive pool gives its peer no more credits; what it had goes back.
  if (receive_pool* rp = ring_.pool()) {
    rp->retire(ring_.share());
  }
  // Before the queue pairs go to error: which one the device moved there tells why.
  if (device_events_ != nullptr) {
    explain_failure();
  }
  // A failed connection's rdma_cm link is no longer looked at: its events must not wake the worker.
  if (worker_ != nullptr && link_ != nullptr) {
    worker_->watch_fd(link_->fd(), false, this);
  }
  to_error();
  while (!deferred_.empty()) {
    operation& op = *deferred_.pop();
    release_slot(op.p_);
    if (!op.ec_) {
      op.ec_ = ec;
    }
    if (op.pending_ == 0) {
      complete(op);
    }
  }
  deliver();
}

// The peer sent beyond the credits a receive pool gave it.
inline void engine::fail_overrun() noexcept {
  std::snprintf(failure_text_, sizeof failure_text_,
                "the peer sent message %u but was given credits for %u (the receive pool takes no more)",
                ring_.share().received, ring_.share().consumed + ring_.depth());
  fail(make_error_code(errc::protocol_error));
}

// The peer broke the credit protocol: fails with errc::protocol_error and says what arrived.
inline void engine::fail_protocol() noexcept {
  std::snprintf(failure_text_, sizeof failure_text_,
                "the peer's credit count says %u messages were consumed, but this side sent %u",
                ring_.peer_consumed(), ring_.sent());
  fail(make_error_code(errc::protocol_error));
}

// Every queue pair to ERR. Requests that succeeded unsignaled leave no
// completion behind, so a signaled request is posted after them where the
// last one is not: its flush retires them all (posting to a queue pair in
// ERR is allowed; the request completes at once with a flush error).
inline void engine::to_error() noexcept {
  flush_held();  // what a batch holds flushes with the rest
  for (auto& q : qps_) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    (void)::ibv_modify_qp(q.native_handle(), &a, IBV_QP_STATE);
  }
  for (auto& q : sqs_) {
    (void)q.cover();
  }
}

}  // namespace rdx::detail
