// rdx::detail: a worker's receive pool (worker_attr::pool): one shared
// receive queue holding the message buffers of every connection on the
// worker, one registration for them and one for a shared set of send
// staging buffers, and the credits each connection's peer is given from it.
//
// Credits. A connection joins with recv_depth credits for its peer,
// reserved from the buffers posted and promised to nobody (refused when
// the pool has fewer). As the peer's messages are taken and their buffers
// reposted, the pool gives the credit back and one more (a busy peer grows
// towards credit_cap_factor x recv_depth) while buffers are free; when none
// are, a connection that holds more than its recv_depth gives the credit
// up to the connections waiting for one, in turn (the hungry list). So the
// credits promised never exceed the buffers posted (a correct peer never
// meets receiver-not-ready), every peer keeps at least recv_depth, and a
// peer that stops taking its messages holds only what it was given. A peer
// that sends beyond its credits takes buffers promised to others: its
// connection fails at that message (errc::protocol_error) and the buffers
// go back at once.
#pragma once

#include <rdx/channel/detail/index_fifo.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/shared_receive_queue.hpp>
#include <rdx/verbs/work_request.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace rdx {

//! A worker's shared receive pool (worker_attr::pool).
struct receive_pool_attr {
  //! Receive buffers shared by the worker's connections; 0: no pool (each
  //! connection keeps a ring of its own). A connection on the pool takes
  //! its recv_depth credits from these at construction.
  std::uint32_t buffers = 0;
  //! Bytes of each buffer: a connection's message_size must not exceed it.
  std::uint32_t buffer_size = 4096;
  //! Send staging buffers of buffer_size bytes shared by the connections
  //! (a send that does not go inline is copied into one); 0: as many as buffers.
  std::uint32_t staging = 0;
  //! Free buffers that busy peers do not grow into, kept for peers that
  //! join (a joining connection's recv_depth credits must be free at once);
  //! the default (~0): a quarter of buffers.
  std::uint32_t reserve = ~0u;
};

namespace detail {

//! A receiver may give its peer up to this many times recv_depth credits;
//! the sender fails a peer whose count claims more (errc::protocol_error).
inline constexpr std::uint32_t credit_cap_factor = 4;

// One connection's part of a pool (held by its message_ring).
struct pool_share {
  std::uint32_t depth = 0;     // recv_depth: the credits it keeps at least
  std::uint32_t consumed = 0;  // the count the peer is told: its credits are consumed + depth
  std::uint32_t received = 0;  // messages that arrived
  std::uint32_t returned = 0;  // its buffers reposted (with their credit)
  bool active = false;         // joined and not failed: its credits count
  bool hungry = false;         // on the hungry list
  bool granted = false;        // on the granted list (a credit report may be due)
  pool_share* next_hungry = nullptr;
  pool_share* next_granted = nullptr;
  void* owner = nullptr;  // its engine (the worker reports its credits)
  // Credits the peer still has: it may send messages received .. consumed + depth.
  [[nodiscard]] std::uint32_t out() const noexcept { return consumed + depth - received; }
  // Buffers it ties up: credits out and messages held.
  [[nodiscard]] std::uint32_t share() const noexcept { return consumed + depth - returned; }
  [[nodiscard]] std::uint32_t cap() const noexcept { return credit_cap_factor * depth; }
};

class receive_pool {
public:
  receive_pool(const protection_domain& pd, const receive_pool_attr& a)
      : size_(check(pd, a)),
        stride_(a.buffer_size),
        srq_(pd, shared_receive_queue_attr{.max_wr = a.buffers}),
        buf_(pd, std::size_t{a.buffers} * a.buffer_size),
        stage_(pd, std::size_t{staging_count(a)} * a.buffer_size),
        rx_(std::make_unique<rx_entry[]>(a.buffers)),
        chain_(std::make_unique<recv_wr[]>(a.buffers)),
        repost_(std::make_unique<std::uint32_t[]>(a.buffers)),
        credit_(std::make_unique<pool_share*[]>(a.buffers)),
        free_stage_(staging_count(a)),
        pd_handle_(pd.native_handle()),
        reserve_(a.reserve != ~0u ? a.reserve : a.buffers / 4) {
    for (std::uint32_t i = 0; i < size_; ++i) {
      chain_[i] = wr::recv(buf_.sge(std::size_t{i} * stride_, stride_));
      chain_[i].id(i);
      repost_[queued_] = i;
      credit_[queued_++] = nullptr;
    }
    for (std::uint32_t i = 0; i < staging_count(a); ++i) {
      free_stage_.push(i);
    }
    if (std::error_code ec = flush()) {
      throw error(ec, "worker: posting its receive pool");
    }
  }
  receive_pool(const receive_pool&) = delete;
  receive_pool& operator=(const receive_pool&) = delete;
  ~receive_pool() = default;

