// rdx::detail: how a worker drives its connections: one poll of the shared
// completion queue, each completion handed to its connection found by
// queue-pair number in a hash table (constant time), then only the
// connections that got completions, have deferred operations or coroutines
// to resume are visited; the clocks (keepalive, stall, rdma_cm link,
// deadlines) are swept over all of them on a timer. Event mode: one epoll
// descriptor holding the completion channel, the stop eventfd and rdma_cm
// links. Included by detail/engine.hpp.
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

inline worker_core::worker_core(const context& ctx, const worker_attr& attr, const protection_domain* pd)
    : ctx_(ctx.share()),
      channel_(attr.events ? std::optional<completion_channel>(std::in_place, ctx_) : std::nullopt),
      cq_([&] {
        int depth = attr.cq_depth;
        if (depth < 0) {
          throw_rdx(errc::invalid_argument,
                    "worker: cq_depth = " + std::to_string(depth) + ", need 0 (the device's) or more");
        }
        if (depth == 0) depth = std::min(ctx.query_device().max_cqe, 65536);
        return completion_queue(ctx_, completion_queue_attr{.depth = depth,
                                                            .channel = channel_ ? &*channel_ : nullptr,
                                                            .comp_vector = attr.comp_vector});
      }()) {
  capacity_ = cq_.depth();
  rehash(64);
  if (attr.pool.buffers != 0) {
    if (pd == nullptr) {
      throw_rdx(errc::invalid_argument,
                "worker: a receive pool (worker_attr::pool.buffers = " + std::to_string(attr.pool.buffers) +
                    ") registers memory: make the worker from a protection domain, worker(pd, attr)");
    }
    if (static_cast<std::int64_t>(attr.pool.buffers) + 1 > capacity_) {
      throw_rdx(errc::limit_exceeded, "worker: its receive pool of " + std::to_string(attr.pool.buffers) +
                                          " buffers does not fit its completion queue of " +
                                          std::to_string(capacity_) +
                                          " entries; make the pool smaller or cq_depth larger");
    }
    pool_ = std::make_unique<receive_pool>(*pd, attr.pool);
    reserved_ = static_cast<int>(attr.pool.buffers);  // each buffer completes once before it is reposted
  }
  device_events_ = ctx_.async_events();
  if (device_events_ != nullptr) {
    device_events_->read();  // O_NONBLOCK, before the descriptor goes in the epoll set
    events_seen_ = device_events_->sequence();
  }
  if (channel_) {
    channel_->set_nonblocking();
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (wake_fd_ < 0 || epoll_fd_ < 0) {
      const int e = errno;
      if (wake_fd_ >= 0) ::close(wake_fd_);
      if (epoll_fd_ >= 0) ::close(epoll_fd_);
      throw error(std::error_code(e, std::generic_category()), "worker: eventfd or epoll_create1");
    }
    watch_fd(channel_->fd(), true, nullptr);
    watch_fd(wake_fd_, true, nullptr);
    if (device_events_ != nullptr) watch_fd(ctx_.native_handle()->async_fd, true, this);
  }
}

