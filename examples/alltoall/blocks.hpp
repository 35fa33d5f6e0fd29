// alltoall: where a rank's blocks live. A rank writes block p of its source to
// rank p and receives block p of its window from rank p; both are host memory
// (host_memory, here) or GPU memory (gpu_memory.hpp, where rdx::cuda is built).
#pragma once

#include <rdx/group/mesh_options.hpp>
#include <rdx/rdx.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace alltoall {

// The byte `from` writes at offset i of its block at `to` in iteration `it`.
inline std::byte pattern(std::uint32_t it, std::uint32_t from, std::uint32_t to, std::size_t i) {
  const std::uint64_t x = (std::uint64_t{it} * 0x9e3779b1u) ^ (std::uint64_t{from} << 20) ^
                          (std::uint64_t{to} << 8) ^ (i * 0x45d9f3bu) ^ (i >> 9);
  return static_cast<std::byte>(x ^ (x >> 13));
}

// Fills every block but the rank's own (blocks of `block` bytes, one per rank).
inline void fill(std::span<std::byte> src, std::size_t block, std::uint32_t it, std::uint32_t rank) {
  const auto ranks = static_cast<std::uint32_t>(src.size() / block);
  for (std::uint32_t p = 0; p < ranks; ++p) {
    if (p == rank) continue;
    std::byte* b = src.data() + std::size_t{p} * block;
    for (std::size_t i = 0; i < block; ++i) b[i] = pattern(it, rank, p, i);
  }
}

// Counts the wrong bytes of every received block; `first` names the first.
inline std::uint64_t check(std::span<const std::byte> window, std::size_t block, std::uint32_t it,
                           std::uint32_t rank, std::string& first) {
  const auto ranks = static_cast<std::uint32_t>(window.size() / block);
  std::uint64_t wrong = 0;
  for (std::uint32_t p = 0; p < ranks; ++p) {
    if (p == rank) continue;
    const std::byte* got = window.data() + std::size_t{p} * block;
    for (std::size_t i = 0; i < block; ++i) {
      if (got[i] != pattern(it, p, rank, i) && wrong++ == 0) {
        first = "iteration " + std::to_string(it) + ", from rank " + std::to_string(p) + ", offset " +
                std::to_string(i);
      }
    }
  }
  return wrong;
}

// A rank's source and window. The timed part of an iteration is
// before_writes(), the writes from source(), the barrier and after_barrier();
// host_fill()/filled() before it and received() after it are not timed.
class memory {
public:
  virtual ~memory() = default;
  // "host memory", "GPU 0, direct (dma-buf)", ...
  [[nodiscard]] virtual std::string describe() const = 0;
  // The window the mesh grants its peers, block by block.
  [[nodiscard]] virtual rdx::group::mesh_window window() = 0;
  // Host bytes to write this iteration's source into; filled() takes them.
  [[nodiscard]] virtual std::span<std::byte> host_fill() = 0;
  virtual void filled() = 0;
  // Before the writes: a staged source is copied to host memory.
  virtual void before_writes() = 0;
  // What the writes to rank p read.
  [[nodiscard]] virtual rdx::local_span<const std::byte> source(std::uint32_t p) = 0;
  // After the barrier that follows the writes: a staged window is copied to
  // the GPU; GPU memory written by the NIC is made visible to the GPU.
  virtual void after_barrier() = 0;
  // The window's bytes as the host sees them (a copy of GPU memory).
  [[nodiscard]] virtual std::span<const std::byte> received() = 0;
};

// Blocks in registered host memory.
class host_memory final : public memory {
public:
  host_memory(const rdx::protection_domain& pd, std::size_t block, std::uint32_t ranks)
      : block_(block),
        window_(rdx::make_window_buffer<std::byte>(pd, block * ranks)),
        src_(pd, block * ranks) {}
  [[nodiscard]] std::string describe() const override { return "host memory"; }
  [[nodiscard]] rdx::group::mesh_window window() override {
    return {&window_.region(), std::span(window_.data(), window_.size()), block_};
  }
  [[nodiscard]] std::span<std::byte> host_fill() override { return {src_.data(), src_.size()}; }
  void filled() override {}
  void before_writes() override {}
  [[nodiscard]] rdx::local_span<const std::byte> source(std::uint32_t p) override {
    return rdx::local_span<const std::byte>(src_).subspan(std::size_t{p} * block_, block_);
  }
  void after_barrier() override {}
  [[nodiscard]] std::span<const std::byte> received() override { return {window_.data(), window_.size()}; }

private:
  std::size_t block_;
  rdx::registered_buffer<std::byte> window_;
  rdx::registered_buffer<std::byte> src_;
};

}  // namespace alltoall
