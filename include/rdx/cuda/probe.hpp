// rdx::cuda: which GPUDirect RDMA path works between a GPU and an RDMA
// device, and why, as a printable report.
#pragma once

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/detail/driver.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/nic_probe.hpp>
#include <rdx/cuda/topology.hpp>

#include <infiniband/verbs.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include <unistd.h>

namespace rdx::cuda {

//! What was checked for one GPU (and the RDMA device nearest to it).
struct gpudirect_report {
  int cuda_device = 0;          //!< the CUDA device ordinal probed
  std::string gpu_name;         //!< cudaDeviceProp::name
  std::string gpu_pci_address;  //!< in sysfs's form, "0000:3b:00.0"

  // CUDA device attributes.
  bool dma_buf_attribute = false;          //!< CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  bool gpu_direct_rdma_supported = false;  //!< CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
  int flush_writes_options = 0;  //!< CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS (bitmask)
  int writes_ordering = 0;       //!< CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING (0, 100, 200)

  //! cuMemGetHandleForAddressRange(DMA_BUF_FD) on a fresh 2 MiB cudaMalloc.
  support dma_buf_export = support::unknown;
  std::string dma_buf_export_detail;  //!< what the export check saw, in words

  //! The RDMA device probed ("" when there is none).
  std::string rdma_device;
  std::string rdma_device_detail;  //!< why this device was probed, or why none was
  //! ibv_reg_dmabuf_mr with fd -1: EBADF means the kernel and driver take
  //! dma-buf, EOPNOTSUPP means they do not.
  support kernel_dmabuf_mr = support::unknown;
  std::string kernel_dmabuf_detail;  //!< what the kernel check saw, in words

  //! Contents of /sys/kernel/mm/memory_peers/nv_mem/version ("" if absent).
  std::string nv_mem_version;
  //! Contents of /sys/module/nvidia_peermem/version ("" if absent).
  std::string nvidia_peermem_version;

  //! True when a peer-memory module (nv_peer_mem or nvidia_peermem) reports a version.
  [[nodiscard]] bool peermem_loaded() const noexcept {
    return !nv_mem_version.empty() || !nvidia_peermem_version.empty();
  }

  //! Whether registering GPU memory through dma-buf should work here.
  [[nodiscard]] support dma_buf_path() const noexcept {
    if (!dma_buf_attribute || dma_buf_export == support::no || kernel_dmabuf_mr == support::no) {
      return support::no;
    }
    if (dma_buf_export == support::yes && kernel_dmabuf_mr == support::yes) {
      return support::yes;
    }
    return support::unknown;
  }
  //! Whether registering GPU memory through nvidia_peermem should work here.
  [[nodiscard]] support peermem_path() const noexcept {
    if (!peermem_loaded() || !gpu_direct_rdma_supported) {
      return support::no;
    }
    return rdma_device.empty() ? support::unknown : support::yes;
  }
  //! The path register_memory's automatic choice would take.
  [[nodiscard]] gpu_path best_path() const noexcept {
    if (dma_buf_path() == support::yes) {
      return gpu_path::dma_buf;
    }
    if (peermem_path() == support::yes) {
      return gpu_path::peermem;
    }
    return gpu_path::staged;
  }