inline worker_core::~worker_core() {
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void worker_core::watch_fd(int fd, bool on, void* owner) noexcept {
  if (epoll_fd_ < 0 || fd < 0) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  // An rdma_cm link's connection; this worker: the device's events; foreign_fd(): an
  // application's descriptor (worker::watch); nullptr: the channel or the eventfd.
  ev.data.ptr = owner;
  (void)::epoll_ctl(epoll_fd_, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, fd, &ev);
}

// --- the table and the lists ---------------------------------------------------------

inline void worker_core::rehash(std::size_t size) {
  std::vector<slot> old = std::move(table_);
  table_.assign(size, slot{});
  mask_ = size - 1;
  shift_ = 32 - static_cast<unsigned>(std::countr_zero(size));
  used_ = 0;
  for (const slot& s : old) {
    if (s.key == empty_key || s.key == gone_key) continue;
    std::size_t i = home(s.key);
    while (table_[i].key != empty_key) i = (i + 1) & mask_;
    table_[i] = s;
    ++used_;
  }
}

inline receive_pool* worker_core::pool(const protection_domain& pd, const connection_attr& attr) const {
  if (!pool_) return nullptr;
  if (pd.native_handle() != pool_->pd()) {
    throw_rdx(errc::invalid_argument,
              "connection: the worker's receive pool is registered in another protection domain; make the "
              "connection with the one the worker was made from");
  }
  if (attr.message_size > pool_->buffer_size()) {
    throw_rdx(errc::invalid_argument,
              "connection: message_size = " + std::to_string(attr.message_size) +
                  " but the worker's receive pool has buffers of " + std::to_string(pool_->buffer_size()) +
                  " bytes; use at most that, or a worker with larger pool.buffer_size");
  }
  return pool_.get();
}

void worker_core::return_stray(const completion& c) noexcept {
  const std::uint64_t id = c.wr_id();
  if (pool_ && (id & send_queue::wr_id_tag) == 0 && id < pool_->size()) {
    pool_->stray(static_cast<std::uint32_t>(id));
  }
}

void worker_core::flush_pool() noexcept {
  if (!pool_) return;
  if (std::error_code ec = pool_->flush()) [[unlikely]] {
    // Buffers the shared queue refused are lost to every peer: all fail.
    for (engine* e = head_[wl_all]; e != nullptr; e = e->wk_next_[wl_all]) e->fail(ec);
  }
  while (pool_share* s = pool_->next_granted()) {
    auto* e = static_cast<engine*>(s->owner);
    if (e->connected_ && !e->failed_ && e->ring_.grant_due()) e->report_credits();
  }
}

inline void worker_core::join(engine& e, int entries) {
  if (entries > capacity_ - reserved_) {
    throw_rdx(
        errc::limit_exceeded,
        "worker: its completion queue of " + std::to_string(capacity_) + " entries has " +
            std::to_string(capacity_ - reserved_) + " left for " + std::to_string(attached_) +
            " connections, and this one needs " + std::to_string(entries) +
            " (queue_pairs x send_depth + recv_depth + 1); give the connection a smaller send_depth or "
            "recv_depth, or make another worker, or one with a larger worker_attr::cq_depth (the device "
            "allows " +
            std::to_string(ctx_.query_device().max_cqe) + ")");
  }
  reserved_ += entries;
  e.wk_entries_ = entries;
  e.joined_ = true;
  ++attached_;
  link(e, wl_all);
  e.uncovered_.first = &worker_core::uncovered;
  e.uncovered_.ctx = &e;
  if (e.uncovered_.uncovered) link(e, wl_uncovered);
  // The shortest keepalive or stall bound sets how often the clocks are swept.
  if (e.attr_.keepalive.count() > 0)
    tick_ = std::min(tick_, std::max(e.attr_.keepalive / 4, std::chrono::milliseconds(1)));
  if (e.attr_.stall_timeout.count() > 0) {
    tick_ = std::min(tick_, std::max(e.attr_.stall_timeout / 4, std::chrono::milliseconds(1)));
  }
}

inline void worker_core::add_queue_pair(std::uint32_t qp_num, engine& e) {
  if ((used_ + 1) * 2 > table_.size()) rehash(std::bit_ceil((keys_ + 1) * 4));
  std::size_t i = home(qp_num);
  while (table_[i].key != empty_key && table_[i].key != gone_key && table_[i].key != qp_num)
    i = (i + 1) & mask_;
  if (table_[i].key == empty_key) ++used_;
  table_[i] = slot{qp_num, &e};
  ++keys_;
}

inline void worker_core::leave(engine& e) noexcept {
  if (!e.joined_) return;
  e.joined_ = false;
  e.uncovered_.first = nullptr;
  for (const auto& q : e.qps_) {
    const std::uint32_t key = q.qp_num();
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (table_[i].key == empty_key) break;
      if (table_[i].key == key && table_[i].e == &e) {
        table_[i] = slot{gone_key, nullptr};
        --keys_;
        break;
      }
    }
  }
  if (cursor_ == &e) cursor_ = e.wk_next_[wl_all];
  for (std::uint8_t l = 0; l < wl_count; ++l) unlink(e, static_cast<worker_list>(l));
  for (resume_frame* f = frames_; f != nullptr; f = f->up) {
    if (f->e == &e) f->e = nullptr;
  }
  if (e.holds_ != 0) holding_changed(-1);
  reserved_ -= e.wk_entries_;
  --attached_;
  for (std::uint32_t i = 0; i < ntouched_; ++i) {
    if (touched_[i] == &e) {
      touched_[i] = touched_[--ntouched_];
      break;
    }
  }
  e.wk_touched_ = false;
  // Completions of its queue pairs still in the poll buffer go nowhere.
  for (int i = buf_head_; i < buf_count_; ++i) {
    for (const auto& q : e.qps_) {
      if (buf_[i].qp_num() != q.qp_num()) continue;
      return_stray(buf_[i]);
      buf_[i] = completion{};
    }
  }
}

inline void worker_core::link(engine& e, worker_list l) noexcept {
  if (e.wk_in_[l]) return;
  e.wk_in_[l] = true;
  e.wk_prev_[l] = nullptr;
  e.wk_next_[l] = head_[l];
  if (head_[l] != nullptr) head_[l]->wk_prev_[l] = &e;
  head_[l] = &e;
}

