// rdx: a non-owning view of a queue pair, for the parts that only post
// through one (a channel's send queue and message ring, the GPU staging
// pipeline): it posts and reads what posting needs, and can neither change
// the queue pair's state nor destroy it.
#pragma once

#include <rdx/verbs/queue_pair.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>

namespace rdx {

//! Posts through a queue_pair it does not own. Made from a queue_pair
//! (implicitly); the queue pair must outlive the view and stay where it is
//! (not moved). Copying a view copies the reference.
class queue_pair_view {
public:
  //! A view of qp (implicit: a queue pair is passed where a view is taken).
  queue_pair_view(queue_pair& qp) noexcept : qp_(&qp) {}  // NOLINT(google-explicit-constructor)

  //! As queue_pair::post_send(send_wr&).
  [[nodiscard, gnu::always_inline]] std::error_code post_send(send_wr& w) const noexcept {
    return qp_->post_send(w);
  }
  //! As queue_pair::post_send(flat_wr&).
  [[nodiscard, gnu::always_inline]] std::error_code post_send(flat_wr& f) const noexcept {
    return qp_->post_send(f);
  }
  //! As queue_pair::post_send(std::span<send_wr>, std::size_t&).
  [[nodiscard]] std::error_code post_send(std::span<send_wr> batch, std::size_t& posted) const noexcept {
    return qp_->post_send(batch, posted);
  }
  //! As queue_pair::post_send(std::span<send_wr>).
  [[nodiscard]] std::error_code post_send(std::span<send_wr> batch) const noexcept {
    return qp_->post_send(batch);
  }
  //! As queue_pair::post_recv(recv_wr&).
  [[nodiscard]] std::error_code post_recv(recv_wr& w) const noexcept { return qp_->post_recv(w); }
  //! As queue_pair::post_recv_linked.
  [[nodiscard, gnu::always_inline]] std::error_code post_recv_linked(recv_wr& first, std::size_t count,
                                                                     std::size_t& posted) const noexcept {
    return qp_->post_recv_linked(first, count, posted);
  }

  //! The queue pair's number.
  [[nodiscard]] std::uint32_t qp_num() const noexcept { return qp_->qp_num(); }
  //! Payloads up to this many bytes go inline.
  [[nodiscard]] std::uint32_t max_inline_data() const noexcept { return qp_->max_inline_data(); }
  //! The capacities the provider gave it.
  [[nodiscard]] const ibv_qp_cap& caps() const noexcept { return qp_->caps(); }
  //! Its state as rdx last set it.
  [[nodiscard]] qp_state state() const noexcept { return qp_->state(); }
  //! "QP 0x12", for messages.
  [[nodiscard]] std::string name() const { return qp_->name(); }

private:
  queue_pair* qp_;
};

}  // namespace rdx
