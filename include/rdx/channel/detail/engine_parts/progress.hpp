// rdx::detail: a connection's progress loop: the poll of its own queue (or
// its worker's), the loop that waits for an operation, covering the send
// queues, and batches. A part of detail/engine_all.hpp (include that).
#pragma once

#include <rdx/channel/detail/engine.hpp>

namespace rdx::detail {

// A connection on a worker drives the whole worker; the test is made
// before the engine's own progress sets up its frame.
inline int engine::progress() noexcept {
  if (worker_ != nullptr) [[unlikely]] {
    return worker_->progress();
  }
  flush_held();
  return progress_own();
}

// progress() right after cover_all(), which posted what was held (test()).
inline int engine::progress_covered() noexcept {
  if (worker_ != nullptr) [[unlikely]] {
    return worker_->progress();
  }
  return progress_own();
}

// Posts what held queues keep, and they stay held: before any wait.
inline void engine::flush_held() noexcept {
  if (holds_ != 0) [[unlikely]] {
    post_held(false);
  }
}

int engine::poll_once() noexcept {
  if (worker_ != nullptr) {
    const std::uint64_t before = wk_handled_;
    worker_->poll();
    return static_cast<int>(wk_handled_ - before);
  }
  return poll_inline();
}

// poll_once(), inlined into progress(): the data path's poll, whose instruction count rdx's cost
// model measures.
inline int engine::poll_inline() noexcept {
  if (cq_head_ == cq_count_) {
    std::size_t n = 0;
    if (const std::error_code ec = cq_.poll(std::span<completion>(cq_buf_), n)) {
      fail(ec);
      return 0;
    }
    cq_head_ = 0;
    cq_count_ = static_cast<int>(n);
  }
  // Each completion is taken off the buffer before it is handled, so a
  // nested poll (a coroutine resumed here polls again) keeps the order.
  int handled = 0;
  ++polling_;
  while (cq_head_ < cq_count_) {
    const completion c = cq_buf_[cq_head_++];
    dispatch<0>(c);
    ++handled;
  }
  // The buffers of every message delivered in this poll go back with one doorbell.
  if (--polling_ == 0 && ring_.queued() != 0) {
    repost_consumed();
  }
  return handled;
}

int engine::progress_own() noexcept {
  thread_check::scope guard(*thread_, "progress");
  if (stop_requests_.load(std::memory_order_acquire) != stops_seen_) {
    housekeeping({});
  }
  const int handled = poll_inline();
  if (handled > 0) {
    live_.activity();
  }
  if (!deferred_.empty()) {
    pump();
  }
  if (handled == 0 && tails_in_flight() && (++paced_idle_polls_ & 15) == 0) {
    probe_tails();
  }
  if (ring_.report_due() && connected_ && !failed_) {
    report_credits();
  }
  // The clock is read only when something needs it (a clock read can be a
  // system call in a VM): bounded awaits every 64 calls, and the keepalive
  // every 1024 idle polls while receives or deferred operations wait.
  // A connection manager's link is looked at on the same clock, also while
  // only one-sided work is in flight (a disconnect ends it at once).
  // The stall watchdog looks on the same clock while sends are outstanding.
  const bool keepalive_due = handled == 0 && live_.idle_poll() && housekeeping_due();
  if (keepalive_due || (bounded_ != nullptr && live_.tick())) {
    housekeeping(std::chrono::steady_clock::now());
  }
  resume_ready();
  return handled;
}

// Drives progress until op ends (or, without op, the connection fails) or
// the deadline passes. Busy polling looks at the clock every 64 polls.
inline std::error_code engine::run_until(std::chrono::steady_clock::time_point deadline, wait_mode mode,
                                         const operation* op) noexcept {
  auto finished = [&] { return op != nullptr ? op->done() : failed_; };
  auto result = [&] { return op != nullptr ? op->error() : failure_; };
  cover_all();
  if (mode == wait_mode::events) {
    while (!finished()) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return make_error_code(errc::timed_out);
      }
      // Paced chunks in flight: wake at least every 2 ms to look for a tail to probe.
      const bool tails = tails_in_flight();
      std::error_code ec = wait_event(tails ? std::min(left, std::chrono::milliseconds(2)) : left);
      if (tails && ec == errc::timed_out) {
        probe_tails();
        continue;
      }
      if (ec && ec != errc::timed_out) {
        return ec;
      }
    }
    return result();
  }
  for (unsigned spins = 1; !finished(); ++spins) {
    progress();
    if (spins % 64 == 0 && !finished() && std::chrono::steady_clock::now() >= deadline) {
      return make_error_code(errc::timed_out);
    }
  }
  return result();
}

// Only after a post that may have left a queue uncovered (send_queue::watch_cover).
inline void engine::cover_all() noexcept {
  flush_held();
  if (!uncovered_.uncovered || failed_) {  // usually covered: one test
    return;
  }
  uncovered_.uncovered = false;
  bool again = false;
  for (auto& q : sqs_) {
    if (!q.cover()) {
      again = true;
    }
  }
  if (again) {
    uncovered_.raise();  // tried again at the next cover_all (a worker lists it again)
  }
}

// Holds every send queue while f runs: the requests f's operations post go
// out with one doorbell per queue pair when it returns (or throws). A wait
// or progress inside f posts what is held first.
template <class F>
inline void engine::batch(F&& f) {
  thread_check::scope guard(*thread_, "a batch");
  if (holds_++ == 0 && worker_ != nullptr) {
    worker_->holding_changed(1);
  }
  for (auto& q : sqs_) {
    q.hold();
  }
  try {
    std::forward<F>(f)();
  } catch (...) {
    post_held(true);
    throw;
  }
  post_held(true);
}

// Posts what the send queues hold (one doorbell each); with release, ends
// the outermost batch's hold. Requests the provider refused end their
// operations' parts with its error, as a refused post does.
void engine::post_held(bool release) noexcept {
  auto unposted = [this](const sq_record& r, std::error_code e) { retire(r, e); };
  for (auto& q : sqs_) {
    (void)(release ? q.release(unposted) : q.flush(unposted));
  }
  if (release && --holds_ == 0 && worker_ != nullptr) {
    worker_->holding_changed(-1);
  }
}

}  // namespace rdx::detail
