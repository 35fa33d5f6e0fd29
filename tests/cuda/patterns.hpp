// Host-callable wrappers of rdx/cuda/pattern.cuh's kernels, compiled by nvcc
// in patterns.cu, so tests in plain C++ can fill and check GPU memory.
#pragma once

#include <rdx/cuda/pattern.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace rdx_test {
void gpu_fill(void* p, std::size_t n, std::uint64_t seed, std::uint64_t offset = 0, cudaStream_t s = nullptr);
rdx::cuda::pattern_result gpu_check(const void* p, std::size_t n, std::uint64_t seed,
                                    std::uint64_t offset = 0, cudaStream_t s = nullptr);
}  // namespace rdx_test
