// rdx::cuda: the NIC and kernel side of GPUDirect RDMA, which needs no CUDA:
// whether ibv_reg_dmabuf_mr works on a device, and whether nvidia_peermem is
// loaded. rdx/cuda/probe.hpp adds the GPU side.
#pragma once

#include <rdx/cuda/path.hpp>
#include <rdx/cuda/topology.hpp>
#include <rdx/error.hpp>

#include <infiniband/verbs.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace rdx::cuda {

//! An answer and the evidence for it.
struct probe_answer {
  support answer = support::unknown;  //!< yes, no, or unknown (not checked, or an unexpected result)
  std::string detail;                 //!< what was seen, in words
};

//! Whether the kernel and the device's driver register dma-bufs: calls
//! ibv_reg_dmabuf_mr with fd -1 on a scratch protection domain. EBADF means
//! the call reached the dma-buf layer (supported); EOPNOTSUPP means the
//! driver, kernel or rdma-core has no dma-buf registration.
[[nodiscard]] inline probe_answer probe_kernel_dmabuf(ibv_context* ctx) {
  probe_answer r;
  if (ctx == nullptr) {
    r.detail = "not checked: no RDMA device";
    return r;
  }
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == nullptr) {
    r.detail = std::string("ibv_alloc_pd failed: ") + std::generic_category().message(errno);
    return r;
  }
  errno = 0;
  ibv_mr* mr = ibv_reg_dmabuf_mr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE);
  const int err = errno;
  if (mr != nullptr) {
    (void)ibv_dereg_mr(mr);
    r.detail = "ibv_reg_dmabuf_mr accepted fd -1 (unexpected)";
  } else if (err == EBADF) {
    r.answer = support::yes;
    r.detail = "EBADF for fd -1: kernel and driver take dma-buf";
  } else if (err == EOPNOTSUPP || err == ENOSYS || err == EPROTONOSUPPORT) {
    r.answer = support::no;
    r.detail = std::generic_category().message(err) +
               " for fd -1: this kernel, NIC driver or rdma-core lacks dma-buf registration";
  } else {
    r.detail = std::string("unexpected errno for fd -1: ") + std::generic_category().message(err);
  }
  if (int e = ibv_dealloc_pd(pd); e != 0) {
    rdx::detail::report_destroy_failure("ibv_dealloc_pd", e);
  }
  return r;
}

//! The peermem module's version files ("" where absent).
struct peermem_status {
  std::string nv_mem_version;          //!< \<sysfs\>/kernel/mm/memory_peers/nv_mem/version
  std::string nvidia_peermem_version;  //!< \<sysfs\>/module/nvidia_peermem/version
  //! True when either module reports a version (GPU memory can be registered through it).
  [[nodiscard]] bool loaded() const noexcept {
    return !nv_mem_version.empty() || !nvidia_peermem_version.empty();
  }
};

//! Reads both version files under sysfs_root ("" where a file is absent).
[[nodiscard]] inline peermem_status read_peermem(const std::filesystem::path& sysfs_root = "/sys") {
  return {detail::read_first_line(sysfs_root / "kernel/mm/memory_peers/nv_mem/version"),
          detail::read_first_line(sysfs_root / "module/nvidia_peermem/version")};
}

}  // namespace rdx::cuda
