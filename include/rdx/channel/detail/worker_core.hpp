// rdx::detail: the state of a worker (channel/worker.hpp): one completion
// queue shared by every connection attached to it, the table that finds a
// completion's connection from its queue-pair number, the lists of
// connections with work to finish, and the wake-up descriptors (the
// completion channel, a stop eventfd, rdma_cm links and the device's
// asynchronous events). Its member functions, which need the engine, are
// in engine_parts/worker_members.hpp and engine_parts/worker_drive.hpp.
#pragma once

#include <rdx/channel/connection_attr.hpp>
#include <rdx/channel/detail/receive_pool.hpp>
#include <rdx/detail/thread_check.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/async_event.hpp>
#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/context.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <system_error>
#include <vector>

#include <unistd.h>

namespace rdx {

//! Settings of a worker (rdx::worker).
struct worker_attr {
  //! Entries of the shared completion queue; 0: the device's max_cqe, at
  //! most 65536. Every connection attached reserves queue_pairs x send_depth
  //! + recv_depth + 1 of them (on a receive pool: queue_pairs x send_depth +
  //! 1, and the pool its buffers), so the queue can never overflow; a
  //! connection that does not fit is refused (errc::limit_exceeded).
  int cq_depth = 0;
  //! A completion channel and one descriptor (fd()) to sleep on: wait(), or
  //! the application's own epoll loop with arm() and ack_events().
  bool events = false;
  //! The completion vector of the shared queue (0 to the device's count - 1).
  int comp_vector = 0;
  //! A receive pool shared by its connections (buffers 0: none, each keeps
  //! a ring of its own). Needs the worker made from a protection domain;
  //! its connections use that one. The pool's buffers take their share of
  //! cq_depth, and a connection on it reserves queue_pairs x send_depth + 1.
  receive_pool_attr pool{};
};

namespace detail {

class engine;

// The lists a worker keeps its connections on (engine::wk_next_ and wk_prev_).
// wl_uncovered: a send queue may be uncovered since the last arm() (engine::uncovered_).
enum worker_list : std::uint8_t {
  wl_all = 0,
  wl_ready = 1,
  wl_pumping = 2,
  wl_bounded = 3,
  wl_uncovered = 4,
  wl_count = 5
};

// A coroutine resumption the worker is running: a connection destroyed by a
// coroutine it resumed clears its own entry, so the loop does not touch it again.
struct resume_frame {
  engine* e;
  resume_frame* up;
};

class worker_core {
public:
  // pd: the protection domain of its receive pool (nullptr: none may be asked for).
  worker_core(const context& ctx, const worker_attr& attr, const protection_domain* pd);
  worker_core(const worker_core&) = delete;
  worker_core& operator=(const worker_core&) = delete;
  ~worker_core();

  // --- what the public worker offers -------------------------------------------
  [[gnu::noinline]] inline int progress() noexcept;
  std::error_code wait(std::chrono::milliseconds timeout) noexcept;
  std::error_code arm() noexcept;
  void ack_events() noexcept;
  [[nodiscard]] int fd() const noexcept { return epoll_fd_; }
  [[nodiscard]] bool events() const noexcept { return channel_.has_value(); }
  [[nodiscard]] std::size_t connections() const noexcept { return attached_; }
  [[nodiscard]] std::size_t queue_pairs() const noexcept { return keys_; }
  [[nodiscard]] int cq_capacity() const noexcept { return capacity_; }
  [[nodiscard]] int cq_reserved() const noexcept { return reserved_; }
  [[nodiscard]] std::uint64_t wakeups() const noexcept { return wakeups_; }
  [[nodiscard]] completion_queue& cq() noexcept { return cq_; }
  [[nodiscard]] const context& device_context() const noexcept { return ctx_; }

  // --- what its connections use ---------------------------------------------------
  // The receive pool for a connection on pd with attr (nullptr: none); throws when they do not fit it.
  [[nodiscard]] receive_pool* pool(const protection_domain& pd, const connection_attr& attr) const;
  [[nodiscard]] receive_pool* pool() const noexcept { return pool_ ? pool_.get() : nullptr; }
  // Posts the pool's returned buffers (one doorbell) and sends the credit
  // reports their grants made due.
  void flush_pool() noexcept;
  // A completion of a connection no longer here: a receive's pool buffer goes back.
  [[gnu::cold]] void return_stray(const completion& c) noexcept;
  // Reserves a connection's completion-queue entries and lists it; throws when it does not fit.
  void add_connection(engine& e, int entries);
  // Its queue pairs: completions of qp_num go to e from now on.
  void add_queue_pair(std::uint32_t qp_num, engine& e);
  // Everything add_connection and add_queue_pair did, undone; completions of its queue pairs left in the CQ
  // are dropped.
  void remove_connection(engine& e) noexcept;
  // Polls the shared queue and hands each completion to its connection; returns the completions handled.
  [[gnu::always_inline]] int poll() noexcept;
  // Out of line: the engine's hot functions stay as small as without a worker.
  [[gnu::noinline]] inline void mark_ready(engine& e) noexcept;
  [[gnu::noinline]] inline void mark_pumping(engine& e) noexcept;
  // e has a suspended bounded await now (on), or none any more.
  void bounded_changed(engine& e, bool on) noexcept;
  void holding_changed(int d) noexcept { holding_ += d; }
  // A stop request on one of its connections, from any thread.
  void signal_stop() noexcept {
    stop_requests_.fetch_add(1, std::memory_order_release);
    if (wake_fd_ >= 0) {
      const std::uint64_t one = 1;
      // Fails only when the counter is full: the reader is woken already.
      (void)(::write(wake_fd_, &one, sizeof one) < 0);
    }
  }
  // What an application's descriptor (worker::watch) names in the epoll set: no connection.
  static engine* foreign_fd() noexcept { return reinterpret_cast<engine*>(std::uintptr_t{1}); }
  // An rdma_cm link's descriptor in (or out of) the epoll set; owner: its connection.
  // owner: the connection (an engine), this worker for the device's asynchronous events, or nullptr.
  [[gnu::noinline, gnu::cold]] inline void watch_fd(int fd, bool on, void* owner) noexcept;
  [[nodiscard]] thread_check& thread() noexcept { return thread_; }

private:
  static constexpr std::uint32_t empty_key = 0xffffffffu;  // queue-pair numbers are 24 bits
  static constexpr std::uint32_t gone_key = 0xfffffffeu;
  struct slot {
    std::uint32_t key = empty_key;
    engine* e = nullptr;
  };

