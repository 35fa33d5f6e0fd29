// rdx: a protection domain (ibv_pd).
#pragma once

#include <rdx/detail/handle.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/context.hpp>

#include <infiniband/verbs.h>

#include <memory>

namespace rdx {

//! A protection domain. Move-only; keeps its context alive, and memory regions,
//! queue pairs and address handles keep it alive.
class protection_domain : detail::move_only {
public:
  //! @throws rdx::error when ibv_alloc_pd fails.
  explicit protection_domain(const context& ctx) {
    ibv_pd* pd = ::ibv_alloc_pd(ctx.native_handle());
    if (pd == nullptr) {
      detail::throw_errno("ibv_alloc_pd", ctx.name(), errno ? errno : ENOMEM);
    }
    h_ = detail::make_shared_verbs(pd, &::ibv_dealloc_pd, "ibv_dealloc_pd", {ctx.shared_handle()});
    ctx_ = ctx.shared_handle();
  }

  //! Takes ownership of pd, which must belong to ctx. @throws rdx::error on nullptr or a mismatch.
  [[nodiscard]] static protection_domain from_native_handle(const context& ctx, ibv_pd* pd) {
    detail::refuse_null(pd, "protection_domain::from_native_handle");
    if (pd->context != ctx.native_handle()) {
      detail::throw_rdx(errc::invalid_argument,
                        "protection_domain::from_native_handle: pd belongs to another context");
    }
    protection_domain r;
    r.h_ = detail::make_shared_verbs(pd, &::ibv_dealloc_pd, "ibv_dealloc_pd", {ctx.shared_handle()});
    r.ctx_ = ctx.shared_handle();
    return r;
  }

  //! The ibv_pd, still owned (nullptr when empty).
  [[nodiscard]] ibv_pd* native_handle() const noexcept { return h_.get(); }
  //! The ibv_context the domain was allocated on (nullptr when empty).
  [[nodiscard]] ibv_context* context_handle() const noexcept { return h_ ? h_->context : nullptr; }
  //! Gives up ownership. @throws rdx::error while objects created from it are alive.
  [[nodiscard]] ibv_pd* release() { return detail::release_verbs(h_, "protection_domain"); }
  //! Shared ownership of the native handle, for objects built on this one.
  [[nodiscard]] const std::shared_ptr<ibv_pd>& shared_handle() const noexcept { return h_; }
  //! True when it owns a domain (not default-constructed, moved from or released).
  explicit operator bool() const noexcept { return h_ != nullptr; }
  //! Another owner of the same domain (shares the native handle).
  [[nodiscard]] protection_domain share() const {
    protection_domain r;
    r.h_ = h_;
    r.ctx_ = ctx_;
    return r;
  }
  //! The context this domain was allocated on (a new owner sharing it).
  [[nodiscard]] context device_context() const { return context(ctx_); }

private:
  protection_domain() = default;
  std::shared_ptr<ibv_pd> h_;
  std::shared_ptr<ibv_context> ctx_;
};

}  // namespace rdx
