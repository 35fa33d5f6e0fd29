// rdx::detail: a connection's liveness clocks: when it went idle (the
// keepalive probe), since when a queue pair has awaited a completion (the
// stall watchdog), when its rdma_cm link was last looked at, and the bounds
// within which a dead peer is found. No clock is read here: the caller
// passes the time it read, and reads it only when one of these needs it.
#pragma once

#include <rdx/channel/connection_attr.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace rdx::detail {

class liveness {
public:
  using clock = std::chrono::steady_clock;

  // How long the transport takes to give up on a dead peer, plus the
  // keepalive's own delay: the probe leaves within keepalive + keepalive / 4
  // of the last completion (event mode sleeps at most keepalive / 4 at a time).
  [[nodiscard]] static std::chrono::milliseconds detection_bound(const connection_attr& a,
                                                                 const connect_options& o) noexcept {
    // A NIC may wait up to 4 times the ACK timeout before it declares a packet lost.
    const std::chrono::nanoseconds retries = retry_window(o.timeout, o.retry_cnt) * 4;
    return a.keepalive + a.keepalive / 4 + std::chrono::duration_cast<std::chrono::milliseconds>(retries) +
           std::chrono::milliseconds(1);
  }
  // 7 means "retry forever" for rnr_retry (IBTA) and, in Soft-RoCE, for
  // retry_cnt too: a connection's waits must end, so both become 6.
  [[nodiscard]] static connect_options with_bounded_retries(connect_options o) noexcept {
    if (o.rnr_retry == 7) {
      o.rnr_retry = 6;
    }
    if (o.retry_cnt == 7) {
      o.retry_cnt = 6;
    }
    return o;
  }
  // How long the watchdog lets a queue pair await a completion.
  [[nodiscard]] static std::chrono::milliseconds stall_bound(const connection_attr& a,
                                                             const connect_options& o) noexcept {
    return std::max(a.stall_timeout, detection_bound(a, o));
  }

  // A completion came: the connection is neither idle nor stalled.
  void completion_seen() noexcept {
    idle_since_ = {};
    stall_since_ = {};
  }
  // A poll of its own found completions: the idle-poll count starts again too.
  void activity() noexcept {
    idle_polls_ = 0;
    completion_seen();
  }
  // A poll found nothing: true every 1024th time in a row (the keepalive's clock is due).
  [[nodiscard]] bool idle_poll() noexcept { return (++idle_polls_ & 1023) == 0; }
  // True every 64th call: bounded awaits look at the clock that often.
  [[nodiscard]] bool tick() noexcept { return (++ticks_ & 63) == 0; }

  // --- keepalive ---
  void not_idle() noexcept { idle_since_ = {}; }
  // Idle at now: true when it has been idle for keepalive (a probe is due; the clock restarts).
  [[nodiscard]] bool probe_due(clock::time_point now, std::chrono::milliseconds keepalive) noexcept {
    if (idle_since_ == clock::time_point{}) {
      idle_since_ = now;
      return false;
    }
    if (now - idle_since_ < keepalive) {
      return false;
    }
    idle_since_ = now;
    return true;
  }

  // --- the stall watchdog ---
  void not_stalled() noexcept { stall_since_ = {}; }
  // Awaiting a completion at now: true once that has lasted bound.
  [[nodiscard]] bool stalled(clock::time_point now, std::chrono::milliseconds bound) noexcept {
    if (stall_since_ == clock::time_point{}) {
      stall_since_ = now;
      return false;
    }
    return now - stall_since_ >= bound;
  }
  [[nodiscard]] std::chrono::milliseconds stalled_for(clock::time_point now) const noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - stall_since_);
  }

  // --- the rdma_cm link ---
  // True when the link was last looked at 1 ms or more before now (and it is looked at now).
  [[nodiscard]] bool link_due(clock::time_point now) noexcept {
    if (now - link_checked_ < std::chrono::milliseconds(1)) {
      return false;
    }
    link_checked_ = now;
    return true;
  }
  // An event of the link woke a sleep: the next look is due at once.
  void link_woke() noexcept { link_checked_ = {}; }

private:
  std::uint32_t idle_polls_ = 0;
  std::uint32_t ticks_ = 0;
  clock::time_point idle_since_{};   // empty: the idle clock is not running
  clock::time_point stall_since_{};  // first seen awaiting a completion; empty: not
  clock::time_point link_checked_{};
};

}  // namespace rdx::detail
