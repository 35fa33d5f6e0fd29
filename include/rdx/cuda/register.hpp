// rdx::cuda: registering GPU memory with an RDMA device (GPUDirect RDMA), and
// the flush that makes RDMA writes into GPU memory visible to GPU consumers.
#pragma once

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/detail/driver.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/probe.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include <unistd.h>

namespace rdx::cuda {

//! A memory region over GPU memory, and the path that registered it.
struct gpu_memory_region {
  memory_region region;                 //!< the registration of the GPU memory
  gpu_path path = gpu_path::automatic;  //!< dma_buf or peermem
};

namespace detail {
struct registration_attempts {
  std::string dma_buf;  // why dma-buf failed ("" if not tried)
  std::string peermem;  // why peermem failed ("" if not tried)
};

inline std::string errno_text(int e) {
  return std::generic_category().message(e) + " (errno " + std::to_string(e) + ")";
}

inline std::string hex_address(std::uintptr_t a) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}
}  // namespace detail

//! A dma-buf exported by the CUDA driver over a whole device allocation, and
//! where a range of it sits: what ibv_reg_dmabuf_mr takes. Owns the fd.
class dma_buf_range {
public:
  //! Takes ownership of fd, a dma-buf of dma_buf_bytes bytes, and says where the range sits in it.
  dma_buf_range(int fd, std::uint64_t offset, std::size_t length, std::uint64_t iova,
                std::size_t dma_buf_bytes) noexcept
      : fd_(fd), offset_(offset), length_(length), iova_(iova), dma_buf_bytes_(dma_buf_bytes) {}
  //! Takes o's fd and range; o is left without an fd.
  dma_buf_range(dma_buf_range&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)),
        offset_(o.offset_),
        length_(o.length_),
        iova_(o.iova_),
        dma_buf_bytes_(o.dma_buf_bytes_) {}
  //! Closes this fd, then takes o's fd and range; o is left without an fd.
  dma_buf_range& operator=(dma_buf_range&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
      offset_ = o.offset_;
      length_ = o.length_;
      iova_ = o.iova_;
      dma_buf_bytes_ = o.dma_buf_bytes_;
    }
    return *this;
  }
  dma_buf_range(const dma_buf_range&) = delete;
  dma_buf_range& operator=(const dma_buf_range&) = delete;
  ~dma_buf_range() { close(); }

  //! The dma-buf descriptor, still owned (-1 once closed or released).
  [[nodiscard]] int fd() const noexcept { return fd_; }
  //! The descriptor, as fd().
  [[nodiscard]] int native_handle() const noexcept { return fd_; }
  //! Gives up the fd; the caller closes it.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  //! Offset of the range from the start of the dma-buf.
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
  //! Bytes of the range.
  [[nodiscard]] std::size_t length() const noexcept { return length_; }
  //! The range's own virtual address: the NIC addresses it as ibv_reg_mr would.
  [[nodiscard]] std::uint64_t iova() const noexcept { return iova_; }
  //! Bytes the dma-buf spans (the allocation, rounded out to host pages).
  [[nodiscard]] std::size_t dma_buf_bytes() const noexcept { return dma_buf_bytes_; }
  //! Closes the fd (a registration keeps its own reference to the dma-buf).
  void close() noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = -1;
  }

private:
  int fd_ = -1;
  std::uint64_t offset_ = 0;
  std::size_t length_ = 0;
  std::uint64_t iova_ = 0;
  std::size_t dma_buf_bytes_ = 0;
};

