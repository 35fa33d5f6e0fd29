// rdx: the receive side of a connection's messages: a registered ring of
// pre-posted receive buffers, the arrival queues of messages and
// notifications, and the flow-control credits both ways.
//
// Credits: this side counts the buffers it took and reposted (consumed) and
// tells the peer, piggybacked in the immediate of its own messages or by an
// RDMA write of the count into the peer's credit word once a quarter of the
// ring is owed. The peer may send while sent - consumed_by_peer < depth, so
// a message never meets a queue pair without a posted receive. A count from
// the peer that claims more than was sent is a protocol error.
#pragma once

#include <rdx/error.hpp>
#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/work_request.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

namespace rdx::detail {

[[nodiscard]] inline bool serial_after(std::uint32_t a, std::uint32_t b) noexcept {
  return static_cast<std::int32_t>(a - b) > 0;
}

// A fixed-capacity FIFO of indices.
class index_fifo {
public:
  // Its ring has a power-of-two size (capacity rounded up): a mask, not a
  // division, on every push and pop (a 64-bit division is tens of cycles).
  explicit index_fifo(std::uint32_t capacity)
      : buf_(std::make_unique<std::uint32_t[]>(std::bit_ceil(capacity))),
        mask_(std::bit_ceil(capacity) - 1) {}
  [[nodiscard]] bool empty() const noexcept { return head_ == tail_; }
  [[nodiscard]] std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(tail_ - head_); }
  void push(std::uint32_t v) noexcept { buf_[tail_++ & mask_] = v; }
  std::uint32_t pop() noexcept { return buf_[head_++ & mask_]; }

private:
  std::unique_ptr<std::uint32_t[]> buf_;
  std::uint64_t mask_, head_ = 0, tail_ = 0;
};

// What arrived in one receive buffer.
struct rx_entry {
  std::uint32_t bytes = 0;
  std::uint32_t imm = 0;
  bool posted = false;
  void* lent = nullptr;  // the message_view that holds the buffer, if one does
};

class message_ring {
public:
  //! The ring's own kinds of arrival.
  enum class arrival { message, notification, failed };

  message_ring(const protection_domain& pd, std::uint32_t depth, std::uint32_t message_size)
      : depth_(depth),
        size_(message_size),
        report_at_(std::max<std::uint32_t>(1, depth / 4)),
        buf_(pd, std::size_t{depth} * message_size),
        rx_(std::make_unique<rx_entry[]>(depth)),
        messages_(depth),
        notes_(depth),
        repost_(std::make_unique<std::uint32_t[]>(depth)),
        chain_(std::make_unique<recv_wr[]>(depth)),
        control_(pd, 2, access::local_write) {
    // Each buffer's receive is built once (its wr_id is its index) and
    // posted as it is every time the buffer goes back.
    for (std::uint32_t i = 0; i < depth; ++i) {
      chain_[i] = wr::recv(buf_.sge(std::size_t{i} * size_, size_));
      chain_[i].id(i);
    }
  }

  [[nodiscard]] std::uint32_t depth() const noexcept { return depth_; }
  [[nodiscard]] std::uint32_t message_size() const noexcept { return size_; }
  //! wr_ids of receives are buffer indices (below depth; no send_queue tag).
  [[nodiscard]] bool owns(std::uint64_t wr_id) const noexcept { return wr_id < depth_; }

  //! Posts buffer i on qp.
  [[nodiscard]] std::error_code post(queue_pair& qp, std::uint32_t i) noexcept {
    std::error_code ec = qp.post_recv(chain_[i]);  // alone: post_recv clears its next
    if (!ec) {
      rx_[i].posted = true;
      ++posted_;
    }
    return ec;
  }
  //! Queues buffer i (its message was taken) for post_queued().
  void queue_repost(std::uint32_t i) noexcept { repost_[queued_++] = i; }
  //! Buffers queued for reposting.
  [[nodiscard]] std::uint32_t queued() const noexcept { return queued_; }
  //! Posts every queued buffer on qp with one ibv_post_recv (one doorbell):
  //! their receives, built once, are linked in the order queued.
  //! @param posted_now set to how many were posted (all, or those before the refused one)
  [[nodiscard]] std::error_code post_queued(queue_pair& qp, std::uint32_t& posted_now) noexcept {
    posted_now = 0;
    if (queued_ == 0) return detail::no_error();
    ++repost_calls_;
    const std::uint32_t n = std::exchange(queued_, 0);
    for (std::uint32_t k = 0; k + 1 < n; ++k)
      chain_[repost_[k]].native().next = &chain_[repost_[k + 1]].native();
    chain_[repost_[n - 1]].native().next = nullptr;
    ibv_recv_wr* bad = nullptr;
    const std::error_code ec = qp.post_recv_linked(chain_[repost_[0]], bad);
    if (ec) {
      std::uint32_t k = 0;
      while (k < n && &chain_[repost_[k]].native() != bad) ++k;
      posted_now = k < n ? k : 0;  // a refusal that names no request of the chain: none counted
    } else {
      posted_now = n;
    }
    reposted_ += posted_now;
    for (std::uint32_t k = 0; k < posted_now; ++k) rx_[repost_[k]].posted = true;
    posted_ += posted_now;
    return ec;
  }
  //! ibv_post_recv calls of post_queued (one doorbell each).
  [[nodiscard]] std::uint64_t repost_calls() const noexcept { return repost_calls_; }
  //! Buffers post_queued reposted in them.
  [[nodiscard]] std::uint64_t reposted() const noexcept { return reposted_; }
  //! Receives posted and not yet completed (flushed ones included).
  [[nodiscard]] std::uint32_t posted() const noexcept { return posted_; }

