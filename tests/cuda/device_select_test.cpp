// A GPU named by its ordinal or its UUID (rdx/cuda/device_select.hpp), and a
// device with itself refused before CUDA is asked (peer_access.hpp): on
// whatever GPUs the machine has (one is enough); skipped (77) without a GPU.
#include <rdx/cuda/device_select.hpp>
#include <rdx/cuda/peer_access.hpp>

#include <catch2/catch.hpp>

#include <cctype>
#include <string>
#include <vector>

#include "gpu_skip.hpp"

namespace {
[[maybe_unused]] const bool gpu_present = rdx_test::require_gpu_or_skip("cuda_device_select_test");
std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return "GPU-" + s.substr(4);
}
}  // namespace

TEST_CASE("every visible GPU is found again by its UUID, in either case", "[cuda]") {
  const std::vector<rdx::cuda::gpu_uuid> gpus = rdx::cuda::visible_gpus();
  REQUIRE(static_cast<int>(gpus.size()) == rdx::cuda::device_count());
  for (std::size_t d = 0; d < gpus.size(); ++d) {
    const std::string text = rdx::cuda::to_string(gpus[d]);
    INFO("CUDA device " << d << ": " << text);
    CHECK(gpus[d] != rdx::cuda::gpu_uuid{});
    CHECK(rdx::cuda::device_of(gpus[d]) == static_cast<int>(d));
    CHECK(rdx::cuda::select_device(text) == static_cast<int>(d));
    CHECK(rdx::cuda::select_device(upper(text)) == static_cast<int>(d));
    CHECK(rdx::cuda::select_device(std::to_string(d)) == static_cast<int>(d));
  }
}

TEST_CASE("a GPU this process does not see is refused, naming those it does", "[cuda]") {
  const std::vector<rdx::cuda::gpu_uuid> gpus = rdx::cuda::visible_gpus();
  REQUIRE(!gpus.empty());
  rdx::cuda::gpu_uuid other = gpus[0];
  other[15] = static_cast<std::uint8_t>(other[15] ^ 0xff);
  bool unseen = true;
  for (const auto& u : gpus) unseen = unseen && u != other;
  REQUIRE(unseen);
  CHECK_THROWS_WITH(rdx::cuda::device_of(other), Catch::Contains(rdx::cuda::to_string(other)) &&
                                                     Catch::Contains(rdx::cuda::to_string(gpus[0])) &&
                                                     Catch::Contains("CUDA_VISIBLE_DEVICES"));
  CHECK_THROWS_WITH(rdx::cuda::select_device(std::to_string(gpus.size())), Catch::Contains("sees"));
  CHECK_THROWS_WITH(rdx::cuda::select_device("first"), Catch::Contains("nvidia-smi -L"));
}

TEST_CASE("peer access of a GPU with itself is refused cleanly, and asked only of distinct pairs", "[cuda]") {
  const int n = rdx::cuda::device_count();
  for (int d = 0; d < n; ++d) {
    CHECK_THROWS_WITH(rdx::cuda::probe_gpu_pair(d, d), Catch::Contains("itself"));
  }
  // Every pair probe_gpu_pairs() reports is of two distinct GPUs, each way; one GPU has none.
  const auto pairs = rdx::cuda::probe_gpu_pairs();
  CHECK(pairs.size() == static_cast<std::size_t>(n * (n - 1)));  // each ordered pair once
  for (const auto& p : pairs) CHECK(p.a != p.b);
}
