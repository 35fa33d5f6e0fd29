// Throughput of the staging pipeline's GPU halves (device to pinned host and
// back, chunked and overlapped) against one plain cudaMemcpy of the same
// bytes with pinned memory, in the same run. Every byte is checked once.
//
// usage: cuda_staging_throughput [bytes_mib=1024] [reps=7] [chunk_kib...]  (chunk 0: the default options)
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/staging.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "patterns.hpp"

namespace {
template <class F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main(int argc, char** argv) try {
  if (rdx::cuda::device_count() == 0) {
    std::fprintf(stderr, "cuda_staging_throughput: SKIP: no CUDA GPU: %s\n",
                 rdx::cuda::no_device_reason().c_str());
    return 77;
  }
  const std::size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024) << 20;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 7;
  std::vector<std::size_t> chunks;
  for (int i = 3; i < argc; ++i) {
    chunks.push_back(std::strtoull(argv[i], nullptr, 10) << 10);
  }
  if (chunks.empty()) {
    chunks = {std::size_t{4} << 20};
  }

  rdx::cuda::device_buffer<std::byte> dev(bytes);
  rdx::cuda::pinned_buffer<std::byte> host(bytes);
  rdx_test::gpu_fill(dev.data(), bytes, 31337);
  RDX_CUDA_TRY(cudaDeviceSynchronize());

  // Baseline: one cudaMemcpy of all bytes each way, pinned host memory.
  const double d2h_plain = median_seconds(
      reps, [&] { RDX_CUDA_TRY(cudaMemcpy(host.data(), dev.data(), bytes, cudaMemcpyDeviceToHost)); });
  if (!rdx::cuda::check_pattern_host(host.data(), bytes, 31337).ok()) {
    std::fprintf(stderr, "plain D2H copy: wrong bytes\n");
    return 1;
  }
  const double h2d_plain = median_seconds(
      reps, [&] { RDX_CUDA_TRY(cudaMemcpy(dev.data(), host.data(), bytes, cudaMemcpyHostToDevice)); });
  const auto gbs = [&](double s) { return static_cast<double>(bytes) / s / 1e9; };
  std::printf("bytes %zu MiB, reps %d (median)\n", bytes >> 20, reps);
  std::printf("RESULT plain    D2H %7.2f GB/s  H2D %7.2f GB/s\n", gbs(d2h_plain), gbs(h2d_plain));

  int rc = 0;
  for (const std::size_t chunk : chunks) {
    for (const std::size_t depth : {std::size_t{2}, std::size_t{4}}) {
      // chunk 0: the default options (chunks sized by rdx::cuda::chunk_for).
      rdx::cuda::staging_options o{.depth = depth};
      if (chunk != 0) o.chunk_bytes = chunk;
      rdx::cuda::staging_pipeline p(o);
      // The timed receives below overwrite dev with bounce-buffer leftovers:
      // restore the pattern, then check every chunk of one send as it lands.
      rdx_test::gpu_fill(dev.data(), bytes, 31337);
      RDX_CUDA_TRY(cudaDeviceSynchronize());
      std::uint64_t bad = 0;
      (void)p.send(dev.data(), bytes, [&](const rdx::cuda::staged_chunk& c) {
        bad += rdx::cuda::check_pattern_host(c.host.data(), c.host.size(), 31337, c.offset).mismatches;
      });
      if (bad != 0) {
        std::fprintf(stderr, "staged send: %llu wrong bytes\n", static_cast<unsigned long long>(bad));
        rc = 1;
      }
      // Timed: the sink and source stand for RDMA work that overlaps the copies.
      const double d2h = median_seconds(
          reps, [&] { (void)p.send(dev.data(), bytes, [](const rdx::cuda::staged_chunk&) {}); });
      const double h2d = median_seconds(
          reps, [&] { (void)p.receive(dev.data(), bytes, [](const rdx::cuda::staged_chunk&) {}); });
      std::printf(
          "RESULT staged chunk %5s KiB depth %zu  D2H %7.2f GB/s (%5.1f%% of plain)  H2D %7.2f GB/s "
          "(%5.1f%% of plain)\n",
          chunk == 0 ? "dflt" : std::to_string(chunk >> 10).c_str(), depth, gbs(d2h), 100.0 * d2h_plain / d2h,
          gbs(h2d), 100.0 * h2d_plain / h2d);
    }
  }
  // The receive runs above wrote bounce-buffer contents into dev; a full
  // receive of the pattern must still land right.
  rdx::cuda::staging_pipeline p;
  (void)p.receive(dev.data(), bytes, [&](const rdx::cuda::staged_chunk& c) {
    std::memcpy(c.host.data(), host.data() + c.offset, c.host.size());
  });
  if (!rdx_test::gpu_check(dev.data(), bytes, 31337).ok()) {
    std::fprintf(stderr, "staged receive: wrong bytes\n");
    rc = 1;
  }
  return rc;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cuda_staging_throughput: %s\n", e.what());
  return 1;
}
