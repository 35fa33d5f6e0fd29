// rdx::detail: what backs a grant. By default one type 2 memory window per
// queue pair of the connection, each bound to its queue pair and to a
// registration of exactly the granted range (with no remote rights of its
// own), so the NIC enforces the range and a key is useless on any other
// queue pair; where the device has no type 2 windows, a registration of
// exactly the range with the granted rights. The connection lists its grants, binds
// them once its queue pairs are in RTS, and revokes them before it destroys
// its queue pairs.
#pragma once

#include <rdx/verbs/context.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/memory_window.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rdx {

//! What backs a grant; either way the NIC enforces exactly the granted range.
enum class grant_backing {
  //! memory_window where the device offers type 2 windows, else exact_registration.
  automatic,
  //! One type 2 memory window per queue pair over exactly the range: the NIC
  //! enforces the range, and a key works only on its own queue pair.
  memory_window,
  //! A registration of exactly the range: the NIC enforces the range, but
  //! the key works on every queue pair of the protection domain.
  exact_registration,
};

//! How to back a grant.
struct grant_options {
  grant_backing backing = grant_backing::automatic;  //!< what backs the grant
};

namespace detail {

class engine;

//! Whether the device can back grants with type 2 memory windows.
[[nodiscard]] inline bool device_has_type2_windows(const context& ctx) {
  const ibv_device_attr& a = ctx.query_device().raw.orig_attr;
  return a.max_mw > 0 &&
         (a.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
}

class grant_base {
public:
  grant_base(const grant_base&) = delete;
  grant_base& operator=(const grant_base&) = delete;

  //! True once revoke() ran, or the connection was destroyed: the keys are gone.
  [[nodiscard]] bool revoked() const noexcept { return revoked_; }
  //! memory_window or exact_registration (never automatic).
  [[nodiscard]] grant_backing backing() const noexcept { return backing_; }
  //! The key the peer uses on each queue pair of the connection, in order.
  [[nodiscard]] const std::vector<std::uint32_t>& keys() const noexcept { return rkeys_; }
  //! What backs the grant, in words (for logs and error messages).
  [[nodiscard]] std::string description() const {
    std::string s = std::to_string(bytes_) + " bytes, ";
    if (backing_ == grant_backing::memory_window) {
      s += std::to_string(windows_.size()) +
           (windows_.size() == 1 ? " type 2 memory window" : " type 2 memory windows") +
           " (one per queue pair, each bound to its queue pair)";
    } else {
      s += "an exact registration (the device has no type 2 memory windows, or it was asked for): the key "
           "works on every queue pair of the protection domain";
    }
    if (revoked_) {
      s += ", revoked";
    }
    return s;
  }

protected:
  grant_base(engine& e, const memory_region& mr, const void* addr, std::size_t bytes, access rights,
             grant_options opt);
  grant_base(grant_base&& o) noexcept;
  ~grant_base() { revoke(); }
  //! Makes every key invalid at once (deallocates the windows or deregisters
  //! the exact registration); a peer's later access fails at the NIC with a
  //! remote access error. Idempotent.
  void revoke() noexcept;

private:
  friend class engine;
  friend class grant_table;
  grant_base() = default;  // the connection's own credit-word grant
  engine* eng_ = nullptr;
  grant_base* prev_ = nullptr;
  grant_base* next_ = nullptr;
  std::uint64_t bytes_ = 0;
  access rights_ = access::none;
  grant_backing backing_ = grant_backing::memory_window;
  bool first_qp_only_ = false;  // the credit word: queue pair 0 only
  bool bound_ = false;
  bool revoked_ = false;
  std::vector<memory_window> windows_;
  std::optional<memory_region> exact_;  // exactly the range: under the windows, or the grant itself
  std::vector<std::uint32_t> rkeys_;
};

}  // namespace detail
}  // namespace rdx
