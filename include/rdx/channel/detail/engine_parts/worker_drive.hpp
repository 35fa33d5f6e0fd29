// rdx::detail: how a worker drives its connections: one poll of the shared
// completion queue, each completion handed to its connection found by
// queue-pair number in a hash table (constant time), then only the
// connections that got completions, have deferred operations or coroutines
// to resume are visited; the clocks (keepalive, stall, rdma_cm link,
// deadlines) are swept over all of them on a timer. Event mode: one epoll
// descriptor holding the completion channel, the stop eventfd and rdma_cm
// links. A part of detail/engine_all.hpp (include that).
#pragma once

#include <rdx/channel/detail/engine.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <string>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

namespace rdx::detail {

// --- progress -------------------------------------------------------------------------

// Each completion is taken off the buffer before it is handled, so a nested
// poll (a connection's teardown or staging wait) keeps the order.
inline int worker_core::poll() noexcept {
  if (buf_head_ == buf_count_) {
    std::size_t n = 0;
    if (const std::error_code ec = cq_.poll(std::span<completion>(buf_), n)) [[unlikely]] {
      // The shared queue failed: every connection on it fails.
      for (engine* e = head_[wl_all]; e != nullptr; e = e->wk_next_[wl_all]) {
        e->fail(ec);
      }
      return 0;
    }
    buf_head_ = 0;
    buf_count_ = static_cast<int>(n);
  }
  int handled = 0;
  ++polling_;
  while (buf_head_ < buf_count_) {
    const completion c = buf_[buf_head_++];
    engine* e = find(c.qp_num());
    if (e == nullptr) [[unlikely]] {
      // A connection that left (its queue pairs are gone), or an entry its leaving blanked (0).
      if (c.qp_num() != 0) {
        return_stray(c);
      }
      continue;
    }
    // A send's success needs nothing at the end of the poll but its idle and
    // stall clocks restarted: done here, without the list. A receive (whose
    // buffer is reposted at the end) or a failure goes on the list.
    if ((c.wr_id() & send_queue::wr_id_tag) != 0 && c.ok()) {
      e->live_.completion_seen();
    } else if (!e->wk_touched_) {
      if (ntouched_ == touched_.size()) [[unlikely]] {
        settle_all();  // early: more doorbells, the same reposts
      }
      e->wk_touched_ = true;
      touched_[ntouched_++] = e;
      ++e->polling_;  // its receive reposts wait for the end of this poll
    }
    e->template dispatch<1>(c);
    ++e->wk_handled_;
    ++handled;
  }
  // Nothing to settle after sends alone: no connection touched, no pool buffer queued.
  if (--polling_ == 0 && (ntouched_ != 0 || (pool_ && pool_->queued() != 0))) {
    settle();
  }
  return handled;
}

// The end of the outermost poll: each connection that got completions
// reposts its buffers with one doorbell and restarts its idle clocks.
inline void worker_core::settle() noexcept {
  // A receive pool's buffers first (one doorbell for every connection), so
  // that the credits they bring are reported below.
  if (pool_ && pool_->queued() != 0) [[unlikely]] {
    flush_pool();
  }
  for (std::uint32_t i = 0; i < ntouched_; ++i) {
    touched_[i]->settle();
  }
  ntouched_ = 0;
}

void worker_core::settle_all() noexcept {
  settle();
}

inline void engine::settle() noexcept {
  wk_touched_ = false;
  if (--polling_ == 0 && ring_.queued() != 0) {
    repost_consumed();
  }
  live_.completion_seen();
  if (ring_.report_due() && connected_ && !failed_) [[unlikely]] {
    report_credits();
  }
}

int worker_core::progress() noexcept {
  thread_check::scope guard(thread_, "a worker's progress");
  if (holding_ != 0) [[unlikely]] {
    for (engine* e = head_[wl_all]; e != nullptr; e = e->wk_next_[wl_all]) {
      e->flush_held();
    }
  }
  if (stop_requests_.load(std::memory_order_acquire) != stops_seen_) [[unlikely]] {
    stops_seen_ = stop_requests_.load(std::memory_order_acquire);
    for (engine* e = head_[wl_all]; e != nullptr;) {
      engine* next = e->wk_next_[wl_all];
      if (e->stop_requests_.load(std::memory_order_acquire) != e->stops_seen_) {
        e->housekeeping({});
      }
      e = next;
    }
  }
  const int handled = poll();
  // Deferred operations wait for room or credits; credits come by RDMA
  // write and raise no completion, so these are looked at every time.
  for (engine* e = head_[wl_pumping]; e != nullptr;) [[unlikely]] {
      engine* next = e->wk_next_[wl_pumping];
      if (!e->deferred_.empty()) {
        e->pump();
      }
      if (e->deferred_.empty()) {
        unlink(*e, wl_pumping);
      }
      e = next;
    }
  // The clocks: every 1024 polls (whether busy or not, so that an idle peer
  // among busy ones is still probed), or every 64 while a bounded await
  // exists; one count down between them.
  if (--tick_in_ == 0) [[unlikely]] {
    tick();
  }
  if (head_[wl_ready] != nullptr) {
    resume();
  }
  return handled;
}

void worker_core::tick() noexcept {
  polls_ += tick_len_;
  const bool clocks = polls_ >= 1024;
  if (clocks) {
    polls_ = 0;
  }
  const bool bounded = head_[wl_bounded] != nullptr;
  const auto now = std::chrono::steady_clock::now();
  if (clocks && now - swept_ >= std::chrono::milliseconds(1)) {
    swept_ = now;
    sweep(now);
  } else if (bounded) {
    sweep_bounded(now);
  }
  // The next count: to the next sweep, or 64 while a bounded await exists
  // (read again: the sweep may have ended the last one).
  tick_len_ = head_[wl_bounded] != nullptr ? 64 : 1024 - polls_;
  tick_in_ = tick_len_;
}

// The clocks of at most 64 connections a sweep, going round from where the
// last one stopped: a sweep costs the same at 10 peers or 10,000, and every
// connection is looked at within ceil(N / 64) sweeps (a millisecond or more
// apart); the keepalive and stall bounds are hundreds of times longer. The
// bounded awaits' deadlines have their own list.
inline void worker_core::sweep(std::chrono::steady_clock::time_point now) noexcept {
  device_events(now);
  sweep_bounded(now);
  if (cursor_ == nullptr) {
    cursor_ = head_[wl_all];
  }
  for (int n = 0; n < 64 && cursor_ != nullptr; ++n) {
    engine* e = cursor_;
    cursor_ = e->wk_next_[wl_all];
    if (e->bounded_ == nullptr && e->housekeeping_due()) {
      e->housekeeping(now);
    }
  }
}

inline void worker_core::sweep_bounded(std::chrono::steady_clock::time_point now) noexcept {
  for (engine* e = head_[wl_bounded]; e != nullptr;) {
    engine* next = e->wk_next_[wl_bounded];
    e->housekeeping(now);
    e = next;
  }
}

// Coroutines resume here, connection by connection, each one's in order. A
// coroutine may destroy any connection, its own included: remove_connection() clears the
// frame, and the loop stops touching it.
inline void worker_core::resume() noexcept {
  while (engine* e = pop(wl_ready)) {
    resume_frame f{e, frames_};
    frames_ = &f;
    while (f.e != nullptr && f.e->resume_one()) {}
    frames_ = f.up;
  }
}

// --- event mode -------------------------------------------------------------------------

inline std::error_code worker_core::arm() noexcept {
  if (!channel_) {
    return make_error_code(errc::not_ready);
  }
  // Only the connections that posted unsignaled since the last arm: a
  // connection whose cover is refused lists itself again, at the head, which
  // this loop has passed.
  for (engine* e = head_[wl_uncovered]; e != nullptr;) {
    engine* next = e->wk_next_[wl_uncovered];
    unlink(*e, wl_uncovered);
    e->cover_all();
    e = next;
  }
  if (std::error_code ec = cq_.arm()) {
    return ec;
  }
  // Completions that came before arming raise no event: look once more.
  if (buf_head_ != buf_count_ || progress() > 0 || head_[wl_ready] != nullptr) {
    return std::make_error_code(std::errc::resource_unavailable_try_again);
  }
  return {};
}

inline void worker_core::ack_events() noexcept {
  if (!channel_) {
    return;
  }
  std::uint64_t v = 0;
  // EAGAIN: no wake-up was pending.
  (void)(::read(wake_fd_, &v, sizeof v) < 0);
  unsigned n = 0;
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  while (::ibv_get_cq_event(channel_->native_handle(), &cq, &ctx) == 0) {
    ++n;
  }
  if (n != 0) {
    ::ibv_ack_cq_events(cq_.native_handle(), n);
  }
  // Neither a completion nor a stop: an rdma_cm link or the device's
  // asynchronous events, read now so that the descriptor does not stay
  // readable (one more system call, only on such a wake-up).
  if (n == 0 && v == 0) {
    device_events({});
  }
}

// How long a sleep may last: the next bounded await's deadline, a quarter
// keepalive or stall bound (tick_), and 1 ms while operations are deferred.
inline std::chrono::steady_clock::time_point worker_core::sleep_until(
    std::chrono::steady_clock::time_point now, std::chrono::steady_clock::time_point until) const noexcept {
  until = std::min(until, now + tick_);
  if (head_[wl_pumping] != nullptr) {
    until = std::min(until, now + std::chrono::milliseconds(1));
  }
  for (engine* e = head_[wl_bounded]; e != nullptr; e = e->wk_next_[wl_bounded]) {
    until = e->earliest_deadline(until);
  }
  return until;
}

inline std::error_code worker_core::wait(std::chrono::milliseconds timeout) noexcept {
  if (!channel_) {
    return make_error_code(errc::not_ready);
  }
  if (progress() > 0) {
    return {};
  }
  if (std::error_code ec = arm()) {
    return ec == std::errc::resource_unavailable_try_again ? std::error_code{} : ec;
  }
  const auto now = std::chrono::steady_clock::now();
  const auto until = sleep_until(now, now + timeout);
  const int ms = static_cast<int>(
      std::max<std::int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(until - now).count()));
  epoll_event ev[8];
  const int r = ::epoll_wait(epoll_fd_, ev, 8, ms);
  const int err = errno;
  if (r > 0) {
    ++wakeups_;
    ack_events();
  }
  const auto after = std::chrono::steady_clock::now();
  // An rdma_cm event names its connection: that one looks at its link now; the
  // device's asynchronous events are handed to their connections.
  for (int i = 0; i < r; ++i) {
    if (ev[i].data.ptr == this) {
      device_events({});
    } else if (auto* e = static_cast<engine*>(ev[i].data.ptr); e != nullptr && e != foreign_fd()) {
      e->live_.link_woke();
      e->housekeeping(after);
    }
  }
  if (r == 0 || after - swept_ >= std::chrono::milliseconds(1)) {
    swept_ = after;
    sweep(after);
  }
  progress();
  if (r < 0 && err != EINTR) {
    return {err, std::generic_category()};
  }
  return r == 0 && after >= now + timeout ? make_error_code(errc::timed_out) : std::error_code{};
}

}  // namespace rdx::detail
