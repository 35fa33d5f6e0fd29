// rdx: a shared receive queue (ibv_srq): one pool of receives for many QPs.
#pragma once

#include <rdx/detail/handle.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/work_request.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>

namespace rdx {

//! Settings of a shared receive queue.
struct shared_receive_queue_attr {
  std::uint32_t max_wr = 256;  //!< checked against max_srq_wr
  std::uint32_t max_sge = 1;   //!< checked against max_sge
  std::uint32_t limit = 0;     //!< low-water mark for IBV_EVENT_SRQ_LIMIT_REACHED (0: off)
};

//! A shared receive queue. Move-only; keeps its protection domain alive; queue
//! pairs created with it keep it alive.
class shared_receive_queue : detail::move_only {
public:
  //! @throws rdx::error (errc::limit_exceeded) naming field, value and limit;
  //! rdx::error from ibv_create_srq otherwise.
  explicit shared_receive_queue(const protection_domain& pd, const shared_receive_queue_attr& attr = {}) {
    const context ctx = pd.device_context();
    device_attributes d = ctx.query_device();
    std::string obj = "shared_receive_queue on " + ctx.name();
    if (d.max_srq == 0) {
      detail::throw_rdx(errc::unsupported, obj + ": the device has no shared receive queues");
    }
    if (attr.max_wr == 0) {
      detail::throw_rdx(errc::invalid_argument, obj + ": max_wr = 0, need at least 1");
    }
    if (attr.max_wr > static_cast<std::uint32_t>(d.max_srq_wr)) {
      detail::throw_rdx(
          errc::limit_exceeded,
          detail::limit_message(obj, "max_wr", attr.max_wr, static_cast<std::uint64_t>(d.max_srq_wr)));
    }
    if (attr.max_sge > static_cast<std::uint32_t>(d.raw.orig_attr.max_srq_sge)) {
      detail::throw_rdx(errc::limit_exceeded,
                        detail::limit_message(obj, "max_sge", attr.max_sge,
                                              static_cast<std::uint64_t>(d.raw.orig_attr.max_srq_sge)));
    }
    ibv_srq_init_attr ia{};
    ia.attr.max_wr = attr.max_wr;
    ia.attr.max_sge = attr.max_sge;
    ia.attr.srq_limit = attr.limit;
    ibv_srq* srq = ::ibv_create_srq(pd.native_handle(), &ia);
    if (srq == nullptr) {
      detail::throw_errno("ibv_create_srq", ctx.name(), errno ? errno : EINVAL);
    }
    h_ = detail::make_shared_verbs(srq, &::ibv_destroy_srq, "ibv_destroy_srq", {pd.shared_handle()});
    max_wr_ = ia.attr.max_wr;
  }

  //! The ibv_srq, still owned (nullptr when empty).
  [[nodiscard]] ibv_srq* native_handle() const noexcept { return h_.get(); }
  //! Gives up ownership without destroying (nullptr when empty); the caller calls ibv_destroy_srq
  //! and keeps the protection domain alive.
  //! @throws rdx::error (errc::not_ready) while queue pairs using it are alive
  [[nodiscard]] ibv_srq* release() { return detail::release_verbs(h_, "shared_receive_queue"); }
  //! The shared reference that queue pairs using it hold, so it outlives them.
  [[nodiscard]] const std::shared_ptr<ibv_srq>& shared_handle() const noexcept { return h_; }
  //! True when it owns an SRQ (not default-constructed, moved from or released).
  explicit operator bool() const noexcept { return h_ != nullptr; }
  //! Receives it can hold (what the device granted).
  [[nodiscard]] std::uint32_t max_wr() const noexcept { return max_wr_; }

  //! Posts one receive. @return empty or the errno of ibv_post_srq_recv (ENOMEM: full).
  [[nodiscard]] std::error_code post_recv(recv_wr& w) noexcept {
    w.native().next = nullptr;
    ibv_recv_wr* bad = nullptr;
    return result(::ibv_post_srq_recv(h_.get(), &w.native(), &bad));
  }
  //! Posts one receive built in the call (wr::recv(...)).
  [[nodiscard]] std::error_code post_recv(recv_wr&& w) noexcept { return post_recv(w); }
  //! Posts a batch of receives with one call.
  [[nodiscard]] std::error_code post_recv(std::span<recv_wr> batch) noexcept {
    if (batch.empty()) {
      return {};
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      batch[i].native().next = i + 1 < batch.size() ? &batch[i + 1].native() : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    return result(::ibv_post_srq_recv(h_.get(), &batch[0].native(), &bad));
  }

private:
  static std::error_code result(int rc) noexcept {
    if (rc == 0) {
      return {};
    }
    return {rc > 0 ? rc : (errno != 0 ? errno : EINVAL), std::generic_category()};
  }
  std::shared_ptr<ibv_srq> h_;
  std::uint32_t max_wr_ = 0;
};

}  // namespace rdx
