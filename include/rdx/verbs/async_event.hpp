// rdx: a device's asynchronous events (ibv_get_async_event), what each one
// means, and the bounded log in which an open context keeps them for the
// owners of its queue pairs.
//
// Every queue pair, completion queue and port of a device reports its events
// on one descriptor of the context (ibv_context::async_fd), and a context may
// be shared by several owners on several threads. The log reads that
// descriptor without blocking, acknowledges each event as soon as it is
// copied (ibv_destroy_qp waits for events read and not yet acknowledged),
// and keeps what it read until an owner takes the events of its own queue
// pairs. It is the failure path, not the data path: every call but
// sequence() takes a mutex, and nothing allocates after construction.
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>

#include <fcntl.h>

namespace rdx {

//! "QP_ACCESS_ERR", "PORT_ERR", ...: the event's name without its IBV_EVENT_ prefix.
[[nodiscard]] constexpr std::string_view to_string(ibv_event_type t) noexcept {
  switch (t) {
    case IBV_EVENT_CQ_ERR: return "CQ_ERR";
    case IBV_EVENT_QP_FATAL: return "QP_FATAL";
    case IBV_EVENT_QP_REQ_ERR: return "QP_REQ_ERR";
    case IBV_EVENT_QP_ACCESS_ERR: return "QP_ACCESS_ERR";
    case IBV_EVENT_COMM_EST: return "COMM_EST";
    case IBV_EVENT_SQ_DRAINED: return "SQ_DRAINED";
    case IBV_EVENT_PATH_MIG: return "PATH_MIG";
    case IBV_EVENT_PATH_MIG_ERR: return "PATH_MIG_ERR";
    case IBV_EVENT_DEVICE_FATAL: return "DEVICE_FATAL";
    case IBV_EVENT_PORT_ACTIVE: return "PORT_ACTIVE";
    case IBV_EVENT_PORT_ERR: return "PORT_ERR";
    case IBV_EVENT_LID_CHANGE: return "LID_CHANGE";
    case IBV_EVENT_PKEY_CHANGE: return "PKEY_CHANGE";
    case IBV_EVENT_SM_CHANGE: return "SM_CHANGE";
    case IBV_EVENT_SRQ_ERR: return "SRQ_ERR";
    case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ_LIMIT_REACHED";
    case IBV_EVENT_QP_LAST_WQE_REACHED: return "QP_LAST_WQE_REACHED";
    case IBV_EVENT_CLIENT_REREGISTER: return "CLIENT_REREGISTER";
    case IBV_EVENT_GID_CHANGE: return "GID_CHANGE";
    case IBV_EVENT_WQ_FATAL: return "WQ_FATAL";
  }
  return "UNKNOWN_EVENT";
}

//! What an event means and its likely cause, in words.
[[nodiscard]] constexpr std::string_view explain(ibv_event_type t) noexcept {
  switch (t) {
    case IBV_EVENT_QP_ACCESS_ERR:
      return "the peer's request broke this queue pair's access rights or a memory key (a write or read "
             "outside what was granted, a revoked key)";
    case IBV_EVENT_QP_REQ_ERR:
      return "a request that arrived broke the transport's rules (an opcode this queue pair does not allow, "
             "one out of sequence, a bad length): the responder moved the queue pair to error";
    case IBV_EVENT_QP_FATAL:
      return "the queue pair hit an error that no completion could report (its work queue or the NIC "
             "failed) and went to error";
    case IBV_EVENT_CQ_ERR:
      return "a completion queue overran or failed: completions were lost and its queue pairs went to error";
    case IBV_EVENT_COMM_EST: return "the first message arrived while the queue pair was in RTR";
    case IBV_EVENT_SQ_DRAINED:
      return "its send queue was drained into SQD: requests posted after are neither executed nor failed "
             "until it is moved back to RTS";
    case IBV_EVENT_PATH_MIG: return "the connection moved to its alternate path";
    case IBV_EVENT_PATH_MIG_ERR: return "moving the connection to its alternate path failed";
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return "a queue pair of a shared receive queue went to error and took its last receive";
    case IBV_EVENT_SRQ_ERR: return "a shared receive queue failed";
    case IBV_EVENT_SRQ_LIMIT_REACHED: return "a shared receive queue fell below its limit";
    case IBV_EVENT_WQ_FATAL: return "a work queue failed";
    case IBV_EVENT_DEVICE_FATAL:
      return "the device failed (a firmware or driver fault, or it was removed): nothing made on it works "
             "any more; open it again";
    case IBV_EVENT_PORT_ACTIVE: return "the port became ACTIVE (its link came up)";
    case IBV_EVENT_PORT_ERR:
      return "the port left ACTIVE: its link went down (a cable, a switch port, or its network interface "
             "taken down), and what it could not deliver fails";
    case IBV_EVENT_LID_CHANGE: return "the port's LID changed";
    case IBV_EVENT_PKEY_CHANGE: return "the port's P_Key table changed";
    case IBV_EVENT_SM_CHANGE: return "the port's subnet manager changed";
    case IBV_EVENT_CLIENT_REREGISTER: return "the subnet manager asked for its registrations again";
    case IBV_EVENT_GID_CHANGE: return "the port's GID table changed (an address came or went)";
  }
  return "an event this version of rdx does not know";
}

//! True for the events whose element is a queue pair.
[[nodiscard]] constexpr bool is_queue_pair_event(ibv_event_type t) noexcept {
  switch (t) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED: return true;
    default: return false;
  }
}

