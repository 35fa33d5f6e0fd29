// rdx: fixed-capacity batches of work requests, posted with one call.
#pragma once

#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/work_request.hpp>

#include <array>
#include <cstddef>
#include <memory>
#include <new>
#include <span>
#include <system_error>
#include <type_traits>
#include <utility>

namespace rdx {

//! Up to N work requests posted with one ibv_post_send or ibv_post_recv (one
//! doorbell). No allocation: storage is inline. emplace() builds a request in
//! that storage; push() copies one built elsewhere.
template <class Wr, std::size_t N>
class basic_batch {
public:
  static_assert(N > 0);
  //! Appends a request; false when the batch is full.
  [[nodiscard]] bool push(const Wr& w) noexcept {
    if (size_ == N) {
      return false;
    }
    wrs_[size_++] = w;
    return true;
  }
  //! Builds the next request in place from make(), a builder call such as
  //! [&] { return wr::write(sge, to); }: its result is constructed in the
  //! batch's storage, never built elsewhere and copied. False (make() not
  //! called) when the batch is full.
  template <class Make>
  [[nodiscard]] bool emplace(Make&& make) noexcept(std::is_nothrow_invocable_v<Make>) {
    static_assert(std::is_same_v<std::invoke_result_t<Make>, Wr>, "make() returns the request by value");
    static_assert(std::is_trivially_destructible_v<Wr>);
    if (size_ == N) {
      return false;
    }
    Wr* slot = &wrs_[size_];
    std::destroy_at(slot);
    ::new (static_cast<void*>(slot)) Wr(std::forward<Make>(make)());
    ++size_;
    return true;
  }
  //! Empties the batch (post() does it after a successful post).
  void clear() noexcept { size_ = 0; }
  //! Requests in the batch.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! N, the most requests the batch holds.
  [[nodiscard]] static constexpr std::size_t capacity() noexcept { return N; }
  //! True when the batch holds no request.
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  //! True when push() would refuse.
  [[nodiscard]] bool full() const noexcept { return size_ == N; }
  //! The requests pushed so far, in order.
  [[nodiscard]] std::span<Wr> requests() noexcept { return {wrs_.data(), size_}; }
  //! Request i; not bounds-checked.
  [[nodiscard]] Wr& operator[](std::size_t i) noexcept { return wrs_[i]; }

private:
  std::array<Wr, N> wrs_{};
  std::size_t size_ = 0;
};

//! Up to N send requests, posted with one ibv_post_send.
template <std::size_t N>
using send_batch = basic_batch<send_wr, N>;
//! Up to N receive requests, posted with one ibv_post_recv.
template <std::size_t N>
using recv_batch = basic_batch<recv_wr, N>;

//! Posts a send batch with one call; on success the batch is cleared.
//! @param posted as queue_pair::post_send(std::span<send_wr>, std::size_t&).
template <std::size_t N>
[[nodiscard]] std::error_code post(queue_pair& qp, send_batch<N>& batch, std::size_t& posted) noexcept {
  std::error_code ec = qp.post_send(batch.requests(), posted);
  if (!ec) {
    batch.clear();
  }
  return ec;
}
//! Posts a send batch with one call; on success the batch is cleared.
template <std::size_t N>
[[nodiscard]] std::error_code post(queue_pair& qp, send_batch<N>& batch) noexcept {
  std::size_t posted = 0;
  return post(qp, batch, posted);
}
//! Posts a receive batch with one call; on success the batch is cleared.
//! @param posted as queue_pair::post_recv(std::span<recv_wr>, std::size_t&).
template <std::size_t N>
[[nodiscard]] std::error_code post(queue_pair& qp, recv_batch<N>& batch, std::size_t& posted) noexcept {
  std::error_code ec = qp.post_recv(batch.requests(), posted);
  if (!ec) {
    batch.clear();
  }
  return ec;
}
//! Posts a receive batch with one call; on success the batch is cleared.
template <std::size_t N>
[[nodiscard]] std::error_code post(queue_pair& qp, recv_batch<N>& batch) noexcept {
  std::size_t posted = 0;
  return post(qp, batch, posted);
}

}  // namespace rdx
