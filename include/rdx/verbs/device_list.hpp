// rdx: the list of RDMA devices on this host.
#pragma once

#include <rdx/error.hpp>

#include <infiniband/verbs.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace rdx {

//! Owns the array from ibv_get_device_list(); iterates over ibv_device*.
class device_list {
public:
  //! @throws rdx::error when libibverbs cannot list devices (other than "none present").
  device_list() {
    int n = 0;
    list_ = ::ibv_get_device_list(&n);
    if (list_ == nullptr) {
      int e = errno;
      // ENOSYS: no kernel RDMA support at all, which is "no devices" to a caller.
      if (e == ENOSYS || e == 0) {
        return;
      }
      detail::throw_errno("ibv_get_device_list", "", e);
    }
    size_ = n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  device_list(const device_list&) = delete;
  device_list& operator=(const device_list&) = delete;
  //! Takes o's list; o is left empty.
  device_list(device_list&& o) noexcept
      : list_(std::exchange(o.list_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  //! Frees this list, then takes o's; o is left empty.
  device_list& operator=(device_list&& o) noexcept {
    if (this != &o) {
      reset();
      list_ = std::exchange(o.list_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~device_list() { reset(); }

  //! Number of devices.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! True when the host has no RDMA device (or no kernel RDMA support).
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  //! Device i, valid while the list lives; not bounds-checked.
  [[nodiscard]] ibv_device* operator[](std::size_t i) const noexcept { return list_[i]; }
  //! The first device (nullptr for an empty list).
  [[nodiscard]] ibv_device* const* begin() const noexcept { return list_; }
  //! One past the last device.
  [[nodiscard]] ibv_device* const* end() const noexcept { return list_ == nullptr ? nullptr : list_ + size_; }
  //! The array from ibv_get_device_list, still owned (nullptr when empty).
  [[nodiscard]] ibv_device** native_handle() const noexcept { return list_; }

  //! The device called name, or nullptr.
  [[nodiscard]] ibv_device* find(std::string_view name) const noexcept {
    for (ibv_device* d : *this) {
      if (name == ::ibv_get_device_name(d)) {
        return d;
      }
    }
    return nullptr;
  }

  //! Device names joined with ", " (for error messages), or "none".
  [[nodiscard]] std::string names() const {
    std::string s;
    for (ibv_device* d : *this) {
      if (!s.empty()) {
        s += ", ";
      }
      s += ::ibv_get_device_name(d);
    }
    return s.empty() ? std::string("none") : s;
  }

private:
  void reset() noexcept {
    if (list_ != nullptr) {
      ::ibv_free_device_list(list_);
    }
    list_ = nullptr;
    size_ = 0;
  }
  ibv_device** list_ = nullptr;
  std::size_t size_ = 0;
};

//! The kernel name of a device ("rxe0", "mlx5_0").
[[nodiscard]] inline std::string_view device_name(ibv_device* d) noexcept {
  const char* n = d != nullptr ? ::ibv_get_device_name(d) : nullptr;
  return n != nullptr ? std::string_view(n) : std::string_view();
}

}  // namespace rdx
