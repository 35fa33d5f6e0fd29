// rdx: a worker: one completion queue shared by every connection attached
// to it, driven by one progress() on one thread, with one descriptor to
// sleep on. A connection made on a worker (connection(worker&, pd, attr))
// posts its completions to the worker's queue; the worker finds each one's
// connection by queue-pair number in constant time and visits only the
// connections with something to finish, so one thread serves many peers.
//
// Threading: a worker and every connection attached to it are used by one
// thread at a time (checked in debug builds); a stop_token may be stopped
// from any thread. More in rdx's design notes (share/doc/rdx/design.md),
// "Workers".
#pragma once

#include <rdx/channel/detail/engine_all.hpp>
#include <rdx/channel/detail/worker_core.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <system_error>

namespace rdx {

//! One completion queue, one progress() and (with worker_attr::events) one
//! descriptor for any number of connections of one device. Move-only.
//! Connections join by being made on it and leave by being destroyed, at
//! any time, also while others carry traffic; one connection's failure or
//! teardown ends only its own operations. The worker's state lives while
//! the worker or any connection on it does, so they may be destroyed in
//! any order. A moved-from worker is empty: progress() returns 0, wait()
//! and arm() errc::not_ready, fd() -1, and no connection can be made on it.
class worker {
public:
  //! Creates the shared completion queue (and, with events, its completion
  //! channel, a stop eventfd and the epoll descriptor holding both).
  //! @throws rdx::error for a cq_depth out of range or a failed verb.
  explicit worker(const context& ctx, const worker_attr& attr = {})
      : core_(std::make_shared<detail::worker_core>(ctx, attr, nullptr)) {}
  //! A worker on the protection domain's device; with worker_attr::pool, its
  //! receive pool is registered in pd (its connections use pd).
  explicit worker(const protection_domain& pd, const worker_attr& attr = {})
      : core_(std::make_shared<detail::worker_core>(pd.device_context(), attr, &pd)) {}
  //! Takes o's worker; o is left empty (its connections keep the shared state).
  worker(worker&& o) noexcept = default;
  //! Lets go of this worker's state (its connections keep it) and takes o's.
  worker& operator=(worker&& o) noexcept = default;
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
  ~worker() = default;

  //! Polls the shared completion queue once (no blocking) and finishes, for
  //! every connection, what completed: operations end, deferred ones are
  //! posted when they fit, receive buffers are reposted, credits returned;
  //! deadlines, stop requests, keepalive probes and rdma_cm links are
  //! looked at on a clock. Coroutines resume here, inline.
  //! A connection's own progress(), test() and wait() drive its whole worker.
  //! @return completions handled (all connections).
  int progress() noexcept { return core_ ? core_->progress() : 0; }
  //! Event mode: progress if anything completed, else arm and sleep on fd()
  //! up to timeout (shortened to the next deadline, a quarter keepalive, or
  //! 1 ms while operations are deferred), then progress.
  //! @return empty when something was handled or a wake-up came;
  //! errc::timed_out; errc::not_ready without events.
  [[nodiscard]] std::error_code wait(std::chrono::milliseconds timeout) noexcept {
    return core_ ? core_->wait(timeout) : make_error_code(errc::not_ready);
  }

  //! One descriptor for an application's epoll or io_uring loop (an epoll
  //! descriptor, readable when a completion, a stop request or an rdma_cm
  //! event waits); -1 without events. The loop: progress() until it
  //! returns 0; arm(); on success sleep on fd(), else progress() again;
  //! after a wake-up ack_events(), then progress(). No wake-up is lost.
  [[nodiscard]] int fd() const noexcept { return core_ ? core_->fd() : -1; }
  //! Before sleeping on fd(): every connection's last posted request is made
  //! to produce a completion, the queue is armed and polled once more.
  //! @return empty: sleep; std::errc::resource_unavailable_try_again:
  //! something completed meanwhile (and was handled), do not sleep;
  //! errc::not_ready without events; the verb's error.
  [[nodiscard]] std::error_code arm() noexcept {
    return core_ ? core_->arm() : make_error_code(errc::not_ready);
  }
  //! After fd() was readable: takes every completion event and the stop
  //! wake-up (non-blocking; nothing waiting is fine).
  void ack_events() noexcept {
    if (core_) {
      core_->ack_events();
    }
  }

  //! Event mode: wait() also wakes when `fd` is readable (an acceptor's
  //! descriptor, the application's own), and stops doing so after
  //! watch(fd, false). The worker reads nothing from it: the caller handles
  //! it after wait() returns. Without events it does nothing.
  void watch(int fd, bool on = true) noexcept {
    if (core_) {
      core_->watch_fd(fd, on, detail::worker_core::foreign_fd());
    }
  }

  //! Connections attached now.
  [[nodiscard]] std::size_t connections() const noexcept { return core_ ? core_->connections() : 0; }
  //! Their queue pairs.
  [[nodiscard]] std::size_t queue_pairs() const noexcept { return core_ ? core_->queue_pairs() : 0; }
  //! Entries of the shared completion queue.
  [[nodiscard]] int cq_capacity() const noexcept { return core_ ? core_->cq_capacity() : 0; }
  //! Entries reserved by the connections attached (never above cq_capacity()).
  [[nodiscard]] int cq_reserved() const noexcept { return core_ ? core_->cq_reserved() : 0; }
  //! Receive-pool buffers (worker_attr::pool.buffers; 0 without a pool).
  [[nodiscard]] std::uint32_t pool_buffers() const noexcept {
    return core_ && core_->pool() != nullptr ? core_->pool()->size() : 0;
  }
  //! Receive-pool buffers posted and promised to no peer (what a new
  //! connection's recv_depth is taken from, and busy peers grow by).
  [[nodiscard]] std::int64_t pool_free() const noexcept {
    return core_ && core_->pool() != nullptr ? core_->pool()->available() : 0;
  }
  //! ibv_post_srq_recv calls of the receive pool (one per poll that took messages).
  [[nodiscard]] std::uint64_t pool_doorbells() const noexcept {
    return core_ && core_->pool() != nullptr ? core_->pool()->doorbells() : 0;
  }
  //! Sleeps in wait() that ended with a descriptor readable.
  [[nodiscard]] std::uint64_t wakeups() const noexcept { return core_ ? core_->wakeups() : 0; }
  //! The shared completion queue (not for an empty worker).
  [[nodiscard]] completion_queue& cq() noexcept { return core_->cq(); }
  //! True unless moved from.
  explicit operator bool() const noexcept { return core_ != nullptr; }

private:
  friend class connection;
  std::shared_ptr<detail::worker_core> core_;
};

}  // namespace rdx
