// device_buffer, pinned_buffer, stream, event and the CUDA check, on a GPU.
#include <rdx/cuda/check.hpp>
#include <rdx/cuda/memory.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "gpu_skip.hpp"
#include "patterns.hpp"

// Owners are move-only.
static_assert(!std::is_copy_constructible_v<rdx::cuda::device_buffer<int>>);
static_assert(!std::is_copy_assignable_v<rdx::cuda::pinned_buffer<int>>);
static_assert(!std::is_copy_constructible_v<rdx::cuda::stream>);
static_assert(!std::is_copy_constructible_v<rdx::cuda::event>);
static_assert(std::is_nothrow_move_constructible_v<rdx::cuda::device_buffer<int>>);
static_assert(std::is_nothrow_move_constructible_v<rdx::cuda::pinned_buffer<int>>);
static_assert(std::is_nothrow_move_constructible_v<rdx::cuda::stream>);
static_assert(std::is_nothrow_move_assignable_v<rdx::cuda::event>);

namespace {
[[maybe_unused]] const bool gpu_present = rdx_test::require_gpu_or_skip("cuda_memory_test");
}

TEST_CASE("device_buffer allocates, moves and frees device memory", "[cuda]") {
  rdx::cuda::device_buffer<std::uint32_t> a(1000);
  REQUIRE(a.data() != nullptr);
  REQUIRE(a.size() == 1000);
  REQUIRE(a.size_bytes() == 4000);
  REQUIRE(a.device() == rdx::cuda::current_device());

  cudaPointerAttributes pa{};
  REQUIRE(cudaPointerGetAttributes(&pa, a.data()) == cudaSuccess);
  REQUIRE(pa.type == cudaMemoryTypeDevice);

  auto* p = a.data();
  rdx::cuda::device_buffer<std::uint32_t> b(std::move(a));
  REQUIRE(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  REQUIRE(a.empty());
  REQUIRE(b.data() == p);

  a = std::move(b);
  REQUIRE(a.data() == p);
  REQUIRE(b.data() == nullptr);

  auto* raw = a.release();
  REQUIRE(a.data() == nullptr);
  auto c = rdx::cuda::device_buffer<std::uint32_t>::from_native_handle(raw, 1000, 0);
  REQUIRE(c.data() == raw);
  REQUIRE_THROWS_AS(rdx::cuda::device_buffer<int>::from_native_handle(nullptr, 1, 0), rdx::error);
}

TEST_CASE("pinned_buffer is page-locked host memory the GPU copies to and from", "[cuda]") {
  constexpr std::size_t n = (1u << 20) + 13;
  rdx::cuda::pinned_buffer<std::byte> host(n);
  REQUIRE(host.size() == n);
  cudaPointerAttributes pa{};
  REQUIRE(cudaPointerGetAttributes(&pa, host.data()) == cudaSuccess);
  REQUIRE(pa.type == cudaMemoryTypeHost);

  rdx::cuda::device_buffer<std::byte> dev(n);
  rdx::cuda::stream s;
  rdx_test::gpu_fill(dev.data(), n, 42, 0, s.native_handle());
  std::memset(host.data(), 0, n);
  REQUIRE(cudaMemcpyAsync(host.data(), dev.data(), n, cudaMemcpyDeviceToHost, s.native_handle()) ==
          cudaSuccess);
  s.synchronize();
  const auto r = rdx::cuda::check_pattern_host(host.data(), n, 42);
  REQUIRE(r.mismatches == 0);
  // A different seed must not pass: the check would be worthless otherwise.
  REQUIRE_FALSE(rdx::cuda::check_pattern_host(host.data(), n, 43).ok());
}

TEST_CASE("stream and event order and time GPU work", "[cuda]") {
  rdx::cuda::stream s;
  REQUIRE(s.native_handle() != nullptr);
  rdx::cuda::event start(rdx::cuda::event::timing::on);
  rdx::cuda::event stop(rdx::cuda::event::timing::on);
  rdx::cuda::device_buffer<std::byte> dev(64u << 20);
  start.record(s);
  rdx_test::gpu_fill(dev.data(), dev.size_bytes(), 7, 0, s.native_handle());
  stop.record(s);
  stop.synchronize();
  REQUIRE(stop.ready());
  REQUIRE(s.ready());
  REQUIRE(rdx::cuda::event::elapsed_ms(start, stop) > 0.0f);

  rdx::cuda::stream moved(std::move(s));
  REQUIRE(moved.native_handle() != nullptr);
  REQUIRE(s.native_handle() == nullptr);  // NOLINT(bugprone-use-after-move)
  REQUIRE_THROWS_AS(rdx::cuda::stream::from_native_handle(nullptr), rdx::error);
  REQUIRE_THROWS_AS(rdx::cuda::event::from_native_handle(nullptr), rdx::error);
}

TEST_CASE("a failed CUDA call throws cuda_error with its name and status, and clears the error", "[cuda]") {
  try {
    // Far more than any GPU has.
    rdx::cuda::device_buffer<std::byte> huge(std::size_t{1} << 52);
    FAIL("a 4 PiB cudaMalloc succeeded");
  } catch (const rdx::cuda::cuda_error& e) {
    REQUIRE(e.code() == rdx::cuda::make_error_code(cudaErrorMemoryAllocation));
    REQUIRE(&e.code().category() == &rdx::cuda::runtime_category());
    REQUIRE(e.call().find("cudaMalloc") != std::string::npos);
    REQUIRE(std::string(e.what()).find("cudaMalloc") != std::string::npos);
    REQUIRE(std::string(e.what()).find("cudaErrorMemoryAllocation") != std::string::npos);
  }
  // The check cleared the error: the next, unrelated, call sees none.
  REQUIRE(cudaGetLastError() == cudaSuccess);
  rdx::cuda::device_buffer<int> fine(16);
  REQUIRE(fine.data() != nullptr);

  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  REQUIRE_THROWS_AS(rdx::cuda::device_guard(count + 7), rdx::cuda::cuda_error);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  // The guard that failed left the current device alone.
  REQUIRE(rdx::cuda::current_device() == 0);
}

TEST_CASE("RDX_CUDA_TRY passes success through and throws on failure", "[cuda]") {
  REQUIRE_NOTHROW(RDX_CUDA_TRY(cudaDeviceSynchronize()));
  REQUIRE_THROWS_WITH(RDX_CUDA_TRY(cudaSetDevice(-1)), Catch::Contains("cudaSetDevice(-1)"));
  REQUIRE(cudaGetLastError() == cudaSuccess);
}
