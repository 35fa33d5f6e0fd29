// rdx: the receive side of a connection's messages: its receive buffers (a
// registered ring of its own, or its part of a worker's receive pool), the
// arrival queues of messages and notifications, and the flow-control
// credits both ways.
//
// Credits: this side keeps a count (consumed) and tells the peer,
// piggybacked in the immediate of its own messages or by an RDMA write of
// the count into the peer's credit word once a quarter of recv_depth is
// owed. The peer may send while sent - count < recv_depth. With a ring of
// its own the count is the buffers it took and reposted; on a receive pool
// the pool moves it (detail/receive_pool.hpp), so a peer may hold from 0 to
// credit_cap_factor x recv_depth credits. Either way a message never meets
// a queue pair without a posted receive. A count from the peer that claims
// more than that is a protocol error, and so is a message beyond the
// credits given (on a pool, where the shared queue cannot refuse it). More in
// rdx's design notes (share/doc/rdx/design.md), "Wire protocols",
// "Messages and credits".
#pragma once

#include <rdx/channel/detail/index_fifo.hpp>
#include <rdx/channel/detail/receive_pool.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair_view.hpp>
#include <rdx/verbs/work_request.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>

namespace rdx::detail {

class message_ring {
public:
  //! The ring's own kinds of arrival; overrun: a message beyond the credits given (pool).
  enum class arrival { message, notification, failed, overrun };

  //! A ring of its own: depth buffers of message_size bytes, registered.
  message_ring(const protection_domain& pd, std::uint32_t depth, std::uint32_t message_size)
      : depth_(depth),
        size_(message_size),
        stride_(message_size),
        report_at_(std::max<std::uint32_t>(1, depth / 4)),
        buf_(std::in_place, pd, std::size_t{depth} * message_size),
        rx_own_(std::make_unique<rx_entry[]>(depth)),
        rx_(rx_own_.get()),
        base_(buf_->data()),
        messages_(depth),
        notes_(depth),
        chain_(std::make_unique<recv_wr[]>(depth)),
        control_(pd, 2, access::local_write) {
    // Each buffer's receive is built once (its wr_id is its index) and
    // posted as it is every time the buffer goes back.
    for (std::uint32_t i = 0; i < depth; ++i) {
      chain_[i] = wr::recv(buf_->sge(std::size_t{i} * size_, size_));
      chain_[i].id(i);
    }
  }
  //! Its part of a worker's receive pool: no buffers of its own; the pool
  //! gives its peer depth credits now (or refuses: errc::limit_exceeded).
  message_ring(const protection_domain& pd, receive_pool& pool, std::uint32_t depth,
               std::uint32_t message_size, void* owner)
      : depth_(depth),
        size_(message_size),
        stride_(pool.buffer_size()),
        report_at_(std::max<std::uint32_t>(1, depth / 4)),
        pool_(&pool),
        rx_(pool.entries()),
        base_(pool.data(0)),
        messages_(credit_cap_factor * depth),
        notes_(credit_cap_factor * depth),
        control_(pd, 2, access::local_write) {
    pool.join(share_, depth, owner);
  }

  message_ring(const message_ring&) = delete;
  message_ring& operator=(const message_ring&) = delete;
  // On a pool: the peer's credits and the buffers still held go back.
  ~message_ring() { leave_pool(); }

  [[nodiscard]] std::uint32_t depth() const noexcept { return depth_; }
  [[nodiscard]] std::uint32_t message_size() const noexcept { return size_; }
  [[nodiscard]] receive_pool* pool() const noexcept { return pool_; }
  [[nodiscard]] pool_share& share() noexcept { return share_; }
  //! wr_ids of receives are buffer indices (below depth, or the pool's size; no send_queue tag).
  [[nodiscard]] bool owns(std::uint64_t wr_id) const noexcept {
    return wr_id < (pool_ != nullptr ? pool_->size() : depth_);
  }

