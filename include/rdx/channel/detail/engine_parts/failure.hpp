// rdx::detail: a connection's clocks and its failure: deadlines, stop requests and the liveness
// probe, the stall watchdog, the first failure and the queue pairs' move to error. A part of
// detail/engine_all.hpp.
#pragma once

#include <rdx/channel/detail/engine.hpp>

namespace rdx::detail {

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
