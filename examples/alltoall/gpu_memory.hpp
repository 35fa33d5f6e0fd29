// alltoall with GPU memory (built where rdx::cuda is): the blocks a rank
// writes and its window live on a CUDA device. The path is chosen as
// gpu_pingpong chooses it: direct (the NIC reads and writes GPU memory,
// registered by dma-buf or peermem) where the GPU's memory registers and
// needs no RDMA read to flush the NIC's writes, else staged through pinned
// host memory (one copy to the host before the writes, one to the GPU after
// the barrier).
#pragma once

#include <rdx/cuda/memory.hpp>
#include <rdx/rdx.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "blocks.hpp"

namespace alltoall {

// The GPU half of a rank's blocks on one device, with no RDMA in it: source and
// window in device memory, a pinned host buffer to fill and check them, and,
// staged, the pinned host copies the NIC reads and writes.
class gpu_blocks {
public:
  gpu_blocks(int device, std::size_t block, std::uint32_t ranks, bool staged);
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] bool staged() const noexcept { return staged_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return src_.size_bytes(); }
  // Host bytes for the next source; upload() copies them to the GPU.
  [[nodiscard]] std::span<std::byte> host_fill() const noexcept { return scratch_.span(); }
  void upload();
  // Staged: the GPU's source to its pinned copy, and the pinned window to the GPU.
  void stage_out();
  void stage_in();
  // The GPU's window, copied to the host.
  [[nodiscard]] std::span<const std::byte> download();
  [[nodiscard]] std::byte* device_source() const noexcept { return src_.data(); }
  [[nodiscard]] std::byte* device_window() const noexcept { return win_.data(); }
  // Staged only (empty otherwise): what the NIC reads and writes.
  [[nodiscard]] std::span<std::byte> staged_source() const noexcept { return host_src_.span(); }
  [[nodiscard]] std::span<std::byte> staged_window() const noexcept { return host_win_.span(); }

private:
  int device_;
  bool staged_;
  rdx::cuda::device_buffer<std::byte> src_, win_;
  rdx::cuda::pinned_buffer<std::byte> scratch_, host_src_, host_win_;
};

// The CUDA device of a rank: `wanted` (--gpu), else the local rank modulo the
// GPUs. Called before the RDMA device is opened, so that a rank without a
// usable GPU says so first. @throws rdx::error: no usable GPU, or no such one.
[[nodiscard]] int choose_gpu(std::optional<int> wanted, std::uint32_t local_rank);

// `device` as choose_gpu gives it; path "auto", "direct" or "staged" (--path).
[[nodiscard]] std::unique_ptr<memory> make_gpu_memory(const rdx::protection_domain& pd, std::size_t block,
                                                      std::uint32_t ranks, int device,
                                                      const std::string& path);

}  // namespace alltoall