//! Exports the allocation holding device bytes [device_ptr, device_ptr +
//! bytes) as a dma-buf: the whole allocation (cuMemGetAddressRange), rounded
//! out to host pages, and the range's offset in it.
//! @throws rdx::error (unsupported) saying which step failed and why;
//!         (out_of_range) when the range runs past its allocation
[[nodiscard]] inline dma_buf_range export_dma_buf(const void* device_ptr, std::size_t bytes) {
  int device = 0;
  {
    cudaPointerAttributes pa{};
    RDX_CUDA_TRY(cudaPointerGetAttributes(&pa, device_ptr));
    if (pa.type != cudaMemoryTypeDevice) {
      rdx::detail::throw_rdx(
          errc::invalid_argument,
          "export_dma_buf: " + detail::hex_address(reinterpret_cast<std::uintptr_t>(device_ptr)) +
              " is not device memory");
    }
    device = pa.device;
  }
  int attr = 0;
  RDX_CUDA_TRY(cudaDeviceGetAttribute(
      &attr, static_cast<cudaDeviceAttr>(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED), device));
  if (attr == 0) {
    rdx::detail::throw_rdx(errc::unsupported, "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0 on GPU " +
                                                  std::to_string(device) +
                                                  " (driver too old, or not the open kernel modules)");
  }
  const auto& drv = detail::driver();
  const auto addr = reinterpret_cast<std::uintptr_t>(device_ptr);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (CUresult st = drv.mem_get_address_range(&base, &size, static_cast<CUdeviceptr>(addr));
      st != CUDA_SUCCESS) {
    rdx::detail::throw_rdx(errc::unsupported,
                           "cuMemGetAddressRange: " + driver_category().message(static_cast<int>(st)));
  }
  if (bytes > base + size - addr) {
    rdx::detail::throw_rdx(errc::out_of_range, "export_dma_buf: " + std::to_string(bytes) + " bytes at " +
                                                   detail::hex_address(addr) +
                                                   " run past the allocation's end (" +
                                                   std::to_string(base + size - addr) + " bytes left)");
  }
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const std::uintptr_t aligned_base = base & ~(page - 1);
  const std::uintptr_t aligned_end = (base + size + page - 1) & ~(page - 1);
  int fd = -1;
  if (CUresult st = drv.mem_get_handle_for_address_range(&fd, aligned_base, aligned_end - aligned_base,
                                                         CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
      st != CUDA_SUCCESS || fd < 0) {
    rdx::detail::throw_rdx(errc::unsupported, "cuMemGetHandleForAddressRange(DMA_BUF_FD): " +
                                                  driver_category().message(static_cast<int>(st)));
  }
  return {fd, addr - aligned_base, bytes, addr, aligned_end - aligned_base};
}

namespace detail {
//! dma-buf: register the caller's range of the exported allocation at its own
//! virtual address, through rdx::memory_region's dma-buf constructor. Empty on
//! failure, with the reason in why.
inline std::optional<memory_region> register_dma_buf(const protection_domain& pd, void* ptr,
                                                     std::size_t bytes, access rights, std::string& why) {
  try {
    const dma_buf_range r = export_dma_buf(ptr, bytes);
    // r closes the fd when it goes: the registration holds its own reference.
    return memory_region(pd, dma_buf::borrow(r.fd()), r.offset(), r.length(), r.iova(), rights);
  } catch (const rdx::error& e) {
    why = e.what();
    return std::nullopt;
  }
}

//! peermem: the NIC driver asks nvidia_peermem to pin the GPU pages.
inline ibv_mr* register_peermem(ibv_pd* pd, void* ptr, std::size_t bytes, int rights, std::string& why) {
  errno = 0;
  ibv_mr* mr = ::ibv_reg_mr(pd, ptr, bytes, rights);
  if (mr == nullptr) {
    const int err = errno != 0 ? errno : EINVAL;
    why = "ibv_reg_mr on device memory: " + errno_text(err);
    if (!read_peermem().loaded()) {
      why += "; nvidia_peermem is not loaded (no /sys/module/nvidia_peermem/version)";
    }
  }
  return mr;
}

[[noreturn]] inline void throw_unregistrable(void* ptr, std::size_t bytes, gpu_path force,
                                             const registration_attempts& a) {
  char head[128];
  std::snprintf(head, sizeof head, "register_memory of %zu GPU bytes at %p (path %s) failed:", bytes, ptr,
                std::string(to_string(force)).c_str());
  std::string w = head;
  if (!a.dma_buf.empty()) {
    w += "\n  dma-buf: " + a.dma_buf;
  }
  if (!a.peermem.empty()) {
    w += "\n  peermem: " + a.peermem;
  }
  w += "\n  to fix: for dma-buf, a kernel of 5.12 or later with a NIC driver that takes dma-buf (mlx5, for "
       "one),"
       " rdma-core 34 or later and the NVIDIA open kernel modules;"
       " for peermem, `modprobe nvidia_peermem`;"
       " or move the bytes through rdx::cuda::staging_pipeline (gpu_path::staged)" +
       rdx::detail::doctor_hint("gpu");
  rdx::detail::throw_rdx(errc::unsupported, w);
}
}  // namespace detail

//! Registers device memory [device_ptr, device_ptr + bytes) with pd: through
//! dma-buf first, then peermem, unless force names one of them.
//! @param rights as for rdx::memory_region (local write is added to remote write)
//! @throws rdx::error (invalid_argument) for host memory or gpu_path::staged,
//!         (unsupported) listing each path tried, why it failed and how to fix it
[[nodiscard]] inline gpu_memory_region register_memory(const protection_domain& pd, void* device_ptr,
                                                       std::size_t bytes, access rights = access::local_write,
                                                       gpu_path force = gpu_path::automatic) {
  if (force == gpu_path::staged) {
    rdx::detail::throw_rdx(
        errc::invalid_argument,
        "register_memory: gpu_path::staged registers nothing: use rdx::cuda::staging_pipeline");
  }
  if (device_ptr == nullptr || bytes == 0) {
    rdx::detail::throw_rdx(errc::invalid_argument, "register_memory: null pointer or zero bytes");
  }
  cudaPointerAttributes pa{};
  RDX_CUDA_TRY(cudaPointerGetAttributes(&pa, device_ptr));
  if (pa.type != cudaMemoryTypeDevice) {
    rdx::detail::throw_rdx(errc::invalid_argument,
                           "register_memory: not device memory (cudaPointerGetAttributes type " +
                               std::to_string(static_cast<int>(pa.type)) +
                               "); register host memory with rdx::memory_region");
  }
  if (has(rights, access::remote_write) || has(rights, access::remote_atomic)) {
    rights |= access::local_write;
  }

  detail::registration_attempts tried;
  if (force == gpu_path::automatic || force == gpu_path::dma_buf) {
    if (std::optional<memory_region> mr =
            detail::register_dma_buf(pd, device_ptr, bytes, rights, tried.dma_buf)) {
      return {std::move(*mr), gpu_path::dma_buf};
    }
  }
  if (force == gpu_path::automatic || force == gpu_path::peermem) {
    if (ibv_mr* mr =
            detail::register_peermem(pd.native_handle(), device_ptr, bytes, to_ibv(rights), tried.peermem)) {
      return {memory_region::adopt(pd, mr), gpu_path::peermem};
    }
  }
  detail::throw_unregistrable(device_ptr, bytes, force, tried);
}

//! register_memory over a whole device_buffer.
template <class T>
[[nodiscard]] gpu_memory_region register_memory(const protection_domain& pd, const device_buffer<T>& buffer,
                                                access rights = access::local_write,
                                                gpu_path force = gpu_path::automatic) {
  return register_memory(pd, static_cast<void*>(buffer.data()), buffer.size_bytes(), rights, force);
}

//! Who consumes data that RDMA wrote into GPU memory.
enum class flush_scope {
  owner = 100,        //!< the GPU that owns the memory
  all_devices = 200,  //!< any GPU of this host (peer access)
};

//! What must happen between an RDMA write's completion and a GPU consumer.
enum class flush_method {
  none,        //!< the GPU orders RDMA writes for this scope by itself
  cuda_flush,  //!< cudaDeviceFlushGPUDirectRDMAWrites (cuFlushGPUDirectRDMAWrites)
  rdma_read,   //!< no flush API: read back the last bytes over RDMA on the same queue pair
};

//! "none", "cuFlushGPUDirectRDMAWrites" or "RDMA read of the last bytes".
[[nodiscard]] constexpr std::string_view to_string(flush_method m) noexcept {
  switch (m) {
    case flush_method::none: return "none";
    case flush_method::cuda_flush: return "cuFlushGPUDirectRDMAWrites";
    case flush_method::rdma_read: return "RDMA read of the last bytes";
  }
  return "unknown";
}

//! The flush a device needs, from its GPU_DIRECT_RDMA_WRITES_ORDERING and
//! GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS attributes.
[[nodiscard]] constexpr flush_method required_flush(int writes_ordering, int flush_options,
                                                    flush_scope consumer) noexcept {
  if (writes_ordering >= static_cast<int>(consumer)) {
    return flush_method::none;
  }
  if ((flush_options & CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST) != 0) {
    return flush_method::cuda_flush;
  }
  return flush_method::rdma_read;
}

//! The flush step of one GPU, chosen once from its attributes.
class gpudirect_flush {
public:
  //! @throws rdx::cuda::cuda_error when the attributes cannot be read
  explicit gpudirect_flush(int device, flush_scope consumer = flush_scope::owner)
      : device_(device), scope_(consumer) {
    int ordering = 0;
    int options = 0;
    RDX_CUDA_TRY(cudaDeviceGetAttribute(&ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, device));
    RDX_CUDA_TRY(cudaDeviceGetAttribute(&options, cudaDevAttrGPUDirectRDMAFlushWritesOptions, device));
    method_ = required_flush(ordering, options, consumer);
  }
  //! The flush this device needs for the consumer scope it was made with.
  [[nodiscard]] flush_method method() const noexcept { return method_; }
  //! The CUDA device ordinal.
  [[nodiscard]] int device() const noexcept { return device_; }
  //! Call after the last RDMA write's completion and before the consumer is
  //! launched. Returns the method: with rdma_read, the caller still has to
  //! read back the last bytes over the same queue pair.
  flush_method operator()() const {
    if (method_ == flush_method::cuda_flush) {
      device_guard g(device_);
      RDX_CUDA_TRY(cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                                      scope_ == flush_scope::owner
                                                          ? cudaFlushGPUDirectRDMAWritesToOwner
                                                          : cudaFlushGPUDirectRDMAWritesToAllDevices));
    }
    return method_;
  }

private:
  int device_;
  flush_scope scope_;
  flush_method method_ = flush_method::none;
};

}  // namespace rdx::cuda
