// rdx::detail: a connection's send slots: the staging buffers a send's
// payload is copied into when it cannot go inline or must wait, and the
// 8-byte result slots of its atomics. Staging is the connection's own
// (2 x recv_depth buffers of message_size) or, on a worker's receive pool,
// the pool's shared staging; the atomic slots are always its own.
#pragma once

#include <rdx/channel/detail/index_fifo.hpp>
#include <rdx/channel/detail/receive_pool.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace rdx::detail {

class send_slots {
public:
  static constexpr std::uint32_t atomic_count = 64;

  // pool: the receive pool whose staging the sends share, or nullptr for staging of its own.
  send_slots(const protection_domain& pd, std::uint32_t recv_depth, std::uint32_t message_size,
             receive_pool* pool)
      : own_(pool != nullptr ? std::nullopt
                             : std::optional<registered_buffer<std::byte>>(
                                   std::in_place, pd, std::size_t{2} * recv_depth * message_size)),
        atomics_(pd, atomic_count),
        own_free_(pool != nullptr ? 1 : 2 * recv_depth),
        free_atomics_(atomic_count) {
    if (pool != nullptr) {
      free_ = &pool->free_staging();
      base_ = pool->staging_base();
      lkey_ = pool->staging_lkey();
      stride_ = pool->buffer_size();
    } else {
      free_ = &own_free_;
      base_ = own_->data();
      lkey_ = own_->region().lkey();
      stride_ = message_size;
      for (std::uint32_t i = 0; i < 2 * recv_depth; ++i) {
        own_free_.push(i);
      }
    }
    for (std::uint32_t i = 0; i < atomic_count; ++i) {
      free_atomics_.push(i);
    }
  }
  send_slots(const send_slots&) = delete;  // free_ may point into itself
  send_slots& operator=(const send_slots&) = delete;
  ~send_slots() = default;

  // --- staging ---
  [[nodiscard]] bool staging_empty() const noexcept { return free_->empty(); }
  [[nodiscard]] std::uint32_t take_staging() noexcept { return free_->pop(); }
  void give_staging(std::uint32_t slot) noexcept { free_->push(slot); }
  [[nodiscard]] std::byte* staging(std::uint32_t slot) const noexcept {
    return base_ + std::size_t{slot} * stride_;
  }
  [[nodiscard]] ibv_sge staging_sge(std::uint32_t slot, std::uint32_t bytes) const noexcept {
    return ibv_sge{reinterpret_cast<std::uint64_t>(staging(slot)), bytes, lkey_};
  }

  // --- atomic result slots ---
  [[nodiscard]] bool atomics_empty() const noexcept { return free_atomics_.empty(); }
  [[nodiscard]] std::uint32_t take_atomic() noexcept { return free_atomics_.pop(); }
  void give_atomic(std::uint32_t slot) noexcept { free_atomics_.push(slot); }
  [[nodiscard]] ibv_sge atomic_sge(std::uint32_t slot) const noexcept { return atomics_.sge(slot, 1); }
  [[nodiscard]] std::uint64_t atomic_result(std::uint32_t slot) const noexcept { return atomics_[slot]; }

private:
  std::optional<registered_buffer<std::byte>> own_;  // none on a receive pool
  registered_buffer<std::uint64_t> atomics_;
  index_fifo own_free_, free_atomics_;
  index_fifo* free_ = nullptr;  // own_free_, or the pool's
  std::byte* base_ = nullptr;
  std::uint32_t lkey_ = 0;
  std::uint32_t stride_ = 0;
};

}  // namespace rdx::detail