inline void worker_core::unlink(engine& e, worker_list l) noexcept {
  if (!e.wk_in_[l]) return;
  e.wk_in_[l] = false;
  if (e.wk_prev_[l] != nullptr) {
    e.wk_prev_[l]->wk_next_[l] = e.wk_next_[l];
  } else {
    head_[l] = e.wk_next_[l];
  }
  if (e.wk_next_[l] != nullptr) e.wk_next_[l]->wk_prev_[l] = e.wk_prev_[l];
  e.wk_next_[l] = e.wk_prev_[l] = nullptr;
}

inline engine* worker_core::pop(worker_list l) noexcept {
  engine* e = head_[l];
  if (e != nullptr) unlink(*e, l);
  return e;
}

inline void worker_core::bounded_changed(engine& e, bool on) noexcept {
  if (on) {
    link(e, wl_bounded);
  } else {
    unlink(e, wl_bounded);
  }
}

void worker_core::mark_ready(engine& e) noexcept {
  link(e, wl_ready);
}
inline void worker_core::uncovered(void* e) noexcept {
  auto& c = *static_cast<engine*>(e);
  c.worker_->link(c, wl_uncovered);
}
void worker_core::mark_pumping(engine& e) noexcept {
  link(e, wl_pumping);
}

// --- progress -------------------------------------------------------------------------

// Each completion is taken off the buffer before it is handled, so a nested
// poll (a connection's teardown or staging wait) keeps the order.
inline int worker_core::poll() noexcept {
  if (buf_head_ == buf_count_) {
    const int n = cq_.poll(std::span<completion>(buf_));
    if (n < 0) [[unlikely]] {
      // The shared queue failed: every connection on it fails.
      for (engine* e = head_[wl_all]; e != nullptr; e = e->wk_next_[wl_all])
        e->fail({-n, std::generic_category()});
      return 0;
    }
    buf_head_ = 0;
    buf_count_ = n;
  }
  int handled = 0;
  ++polling_;
  while (buf_head_ < buf_count_) {
    const completion c = buf_[buf_head_++];
    engine* e = find(c.qp_num());
    if (e == nullptr) [[unlikely]] {
      // A connection that left (its queue pairs are gone), or an entry its leaving blanked (0).
      if (c.qp_num() != 0) return_stray(c);
      continue;
    }
    // A send's success needs nothing at the end of the poll but its idle and
    // stall clocks restarted: done here, without the list. A receive (whose
    // buffer is reposted at the end) or a failure goes on the list.
    if ((c.wr_id() & send_queue::wr_id_tag) != 0 && c.ok()) {
      e->idle_since_ = {};
      e->stall_since_ = {};
    } else if (!e->wk_touched_) {
      if (ntouched_ == touched_.size()) [[unlikely]]
        settle_all();  // early: more doorbells, the same reposts
      e->wk_touched_ = true;
      touched_[ntouched_++] = e;
      ++e->polling_;  // its receive reposts wait for the end of this poll
    }
    e->template dispatch<1>(c);
    ++e->wk_handled_;
    ++handled;
  }
  if (--polling_ == 0) settle();
  return handled;
}

// The end of the outermost poll: each connection that got completions
// reposts its buffers with one doorbell and restarts its idle clocks.
inline void worker_core::settle() noexcept {
  // A receive pool's buffers first (one doorbell for every connection), so
  // that the credits they bring are reported below.
  if (pool_ && pool_->queued() != 0) [[unlikely]]
    flush_pool();
  for (std::uint32_t i = 0; i < ntouched_; ++i) touched_[i]->settle();
  ntouched_ = 0;
}

void worker_core::settle_all() noexcept {
  settle();
}

inline void engine::settle() noexcept {
  wk_touched_ = false;
  if (--polling_ == 0 && ring_.queued() != 0) repost_consumed();
  idle_since_ = {};
  stall_since_ = {};
  if (ring_.report_due() && connected_ && !failed_) [[unlikely]]
    report_credits();
}