  [[nodiscard]] std::uint32_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint32_t buffer_size() const noexcept { return stride_; }
  [[nodiscard]] const shared_receive_queue& srq() const noexcept { return srq_; }
  [[nodiscard]] ibv_pd* pd() const noexcept { return pd_handle_; }
  [[nodiscard]] rx_entry* entries() const noexcept { return rx_.get(); }
  [[nodiscard]] const std::byte* data(std::uint32_t i) const noexcept {
    return buf_.data() + std::size_t{i} * stride_;
  }
  // Send staging, shared.
  [[nodiscard]] index_fifo& free_staging() noexcept { return free_stage_; }
  [[nodiscard]] std::byte* staging_base() const noexcept { return stage_.data(); }
  [[nodiscard]] std::uint32_t staging_lkey() const noexcept { return stage_.region().lkey(); }
  // Buffers posted and promised to no peer.
  [[nodiscard]] std::int64_t available() const noexcept { return avail_; }
  [[nodiscard]] std::uint64_t doorbells() const noexcept { return doorbells_; }

  // A connection joins with depth credits for its peer; refused when fewer are free.
  void join(pool_share& s, std::uint32_t depth, void* owner) {
    if (avail_ < depth) {
      throw_rdx(errc::limit_exceeded,
                "worker: its receive pool of " + std::to_string(size_) + " buffers has " +
                    std::to_string(std::max<std::int64_t>(avail_, 0)) +
                    " free for another peer, and this "
                    "connection's recv_depth is " +
                    std::to_string(depth) +
                    "; give the connections a smaller recv_depth, or make the worker with a larger "
                    "worker_attr::pool.buffers, or another worker");
    }
    avail_ -= depth;
    s = pool_share{};
    s.depth = depth;
    s.active = true;
    s.owner = owner;
  }
  // It gives its peer no more credits (failed or leaving): what the peer
  // still had goes back to the free count. Its buffers come back as they
  // are reposted.
  void retire(pool_share& s) noexcept {
    if (!s.active) {
      return;
    }
    s.active = false;
    // A peer that overran has none left (its overrun was counted as it came).
    const auto out = static_cast<std::int32_t>(s.out());
    if (out > 0) {
      avail_ += out;
    }
    drop(s);
  }
  // A message of s arrived in buffer i. False: beyond its credits.
  [[nodiscard]] bool arrived(pool_share& s) noexcept {
    ++s.received;
    if (static_cast<std::int32_t>(s.received - (s.consumed + s.depth)) > 0) [[unlikely]] {
      // It took a buffer promised to nobody (or to another peer): counted as such.
      --avail_;
      return false;
    }
    return true;
  }
  // Buffer i goes back; with s, its credit is s's to give again.
  void queue(std::uint32_t i, pool_share* s) noexcept {
    repost_[queued_] = i;
    credit_[queued_++] = s != nullptr && s->active ? s : nullptr;
    rx_[i].lent = nullptr;
    rx_[i].owner = nullptr;
  }
  [[nodiscard]] std::uint32_t queued() const noexcept { return queued_; }

