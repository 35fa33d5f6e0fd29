// rdx::detail: the small parts a message ring and a receive pool share: a
// fixed-capacity FIFO of buffer indices, what arrived in one receive buffer,
// and 32-bit serial-number order.
#pragma once

#include <rdx/verbs/work_request.hpp>

#include <bit>
#include <cstdint>
#include <memory>

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
  void* lent = nullptr;   // the message_view that holds the buffer, if one does
  void* owner = nullptr;  // in a receive pool: the connection's share whose message it holds
};

// Links the receives chain[order[0]] .. chain[order[n - 1]] (n > 0) into
// one list in that order, for one ibv_post_recv or ibv_post_srq_recv.
inline recv_wr& link_receives(recv_wr* chain, const std::uint32_t* order, std::uint32_t n) noexcept {
  for (std::uint32_t k = 0; k + 1 < n; ++k) {
    chain[order[k]].native().next = &chain[order[k + 1]].native();
  }
  chain[order[n - 1]].native().next = nullptr;
  return chain[order[0]];
}
// How many of a linked list's receives were posted before bad, the one the
// provider refused (n when bad names none of them).
[[nodiscard]] inline std::uint32_t receives_before(const recv_wr* chain, const std::uint32_t* order,
                                                   std::uint32_t n, const ibv_recv_wr* bad) noexcept {
  std::uint32_t k = 0;
  while (k < n && &chain[order[k]].native() != bad) {
    ++k;
  }
  return k;
}

}  // namespace rdx::detail
