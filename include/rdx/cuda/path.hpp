// rdx::cuda: how GPU memory meets the NIC (the path), and three-valued probe
// answers. Needs no CUDA.
#pragma once

#include <string_view>

namespace rdx::cuda {

//! How GPU memory reaches the RDMA device: registered directly (dma-buf or
//! peermem), or copied through pinned host buffers (staged).
enum class gpu_path {
  automatic,  //!< let rdx choose: dma_buf, else peermem, else staged
  dma_buf,    //!< ibv_reg_dmabuf_mr over a dma-buf exported by the CUDA driver
  peermem,    //!< ibv_reg_mr on the device pointer, through nvidia_peermem
  staged,     //!< cudaMemcpyAsync through pinned host bounce buffers
};

//! "automatic", "dma-buf", "peermem" or "staged".
[[nodiscard]] constexpr std::string_view to_string(gpu_path p) noexcept {
  switch (p) {
    case gpu_path::automatic: return "automatic";
    case gpu_path::dma_buf: return "dma-buf";
    case gpu_path::peermem: return "peermem";
    case gpu_path::staged: return "staged";
  }
  return "unknown";
}

//! Three-valued answer: a check that could not run says unknown, never no.
enum class support { yes, no, unknown };

//! "yes", "no" or "unknown".
[[nodiscard]] constexpr std::string_view to_string(support s) noexcept {
  switch (s) {
    case support::yes: return "yes";
    case support::no: return "no";
    case support::unknown: return "unknown";
  }
  return "unknown";
}

}  // namespace rdx::cuda
