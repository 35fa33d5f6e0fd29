// rdx::detail: a worker's connections: the worker made (its completion
// queue, descriptors and receive pool), the queue-pair table that finds a
// completion's connection in constant time, connections joining and leaving
// (their queue entries reserved and given back), and the intrusive lists of
// connections with work to finish. A part of detail/engine_all.hpp (include
// that).
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
        if (depth == 0) {
          depth = std::min(ctx.query_device().max_cqe, 65536);
        }
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
      if (wake_fd_ >= 0) {
        ::close(wake_fd_);
      }
      if (epoll_fd_ >= 0) {
        ::close(epoll_fd_);
      }
      throw error(std::error_code(e, std::generic_category()), "worker: eventfd or epoll_create1");
    }
    watch_fd(channel_->fd(), true, nullptr);
    watch_fd(wake_fd_, true, nullptr);
    if (device_events_ != nullptr) {
      watch_fd(ctx_.native_handle()->async_fd, true, this);
    }
  }
}

inline worker_core::~worker_core() {
  if (epoll_fd_ >= 0) {
    ::close(epoll_fd_);
  }
  if (wake_fd_ >= 0) {
    ::close(wake_fd_);
  }
}

// NOLINTNEXTLINE(readability-make-member-function-const): it changes the epoll set this worker owns.
void worker_core::watch_fd(int fd, bool on, void* owner) noexcept {
  if (epoll_fd_ < 0 || fd < 0) {
    return;
  }
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
  used_ = 0;
  for (const slot& s : old) {
    if (s.key == empty_key || s.key == gone_key) {
      continue;
    }
    std::size_t i = home(s.key);
    while (table_[i].key != empty_key) {
      i = (i + 1) & mask_;
    }
    table_[i] = s;
    ++used_;
  }
}

inline receive_pool* worker_core::pool(const protection_domain& pd, const connection_attr& attr) const {
  if (!pool_) {
    return nullptr;
  }
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

inline void worker_core::return_stray(const completion& c) noexcept {
  const std::uint64_t id = c.wr_id();
  if (pool_ && (id & send_queue::wr_id_tag) == 0 && id < pool_->size()) {
    pool_->stray(static_cast<std::uint32_t>(id));
  }
}

inline void worker_core::flush_pool() noexcept {
  if (!pool_) {
    return;
  }
  if (std::error_code ec = pool_->flush()) [[unlikely]] {
    // Buffers the shared queue refused are lost to every peer: all fail.
    for (engine* e = head_[wl_all]; e != nullptr; e = e->wk_next_[wl_all]) {
      e->fail(ec);
    }
  }
  while (pool_share* s = pool_->next_granted()) {
    auto* e = static_cast<engine*>(s->owner);
    if (e->connected_ && !e->failed_ && e->ring_.grant_due()) {
      e->report_credits();
    }
  }
}

inline void worker_core::add_connection(engine& e, int entries) {
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
  if (e.uncovered_.uncovered) {
    link(e, wl_uncovered);
  }
  // The shortest keepalive or stall bound sets how often the clocks are swept.
  if (e.attr_.keepalive.count() > 0) {
    tick_ = std::min(tick_, std::max(e.attr_.keepalive / 4, std::chrono::milliseconds(1)));
  }
  if (e.attr_.stall_timeout.count() > 0) {
    tick_ = std::min(tick_, std::max(e.attr_.stall_timeout / 4, std::chrono::milliseconds(1)));
  }
}

inline void worker_core::add_queue_pair(std::uint32_t qp_num, engine& e) {
  if ((used_ + 1) * 2 > table_.size()) {
    rehash(std::bit_ceil((keys_ + 1) * 4));
  }
  std::size_t i = home(qp_num);
  while (table_[i].key != empty_key && table_[i].key != gone_key && table_[i].key != qp_num) {
    i = (i + 1) & mask_;
  }
  if (table_[i].key == empty_key) {
    ++used_;
  }
  table_[i] = slot{qp_num, &e};
  ++keys_;
}

inline void worker_core::remove_connection(engine& e) noexcept {
  if (!e.joined_) {
    return;
  }
  e.joined_ = false;
  e.uncovered_.first = nullptr;
  for (const auto& q : e.qps_) {
    const std::uint32_t key = q.qp_num();
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (table_[i].key == empty_key) {
        break;
      }
      if (table_[i].key == key && table_[i].e == &e) {
        table_[i] = slot{gone_key, nullptr};
        --keys_;
        break;
      }
    }
  }
  if (cursor_ == &e) {
    cursor_ = e.wk_next_[wl_all];
  }
  for (std::uint8_t l = 0; l < wl_count; ++l) {
    unlink(e, static_cast<worker_list>(l));
  }
  for (resume_frame* f = frames_; f != nullptr; f = f->up) {
    if (f->e == &e) {
      f->e = nullptr;
    }
  }
  if (e.holds_ != 0) {
    holding_changed(-1);
  }
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
      if (buf_[i].qp_num() != q.qp_num()) {
        continue;
      }
      return_stray(buf_[i]);
      buf_[i] = completion{};
    }
  }
}

inline void worker_core::link(engine& e, worker_list l) noexcept {
  if (e.wk_in_[l]) {
    return;
  }
  e.wk_in_[l] = true;
  e.wk_prev_[l] = nullptr;
  e.wk_next_[l] = head_[l];
  if (head_[l] != nullptr) {
    head_[l]->wk_prev_[l] = &e;
  }
  head_[l] = &e;
}

inline void worker_core::unlink(engine& e, worker_list l) noexcept {
  if (!e.wk_in_[l]) {
    return;
  }
  e.wk_in_[l] = false;
  if (e.wk_prev_[l] != nullptr) {
    e.wk_prev_[l]->wk_next_[l] = e.wk_next_[l];
  } else {
    head_[l] = e.wk_next_[l];
  }
  if (e.wk_next_[l] != nullptr) {
    e.wk_next_[l]->wk_prev_[l] = e.wk_prev_[l];
  }
  e.wk_next_[l] = e.wk_prev_[l] = nullptr;
}

inline engine* worker_core::pop(worker_list l) noexcept {
  engine* e = head_[l];
  if (e != nullptr) {
    unlink(*e, l);
  }
  return e;
}

inline void worker_core::bounded_changed(engine& e, bool on) noexcept {
  if (on) {
    link(e, wl_bounded);
    if (tick_in_ > 64) {  // its deadline is looked at within 64 polls
      polls_ += tick_len_ - tick_in_;
      tick_len_ = tick_in_ = 64;
    }
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

}  // namespace rdx::detail