  //! Posts buffer i on qp (a ring of its own).
  [[nodiscard]] std::error_code post(queue_pair_view qp, std::uint32_t i) noexcept {
    std::error_code ec = qp.post_recv(chain_[i]);  // alone: post_recv clears its next
    if (!ec) {
      ++posted_;
    }
    return ec;
  }
  //! Queues buffer i, whose message was copied out (a receive, a
  //! notification), handed to a handler or given back by a view: on a ring
  //! of its own it waits until a batch of them is queued, so that a stream
  //! of messages reposts them with one ibv_post_recv per batch; while a view
  //! holds a buffer, and until the repost after the last one is given back,
  //! it is due at once (lend() and post_queued() set the batch to one), since
  //! the views' buffers and those held back could otherwise take every
  //! credit of the peer. On a pool, for the pool's next flush, with its credit.
  void queue_taken(std::uint32_t i) noexcept {
    if (pool_ != nullptr) [[unlikely]] {
      return queue_pooled(i);
    }
    link(i);
  }
  //! Links buffer i's receive behind those queued (its next is set when
  //! another is queued, or cleared when they are posted).
  void link(std::uint32_t i) noexcept {
    ibv_recv_wr& w = chain_[i].native();
    *link_ = &w;
    link_ = &w.next;
    ++queued_;
  }
  //! Buffer i goes back without its credit (the connection failed): to the
  //! pool; a ring of its own keeps it.
  void drop(std::uint32_t i) noexcept {
    if (pool_ != nullptr) {
      lend(i, nullptr);
      pool_->queue(i, nullptr);
    }
  }
  //! Buffers queued whose repost is due (0 while only taken ones below a
  //! batch wait; on a pool: queued to the pool since its last flush here;
  //! another connection's flush may have posted them).
  [[nodiscard]] std::uint32_t queued() const noexcept { return queued_ >= repost_at_ ? queued_ : 0; }
  //! On a pool: the pool was flushed.
  void flushed() noexcept { queued_ = 0; }
  //! Posts every queued buffer on qp with one ibv_post_recv (one doorbell):
  //! their receives, built once, were linked in the order queued.
  //! @param posted_now set to how many were posted (all, or those before the refused one)
  [[nodiscard]] std::error_code post_queued(queue_pair_view qp, std::uint32_t& posted_now) noexcept {
    posted_now = 0;
    if (queued_ == 0) {
      return detail::no_error();
    }
    ++repost_calls_;
    const std::uint32_t n = std::exchange(queued_, 0);
    repost_at_ = lent_ != 0 ? 1 : batch_;  // while a view holds a buffer, each at once (queue_taken)
    *link_ = nullptr;
    link_ = &first_;
    std::size_t posted = 0;
    const std::error_code ec = qp.post_recv_linked(chain_[first_->wr_id], n, posted);
    posted_now = static_cast<std::uint32_t>(posted);
    reposted_ += posted_now;
    posted_ += posted_now;
    return ec;
  }
  //! ibv_post_recv calls of post_queued (one doorbell each).
  [[nodiscard]] std::uint64_t repost_calls() const noexcept { return repost_calls_; }
  //! Buffers post_queued reposted in them.
  [[nodiscard]] std::uint64_t reposted() const noexcept { return reposted_; }
  //! Receives of its own posted and not yet completed (flushed ones included); 0 on a pool.
  [[nodiscard]] std::uint32_t posted() const noexcept { return posted_; }

  //! A receive completion: queues a notification; a message is the caller's to queue.
  arrival arrived(const completion& c) noexcept {
    const auto i = static_cast<std::uint32_t>(c.wr_id());
    rx_entry& e = rx_[i];
    if (pool_ != nullptr) [[unlikely]] {
      if (const arrival a = arrived_pooled(c, i); a != arrival::message) {
        return a;
      }
    } else {
      --posted_;
      if (!c.ok()) {
        return arrival::failed;
      }
    }
    e.bytes = c.byte_len();
    if (c.opcode() == IBV_WC_RECV_RDMA_WITH_IMM) {
      e.imm = c.imm();
      notes_.push(i);
      return arrival::notification;
    }
    if (c.has_imm() && serial_after(c.imm(), peer_piggy_)) {
      peer_piggy_ = c.imm();
    }
    return arrival::message;  // queued by the caller (queue_message), or handed over at once
  }
  //! Queues the message that arrived in buffer i (arrival::message), after those before it.
  void queue_message(std::uint32_t i) noexcept { messages_.push(i); }

