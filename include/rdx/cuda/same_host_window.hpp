// rdx::cuda: the two ends of one same-host grant: the exporter's
// same_host_grant and the importer's same_host_window, whose operations copy
// between the peer's mapped GPU memory and this process's (rdx/cuda/same_host.hpp
// makes both, through a same_host_peer).
#pragma once

#include <rdx/channel/window.hpp>
#include <rdx/cuda/check.hpp>
#include <rdx/cuda/detail/driver.hpp>
#include <rdx/cuda/detail/mapping_cache.hpp>
#include <rdx/cuda/detail/peer_state.hpp>
#include <rdx/cuda/detail/unix_socket.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/same_host_operation.hpp>
#include <rdx/cuda/same_host_types.hpp>
#include <rdx/cuda/shareable_buffer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace rdx::cuda {

namespace detail {
[[nodiscard]] inline std::size_t round_down(std::size_t v, std::size_t g) noexcept {
  return v / g * g;
}
[[nodiscard]] inline std::size_t round_up(std::size_t v, std::size_t g) noexcept {
  return (v + g - 1) / g * g;
}
}  // namespace detail

//! The exporting side of one grant: revoked when destroyed. The granted memory must outlive it.
//! Move-only.
class same_host_grant {
public:
  same_host_grant() noexcept = default;
  //! Takes over o; o is left empty.
  same_host_grant(same_host_grant&& o) noexcept = default;
  //! Revokes or closes what this holds, then takes over o.
  same_host_grant& operator=(same_host_grant&& o) noexcept {
    if (this != &o) {
      revoke();
      st_ = std::move(o.st_);
      id_ = o.id_;
      bytes_ = o.bytes_;
      exposed_ = o.exposed_;
    }
    return *this;
  }
  same_host_grant(const same_host_grant&) = delete;
  same_host_grant& operator=(const same_host_grant&) = delete;
  ~same_host_grant() { revoke(); }

  //! The grant's number on this peer.
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  //! Bytes granted.
  [[nodiscard]] std::size_t size_bytes() const noexcept { return bytes_; }
  //! Bytes the peer can reach: the whole exported allocation.
  [[nodiscard]] std::size_t exposed_bytes() const noexcept { return exposed_; }
  //! Tells the peer that the grant is gone: its window's later operations end with errc::rejected.
  //! Best effort (the peer may be gone); never throws.
  void revoke() noexcept {
    if (!st_) {
      return;
    }
    detail::frame f;
    f.type = detail::frame_type::revoke;
    f.id = id_;
    try {
      if (!st_->usable()) {
        st_->send_setup(f, -1);
      }
    } catch (const std::exception& e) {
      rdx::detail::log_hook_ref()(std::string("same_host_grant: revoke not sent: ") + e.what());
    }
    st_.reset();
  }

private:
  friend class same_host_peer;
  same_host_grant(std::shared_ptr<detail::peer_state> st, std::uint64_t id, std::size_t bytes,
                  std::size_t exposed) noexcept
      : st_(std::move(st)), id_(id), bytes_(bytes), exposed_(exposed) {}
  std::shared_ptr<detail::peer_state> st_;
  std::uint64_t id_ = 0;
  std::size_t bytes_ = 0;
  std::size_t exposed_ = 0;
};

//! The importing side: a peer's granted GPU memory, mapped in this process. Its operations copy
//! between it and this process's device memory. Move-only; destroying it waits for the copies
//! that touch it, then drops its mapping (the last window over an allocation unmaps it).
template <class T>
class same_host_window {
  static_assert(std::is_trivially_copyable_v<T>,
                "GPU memory holds bytes copied by DMA: T must be trivially copyable");

public:
  same_host_window() noexcept = default;
  //! Takes over o; o is left empty.
  same_host_window(same_host_window&&) noexcept = default;
  //! Waits for this window\'s copies, drops its mapping, then takes over o.
  same_host_window& operator=(same_host_window&& o) noexcept {
    if (this != &o) {
      drain();
      st_ = std::move(o.st_);
      map_ = std::move(o.map_);
      base_ = o.base_;
      count_ = o.count_;
      rights_ = o.rights_;
      id_ = o.id_;
      kind_ = o.kind_;
    }
    return *this;
  }
  same_host_window(const same_host_window&) = delete;
  same_host_window& operator=(const same_host_window&) = delete;
  ~same_host_window() { drain(); }

