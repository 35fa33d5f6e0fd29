// register_memory over GPU memory: needs a GPU and an RDMA device on one
// machine (skips, exit 77, elsewhere).
#include <rdx/cuda/gpu_region.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/probe.hpp>
#include <rdx/cuda/register.hpp>
#include <rdx/cuda/topology.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "gpu_skip.hpp"

namespace {
[[maybe_unused]] const bool gpu_present = rdx_test::require_gpu_or_skip("cuda_register_test");
[[maybe_unused]] const bool rdma_present = rdx_test::require_rdma_device_or_skip("cuda_register_test");

rdx::context open_for_gpu0() {
  if (auto name = rdx::cuda::rdma_device_for_gpu(0)) {
    return rdx::context::open(*name);
  }
  return rdx::context::open_default();
}
}  // namespace

TEST_CASE("register_memory takes the path the probe predicts", "[cuda]") {
  auto ctx = open_for_gpu0();
  rdx::protection_domain pd(ctx);
  const auto report = rdx::cuda::probe_gpudirect(0, ctx.native_handle());
  std::printf("%s", report.to_string().c_str());
  rdx::cuda::device_buffer<std::byte> buf(8u << 20);
  if (report.best_path() == rdx::cuda::gpu_path::staged) {
    REQUIRE_THROWS_AS(rdx::cuda::register_memory(pd, buf, rdx::access::local_write), rdx::error);
    return;
  }
  auto mr = rdx::cuda::register_memory(pd, buf, rdx::access::local_write | rdx::access::remote_write);
  REQUIRE(mr.path == report.best_path());
  REQUIRE(mr.region.addr() == static_cast<void*>(buf.data()));
  REQUIRE(mr.region.length() == buf.size_bytes());
  REQUIRE(mr.region.native_handle()->pd == pd.native_handle());
}

TEST_CASE("register_memory covers an interior range at its own address", "[cuda]") {
  auto ctx = open_for_gpu0();
  rdx::protection_domain pd(ctx);
  const auto report = rdx::cuda::probe_gpudirect(0, ctx.native_handle());
  if (report.dma_buf_path() != rdx::cuda::support::yes) {
    WARN("dma-buf path not available here: " << report.kernel_dmabuf_detail);
    return;
  }
  rdx::cuda::device_buffer<std::byte> buf(6u << 20);
  void* inner = buf.data() + 12288 + 64;
  auto mr =
      rdx::cuda::register_memory(pd, inner, 1u << 20, rdx::access::local_write, rdx::cuda::gpu_path::dma_buf);
  REQUIRE(mr.path == rdx::cuda::gpu_path::dma_buf);
  REQUIRE(mr.region.addr() == inner);
  REQUIRE(mr.region.length() == (1u << 20));
}

TEST_CASE("register_memory refuses what it cannot register, saying why", "[cuda]") {
  auto ctx = open_for_gpu0();
  rdx::protection_domain pd(ctx);
  rdx::cuda::device_buffer<std::byte> buf(1u << 20);
  rdx::cuda::pinned_buffer<std::byte> host(4096);
  REQUIRE_THROWS_WITH(rdx::cuda::register_memory(pd, host.data(), 4096),
                      Catch::Contains("not device memory"));
  REQUIRE_THROWS_WITH(
      rdx::cuda::register_memory(pd, buf, rdx::access::local_write, rdx::cuda::gpu_path::staged),
      Catch::Contains("staging_pipeline"));
  REQUIRE_THROWS_WITH(rdx::cuda::register_memory(pd, buf.data() + 4096, buf.size_bytes(),
                                                 rdx::access::local_write, rdx::cuda::gpu_path::dma_buf),
                      Catch::Contains("dma-buf"));
}

TEST_CASE("gpu_region registers GPU memory directly, or stages it, and says which", "[cuda]") {
  auto ctx = open_for_gpu0();
  rdx::protection_domain pd(ctx);
  const auto report = rdx::cuda::probe_gpudirect(0, ctx.native_handle());
  rdx::cuda::device_buffer<std::byte> buf(8u << 20);
  const auto rights = rdx::access::local_write | rdx::access::remote_write;

  auto staged =
      rdx::cuda::make_gpu_region(pd, buf, rights, rdx::cuda::gpu_path::staged, {.chunk_bytes = 1u << 20});
  REQUIRE(staged.path() == rdx::cuda::gpu_path::staged);
  REQUIRE_FALSE(staged.direct());
  REQUIRE(staged.pipeline() != nullptr);
  REQUIRE(staged.region().addr() == static_cast<void*>(staged.pipeline()->bounce_buffers().data()));
  REQUIRE(staged.region().length() == 2 * (1u << 20));
  REQUIRE(staged.remote().length == 2 * (1u << 20));

  auto chosen = rdx::cuda::make_gpu_region(pd, buf, rights);
  if (report.best_path() == rdx::cuda::gpu_path::staged) {
    REQUIRE(chosen.path() == rdx::cuda::gpu_path::staged);
    REQUIRE_FALSE(chosen.why_staged().empty());
  } else {
    REQUIRE(chosen.direct());
    REQUIRE(chosen.pipeline() == nullptr);
    REQUIRE(chosen.region().addr() == static_cast<void*>(buf.data()));
    REQUIRE(chosen.why_staged().empty());
  }
}
