// rdx: memory windows (ibv_mw): revocable remote access to part of a region.
#pragma once

#include <rdx/detail/handle.hpp>
#include <rdx/detail/random.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/work_request.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <system_error>

namespace rdx {

//! Memory window type: type1 binds by a verb (bind()), type2 by a work request (bind_wr()).
enum class mw_type : int { type1 = IBV_MW_TYPE_1, type2 = IBV_MW_TYPE_2 };

//! A memory window. Type 1 binds through bind() (a verb), type 2 through a work
//! request from bind_wr(); either way the peer gets remote() and loses access at
//! the next bind, unbind or invalidation. The region bound must have
//! access::mw_bind. Move-only; keeps its protection domain alive.
class memory_window : detail::move_only {
public:
  //! @throws rdx::error when ibv_alloc_mw fails (e.g. unsupported type).
  explicit memory_window(const protection_domain& pd, mw_type type = mw_type::type1) : type_(type) {
    ibv_mw* mw = ::ibv_alloc_mw(pd.native_handle(), static_cast<ibv_mw_type>(type));
    if (mw == nullptr) {
      detail::throw_errno("ibv_alloc_mw", type == mw_type::type1 ? "type 1" : "type 2",
                          errno ? errno : EOPNOTSUPP);
    }
    h_ = detail::make_shared_verbs(mw, &::ibv_dealloc_mw, "ibv_dealloc_mw", {pd.shared_handle()});
    rkey_ = mw->rkey;
    if (type == mw_type::type2) {
      next_rkey_ = detail::fresh_window_key(rkey_);
    }
  }

  //! The ibv_mw, still owned by this object.
  [[nodiscard]] ibv_mw* native_handle() const noexcept { return h_.get(); }
  //! Gives up ownership without deallocating (nullptr when empty); the caller calls ibv_dealloc_mw
  //! and keeps the protection domain alive.
  //! @throws rdx::error (errc::not_ready) while another owner shares the window
  [[nodiscard]] ibv_mw* release() { return detail::release_verbs(h_, "memory_window"); }
  //! Type 1 or type 2, as allocated.
  [[nodiscard]] mw_type type() const noexcept { return type_; }
  //! The rkey the window grants now (changes at every bind).
  [[nodiscard]] std::uint32_t rkey() const noexcept { return rkey_; }
  //! What the peer needs: the bound range and the current rkey.
  [[nodiscard]] remote_descriptor remote() const noexcept { return {addr_, rkey_, length_}; }

  //! Type 1: binds [offset, offset + len) of mr with rights through qp (in RTS).
  //! The bind completes on qp's send CQ (IBV_WC_BIND_MW) when signaled.
  //! @return empty; errc::out_of_range / invalid_argument before posting; or the verb's errno.
  [[nodiscard]] std::error_code bind(queue_pair& qp, const memory_region& mr, std::size_t offset,
                                     std::size_t len, access rights, const void* ctx = nullptr,
                                     bool signaled = true) noexcept {
    if (type_ != mw_type::type1) {
      return make_error_code(errc::invalid_argument);
    }
    if (offset > mr.length() || len > mr.length() - offset) {
      return make_error_code(errc::out_of_range);
    }
    ibv_mw_bind b{};
    b.wr_id = to_wr_id(ctx);
    b.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    b.bind_info = info(mr.native_handle(),
                       reinterpret_cast<std::uint64_t>(static_cast<char*>(mr.addr()) + offset), len, rights);
    return apply(qp, b, b.bind_info.addr, len);
  }
  //! Type 1: revokes the window (a zero-length bind over the region last bound,
  //! which must still be registered).
  [[nodiscard]] std::error_code unbind(queue_pair& qp, const void* ctx = nullptr,
                                       bool signaled = true) noexcept {
    if (type_ != mw_type::type1) {
      return make_error_code(errc::invalid_argument);
    }
    ibv_mw_bind b{};
    b.wr_id = to_wr_id(ctx);
    b.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    // A zero-length bind on the last region: some providers (rxe) dereference
    // the region even to unbind. A bound region cannot be deregistered, so it is alive.
    b.bind_info.mr = mr_;
    b.bind_info.addr = addr_;
    return apply(qp, b, 0, 0);
  }

  //! Type 2: the key the next bind_wr() gives the window (its key byte random
  //! from the OS CSPRNG, never the current one and never one step away from the
  //! last keys this process chose).
  [[nodiscard]] std::uint32_t next_rkey() const noexcept { return next_rkey_; }
  //! Type 2: a bind work request for [offset, offset + len) of mr; post it on a
  //! queue pair of the same PD. The window's rkey() becomes next_rkey() now,
  //! and a fresh next_rkey() is chosen.
  //! @pre the range lies inside mr.
  //! @throws rdx::error only if the OS CSPRNG fails.
  [[nodiscard]] send_wr bind_wr(const memory_region& mr, std::size_t offset, std::size_t len, access rights,
                                const void* ctx = nullptr) {
    return bind_wr(mr.native_handle(),
                   reinterpret_cast<std::uint64_t>(static_cast<char*>(mr.addr()) + offset), len, rights, ctx);
  }
  //! Type 2: the same for len bytes at addr inside the registered region mr.
  [[nodiscard]] send_wr bind_wr(ibv_mr* mr, std::uint64_t addr, std::size_t len, access rights,
                                const void* ctx = nullptr) {
    rkey_ = next_rkey_;
    next_rkey_ = detail::fresh_window_key(rkey_);
    const ibv_mw_bind_info bi = info(mr, addr, len, rights);
    addr_ = addr;
    length_ = len;
    return send_wr::make(IBV_WR_BIND_MW, std::span<const ibv_sge>(), ctx).bind(h_.get(), rkey_, bi);
  }
  //! Type 2: a local-invalidate work request that revokes the current rkey.
  [[nodiscard]] send_wr invalidate_wr(const void* ctx = nullptr) const noexcept {
    return wr::local_invalidate(rkey_, ctx);
  }

private:
  static ibv_mw_bind_info info(ibv_mr* mr, std::uint64_t addr, std::size_t len, access rights) noexcept {
    ibv_mw_bind_info bi{};
    bi.mr = mr;
    bi.addr = addr;
    bi.length = len;
    bi.mw_access_flags = static_cast<unsigned>(to_ibv(rights));
    return bi;
  }
  std::error_code apply(queue_pair& qp, ibv_mw_bind& b, std::uint64_t addr, std::uint64_t len) noexcept {
    if (qp.state() != qp_state::rts) {
      return make_error_code(errc::not_ready);
    }
    int rc = ::ibv_bind_mw(qp.native_handle(), h_.get(), &b);
    if (rc != 0) {
      return {rc > 0 ? rc : EINVAL, std::generic_category()};
    }
    rkey_ = h_->rkey;
    if (len != 0) {
      mr_ = b.bind_info.mr;
    }
    addr_ = addr;
    length_ = len;
    return {};
  }
  std::shared_ptr<ibv_mw> h_;
  mw_type type_;
  std::uint32_t rkey_ = 0;
  std::uint32_t next_rkey_ = 0;
  std::uint64_t addr_ = 0;
  std::uint64_t length_ = 0;
  ibv_mr* mr_ = nullptr;
};

}  // namespace rdx
