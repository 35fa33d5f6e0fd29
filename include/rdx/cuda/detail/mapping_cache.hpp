// rdx::cuda internals: the importing side's mappings of a peer's GPU memory,
// one per exported allocation per process. CUDA refuses to open one legacy
// IPC handle twice in a process, and mapping costs a fraction of a
// millisecond, so every window over the same allocation shares one mapping;
// the last one to go unmaps it.
#pragma once

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/detail/unix_socket.hpp>
#include <rdx/cuda/detail/vmm_driver.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/same_host_types.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace rdx::cuda::detail {

//! One imported allocation, mapped on one device of this process.
class mapping {
public:
  //! Imports a shareable allocation of bytes from its POSIX descriptor and maps it on device.
  static std::shared_ptr<mapping> import_vmm(const unique_fd& fd, std::size_t bytes, int device) {
    device_guard g(device);
    RDX_CUDA_TRY(cudaFree(nullptr));
    const auto& a = vmm();
    auto m = std::shared_ptr<mapping>(new mapping(share_kind::vmm, bytes, device));
    check(a.import_handle(&m->handle_, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd.get())),
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle (POSIX file descriptor)");
    const std::size_t gran = allocation_granularity(device);
    if (bytes == 0 || bytes % gran != 0) {
      rdx::detail::throw_rdx(errc::protocol_error, "same-host grant: the peer's allocation of " +
                                                       std::to_string(bytes) +
                                                       " bytes is not a whole number of granules");
    }
    check(a.reserve(&m->va_, bytes, gran, 0, 0), "cuMemAddressReserve");
    check(a.map(m->va_, bytes, 0, m->handle_, 0), "cuMemMap (the peer's allocation)");
    m->mapped_ = true;
    const CUmemAccessDesc rw = read_write_access(device);
    check(a.set_access(m->va_, bytes, &rw, 1), "cuMemSetAccess");
    m->base_ = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(m->va_));
    return m;
  }
  //! Opens a legacy CUDA IPC handle on device.
  static std::shared_ptr<mapping> import_legacy(const std::byte (&handle)[64], std::size_t bytes,
                                                int device) {
    device_guard g(device);
    cudaIpcMemHandle_t h{};
    static_assert(sizeof h == 64);
    std::memcpy(&h, handle, sizeof h);
    auto m = std::shared_ptr<mapping>(new mapping(share_kind::legacy_ipc, bytes, device));
    void* p = nullptr;
    RDX_CUDA_TRY(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    m->base_ = static_cast<std::byte*>(p);
    return m;
  }
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  ~mapping() {
    device_guard_noexcept g(device_);
    if (kind_ == share_kind::legacy_ipc) {
      if (base_ != nullptr) {
        check_noexcept(cudaIpcCloseMemHandle(base_), "cudaIpcCloseMemHandle");
      }
      return;
    }
    const auto& a = vmm();
    if (mapped_ && a.unmap(va_, bytes_) != CUDA_SUCCESS) {
      rdx::detail::log_hook_ref()("mapping: cuMemUnmap failed");
    }
    if (va_ != 0 && a.address_free(va_, bytes_) != CUDA_SUCCESS) {
      rdx::detail::log_hook_ref()("mapping: cuMemAddressFree failed");
    }
    if (handle_ != 0 && a.release(handle_) != CUDA_SUCCESS) {
      rdx::detail::log_hook_ref()("mapping: cuMemRelease failed");
    }
  }
  //! The allocation's first byte in this process (a device pointer).
  [[nodiscard]] std::byte* base() const noexcept { return base_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] share_kind kind() const noexcept { return kind_; }

private:
  // Sets the device for a destructor; a failure is logged, never thrown.
  struct device_guard_noexcept {
    explicit device_guard_noexcept(int d) noexcept {
      if (cudaGetDevice(&prev) != cudaSuccess || (d != prev && cudaSetDevice(d) != cudaSuccess)) {
        (void)cudaGetLastError();
        prev = -1;
      }
    }
    ~device_guard_noexcept() {
      if (prev >= 0) {
        (void)cudaSetDevice(prev);
      }
    }
    device_guard_noexcept(const device_guard_noexcept&) = default;
    device_guard_noexcept& operator=(const device_guard_noexcept&) = default;
    device_guard_noexcept(device_guard_noexcept&&) = default;
    device_guard_noexcept& operator=(device_guard_noexcept&&) = default;
    int prev = -1;
  };
  mapping(share_kind k, std::size_t bytes, int device) noexcept : kind_(k), bytes_(bytes), device_(device) {}
  share_kind kind_;
  std::size_t bytes_;
  int device_;
  std::byte* base_ = nullptr;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr va_ = 0;
  bool mapped_ = false;
};

//! The process's mappings, by exporter and allocation. Thread-safe (one mutex, set-up only).
class mapping_cache {
public:
  static mapping_cache& instance() {
    static mapping_cache c;
    return c;
  }
  //! The mapping of the allocation a checked grant frame f from the process peer_token names,
  //! on device: the cached one, else a new import (fd for a shareable allocation).
  std::shared_ptr<mapping> get(std::uint64_t peer_token, const frame& f, const unique_fd& fd, int device) {
    std::string key(reinterpret_cast<const char*>(&peer_token), sizeof peer_token);
    key += static_cast<char>(f.kind);
    key.append(reinterpret_cast<const char*>(&device), sizeof device);
    if (f.kind == share_kind::vmm) {
      key.append(reinterpret_cast<const char*>(&f.serial), sizeof f.serial);
    } else {
      key.append(reinterpret_cast<const char*>(f.ipc_handle), sizeof f.ipc_handle);
    }
    std::lock_guard lock(m_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      if (auto live = it->second.lock()) {
        if (live->bytes() == f.alloc_bytes) {
          ++hits_;
          return live;
        }
      }
      entries_.erase(it);
    }
    if (f.kind == share_kind::vmm && !fd) {
      rdx::detail::throw_rdx(errc::protocol_error,
                             "same-host grant: a shareable allocation came without its descriptor");
    }
    auto m = f.kind == share_kind::vmm ? mapping::import_vmm(fd, f.alloc_bytes, device)
                                       : mapping::import_legacy(f.ipc_handle, f.alloc_bytes, device);
    ++opens_;
    entries_[key] = m;
    return m;
  }
  //! Imports made so far (each allocation once per device while one of its windows lives).
  [[nodiscard]] std::size_t opens() {
    std::lock_guard lock(m_);
    return opens_;
  }
  //! Windows served from a mapping already made.
  [[nodiscard]] std::size_t hits() {
    std::lock_guard lock(m_);
    return hits_;
  }

private:
  std::mutex m_;
  std::map<std::string, std::weak_ptr<mapping>> entries_;
  std::size_t opens_ = 0;
  std::size_t hits_ = 0;
};

}  // namespace rdx::cuda::detail
