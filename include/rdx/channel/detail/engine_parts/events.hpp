// rdx::detail: event mode: arming the completion queue, taking its events,
// and sleeping on the completion channel, the stop eventfd and the device's
// asynchronous events, never past the next deadline or keepalive. A part of detail/engine_all.hpp (include
// that).
#pragma once

#include <rdx/channel/detail/engine.hpp>

namespace rdx::detail {

// A stop request (connection::request_stop): counted, and the sleeper woken.
inline void engine::signal_stop() noexcept {
  stop_requests_.fetch_add(1, std::memory_order_release);
  if (worker_ != nullptr) {
    worker_->signal_stop();
  } else if (wake_fd_ >= 0) {
    const std::uint64_t one = 1;
    // Fails only when the counter is full: the reader is woken already.
    (void)(::write(wake_fd_, &one, sizeof one) < 0);
  }
}

// --- event mode ---------------------------------------------------------------------

inline std::error_code engine::arm() noexcept {
  if (worker_ != nullptr) {
    return worker_->arm();
  }
  if (!channel_) {
    return make_error_code(errc::not_ready);
  }
  cover_all();
  return cq_.arm();
}

inline void engine::ack_event() noexcept {
  if (worker_ != nullptr) {
    return worker_->ack_events();
  }
  if (!channel_) {
    return;
  }
  pollfd p{channel_->fd(), POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) {
    return;
  }
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  if (::ibv_get_cq_event(channel_->native_handle(), &cq, &ctx) == 0) {
    ::ibv_ack_cq_events(cq, 1);
  }
}

inline std::error_code engine::wait_event(std::chrono::milliseconds timeout) noexcept {
  if (worker_ != nullptr) {
    return worker_->wait(timeout);
  }
  if (!channel_) {
    return make_error_code(errc::not_ready);
  }
  if (progress() > 0) {
    return {};
  }
  if (std::error_code ec = arm()) {
    return ec;
  }
  if (progress() > 0) {
    return {};  // completions that came before arming raise no event
  }
  // Sleep no longer than the next deadline, the keepalive, or (while sends
  // wait for credits, which arrive by RDMA write and raise no event) 1 ms.
  auto now = std::chrono::steady_clock::now();
  auto until = now + timeout;
  for (bounded_awaiter_base* a = bounded_; a != nullptr; a = a->next_) {
    until = std::min(until, a->deadline_);
  }
  if (attr_.keepalive.count() > 0 && something_waits()) {
    until = std::min(until, now + attr_.keepalive / 4);
  }
  if (!deferred_.empty()) {
    until = std::min(until, now + std::chrono::milliseconds(1));
  }
  if (attr_.stall_timeout.count() > 0 && sends_outstanding()) {
    until = std::min(until, now + stall_bound() / 4);
  }
  const int ms = static_cast<int>(
      std::max<std::int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(until - now).count()));
  pollfd p[4] = {{channel_->fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}, {-1, POLLIN, 0}, {-1, POLLIN, 0}};
  if (link_ != nullptr && connected_ && !failed_) {
    p[2].fd = link_->fd();
    live_.link_woke();  // a cm event wakes this sleep: housekeeping below takes it now
  }
  // The device's asynchronous events wake it too (read at once, so the descriptor does not stay readable).
  if (device_events_ != nullptr && !failed_) {
    p[3].fd = ctx_.native_handle()->async_fd;
  }
  const int r = ::poll(p, 4, ms);
  if (r > 0 && (p[1].revents & POLLIN) != 0) {
    std::uint64_t v = 0;
    // EAGAIN: no wake-up was pending.
    (void)(::read(wake_fd_, &v, sizeof v) < 0);
  }
  if (r > 0 && (p[3].revents & POLLIN) != 0) {
    device_events_->read();
    events_checked_ = {};
  }
  if (r > 0 && (p[0].revents & POLLIN) != 0) {
    ack_event();
  }
  housekeeping(std::chrono::steady_clock::now());
  progress();
  if (r < 0 && errno != EINTR) {
    return {errno, std::generic_category()};
  }
  return r == 0 && std::chrono::steady_clock::now() >= now + timeout ? make_error_code(errc::timed_out)
                                                                     : std::error_code{};
}

}  // namespace rdx::detail