//! True for the events whose element is a port.
[[nodiscard]] constexpr bool is_port_event(ibv_event_type t) noexcept {
  switch (t) {
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE: return true;
    default: return false;
  }
}

//! One asynchronous event, copied before it was acknowledged.
struct async_event {
  ibv_event_type type = IBV_EVENT_DEVICE_FATAL;  //!< what the device reported
  std::uint32_t qp_num = 0;                      //!< the queue pair, for a queue-pair event
  std::uint8_t port = 0;                         //!< the port, for a port event
  const void* handle = nullptr;  //!< the CQ, SRQ or WQ, for their events (to compare, never to use)
  std::uint64_t sequence = 0;    //!< its place among its context's events, from 1

  //! True when the event concerns one queue pair (qp_num says which).
  [[nodiscard]] bool about_queue_pair() const noexcept { return is_queue_pair_event(type); }
  //! True when the event concerns one port (port says which).
  [[nodiscard]] bool about_port() const noexcept { return is_port_event(type); }
  //! True when the event means its queue pair (or every one on its CQ or device) went to error.
  [[nodiscard]] bool breaks_queue_pair() const noexcept {
    return type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR || type == IBV_EVENT_QP_ACCESS_ERR ||
           type == IBV_EVENT_CQ_ERR || type == IBV_EVENT_DEVICE_FATAL;
  }
  //! "QP_ACCESS_ERR on queue pair 18: the peer's request broke ..." into out, cut to fit and
  //! NUL-terminated. @return the characters written.
  std::size_t describe(std::span<char> out) const noexcept {
    if (out.empty()) {
      return 0;
    }
    const std::string_view n = to_string(type);
    const std::string_view m = explain(type);
    int r = 0;
    if (about_queue_pair()) {
      r = std::snprintf(out.data(), out.size(), "%.*s on queue pair %u: %.*s", static_cast<int>(n.size()),
                        n.data(), static_cast<unsigned>(qp_num), static_cast<int>(m.size()), m.data());
    } else if (about_port()) {
      r = std::snprintf(out.data(), out.size(), "%.*s on port %u: %.*s", static_cast<int>(n.size()), n.data(),
                        static_cast<unsigned>(port), static_cast<int>(m.size()), m.data());
    } else {
      r = std::snprintf(out.data(), out.size(), "%.*s: %.*s", static_cast<int>(n.size()), n.data(),
                        static_cast<int>(m.size()), m.data());
    }
    return r < 0 ? 0 : std::min(static_cast<std::size_t>(r), out.size() - 1);
  }
};

//! The asynchronous events of one open device, kept for the owners of its
//! queue pairs. rdx::context holds one per open device, shared by every
//! owner of it (context::async_events()). Queue-pair, CQ, SRQ and WQ events
//! wait in a log of `capacity` entries until an owner takes them; when it is
//! full the oldest goes (dropped() counts them), so events nobody claims
//! never grow memory. The latest event of each port and a DEVICE_FATAL are
//! kept apart, since they concern every owner. Thread-safe.
//!
//! The descriptor is set O_NONBLOCK at the first read(): an application
//! that reads the context's events itself takes them from this log instead.
class async_event_log {
public:
  static constexpr std::size_t capacity = 64;  //!< queue-pair, CQ, SRQ and WQ events kept
  static constexpr std::size_t max_ports = 8;  //!< ports whose latest event is kept

  //! The log of c's events; c must outlive it (the context owns both).
  explicit async_event_log(ibv_context* c) noexcept : ctx_(c) {}
  async_event_log(const async_event_log&) = delete;
  async_event_log& operator=(const async_event_log&) = delete;
  ~async_event_log() = default;

  //! Reads every event the device reported since the last read, without
  //! blocking, acknowledging each one after copying it. @return events read.
  std::size_t read() noexcept {
    std::lock_guard<std::mutex> lock(m_);
    return read_locked();
  }
  //! read() when no owner read in the last millisecond: a busy loop costs the
  //! descriptor at most one system call a millisecond however many owners look.
  std::size_t read_due(std::chrono::steady_clock::time_point now) noexcept {
    const std::int64_t t = now.time_since_epoch().count();
    const std::int64_t every = std::chrono::steady_clock::duration(std::chrono::milliseconds(1)).count();
    std::int64_t last = last_read_.load(std::memory_order_relaxed);
    if (t - last < every || !last_read_.compare_exchange_strong(last, t, std::memory_order_relaxed)) {
      return 0;
    }
    return read();
  }
  //! Events read so far: the sequence of the newest. Changes only when read() finds one (no lock).
  [[nodiscard]] std::uint64_t sequence() const noexcept { return sequence_.load(std::memory_order_acquire); }

