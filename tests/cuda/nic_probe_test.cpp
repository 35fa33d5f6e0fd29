// The NIC half of the GPUDirect probe on a real RDMA device (natively, or
// rxe0 in a Soft-RoCE VM): ibv_reg_dmabuf_mr with fd -1 gives a definite
// answer, never "unknown". Needs no GPU and no CUDA.
#include <rdx/cuda/nic_probe.hpp>
#include <rdx/verbs/context.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

TEST_CASE("the kernel's dma-buf registration support is a definite yes or no", "[rdma]") {
  auto ctx = rdx::context::open_default();
  const auto r = rdx::cuda::probe_kernel_dmabuf(ctx.native_handle());
  std::printf("%s: ibv_reg_dmabuf_mr %s: %s\n", ctx.name().c_str(),
              std::string(rdx::cuda::to_string(r.answer)).c_str(), r.detail.c_str());
  REQUIRE(r.answer != rdx::cuda::support::unknown);
  if (r.answer == rdx::cuda::support::yes) {
    REQUIRE(r.detail.find("EBADF") != std::string::npos);
  } else {
    REQUIRE(r.detail.find("lacks dma-buf") != std::string::npos);
  }
  // Probing leaves nothing behind: a second probe answers the same.
  REQUIRE(rdx::cuda::probe_kernel_dmabuf(ctx.native_handle()).answer == r.answer);
}

TEST_CASE("no device: the kernel check says it did not run", "[rdma]") {
  const auto r = rdx::cuda::probe_kernel_dmabuf(nullptr);
  REQUIRE(r.answer == rdx::cuda::support::unknown);
  REQUIRE(r.detail.find("no RDMA device") != std::string::npos);
}
