// rdx::detail: what a connection and a worker do with the device's
// asynchronous events (rdx/verbs/async_event.hpp): a failed connection names
// the event of its queue pairs, its port or its device in failure_message();
// an event that breaks a queue pair of a connection that has not failed yet
// fails it with errc::device_error; an event that comes after the error
// completion fills in the cause later. Only the failure path and the clocks'
// sweep look at the log: the data path never does. A part of
// detail/engine_all.hpp (include that).
#pragma once

#include <rdx/channel/detail/engine.hpp>

#include <algorithm>
#include <array>
#include <cstdio>

namespace rdx::detail {

// How much an event says about a failure: one that breaks a queue pair says
// the most, one that does not (SQ_DRAINED, COMM_EST) a little.
[[nodiscard]] inline int event_weight(const async_event& e) noexcept {
  if (e.sequence == 0) {
    return 0;
  }
  return e.breaks_queue_pair() ? 2 : 1;
}

// Events already read are of queue pairs that are gone (queue-pair numbers
// are reused; the kernel drops the unread events of a destroyed one).
inline void engine::start_device_events() noexcept {
  device_events_ = ctx_.async_events();
  if (device_events_ == nullptr) {
    return;
  }
  device_events_->read();
  events_from_ = device_events_->sequence();
  events_seen_ = events_from_;
}

inline bool engine::owns_event(const async_event& e) const noexcept {
  if (e.about_queue_pair()) {
    return std::ranges::any_of(qps_, [&e](const queue_pair& q) { return q.qp_num() == e.qp_num; });
  }
  // A worker's queue is shared: the worker hands its CQ_ERR to every connection.
  return worker_ == nullptr && e.type == IBV_EVENT_CQ_ERR && e.handle == cq_.native_handle();
}

// Takes this connection's events out of the device's log, when the log has
// new ones (an atomic load otherwise), and a DEVICE_FATAL.
inline void engine::take_device_events() noexcept {
  const std::uint64_t seq = device_events_->sequence();
  if (seq == events_seen_) {
    return;
  }
  events_seen_ = seq;
  std::array<async_event, 8> got{};
  std::size_t n = 0;
  do {
    n = device_events_->take_if(
        events_from_, [this](const async_event& e) { return owns_event(e); }, got);
    for (std::size_t i = 0; i < n; ++i) {
      on_device_event(got[i]);
    }
  } while (n == got.size());
  if (auto f = device_events_->device_fatal(); f && f->sequence > events_from_) {
    on_device_event(*f);
  }
}

inline void engine::on_device_event(const async_event& e) noexcept {
  if (event_weight(e) >= event_weight(device_note_)) {
    device_note_ = e;
  }
  if (!failed_) {
    if (e.breaks_queue_pair()) {
      fail(make_error_code(errc::device_error));
    }
    return;
  }
  if (cause_open_ && device_note_.sequence == e.sequence) {
    write_device_text();
  }
}

// The first failure: the device may have said why already.
void engine::explain_failure() noexcept {
  device_events_->read();
  take_device_events();
  write_device_text();
}

inline void engine::write_device_text() noexcept {
  const bool wc_error = failure_.category() == wc_category();
  cause_open_ = false;
  device_text_[0] = '\0';
  auto said = [this](const async_event& e) {
    const int r = std::snprintf(device_text_, sizeof device_text_, "the device reported ");
    e.describe(std::span<char>(device_text_).subspan(static_cast<std::size_t>(r)));
  };
  if (device_note_.sequence != 0) {
    said(device_note_);
    cause_open_ = wc_error && !device_note_.breaks_queue_pair();
    return;
  }
  const std::uint8_t port = qps_.empty() ? attr_.port : qps_[0].port();
  if (auto p = device_events_->last_port_event(port); p && p->type == IBV_EVENT_PORT_ERR) {
    said(*p);
    return;
  }
  if (!wc_error) {
    return;
  }
  // Nothing yet: an event may come after the error completion.
  cause_open_ = true;
  cause_until_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  if (failure_ != make_wc_error_code(IBV_WC_WR_FLUSH_ERR)) {
    return;
  }
  // A flush first: a queue pair went to error with no request of this side
  // failing (this runs before the engine moves them to error itself).
  for (std::size_t i = 0; i < qps_.size(); ++i) {
    ibv_qp_attr a{};
    ibv_qp_init_attr init{};
    if (::ibv_query_qp(qps_[i].native_handle(), &a, IBV_QP_STATE, &init) != 0 || a.qp_state != IBV_QPS_ERR) {
      continue;
    }
    std::snprintf(
        device_text_, sizeof device_text_,
        "queue pair %zu (number %u) went to error with no request of this side failed and no event "
        "from the device yet: a responder does that when a peer's request breaks its access rights or "
        "a memory key (a write or read outside what was granted, a revoked key) or the transport's "
        "rules, unless something outside rdx moved it to error",
        i, static_cast<unsigned>(qps_[i].qp_num()));
    return;
  }
}

// The clocks' look at the device, for a connection with its own queue (a
// worker looks for all of its connections at once).
inline void engine::look_at_device(std::chrono::steady_clock::time_point now) noexcept {
  if (cause_open_ && now > cause_until_) {
    cause_open_ = false;
  }
  if (worker_ != nullptr || (failed_ && !cause_open_)) {
    return;
  }
  if (now - events_checked_ < std::chrono::milliseconds(1)) {
    return;
  }
  events_checked_ = now;
  device_events_->read_due(now);
  take_device_events();
}

// The events of the queue pairs in the table, each handed to its connection;
// a CQ_ERR of the shared queue and a DEVICE_FATAL to every connection.
inline void worker_core::device_events(std::chrono::steady_clock::time_point now) noexcept {
  if (device_events_ == nullptr) {
    return;
  }
  if (now == std::chrono::steady_clock::time_point{}) {
    device_events_->read();
  } else {
    device_events_->read_due(now);
  }
  const std::uint64_t seq = device_events_->sequence();
  if (seq == events_seen_) {
    return;
  }
  events_seen_ = seq;
  auto mine = [this](const async_event& e) {
    if (e.type == IBV_EVENT_CQ_ERR) {
      return e.handle == cq_.native_handle();
    }
    if (!e.about_queue_pair()) {
      return false;
    }
    const engine* x = find(e.qp_num);
    return x != nullptr && e.sequence > x->events_from_;
  };
  std::array<async_event, 8> got{};
  std::size_t n = 0;
  do {
    n = device_events_->take_if(0, mine, got);
    for (std::size_t i = 0; i < n; ++i) {
      if (got[i].type == IBV_EVENT_CQ_ERR) {
        for (engine* e = head_[wl_all]; e != nullptr; e = e->wk_next_[wl_all]) {
          e->on_device_event(got[i]);
        }
      } else if (engine* e = find(got[i].qp_num); e != nullptr) {
        e->on_device_event(got[i]);
      }
    }
  } while (n == got.size());
  if (auto f = device_events_->device_fatal()) {
    for (engine* e = head_[wl_all]; e != nullptr; e = e->wk_next_[wl_all]) {
      if (f->sequence > e->events_from_) {
        e->on_device_event(*f);
      }
    }
  }
}

}  // namespace rdx::detail