int worker_core::progress() noexcept {
  thread_check::scope guard(thread_, "a worker's progress");
  if (holding_ != 0) [[unlikely]] {
    for (engine* e = head_[wl_all]; e != nullptr; e = e->wk_next_[wl_all]) e->flush_held();
  }
  if (stop_requests_.load(std::memory_order_acquire) != stops_seen_) [[unlikely]] {
    stops_seen_ = stop_requests_.load(std::memory_order_acquire);
    for (engine* e = head_[wl_all]; e != nullptr;) {
      engine* next = e->wk_next_[wl_all];
      if (e->stop_requests_.load(std::memory_order_acquire) != e->stops_seen_) e->housekeeping({});
      e = next;
    }
  }
  const int handled = poll();
  // Deferred operations wait for room or credits; credits come by RDMA
  // write and raise no completion, so these are looked at every time.
  for (engine* e = head_[wl_pumping]; e != nullptr;) [[unlikely]] {
      engine* next = e->wk_next_[wl_pumping];
      if (!e->deferred_.empty()) e->pump();
      if (e->deferred_.empty()) unlink(*e, wl_pumping);
      e = next;
    }
  // The clocks: every 1024 polls (whether busy or not, so that an idle peer
  // among busy ones is still probed), or every 64 while a bounded await exists.
  const bool clocks = (++polls_ & 1023) == 0;
  const bool bounded = head_[wl_bounded] != nullptr;
  if (clocks || (bounded && (++ticks_ & 63) == 0)) {
    const auto now = std::chrono::steady_clock::now();
    if (clocks && now - swept_ >= std::chrono::milliseconds(1)) {
      swept_ = now;
      sweep(now);
    } else if (bounded) {
      sweep_bounded(now);
    }
  }
  if (head_[wl_ready] != nullptr) resume();
  return handled;
}

// The clocks of at most 64 connections a sweep, going round from where the
// last one stopped: a sweep costs the same at 10 peers or 10,000, and every
// connection is looked at within ceil(N / 64) sweeps (a millisecond or more
// apart); the keepalive and stall bounds are hundreds of times longer. The
// bounded awaits' deadlines have their own list.
inline void worker_core::sweep(std::chrono::steady_clock::time_point now) noexcept {
  device_events(now);
  sweep_bounded(now);
  if (cursor_ == nullptr) cursor_ = head_[wl_all];
  for (int n = 0; n < 64 && cursor_ != nullptr; ++n) {
    engine* e = cursor_;
    cursor_ = e->wk_next_[wl_all];
    if (e->bounded_ == nullptr && e->housekeeping_due()) e->housekeeping(now);
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
// coroutine may destroy any connection, its own included: leave() clears the
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
  if (!channel_) return make_error_code(errc::not_ready);
  // Only the connections that posted unsignaled since the last arm: a
  // connection whose cover is refused lists itself again, at the head, which
  // this loop has passed.
  for (engine* e = head_[wl_uncovered]; e != nullptr;) {
    engine* next = e->wk_next_[wl_uncovered];
    unlink(*e, wl_uncovered);
    e->cover_all();
    e = next;
  }
  if (std::error_code ec = cq_.arm()) return ec;
  // Completions that came before arming raise no event: look once more.
  if (buf_head_ != buf_count_ || progress() > 0 || head_[wl_ready] != nullptr) {
    return std::make_error_code(std::errc::resource_unavailable_try_again);
  }
  return {};
}

inline void worker_core::ack_events() noexcept {
  if (!channel_) return;
  std::uint64_t v = 0;
  (void)!::read(wake_fd_, &v, sizeof v);
  unsigned n = 0;
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  while (::ibv_get_cq_event(channel_->native_handle(), &cq, &ctx) == 0) ++n;
  if (n != 0) ::ibv_ack_cq_events(cq_.native_handle(), n);
  // Neither a completion nor a stop: an rdma_cm link or the device's
  // asynchronous events, read now so that the descriptor does not stay
  // readable (one more system call, only on such a wake-up).
  if (n == 0 && v == 0) device_events({});
}

// How long a sleep may last: the next bounded await's deadline, a quarter
// keepalive or stall bound (tick_), and 1 ms while operations are deferred.
inline std::chrono::steady_clock::time_point worker_core::sleep_until(
    std::chrono::steady_clock::time_point now, std::chrono::steady_clock::time_point until) const noexcept {
  until = std::min(until, now + tick_);
  if (head_[wl_pumping] != nullptr) until = std::min(until, now + std::chrono::milliseconds(1));
  for (engine* e = head_[wl_bounded]; e != nullptr; e = e->wk_next_[wl_bounded])
    until = e->earliest_deadline(until);
  return until;
}

inline std::error_code worker_core::wait(std::chrono::milliseconds timeout) noexcept {
  if (!channel_) return make_error_code(errc::not_ready);
  if (progress() > 0) return {};
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
      e->link_checked_ = {};
      e->housekeeping(after);
    }
  }
  if (r == 0 || after - swept_ >= std::chrono::milliseconds(1)) {
    swept_ = after;
    sweep(after);
  }
  progress();
  if (r < 0 && err != EINTR) return {err, std::generic_category()};
  return r == 0 && after >= now + timeout ? make_error_code(errc::timed_out) : std::error_code{};
}

}  // namespace rdx::detail
