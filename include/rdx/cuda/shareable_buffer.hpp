// rdx::cuda: device memory another process of this host can map. A
// shareable_buffer is one virtual memory management allocation (cuMemCreate)
// whose handle exports as a POSIX file descriptor; the descriptor crosses a
// Unix-domain socket (SCM_RIGHTS) and the peer maps the same physical memory.
// CUDA shares whole allocations: the peer can reach every byte of the
// allocation (its size rounded up to the granularity, 2 MiB on current GPUs),
// so a buffer meant for one grant should hold only what that grant covers.
#pragma once

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/detail/unix_socket.hpp>
#include <rdx/cuda/detail/vmm_driver.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/path.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

namespace rdx::cuda {

//! Whether device can make allocations that export as POSIX file descriptors (the attributes
//! CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and
//! ..._HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED); unknown where the driver cannot be asked.
[[nodiscard]] inline support shareable_supported(int device) noexcept {
  try {
    int vmm = 0;
    int fd = 0;
    const auto& a = detail::vmm();
    if (a.device_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) !=
            CUDA_SUCCESS ||
        a.device_attribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device) !=
            CUDA_SUCCESS) {
      return support::unknown;
    }
    return vmm != 0 && fd != 0 ? support::yes : support::no;
  } catch (...) {
    return support::unknown;
  }
}

namespace detail {
//! A process-unique number per allocation, so that an importer never mistakes a new allocation
//! at a reused address for an old one it has mapped.
inline std::uint64_t next_allocation_serial() noexcept {
  static std::atomic<std::uint64_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed) + 1;
}
}  // namespace detail

//! count elements of T in one shareable allocation on a device, mapped here for reading and
//! writing; unmapped and released on destruction (a peer's mapping keeps the physical memory
//! until the peer unmaps it). Move-only.
template <class T>
class shareable_buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "GPU memory holds bytes copied by DMA: T must be trivially copyable");

public:
  using value_type = T;  //!< the element type
  shareable_buffer() noexcept = default;
  //! Allocates count elements (at least one granule) on device (-1: the current one).
  //! @throws rdx::error (errc::unsupported) where the device cannot export POSIX descriptors;
  //!         rdx::cuda::cuda_error when an allocation call fails
  explicit shareable_buffer(std::size_t count, int device = -1) : count_(count) {
    device_ = device < 0 ? current_device() : device;
    device_guard g(device_);
    RDX_CUDA_TRY(cudaFree(nullptr));  // the primary context exists and is current
    if (shareable_supported(device_) == support::no) {
      rdx::detail::throw_rdx(errc::unsupported,
                             "shareable_buffer: CUDA device " + std::to_string(device_) +
                                 " cannot export allocations as POSIX file descriptors; share cudaMalloc "
                                 "memory (device_buffer) through legacy CUDA IPC instead");
    }
    const auto& a = detail::vmm();
    granularity_ = detail::allocation_granularity(device_);
    const std::size_t want = count * sizeof(T) == 0 ? 1 : count * sizeof(T);
    bytes_ = (want + granularity_ - 1) / granularity_ * granularity_;
    const CUmemAllocationProp prop = detail::shareable_properties(device_);
    detail::check(a.create(&handle_, bytes_, &prop, 0), "cuMemCreate (POSIX file descriptor)");
    try {
      detail::check(a.reserve(&va_, bytes_, granularity_, 0, 0), "cuMemAddressReserve");
      detail::check(a.map(va_, bytes_, 0, handle_, 0), "cuMemMap");
      mapped_ = true;
      const CUmemAccessDesc rw = detail::read_write_access(device_);
      detail::check(a.set_access(va_, bytes_, &rw, 1), "cuMemSetAccess");
    } catch (...) {
      reset();
      throw;
    }
    serial_ = detail::next_allocation_serial();
  }
  //! Takes over o; o is left empty.
  shareable_buffer(shareable_buffer&& o) noexcept { take(o); }
  //! Frees this allocation, then takes over o.
  shareable_buffer& operator=(shareable_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      take(o);
    }
    return *this;
  }
  shareable_buffer(const shareable_buffer&) = delete;
  shareable_buffer& operator=(const shareable_buffer&) = delete;
  ~shareable_buffer() { reset(); }

  //! The first element (a device pointer: never dereference it on the host).
  [[nodiscard]] T* data() const noexcept { return reinterpret_cast<T*>(static_cast<std::uintptr_t>(va_)); }
  //! Number of elements asked for.
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  //! Bytes asked for: size() * sizeof(T).
  [[nodiscard]] std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  //! Bytes of the allocation, a multiple of granularity(): what a peer that maps it can reach.
  [[nodiscard]] std::size_t allocation_bytes() const noexcept { return bytes_; }
  //! The allocation granularity of the device.
  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  //! The CUDA device the memory lives on.
  [[nodiscard]] int device() const noexcept { return device_; }
  //! A process-unique number of this allocation.
  [[nodiscard]] std::uint64_t serial() const noexcept { return serial_; }
  //! The driver's allocation handle, still owned by this object.
  [[nodiscard]] CUmemGenericAllocationHandle native_handle() const noexcept { return handle_; }
  //! The elements as a span of device memory.
  [[nodiscard]] std::span<T> span() const noexcept { return {data(), count_}; }

  //! A new POSIX file descriptor for the allocation (the caller owns it; a peer that imports it
  //! reaches the whole allocation).
  //! @throws rdx::cuda::cuda_error when cuMemExportToShareableHandle fails
  [[nodiscard]] detail::unique_fd export_fd() const {
    int fd = -1;
    detail::check(detail::vmm().export_handle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                  "cuMemExportToShareableHandle (POSIX file descriptor)");
    return detail::unique_fd(fd);
  }

private:
  void take(shareable_buffer& o) noexcept {
    handle_ = std::exchange(o.handle_, 0);
    va_ = std::exchange(o.va_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
    count_ = std::exchange(o.count_, 0);
    granularity_ = o.granularity_;
    device_ = o.device_;
    serial_ = std::exchange(o.serial_, 0);
    mapped_ = std::exchange(o.mapped_, false);
  }
  void reset() noexcept {
    if (handle_ == 0 && va_ == 0) {
      return;
    }
    const auto& a = detail::vmm();  // loaded when the allocation was made
    if (mapped_ && a.unmap(va_, bytes_) != CUDA_SUCCESS) {
      rdx::detail::log_hook_ref()("shareable_buffer: cuMemUnmap failed");
    }
    if (va_ != 0 && a.address_free(va_, bytes_) != CUDA_SUCCESS) {
      rdx::detail::log_hook_ref()("shareable_buffer: cuMemAddressFree failed");
    }
    if (handle_ != 0 && a.release(handle_) != CUDA_SUCCESS) {
      rdx::detail::log_hook_ref()("shareable_buffer: cuMemRelease failed");
    }
    handle_ = 0;
    va_ = 0;
    mapped_ = false;
    count_ = 0;
  }

  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr va_ = 0;
  std::size_t bytes_ = 0;
  std::size_t count_ = 0;
  std::size_t granularity_ = 0;
  int device_ = 0;
  std::uint64_t serial_ = 0;
  bool mapped_ = false;
};

}  // namespace rdx::cuda
