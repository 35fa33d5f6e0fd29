// rdx: an address handle (ibv_ah): where a UD send goes.
#pragma once

#include <rdx/detail/handle.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>

namespace rdx {

//! An address handle for unreliable-datagram sends. Move-only; keeps its
//! protection domain alive.
class address_handle : detail::move_only {
public:
  //! Addresses remote from local port, with the local GID at sgid_index.
  //! @throws rdx::error when ibv_create_ah fails (e.g. an unreachable GID).
  address_handle(const protection_domain& pd, const endpoint& remote, std::uint8_t port,
                 std::uint8_t sgid_index, std::uint8_t hop_limit = 64)
      : address_handle(pd, make_attr(remote, port, sgid_index, hop_limit)) {}

  //! From raw attributes. @throws rdx::error when ibv_create_ah fails.
  address_handle(const protection_domain& pd, ibv_ah_attr attr) {
    ibv_ah* ah = ::ibv_create_ah(pd.native_handle(), &attr);
    if (ah == nullptr) {
      detail::throw_errno(
          "ibv_create_ah",
          "port " + std::to_string(attr.port_num) + " to " +
              (attr.is_global != 0 ? to_string(attr.grh.dgid) : "LID " + std::to_string(attr.dlid)),
          errno ? errno : EINVAL);
    }
    h_ = detail::make_shared_verbs(ah, &::ibv_destroy_ah, "ibv_destroy_ah", {pd.shared_handle()});
  }

  //! The ibv_ah, still owned (nullptr when empty).
  [[nodiscard]] ibv_ah* native_handle() const noexcept { return h_.get(); }
  //! Gives up ownership without destroying (nullptr when empty); the caller calls ibv_destroy_ah
  //! and keeps the protection domain alive.
  //! @throws rdx::error (errc::not_ready) while another owner shares the handle
  [[nodiscard]] ibv_ah* release() { return detail::release_verbs(h_, "address_handle"); }
  //! True when it owns an address handle (not default-constructed, moved from or released).
  explicit operator bool() const noexcept { return h_ != nullptr; }

  //! The attributes used to reach remote: global routing whenever it has a GID.
  [[nodiscard]] static ibv_ah_attr make_attr(const endpoint& remote, std::uint8_t port,
                                             std::uint8_t sgid_index, std::uint8_t hop_limit = 64) noexcept {
    ibv_ah_attr a{};
    a.dlid = remote.lid;
    a.port_num = port;
    a.sl = 0;
    if (!gid_is_zero(remote.gid)) {
      a.is_global = 1;
      a.grh.dgid = remote.gid;
      a.grh.sgid_index = sgid_index;
      a.grh.hop_limit = hop_limit;
    }
    return a;
  }

private:
  std::shared_ptr<ibv_ah> h_;
};

}  // namespace rdx