  // A queue pair's home slot: the number's low bits. Devices number their
  // queue pairs in sequence, so the low bits spread them (linear probing
  // takes the rest).
  [[nodiscard]] std::size_t home(std::uint32_t key) const noexcept { return key & mask_; }
  [[nodiscard, gnu::always_inline]] engine* find(std::uint32_t key) const noexcept {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const slot& s = table_[i];
      if (s.key == key) {
        return s.e;
      }
      if (s.key == empty_key) {
        return nullptr;
      }
    }
  }
  void rehash(std::size_t size);
  void link(engine& e, worker_list l) noexcept;
  void unlink(engine& e, worker_list l) noexcept;
  engine* pop(worker_list l) noexcept;
  // send_queue::cover_watch::first of a connection on this worker: lists it for arm().
  static void uncovered(void* e) noexcept;
  [[gnu::always_inline]] void settle() noexcept;
  [[gnu::noinline]] inline void settle_all() noexcept;
  void sweep(std::chrono::steady_clock::time_point now) noexcept;
  // The device's asynchronous events, each handed to its connection
  // (detail/engine_parts/device_events.hpp); an empty now reads the descriptor at once.
  void device_events(std::chrono::steady_clock::time_point now) noexcept;
  void sweep_bounded(std::chrono::steady_clock::time_point now) noexcept;
  // The count of polls ran out (progress()): the clocks' sweep or the bounded awaits' deadlines.
  [[gnu::noinline]] inline void tick() noexcept;
  void resume() noexcept;
  [[nodiscard]] std::chrono::steady_clock::time_point sleep_until(
      std::chrono::steady_clock::time_point now, std::chrono::steady_clock::time_point until) const noexcept;

  context ctx_;
  std::optional<completion_channel> channel_;
  completion_queue cq_;
  std::unique_ptr<receive_pool> pool_;
  int capacity_ = 0;
  int reserved_ = 0;
  int wake_fd_ = -1;
  int epoll_fd_ = -1;
  std::vector<slot> table_;
  std::size_t mask_ = 0;
  std::size_t keys_ = 0;  // queue pairs listed
  std::size_t used_ = 0;  // slots not empty (listed or gone)
  std::size_t attached_ = 0;
  std::array<engine*, wl_count> head_{};
  std::array<completion, 32> buf_{};
  // The connections that got completions since the last settle(): each
  // reposts its receive buffers with one doorbell then (engine::wk_touched_).
  std::array<engine*, 64> touched_{};
  std::uint32_t ntouched_ = 0;
  int buf_head_ = 0, buf_count_ = 0;
  int polling_ = 0;
  engine* cursor_ = nullptr;  // where the next sweep of the clocks starts (wl_all)
  int holding_ = 0;           // connections inside batch()
  // Polls until tick() looks at the clocks: a count of tick_len_ (64 while a
  // bounded await exists, else up to the next sweep); polls_ counts the polls
  // since the last sweep, one every 1024.
  std::uint32_t tick_in_ = 1024;
  std::uint32_t tick_len_ = 1024;
  std::uint32_t polls_ = 0;
  std::atomic<std::uint32_t> stop_requests_{0};
  std::uint32_t stops_seen_ = 0;
  std::chrono::steady_clock::time_point swept_{};
  std::chrono::milliseconds tick_{
      1000};  // the shortest keepalive / 4 (or stall bound / 4) of its connections
  std::uint64_t wakeups_ = 0;
  resume_frame* frames_ = nullptr;
  async_event_log* device_events_ = nullptr;  // the context's log of asynchronous events
  std::uint64_t events_seen_ = 0;             // its sequence at the last look
  thread_check thread_;

  friend class engine;
};

// A worker's state for a connection to be made on; an empty (moved-from) worker is refused.
inline const std::shared_ptr<worker_core>& check_worker(const std::shared_ptr<worker_core>& w) {
  if (w == nullptr) {
    throw_rdx(errc::invalid_argument, "connection: the worker is empty (moved from)");
  }
  return w;
}

}  // namespace detail
}  // namespace rdx
