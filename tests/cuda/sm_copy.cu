// rdx/cuda/sm_copy.cuh's kernel copy behind a plain C++ declaration
// (patterns.hpp), so the same-host tests and tools can choose it as a copier.
#include <rdx/cuda/sm_copy.cuh>

#include "patterns.hpp"

namespace rdx_test {
cudaError_t sm_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t s) noexcept {
  return rdx::cuda::sm_copy(dst, src, bytes, s);
}
}  // namespace rdx_test
