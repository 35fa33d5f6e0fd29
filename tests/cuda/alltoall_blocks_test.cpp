// alltoall's GPU blocks (examples/alltoall/gpu_memory.hpp) on a GPU: the
// GPU half of an all-to-all of three ranks in one process, with the NIC's
// writes replaced by copies between the ranks' buffers (pinned host memory
// staged, device memory direct), every byte checked after each rank's copy
// back. The RDMA half runs on the fabric (group_alltoall_* tests).
#include <rdx/cuda/check.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "blocks.hpp"
#include "gpu_memory.hpp"
#include "gpu_skip.hpp"

namespace {
[[maybe_unused]] const bool gpu_present = rdx_test::require_gpu_or_skip("cuda_alltoall_blocks_test");

constexpr std::uint32_t ranks = 3;

// One iteration: every rank fills and uploads its source; rank r's block p
// lands in rank p's window at block r, as the NIC would put it; every rank
// reads its window back and checks it. Returns the wrong bytes of all ranks.
std::uint64_t iteration(std::vector<alltoall::gpu_blocks>& rk, std::size_t block, std::uint32_t it,
                        std::string& first) {
  for (std::uint32_t r = 0; r < ranks; ++r) {
    alltoall::fill(rk[r].host_fill(), block, it, r);
    rk[r].upload();
    if (rk[r].staged()) rk[r].stage_out();
  }
  for (std::uint32_t r = 0; r < ranks; ++r) {
    for (std::uint32_t p = 0; p < ranks; ++p) {
      if (p == r) continue;
      const std::size_t from = std::size_t{p} * block, to = std::size_t{r} * block;
      if (rk[r].staged()) {
        std::memcpy(rk[p].staged_window().data() + to, rk[r].staged_source().data() + from, block);
      } else {
        REQUIRE(cudaMemcpy(rk[p].device_window() + to, rk[r].device_source() + from, block,
                           cudaMemcpyDeviceToDevice) == cudaSuccess);
      }
    }
  }
  std::uint64_t wrong = 0;
  for (std::uint32_t r = 0; r < ranks; ++r) {
    if (rk[r].staged()) rk[r].stage_in();
    wrong += alltoall::check(rk[r].download(), block, it, r, first);
  }
  return wrong;
}
}  // namespace

TEST_CASE("alltoall's GPU blocks carry every byte, staged and direct", "[cuda]") {
  const bool staged = GENERATE(true, false);
  const std::size_t block = GENERATE(std::size_t{8}, std::size_t{4096} + 24, std::size_t{1} << 20);
  INFO((staged ? "staged" : "direct") << ", block " << block);
  std::vector<alltoall::gpu_blocks> rk;
  for (std::uint32_t r = 0; r < ranks; ++r) rk.emplace_back(0, block, ranks, staged);
  REQUIRE(rk[0].bytes() == block * ranks);
  REQUIRE(rk[0].staged_source().size() == (staged ? block * ranks : 0));
  REQUIRE(rk[0].staged_window().size() == (staged ? block * ranks : 0));
  cudaPointerAttributes pa{};
  REQUIRE(cudaPointerGetAttributes(&pa, rk[0].device_window()) == cudaSuccess);
  REQUIRE(pa.type == cudaMemoryTypeDevice);

  // A window nothing was written to reads as zeros, which the check refuses.
  std::string first;
  REQUIRE(alltoall::check(rk[1].download(), block, 0, 1, first) > 0);
  first.clear();

  for (std::uint32_t it = 0; it < 3; ++it) {
    INFO("iteration " << it);
    REQUIRE(iteration(rk, block, it, first) == 0);
    REQUIRE(first.empty());
  }
}

TEST_CASE("alltoall's check finds one byte changed on the GPU", "[cuda]") {
  const std::size_t block = 4096;
  std::vector<alltoall::gpu_blocks> rk;
  for (std::uint32_t r = 0; r < ranks; ++r) rk.emplace_back(0, block, ranks, true);
  std::string first;
  REQUIRE(iteration(rk, block, 7, first) == 0);
  // Rank 2's block from rank 1, byte 100, flipped in device memory.
  std::byte b{};
  std::byte* at = rk[2].device_window() + block + 100;
  REQUIRE(cudaMemcpy(&b, at, 1, cudaMemcpyDeviceToHost) == cudaSuccess);
  b = ~b;
  REQUIRE(cudaMemcpy(at, &b, 1, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(alltoall::check(rk[2].download(), block, 7, 2, first) == 1);
  REQUIRE(first == "iteration 7, from rank 1, offset 100");
}