  [[nodiscard]] std::uint32_t messages_waiting() const noexcept { return messages_.size(); }
  [[nodiscard]] std::uint32_t notifications_waiting() const noexcept { return notes_.size(); }
  //! Takes the oldest message (index of its buffer).
  std::uint32_t take_message() noexcept { return messages_.pop(); }
  std::uint32_t take_notification() noexcept { return notes_.pop(); }
  [[nodiscard]] const rx_entry& entry(std::uint32_t i) const noexcept { return rx_[i]; }
  //! Records who holds buffer i (a message_view), or nullptr once it is back.
  void lend(std::uint32_t i, void* holder) noexcept {
    const bool was_lent = rx_[i].lent != nullptr;
    if (holder != nullptr && !was_lent) {
      ++lent_;
      repost_at_ = 1;  // the buffers held back for a batch are due now (queue_taken)
    } else if (holder == nullptr && was_lent) {
      --lent_;
    }
    rx_[i].lent = holder;
  }
  //! Calls f(holder) for every lent buffer's holder and forgets them all;
  //! on a pool the buffers go back to it.
  template <class F>
  void recall_all(F&& f) noexcept {
    const std::uint32_t n = pool_ != nullptr ? pool_->size() : depth_;
    for (std::uint32_t i = 0; i < n && lent_ != 0; ++i) {
      if (pool_ != nullptr && rx_[i].owner != &share_) {
        continue;
      }
      if (void* h = rx_[i].lent) {
        lend(i, nullptr);
        f(h);
        drop(i);
      }
    }
  }
  //! On a pool: the peer's credits for a message arrived in buffer i
  //! (arrival::message: within them, to be queued as usual).
  [[gnu::noinline]] arrival arrived_pooled(const completion& c, std::uint32_t i) noexcept {
    if (!share_.active) {
      pool_->stray(i);
      return arrival::failed;
    }
    const bool within = pool_->arrived(share_);  // counts it against the credits given
    if (!c.ok() || !within) {
      pool_->queue(i, nullptr);
      return within ? arrival::failed : arrival::overrun;
    }
    rx_[i].owner = &share_;
    return arrival::message;
  }
  //! On a pool: buffer i goes back to it with its credit.
  [[gnu::noinline]] void queue_pooled(std::uint32_t i) noexcept {
    lend(i, nullptr);
    pool_->queue(i, &share_);
    ++queued_;  // the engine flushes the pool when it reposts
  }
  //! On a pool: every buffer still queued here goes back to it, and the
  //! peer's credits with them (the connection is going).
  void leave_pool() noexcept {
    if (pool_ == nullptr) {
      return;
    }
    pool_->retire(share_);
    while (!messages_.empty()) {
      pool_->queue(messages_.pop(), nullptr);
    }
    while (!notes_.empty()) {
      pool_->queue(notes_.pop(), nullptr);
    }
  }
  [[nodiscard]] const std::byte* data(std::uint32_t i) const noexcept {
    return base_ + std::size_t{i} * stride_;
  }

  // --- credits ---------------------------------------------------------------