  //! A receive completion: queues the message or notification.
  arrival arrived(const completion& c) noexcept {
    rx_entry& e = rx_[c.wr_id()];
    e.posted = false;
    --posted_;
    if (!c.ok()) return arrival::failed;
    e.bytes = c.byte_len();
    if (c.opcode() == IBV_WC_RECV_RDMA_WITH_IMM) {
      e.imm = c.imm();
      notes_.push(static_cast<std::uint32_t>(c.wr_id()));
      return arrival::notification;
    }
    if (c.has_imm() && serial_after(c.imm(), peer_piggy_)) peer_piggy_ = c.imm();
    messages_.push(static_cast<std::uint32_t>(c.wr_id()));
    return arrival::message;
  }

  [[nodiscard]] std::uint32_t messages_waiting() const noexcept { return messages_.size(); }
  [[nodiscard]] std::uint32_t notifications_waiting() const noexcept { return notes_.size(); }
  //! Takes the oldest message (index of its buffer).
  std::uint32_t take_message() noexcept { return messages_.pop(); }
  std::uint32_t take_notification() noexcept { return notes_.pop(); }
  [[nodiscard]] const rx_entry& entry(std::uint32_t i) const noexcept { return rx_[i]; }
  //! Records who holds buffer i (a message_view), or nullptr once it is back.
  void lend(std::uint32_t i, void* holder) noexcept {
    lent_ += (holder != nullptr) - (rx_[i].lent != nullptr);
    rx_[i].lent = holder;
  }
  //! Calls f(holder) for every lent buffer's holder and forgets them all.
  template <class F>
  void recall_all(F&& f) noexcept {
    for (std::uint32_t i = 0; i < depth_ && lent_ != 0; ++i) {
      if (void* h = std::exchange(rx_[i].lent, nullptr)) {
        --lent_;
        f(h);
      }
    }
  }
  [[nodiscard]] const std::byte* data(std::uint32_t i) const noexcept {
    return buf_.data() + std::size_t{i} * size_;
  }

  // --- credits ---------------------------------------------------------------

  //! The peer's count of taken buffers: the larger of its last credit write
  //! and its last piggybacked immediate.
  [[nodiscard]] std::uint32_t peer_consumed() const noexcept {
    const std::uint32_t written =
        std::atomic_ref<std::uint64_t>(control_[1]).load(std::memory_order_acquire) & 0xffffffffu;
    return serial_after(written, peer_piggy_) ? written : peer_piggy_;
  }
  //! False when the peer claims to have taken more than this side sent.
  [[nodiscard]] bool peer_count_valid() const noexcept { return !serial_after(peer_consumed(), sent_); }
  //! Messages this side may still send.
  [[nodiscard]] std::uint32_t credits() const noexcept {
    const std::uint32_t used = sent_ - peer_consumed();
    return used >= depth_ ? 0 : depth_ - used;
  }
  void count_sent() noexcept { ++sent_; }
  //! Messages and notifications this side sent.
  [[nodiscard]] std::uint32_t sent() const noexcept { return sent_; }
  //! The consumed count to piggyback on an outgoing message (it counts as reported).
  [[nodiscard]] std::uint32_t piggyback() noexcept {
    reported_ = consumed_;
    return consumed_;
  }
  void count_consumed(std::uint32_t n = 1) noexcept { consumed_ += n; }
  //! True once a quarter of the ring (at least one buffer) is owed to the peer.
  [[nodiscard]] bool report_due() const noexcept { return consumed_ - reported_ >= report_at_; }
  //! The request that writes our count into the peer's credit word.
  [[nodiscard]] send_wr credit_report(const remote_descriptor& peer_word) noexcept {
    control_[0] = consumed_;
    return wr::write(control_.sge(0, 1), remote_ptr{peer_word.addr, peer_word.rkey});
  }
  void reported() noexcept { reported_ = consumed_; }
  //! Our credit word: the 8 bytes the peer writes its count into (the
  //! connection grants exactly those; the region has no remote rights).
  [[nodiscard]] std::uint64_t* credit_word_address() const noexcept { return control_.data() + 1; }
  [[nodiscard]] const memory_region& control_region() const noexcept { return control_.region(); }

private:
  std::uint32_t depth_;
  std::uint32_t size_;
  std::uint32_t report_at_;  // credits owed that make a report due (report_due)
  registered_buffer<std::byte> buf_;
  std::unique_ptr<rx_entry[]> rx_;
  index_fifo messages_, notes_;
  std::unique_ptr<std::uint32_t[]> repost_;  // buffers taken, not reposted yet
  std::unique_ptr<recv_wr[]> chain_;         // buffer i's receive, built once, at i
  std::uint32_t queued_ = 0;
  std::uint64_t repost_calls_ = 0, reposted_ = 0;
  registered_buffer<std::uint64_t> control_;  // [0] our count, sent; [1] the peer's, written by it
  std::uint32_t posted_ = 0;
  std::uint32_t lent_ = 0;
  std::uint32_t sent_ = 0;        // messages and notifications sent
  std::uint32_t peer_piggy_ = 0;  // the peer's consumed count, piggybacked
  std::uint32_t consumed_ = 0;    // buffers we took and reposted
  std::uint32_t reported_ = 0;    // consumed_ as last told to the peer
};

}  // namespace rdx::detail
