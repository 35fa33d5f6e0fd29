// rdx::detail: a connection's table of grants: the list of its grants (each
// revoked before the queue pairs go), the union of their rights (what the
// queue pairs must allow), the grant of its own credit word, and the keys
// the peer gave for each of its windows, one per queue pair. Backing,
// binding and revoking a grant are the engine's (detail/engine_parts/grants.hpp): they
// need its queue pairs.
#pragma once

#include <rdx/channel/detail/grant_base.hpp>
#include <rdx/channel/operation.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/context.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace rdx::detail {

class grant_table {
public:
  explicit grant_table(const context& ctx) : windows_supported_(device_has_type2_windows(ctx)) {
    credit_.first_qp_only_ = true;
  }
  grant_table(const grant_table&) = delete;
  grant_table& operator=(const grant_table&) = delete;
  ~grant_table() = default;

  //! Whether the device has type 2 memory windows (else grants are exact registrations).
  [[nodiscard]] bool windows_supported() const noexcept { return windows_supported_; }
  //! The grant of the connection's own credit word (queue pair 0 only).
  [[nodiscard]] grant_base& credit() noexcept { return credit_; }
  [[nodiscard]] const grant_base& credit() const noexcept { return credit_; }
  [[nodiscard]] grant_base* first() const noexcept { return head_; }
  [[nodiscard]] static grant_base* next(const grant_base& g) noexcept { return g.next_; }

  // Lists g; the rights every queue pair must allow, g's included.
  access add(grant_base& g) noexcept {
    g.next_ = head_;
    if (head_ != nullptr) {
      head_->prev_ = &g;
    }
    head_ = &g;
    if (!g.first_qp_only_) {
      granted_ |= g.rights_;
    }
    return access::remote_write | granted_;
  }
  void remove(grant_base& g) noexcept {
    if (g.prev_ != nullptr) {
      g.prev_->next_ = g.next_;
    }
    if (g.next_ != nullptr) {
      g.next_->prev_ = g.prev_;
    }
    if (head_ == &g) {
      head_ = g.next_;
    }
    g.prev_ = g.next_ = nullptr;
  }
  // A grant moved from `from` to `to` (which has from's links already).
  void moved(const grant_base& from, grant_base& to) noexcept {
    if (to.prev_ != nullptr) {
      to.prev_->next_ = &to;
    }
    if (to.next_ != nullptr) {
      to.next_->prev_ = &to;
    }
    if (head_ == &from) {
      head_ = &to;
    }
  }
  void revoke_all() noexcept {
    while (head_ != nullptr) {
      head_->revoke();
    }
  }

  //! Keeps the peer's key for each of nqp queue pairs of a window; the index
  //! for peer_key, or no_slot when one key serves every queue pair.
  std::uint32_t add_peer_window(std::span<const std::uint32_t> keys, std::size_t nqp) {
    if (keys.size() != nqp) {
      throw_rdx(errc::invalid_argument, "remote_window: the peer sent keys for " +
                                            std::to_string(keys.size()) +
                                            " queue pairs, the connection has " + std::to_string(nqp));
    }
    if (std::all_of(keys.begin(), keys.end(), [&](std::uint32_t k) { return k == keys[0]; })) {
      return no_slot;
    }
    const auto index = static_cast<std::uint32_t>(peer_keys_.size() / nqp);
    peer_keys_.insert(peer_keys_.end(), keys.begin(), keys.end());
    return index;
  }
  [[nodiscard]] std::uint32_t peer_key(std::uint32_t window, std::uint32_t nqp,
                                       std::uint32_t qi) const noexcept {
    return peer_keys_[window * nqp + qi];
  }

private:
  grant_base* head_ = nullptr;            // intrusive list of the connection's grants
  access granted_ = access::none;         // the union of their rights
  std::vector<std::uint32_t> peer_keys_;  // the peer's key per queue pair, nqp per striped window
  grant_base credit_;                     // the 8-byte credit word, queue pair 0
  bool windows_supported_;
};

}  // namespace rdx::detail