  // Posts every queued buffer with one ibv_post_srq_recv, then gives their
  // credits (grants: the connections whose count moved, next_granted).
  [[nodiscard]] std::error_code flush() noexcept {
    if (queued_ == 0) {
      return no_error();
    }
    const std::uint32_t n = std::exchange(queued_, 0);
    ibv_recv_wr* bad = nullptr;
    ++doorbells_;
    const int rc = ::ibv_post_srq_recv(srq_.native_handle(),
                                       &link_receives(chain_.get(), repost_.get(), n).native(), &bad);
    const std::uint32_t ok = rc == 0 ? n : receives_before(chain_.get(), repost_.get(), n, bad);
    for (std::uint32_t k = 0; k < ok; ++k) {
      ++avail_;
      if (pool_share* s = credit_[k]) {
        ++s->returned;
        if (s->active) {
          give_back(*s);
        }
      }
    }
    if (hungry_ != nullptr && avail_ > 0) {
      serve_hungry();
    }
    if (rc == 0) {
      return no_error();
    }
    // Those not posted stay out of the pool (the worker's connections fail).
    return {rc > 0 ? rc : EINVAL, std::generic_category()};
  }
  // A message for a connection that gives no credits any more (failed or
  // gone) took buffer i: its credit went back to the free count when the
  // connection retired, so the buffer is taken from there, and goes back.
  void stray(std::uint32_t i) noexcept {
    --avail_;
    queue(i, nullptr);
  }
  // The connections whose credits grew since the last call, one at a time.
  pool_share* next_granted() noexcept {
    pool_share* s = granted_;
    if (s != nullptr) {
      granted_ = s->next_granted;
      s->granted = false;
      s->next_granted = nullptr;
    }
    return s;
  }
  // Off both lists (a connection that fails or leaves).
  void drop(pool_share& s) noexcept {
    unlist(hungry_, hungry_tail_, s, &pool_share::next_hungry, &pool_share::hungry);
    pool_share* tail = nullptr;
    unlist(granted_, tail, s, &pool_share::next_granted, &pool_share::granted);
  }

private:
  static std::uint32_t staging_count(const receive_pool_attr& a) noexcept {
    return a.staging != 0 ? a.staging : a.buffers;
  }
  static std::uint32_t check(const protection_domain& pd, const receive_pool_attr& a) {
    const std::string obj = "worker: receive pool on " + pd.device_context().name() + ": ";
    if (a.buffer_size == 0) {
      throw_rdx(errc::invalid_argument, obj + "buffer_size = 0, need at least 1");
    }
    if (a.buffers > (1u << 24)) {
      throw_rdx(errc::invalid_argument, obj + "buffers = " + std::to_string(a.buffers) + ", at most 2^24");
    }
    return a.buffers;
  }
  void grant(pool_share& s, std::uint32_t n) noexcept {
    s.consumed += n;
    avail_ -= n;
    if (!s.granted) {
      s.granted = true;
      s.next_granted = granted_;
      granted_ = &s;
    }
  }
  // s's buffer came back: its credit, and one more while buffers are free
  // and it holds less than its cap; but a peer above its recv_depth gives
  // it to those waiting.
  void give_back(pool_share& s) noexcept {
    const std::uint32_t share = s.share();
    if (hungry_ != nullptr && share >= s.depth) {
      return;  // serve_hungry() has it
    }
    const std::uint32_t room = share >= s.cap() ? 0 : s.cap() - share;
    const std::uint32_t want = std::min<std::uint32_t>(room, share < s.depth ? s.depth - share + 1 : 2);
    const std::uint32_t n = grantable(s, want);
    if (n != 0) {
      grant(s, n);
    }
    if (n < want) {
      wait_in_turn(s);
    }
  }
  // Of want credits for s: those that bring it back to its recv_depth come
  // from any free buffer; those beyond (growth) only from above the reserve.
  [[nodiscard]] std::uint32_t grantable(const pool_share& s, std::uint32_t want) const noexcept {
    const std::uint32_t share = s.share();
    const std::int64_t restore = share < s.depth ? std::min(want, s.depth - share) : 0;
    const std::int64_t free = std::max<std::int64_t>(avail_, 0);
    if (free <= restore) {
      return static_cast<std::uint32_t>(free);
    }
    const std::int64_t grow = std::clamp<std::int64_t>(avail_ - restore - reserve_, 0, want - restore);
    return static_cast<std::uint32_t>(restore + grow);
  }
  // s joins the end of the hungry list (once).
  void wait_in_turn(pool_share& s) noexcept {
    if (s.hungry) {
      return;
    }
    s.hungry = true;
    if (hungry_tail_ != nullptr) {
      hungry_tail_->next_hungry = &s;
    } else {
      hungry_ = &s;
    }
    hungry_tail_ = &s;
  }
  // One credit at a time to each waiting connection, in turn, while buffers are free.
  void serve_hungry() noexcept {
    while (hungry_ != nullptr && avail_ > 0) {
      pool_share& h = *hungry_;
      hungry_ = h.next_hungry;
      if (hungry_ == nullptr) {
        hungry_tail_ = nullptr;
      }
      h.next_hungry = nullptr;
      h.hungry = false;
      if (!h.active || h.share() >= h.cap()) {
        continue;
      }
      if (grantable(h, 1) == 0) {  // growth, and the free buffers are down to the reserve
        wait_in_turn(h);
        break;
      }
      grant(h, 1);
      if (h.share() < h.cap()) {
        wait_in_turn(h);
      }
    }
  }
  static void unlist(pool_share*& head, pool_share*& tail, pool_share& s, pool_share* pool_share::*next,
                     bool pool_share::*flag) noexcept {
    if (!(s.*flag)) {
      return;
    }
    s.*flag = false;
    pool_share* prev = nullptr;
    for (pool_share* p = head; p != nullptr; prev = p, p = p->*next) {
      if (p != &s) {
        continue;
      }
      (prev != nullptr ? prev->*next : head) = s.*next;
      if (tail == &s) {
        tail = prev;
      }
      s.*next = nullptr;
      return;
    }
  }

  std::uint32_t size_;
  std::uint32_t stride_;
  shared_receive_queue srq_;
  registered_buffer<std::byte> buf_;
  registered_buffer<std::byte> stage_;
  std::unique_ptr<rx_entry[]> rx_;
  std::unique_ptr<recv_wr[]> chain_;         // buffer i's receive, built once
  std::unique_ptr<std::uint32_t[]> repost_;  // buffers to post at the next flush
  std::unique_ptr<pool_share*[]> credit_;    // whose credit each of them carries (or none)
  std::uint32_t queued_ = 0;
  index_fifo free_stage_;
  ibv_pd* pd_handle_;
  std::int64_t avail_ = 0;  // posted and promised to nobody (below 0: a peer overran)
  std::int64_t reserve_;    // free buffers no peer grows into (kept for joining peers)
  std::uint64_t doorbells_ = 0;
  pool_share* hungry_ = nullptr;
  pool_share* hungry_tail_ = nullptr;
  pool_share* granted_ = nullptr;
};

}  // namespace detail
}  // namespace rdx
