// The GPU fill and check kernels agree with the host pattern and find every
// wrong byte.
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/pattern.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "gpu_skip.hpp"
#include "patterns.hpp"

namespace {
[[maybe_unused]] const bool gpu_present = rdx_test::require_gpu_or_skip("cuda_pattern_test");
}

TEST_CASE("GPU fill matches the host pattern at any size and offset", "[cuda]") {
  for (std::size_t n :
       {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{4097}, std::size_t{3u << 20}}) {
    for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{8}, std::uint64_t{3}}) {
      rdx::cuda::device_buffer<std::byte> dev(n);
      REQUIRE(cudaMemset(dev.data(), 0xA5, n) == cudaSuccess);
      rdx_test::gpu_fill(dev.data(), n, 1234, offset);
      std::vector<std::byte> host(n);
      REQUIRE(cudaMemcpy(host.data(), dev.data(), n, cudaMemcpyDeviceToHost) == cudaSuccess);
      INFO("n " << n << " offset " << offset);
      REQUIRE(rdx::cuda::check_pattern_host(host.data(), n, 1234, offset).ok());
      REQUIRE(rdx_test::gpu_check(dev.data(), n, 1234, offset).ok());
    }
  }
}

TEST_CASE("GPU check reports a single wrong byte and where it is", "[cuda]") {
  constexpr std::size_t n = 8u << 20;
  rdx::cuda::device_buffer<std::byte> dev(n);
  rdx_test::gpu_fill(dev.data(), n, 99);
  REQUIRE(rdx_test::gpu_check(dev.data(), n, 99).ok());
  REQUIRE_FALSE(rdx_test::gpu_check(dev.data(), n, 100).ok());

  const std::size_t bad = 5'000'001;
  const auto want = rdx::cuda::pattern_byte(99, bad);
  const auto flipped = static_cast<unsigned char>(want ^ 0x10);
  REQUIRE(cudaMemcpy(static_cast<unsigned char*>(static_cast<void*>(dev.data())) + bad, &flipped, 1,
                     cudaMemcpyHostToDevice) == cudaSuccess);
  const auto r = rdx_test::gpu_check(dev.data(), n, 99);
  REQUIRE(r.mismatches == 1);
  REQUIRE(r.first_bad_offset == bad / 8 * 8);  // word-wise on the GPU

  std::vector<std::byte> host(n);
  REQUIRE(cudaMemcpy(host.data(), dev.data(), n, cudaMemcpyDeviceToHost) == cudaSuccess);
  const auto h = rdx::cuda::check_pattern_host(host.data(), n, 99);
  REQUIRE(h.mismatches == 1);
  REQUIRE(h.first_bad_offset == bad);
}