  //! The peer's count: the later of its last credit write and its last
  //! piggybacked immediate.
  [[nodiscard]] std::uint32_t peer_consumed() const noexcept {
    const std::uint32_t written =
        std::atomic_ref<std::uint64_t>(control_[1]).load(std::memory_order_acquire) & 0xffffffffu;
    return serial_after(written, peer_piggy_) ? written : peer_piggy_;
  }
  //! False when the peer's count gives this side more credits than any
  //! peer may (credit_cap_factor x recv_depth).
  [[nodiscard]] bool peer_count_valid() const noexcept {
    return !serial_after(peer_consumed(), sent_ + (credit_cap_factor - 1) * depth_);
  }
  //! Messages this side may still send (0 for a count no peer may give:
  //! the send is deferred, and the deferral fails the connection).
  [[nodiscard]] std::uint32_t credits() const noexcept {
    const std::uint32_t left = peer_consumed() + depth_ - sent_;
    return left > most_credits_ ? 0 : left;
  }
  void count_sent() noexcept { ++sent_; }
  //! Messages and notifications this side sent.
  [[nodiscard]] std::uint32_t sent() const noexcept { return sent_; }
  //! The count to piggyback on an outgoing message (it counts as reported).
  [[nodiscard]] std::uint32_t piggyback() noexcept {
    reported_ = share_.consumed;
    return share_.consumed;
  }
  //! A ring of its own: n more buffers taken and reposted.
  void count_consumed(std::uint32_t n = 1) noexcept { share_.consumed += n; }
  //! True once a quarter of recv_depth (at least one) is owed to the peer.
  [[nodiscard]] bool report_due() const noexcept { return share_.consumed - reported_ >= report_at_; }
  //! On a pool, after a grant: a report is due, or the peer, as last told,
  //! has no credit left and something is owed.
  [[nodiscard]] bool grant_due() const noexcept {
    return report_due() || (share_.consumed != reported_ && reported_ + depth_ == share_.received);
  }
  //! The request that writes our count into the peer's credit word, held
  //! by value (the extended post API takes it with no ibv_send_wr built).
  [[nodiscard]] flat_wr credit_report(const remote_descriptor& peer_word) noexcept {
    control_[0] = share_.consumed;
    return flat_wr{.sge = control_.sge(0, 1), .remote_addr = peer_word.addr, .rkey = peer_word.rkey};
  }
  void reported() noexcept { reported_ = share_.consumed; }
  //! Our credit word: the 8 bytes the peer writes its count into (the
  //! connection grants exactly those; the region has no remote rights).
  [[nodiscard]] std::uint64_t* credit_word_address() const noexcept { return control_.data() + 1; }
  [[nodiscard]] const memory_region& control_region() const noexcept { return control_.region(); }

private:
  std::uint32_t depth_;
  std::uint32_t size_;
  std::uint32_t stride_;     // bytes from one buffer to the next
  std::uint32_t report_at_;  // credits owed that make a report due (report_due)
  std::uint32_t most_credits_ = credit_cap_factor * depth_;  // the most a peer may give
  receive_pool* pool_ = nullptr;
  std::optional<registered_buffer<std::byte>> buf_;  // a ring of its own
  std::unique_ptr<rx_entry[]> rx_own_;
  rx_entry* rx_;  // its own entries, or the pool's
  const std::byte* base_;
  index_fifo messages_, notes_;
  std::unique_ptr<recv_wr[]> chain_;  // buffer i's receive, built once, at i
  // The receives of the buffers queued (ring of its own), linked as they are
  // queued, in that order: first_, then each one's next up to link_.
  ibv_recv_wr* first_ = nullptr;
  ibv_recv_wr** link_ = &first_;  // where the next one queued is linked (the ring never moves)
  std::uint32_t queued_ = 0;
  // Handled buffers a ring of its own reposts together: a quarter of
  // recv_depth (as many as make a credit report due), 1 on a pool. Those
  // held back and the credits reposted but not yet reported are each fewer
  // than a quarter, so the peer keeps more than half of recv_depth.
  std::uint32_t batch_ = pool_ != nullptr ? 1 : report_at_;
  std::uint32_t repost_at_ = batch_;  // queued buffers that make a repost due (queued())
  std::uint64_t repost_calls_ = 0, reposted_ = 0;
  registered_buffer<std::uint64_t> control_;  // [0] our count, sent; [1] the peer's, written by it
  std::uint32_t posted_ = 0;
  std::uint32_t lent_ = 0;
  std::uint32_t sent_ = 0;        // messages and notifications sent
  std::uint32_t peer_piggy_ = 0;  // the peer's count, piggybacked
  pool_share share_{};            // consumed: our count (on a pool also what the pool gave)
  std::uint32_t reported_ = 0;    // the count as last told to the peer
};

}  // namespace rdx::detail
