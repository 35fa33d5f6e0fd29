// gpu_pingpong's GPU halves on one machine, where there is no RDMA device (or
// --local): fill, stage out, stage in, check, both ways.
#include <rdx/cuda/check.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/staging.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels.hpp"
#include "runs.hpp"

namespace gpu_pingpong {

int run_local(const options& o) {
  rdx::cuda::device_guard g(o.gpu);
  rdx::cuda::staging_pipeline pipe({.chunk_bytes = o.chunk, .depth = o.depth, .device = o.gpu});
  rdx::cuda::device_buffer<std::byte> a(o.size);
  rdx::cuda::device_buffer<std::byte> b(o.size);
  rdx::cuda::pinned_buffer<std::byte> wire(o.size);
  rdx::cuda::stream s;
  std::vector<double> one_way;
  double out_s = 0;
  double in_s = 0;
  for (int it = -o.warmup; it < o.iters; ++it) {
    const auto seed = static_cast<std::uint64_t>(it + 1000);
    gpu_pingpong::fill(a.data(), o.size, seed, s.native_handle());
    RDX_CUDA_TRY(cudaMemsetAsync(b.data(), 0, o.size, s.native_handle()));
    s.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    const auto ping_out = pipe.send(a.data(), o.size, [&](const rdx::cuda::staged_chunk& c) {
      std::memcpy(wire.data() + c.offset, c.host.data(), c.host.size());
    });
    const auto ping_in = pipe.receive(b.data(), o.size, [&](const rdx::cuda::staged_chunk& c) {
      std::memcpy(c.host.data(), wire.data() + c.offset, c.host.size());
    });
    const auto t1 = std::chrono::steady_clock::now();
    if (!report_check("peer's check of the ping",
                      gpu_pingpong::check(b.data(), o.size, seed, s.native_handle()), it)) {
      return 1;
    }
    RDX_CUDA_TRY(cudaMemsetAsync(a.data(), 0, o.size, s.native_handle()));
    s.synchronize();
    const auto t2 = std::chrono::steady_clock::now();
    (void)pipe.send(b.data(), o.size, [&](const rdx::cuda::staged_chunk& c) {
      std::memcpy(wire.data() + c.offset, c.host.data(), c.host.size());
    });
    (void)pipe.receive(a.data(), o.size, [&](const rdx::cuda::staged_chunk& c) {
      std::memcpy(c.host.data(), wire.data() + c.offset, c.host.size());
    });
    const auto t3 = std::chrono::steady_clock::now();
    if (!report_check("check of the pong", gpu_pingpong::check(a.data(), o.size, seed, s.native_handle()),
                      it)) {
      return 1;
    }
    if (it >= 0) {
      one_way.push_back(std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count() / 2);
      out_s += ping_out.seconds;
      in_s += ping_in.seconds;
    }
  }
  const double m = median(one_way);
  std::printf(
      "gpu_pingpong: path staged (GPU halves only), %zu bytes, chunk %zu KiB, depth %zu, %d round trips: all "
      "bytes right\n",
      o.size, o.chunk >> 10, o.depth, o.iters);
  std::printf(
      "gpu_pingpong: one-way latency median %.1f us, bandwidth %.2f GB/s (stage out %.2f GB/s, stage in %.2f "
      "GB/s,"
      " each with a host memcpy standing in for the RDMA write)\n",
      m * 1e6, static_cast<double>(o.size) / m / 1e9, static_cast<double>(o.size) * o.iters / out_s / 1e9,
      static_cast<double>(o.size) * o.iters / in_s / 1e9);
  return 0;
}

}  // namespace gpu_pingpong
