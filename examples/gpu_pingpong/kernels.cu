// gpu_pingpong: the pattern kernels, compiled by nvcc.
#include <rdx/cuda/pattern.cuh>
#include <rdx/cuda/sm_copy.cuh>

#include "kernels.hpp"

namespace gpu_pingpong {
void fill(void* p, std::size_t n, std::uint64_t seed, cudaStream_t s) {
  rdx::cuda::fill_pattern(p, n, seed, 0, s);
}
rdx::cuda::pattern_result check(const void* p, std::size_t n, std::uint64_t seed, cudaStream_t s) {
  return rdx::cuda::check_pattern(p, n, seed, 0, s);
}
cudaError_t sm_copy(void* dst, const void* src, std::size_t n, cudaStream_t s) noexcept {
  return rdx::cuda::sm_copy(dst, src, n, s);
}
}  // namespace gpu_pingpong
