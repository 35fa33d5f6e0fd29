// Fill and check kernels for the cuda tests and tools.
#include <rdx/cuda/pattern.cuh>

#include "patterns.hpp"

namespace rdx_test {
void gpu_fill(void* p, std::size_t n, std::uint64_t seed, std::uint64_t offset, cudaStream_t s) {
  rdx::cuda::fill_pattern(p, n, seed, offset, s);
}
rdx::cuda::pattern_result gpu_check(const void* p, std::size_t n, std::uint64_t seed, std::uint64_t offset,
                                    cudaStream_t s) {
  return rdx::cuda::check_pattern(p, n, seed, offset, s);
}
}  // namespace rdx_test