  //! Moves out of the log, oldest first, up to out.size() events with a
  //! sequence above after that mine(const async_event&) claims. @return events moved.
  template <class Claims>
  std::size_t take_if(std::uint64_t after, Claims&& mine, std::span<async_event> out) noexcept {
    std::lock_guard<std::mutex> lock(m_);
    std::size_t n = 0;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < held_; ++i) {
      const async_event& e = log_[i];
      if (n < out.size() && e.sequence > after && mine(e)) {
        out[n++] = e;
      } else {
        log_[kept++] = e;
      }
    }
    held_ = kept;
    return n;
  }
  //! take_if() for the events of the queue pairs numbered in qps.
  std::size_t take(std::uint64_t after, std::span<const std::uint32_t> qps,
                   std::span<async_event> out) noexcept {
    return take_if(
        after,
        [qps](const async_event& e) {
          return e.about_queue_pair() && std::find(qps.begin(), qps.end(), e.qp_num) != qps.end();
        },
        out);
  }
  //! Copies what the log holds, oldest first, taking nothing. @return events copied.
  std::size_t peek(std::span<async_event> out) const noexcept {
    std::lock_guard<std::mutex> lock(m_);
    const std::size_t n = std::min(out.size(), held_);
    std::copy_n(log_.begin(), n, out.begin());
    return n;
  }
  //! The latest event of port p (1 to max_ports), if any came.
  [[nodiscard]] std::optional<async_event> last_port_event(std::uint8_t p) const noexcept {
    std::lock_guard<std::mutex> lock(m_);
    if (p == 0 || p > max_ports || ports_[p - 1].sequence == 0) {
      return std::nullopt;
    }
    return ports_[p - 1];
  }
  //! The DEVICE_FATAL event, if the device reported one.
  [[nodiscard]] std::optional<async_event> device_fatal() const noexcept {
    std::lock_guard<std::mutex> lock(m_);
    if (fatal_.sequence == 0) {
      return std::nullopt;
    }
    return fatal_;
  }
  //! Events held now, waiting for an owner.
  [[nodiscard]] std::size_t size() const noexcept {
    std::lock_guard<std::mutex> lock(m_);
    return held_;
  }
  //! Events pushed out of a full log before anyone took them.
  [[nodiscard]] std::uint64_t dropped() const noexcept {
    std::lock_guard<std::mutex> lock(m_);
    return dropped_;
  }

private:
  std::size_t read_locked() noexcept {
    if (ctx_ == nullptr) {
      return 0;
    }
    if (!nonblocking_) {
      const int fl = ::fcntl(ctx_->async_fd, F_GETFL);
      if (fl < 0 || ::fcntl(ctx_->async_fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        return 0;  // never block
      }
      nonblocking_ = true;
    }
    std::size_t n = 0;
    ibv_async_event ev{};
    while (::ibv_get_async_event(ctx_, &ev) == 0) {
      async_event e{.type = ev.event_type, .sequence = sequence_.load(std::memory_order_relaxed) + 1};
      if (is_queue_pair_event(e.type)) {
        e.qp_num = ev.element.qp->qp_num;
      } else if (is_port_event(e.type)) {
        e.port = static_cast<std::uint8_t>(ev.element.port_num);
      } else if (e.type == IBV_EVENT_CQ_ERR) {
        e.handle = ev.element.cq;
      } else if (e.type == IBV_EVENT_SRQ_ERR || e.type == IBV_EVENT_SRQ_LIMIT_REACHED) {
        e.handle = ev.element.srq;
      } else if (e.type == IBV_EVENT_WQ_FATAL) {
        e.handle = ev.element.wq;
      }
      ::ibv_ack_async_event(&ev);
      keep(e);
      sequence_.store(e.sequence, std::memory_order_release);
      ++n;
    }
    return n;
  }

  void keep(const async_event& e) noexcept {
    if (e.about_port()) {
      if (e.port >= 1 && e.port <= max_ports) {
        ports_[e.port - 1] = e;
      }
      return;
    }
    if (e.type == IBV_EVENT_DEVICE_FATAL) {
      fatal_ = e;
      return;
    }
    if (held_ == capacity) {
      std::copy(log_.begin() + 1, log_.end(), log_.begin());
      --held_;
      ++dropped_;
    }
    log_[held_++] = e;
  }

  ibv_context* ctx_;
  mutable std::mutex m_;
  bool nonblocking_ = false;
  std::array<async_event, capacity> log_{};
  std::size_t held_ = 0;
  std::uint64_t dropped_ = 0;
  std::array<async_event, max_ports> ports_{};
  async_event fatal_{};
  std::atomic<std::uint64_t> sequence_{0};
  std::atomic<std::int64_t> last_read_{0};
};

}  // namespace rdx
