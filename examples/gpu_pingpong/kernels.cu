// gpu_pingpong: the pattern kernels, compiled by nvcc.
#include <rdx/cuda/pattern.cuh>

#include "kernels.hpp"

namespace gpu_pingpong {
void fill(void* p, std::size_t n, std::uint64_t seed, cudaStream_t s) {
  rdx::cuda::fill_pattern(p, n, seed, 0, s);
}
rdx::cuda::pattern_result check(const void* p, std::size_t n, std::uint64_t seed, cudaStream_t s) {
  return rdx::cuda::check_pattern(p, n, seed, 0, s);
}
}  // namespace gpu_pingpong