  //! A human-readable report, one fact per line.
  [[nodiscard]] std::string to_string() const {
    const auto yn = [](bool b) { return std::string(b ? "yes" : "no"); };
    std::string s;
    s += "GPU " + std::to_string(cuda_device) + ": " + gpu_name + " at " + gpu_pci_address + "\n";
    s += "  CUDA attributes\n";
    s += "    DMA_BUF_SUPPORTED                     " + yn(dma_buf_attribute) + "\n";
    s += "    GPU_DIRECT_RDMA_SUPPORTED             " + yn(gpu_direct_rdma_supported) + "\n";
    s += "    GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS  " + std::to_string(flush_writes_options) +
         ((flush_writes_options & 1) != 0 ? " (host flush)" : "") +
         ((flush_writes_options & 2) != 0 ? " (stream memops flush)" : "") + "\n";
    s += "    GPU_DIRECT_RDMA_WRITES_ORDERING       " + std::to_string(writes_ordering) +
         (writes_ordering >= 200   ? " (all devices see writes in order)"
          : writes_ordering >= 100 ? " (owner GPU sees writes in order)"
                                   : " (none: flush before consuming)") +
         "\n";
    s += "  dma-buf export (cuMemGetHandleForAddressRange)  " +
         std::string(rdx::cuda::to_string(dma_buf_export)) +
         (dma_buf_export_detail.empty() ? "" : ": " + dma_buf_export_detail) + "\n";
    s += "  RDMA device                           " +
         (rdma_device.empty() ? std::string("none") : rdma_device) +
         (rdma_device_detail.empty() ? "" : " (" + rdma_device_detail + ")") + "\n";
    s += "  kernel ibv_reg_dmabuf_mr              " + std::string(rdx::cuda::to_string(kernel_dmabuf_mr)) +
         (kernel_dmabuf_detail.empty() ? "" : ": " + kernel_dmabuf_detail) + "\n";
    s += "  peermem nv_mem/version                " +
         (nv_mem_version.empty() ? std::string("absent") : nv_mem_version) + "\n";
    s += "  peermem nvidia_peermem/version        " +
         (nvidia_peermem_version.empty() ? std::string("absent") : nvidia_peermem_version) + "\n";
    s += "  => dma-buf path " + std::string(rdx::cuda::to_string(dma_buf_path())) + ", peermem path " +
         std::string(rdx::cuda::to_string(peermem_path())) +
         ", best path: " + std::string(rdx::cuda::to_string(best_path())) + "\n";
    return s;
  }
};

namespace detail {
inline int device_attribute(int device, int attribute) {
  int v = 0;
  check(cudaDeviceGetAttribute(&v, static_cast<cudaDeviceAttr>(attribute), device), "cudaDeviceGetAttribute",
        "attribute " + std::to_string(attribute));
  return v;
}

//! dma-buf export of a fresh allocation: the driver half of the dma-buf check.
inline void probe_dma_buf_export(int device, gpudirect_report& r) {
  try {
    device_guard g(device);
    device_buffer<std::byte> b(2u << 20);
    int fd = -1;
    const CUresult st = driver().mem_get_handle_for_address_range(
        &fd, reinterpret_cast<CUdeviceptr>(b.data()), b.size_bytes(), CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (st == CUDA_SUCCESS && fd >= 0) {
      r.dma_buf_export = support::yes;
      r.dma_buf_export_detail = "fd returned for a 2 MiB cudaMalloc";
      ::close(fd);
    } else {
      r.dma_buf_export = support::no;
      r.dma_buf_export_detail = driver_category().message(static_cast<int>(st));
    }
  } catch (const rdx::error& e) {
    r.dma_buf_export = support::unknown;
    r.dma_buf_export_detail = e.what();
  }
}

struct device_list_deleter {
  void operator()(ibv_device** l) const noexcept { ibv_free_device_list(l); }
};
}  // namespace detail

//! Probes one GPU against an opened RDMA device context (nullptr: none).
//! @param sysfs_root where the peermem files are looked for
//! @throws rdx::cuda::cuda_error when the GPU cannot be queried
[[nodiscard]] inline gpudirect_report probe_gpudirect(int cuda_device, ibv_context* ctx,
                                                      const std::filesystem::path& sysfs_root = "/sys") {
  gpudirect_report r;
  r.cuda_device = cuda_device;
  cudaDeviceProp prop{};
  RDX_CUDA_TRY(cudaGetDeviceProperties(&prop, cuda_device));
  r.gpu_name = prop.name;
  r.gpu_pci_address = pci_address_of(cuda_device);
  r.dma_buf_attribute = detail::device_attribute(cuda_device, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) != 0;
  r.gpu_direct_rdma_supported =
      detail::device_attribute(cuda_device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) != 0;
  r.flush_writes_options =
      detail::device_attribute(cuda_device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS);
  r.writes_ordering =
      detail::device_attribute(cuda_device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING);
  if (r.dma_buf_attribute) {
    detail::probe_dma_buf_export(cuda_device, r);
  } else {
    r.dma_buf_export = support::no;
    r.dma_buf_export_detail = "DMA_BUF_SUPPORTED is 0 (driver too old, or the proprietary kernel module)";
  }
  const auto pm = read_peermem(sysfs_root);
  r.nv_mem_version = pm.nv_mem_version;
  r.nvidia_peermem_version = pm.nvidia_peermem_version;
  if (ctx != nullptr) {
    r.rdma_device = ibv_get_device_name(ctx->device);
    const auto k = probe_kernel_dmabuf(ctx);
    r.kernel_dmabuf_mr = k.answer;
    r.kernel_dmabuf_detail = k.detail;
  } else {
    r.kernel_dmabuf_detail = "not checked: no RDMA device";
  }
  return r;
}

//! Probes one GPU against the RDMA device rdx would pick for it (RDX_DEVICE,
//! else the nearest in sysfs, else the first one listed).
[[nodiscard]] inline gpudirect_report probe_gpudirect(int cuda_device,
                                                      const std::filesystem::path& sysfs_root = "/sys") {
  int n = 0;
  std::unique_ptr<ibv_device*, detail::device_list_deleter> list(ibv_get_device_list(&n));
  std::string wanted;
  std::string why;
  try {
    if (auto d = rdma_device_for_gpu(cuda_device, sysfs_root)) {
      wanted = *d;
      // NOLINTNEXTLINE(concurrency-mt-unsafe): read at set-up; rdx never sets the environment
      why = std::getenv("RDX_DEVICE") != nullptr ? "from RDX_DEVICE" : "nearest in sysfs";
    }
  } catch (const rdx::error& e) {
    why = std::string("topology: ") + e.what();
  }
  ibv_device* dev = nullptr;
  for (int i = 0; list && i < n; ++i) {
    if (wanted.empty() || wanted == ibv_get_device_name(list.get()[i])) {
      dev = list.get()[i];
      break;
    }
  }
  if (dev == nullptr) {
    auto r = probe_gpudirect(cuda_device, nullptr, sysfs_root);
    r.rdma_device_detail =
        !list    ? std::string("ibv_get_device_list failed: ") + std::generic_category().message(errno)
        : n == 0 ? std::string("ibv_get_device_list returned 0 devices")
                 : "RDX_DEVICE=" + wanted + " not among the " + std::to_string(n) + " devices";
    return r;
  }
  ibv_context* ctx = ibv_open_device(dev);
  if (ctx == nullptr) {
    auto r = probe_gpudirect(cuda_device, nullptr, sysfs_root);
    r.rdma_device_detail = std::string("ibv_open_device(") + ibv_get_device_name(dev) +
                           ") failed: " + std::generic_category().message(errno);
    return r;
  }
  gpudirect_report r;
  try {
    r = probe_gpudirect(cuda_device, ctx, sysfs_root);
  } catch (...) {
    (void)ibv_close_device(ctx);
    throw;
  }
  r.rdma_device_detail = why.empty() ? "first listed" : why;
  if (int e = ibv_close_device(ctx); e != 0) {
    rdx::detail::report_destroy_failure("ibv_close_device", errno);
  }
  return r;
}

}  // namespace rdx::cuda