  //! Elements granted.
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  //! The rights granted.
  [[nodiscard]] rights granted() const noexcept { return rights_; }
  //! The grant's number on the exporting peer.
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  //! "vmm" (a shareable allocation) or "legacy-ipc" (cudaMalloc memory).
  [[nodiscard]] const char* sharing() const noexcept {
    return kind_ == detail::share_kind::vmm ? "vmm" : "legacy-ipc";
  }
  //! The granted range as a device pointer of this process: kernels of this process may use it
  //! directly (within the granted rights; nothing checks them there), except on the staged route.
  [[nodiscard]] T* data() const noexcept { return base_; }
  //! How copies reach the memory: the same GPU, P2P, or staged through host memory.
  [[nodiscard]] gpu_route route() const noexcept { return route_.route; }
  //! route() in words, with the GPUs: "P2P from GPU 0 to GPU 1", "staged through host memory: ...".
  [[nodiscard]] const std::string& route_text() const noexcept { return route_.why; }

  //! Copies src (device memory of this process) to elements [offset, offset + src.size()).
  [[nodiscard]] peer_operation write(std::span<const T> src, std::size_t offset) noexcept {
    return copy(base_ + offset, src.data(), src.size(), offset, rights::write, false, 0);
  }
  //! write(), then the peer's receive_notification() ends with tag once the bytes are there.
  [[nodiscard]] peer_operation write_with_notify(std::span<const T> src, std::size_t offset,
                                                 std::uint32_t tag) noexcept {
    return copy(base_ + offset, src.data(), src.size(), offset, rights::write, true, tag);
  }
  //! Copies elements [offset, offset + dst.size()) to dst (device memory of this process).
  [[nodiscard]] peer_operation read(std::span<T> dst, std::size_t offset) noexcept {
    return copy(dst.data(), base_ + offset, dst.size(), offset, rights::read, false, 0);
  }

private:
  friend class same_host_peer;
  peer_operation copy(void* dst, const void* src, std::size_t n, std::size_t offset, rights need, bool notify,
                      std::uint32_t tag) noexcept {
    peer_operation op;
    detail::op_node& node = op.node();
    if (!st_) {
      node.done = true;
      node.ec = make_error_code(errc::not_ready);
    } else if (!has(rights_, need)) {  // NOLINT(bugprone-branch-clone): the order picks the error
      detail::peer_state::fail_now(node, make_error_code(errc::rejected));
    } else if (offset > count_ || n > count_ - offset) {
      detail::peer_state::fail_now(node, make_error_code(errc::out_of_range));
    } else if (st_->revoked(id_)) {
      detail::peer_state::fail_now(node, make_error_code(errc::rejected));
    } else {
      // Staged: the mapping is on the memory's GPU, the caller's buffer on this process's.
      const int here = st_->options().device;
      const int there = map_->device();
      const bool to_peer = need == rights::write;
      st_->start_copy(node, dst, src, n * sizeof(T), map_.get(), notify, tag, id_, to_peer ? there : here,
                      to_peer ? here : there);
    }
    return op;
  }
  void drain() noexcept {
    if (st_) {
      st_->drain(map_.get());
    }
    map_.reset();
    st_.reset();
  }
  std::shared_ptr<detail::peer_state> st_;
  std::shared_ptr<detail::mapping> map_;
  T* base_ = nullptr;
  std::size_t count_ = 0;
  rights rights_ = rights::none;
  std::uint64_t id_ = 0;
  detail::share_kind kind_ = detail::share_kind::vmm;
  gpu_route_choice route_{};
};

}  // namespace rdx::cuda
