// alltoall's GPU memory: the blocks on a CUDA device, direct or staged.
#include "gpu_memory.hpp"

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/register.hpp>

#include <cstdio>
#include <optional>
#include <utility>

namespace alltoall {

gpu_blocks::gpu_blocks(int device, std::size_t block, std::uint32_t ranks, bool staged)
    : device_(device), staged_(staged) {
  const rdx::cuda::device_guard g(device);
  const std::size_t n = block * ranks;
  src_ = rdx::cuda::device_buffer<std::byte>(n);
  win_ = rdx::cuda::device_buffer<std::byte>(n);
  scratch_ = rdx::cuda::pinned_buffer<std::byte>(n);
  if (staged) {
    host_src_ = rdx::cuda::pinned_buffer<std::byte>(n);
    host_win_ = rdx::cuda::pinned_buffer<std::byte>(n);
  }
  // A window that never received a block reads as zeros, not as what the
  // allocator left there.
  RDX_CUDA_TRY(cudaMemset(win_.data(), 0, n));
}

void gpu_blocks::upload() {
  const rdx::cuda::device_guard g(device_);
  RDX_CUDA_TRY(cudaMemcpy(src_.data(), scratch_.data(), bytes(), cudaMemcpyHostToDevice));
}

void gpu_blocks::stage_out() {
  const rdx::cuda::device_guard g(device_);
  RDX_CUDA_TRY(cudaMemcpy(host_src_.data(), src_.data(), bytes(), cudaMemcpyDeviceToHost));
}

void gpu_blocks::stage_in() {
  const rdx::cuda::device_guard g(device_);
  RDX_CUDA_TRY(cudaMemcpy(win_.data(), host_win_.data(), bytes(), cudaMemcpyHostToDevice));
}

std::span<const std::byte> gpu_blocks::download() {
  const rdx::cuda::device_guard g(device_);
  RDX_CUDA_TRY(cudaMemcpy(scratch_.data(), win_.data(), bytes(), cudaMemcpyDeviceToHost));
  return scratch_.span();
}

namespace {

// The blocks on the GPU and the registrations the NIC uses: the GPU memory
// itself (direct), or its pinned host copies (staged).
class gpu_memory final : public memory {
public:
  gpu_memory(gpu_blocks b, rdx::memory_region src, rdx::memory_region win, std::size_t block,
             std::string path, std::optional<rdx::cuda::gpudirect_flush> flush)
      : b_(std::move(b)),
        src_(std::move(src)),
        win_(std::move(win)),
        block_(block),
        path_(std::move(path)),
        flush_(std::move(flush)) {}

  [[nodiscard]] std::string describe() const override {
    return "GPU " + std::to_string(b_.device()) + " memory, " + path_;
  }
  [[nodiscard]] rdx::group::mesh_window window() override {
    std::byte* w = b_.staged() ? b_.staged_window().data() : b_.device_window();
    return {&win_, std::span(w, b_.bytes()), block_};
  }
  [[nodiscard]] std::span<std::byte> host_fill() override { return b_.host_fill(); }
  void filled() override { b_.upload(); }
  void before_writes() override {
    if (b_.staged()) b_.stage_out();
  }
  [[nodiscard]] rdx::local_span<const std::byte> source(std::uint32_t p) override {
    const std::byte* s = b_.staged() ? b_.staged_source().data() : b_.device_source();
    return rdx::local_span<const std::byte>(src_, std::span(s + std::size_t{p} * block_, block_));
  }
  void after_barrier() override {
    if (b_.staged()) {
      b_.stage_in();
    } else {
      (void)(*flush_)();  // none or cuFlushGPUDirectRDMAWrites: an RDMA read was refused at set-up
    }
  }
  [[nodiscard]] std::span<const std::byte> received() override { return b_.download(); }

private:
  gpu_blocks b_;
  rdx::memory_region src_, win_;
  std::size_t block_;
  std::string path_;
  std::optional<rdx::cuda::gpudirect_flush> flush_;
};

std::unique_ptr<memory> staged(const rdx::protection_domain& pd, std::size_t block, std::uint32_t ranks,
                               int device, const std::string& why) {
  gpu_blocks b(device, block, ranks, true);
  rdx::memory_region src(pd, b.staged_source(), rdx::access::local_write);
  rdx::memory_region win(pd, b.staged_window(), rdx::access::local_write);
  return std::make_unique<gpu_memory>(std::move(b), std::move(src), std::move(win), block,
                                      "staged through pinned host memory" + why, std::nullopt);
}

}  // namespace

int choose_gpu(std::optional<int> wanted, std::uint32_t local_rank) {
  if (const std::string why = rdx::cuda::no_device_reason(); !why.empty()) {
    throw rdx::error(rdx::errc::unsupported, "--memory cuda: no usable CUDA GPU: " + why);
  }
  const int count = rdx::cuda::device_count();
  if (!wanted) return static_cast<int>(local_rank % static_cast<std::uint32_t>(count));
  if (*wanted >= count) {
    throw rdx::error(rdx::errc::invalid_argument, "--gpu " + std::to_string(*wanted) + ": this machine has " +
                                                      std::to_string(count) + " GPUs");
  }
  return *wanted;
}

std::unique_ptr<memory> make_gpu_memory(const rdx::protection_domain& pd, std::size_t block,
                                        std::uint32_t ranks, int device, const std::string& path) {
  if (path == "staged") return staged(pd, block, ranks, device, "");
  // Direct needs GPU memory the NIC can write, made visible to the GPU
  // without an RDMA read (a mesh's writes end at a barrier, not a read).
  rdx::cuda::gpudirect_flush flush(device, rdx::cuda::flush_scope::owner);
  std::string refused;
  if (flush.method() == rdx::cuda::flush_method::rdma_read) {
    refused = "this GPU needs an RDMA read to flush the NIC's writes";
  } else {
    gpu_blocks b(device, block, ranks, false);
    try {
      auto src = rdx::cuda::register_memory(pd, b.device_source(), b.bytes(), rdx::access::local_write);
      auto win = rdx::cuda::register_memory(pd, b.device_window(), b.bytes(), rdx::access::local_write);
      const std::string how = "direct (" + std::string(rdx::cuda::to_string(win.path)) + ")";
      return std::make_unique<gpu_memory>(std::move(b), std::move(src.region), std::move(win.region), block,
                                          how, std::move(flush));
    } catch (const rdx::error& e) {
      refused = std::string("GPU memory does not register here: ") + e.what();
    }
  }
  if (path == "direct") {
    throw rdx::error(rdx::errc::unsupported, "--path direct: " + refused + " (use --path staged)");
  }
  return staged(pd, block, ranks, device, ", since " + refused);
}

}  // namespace alltoall
