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
//! rdx::cuda::sm_copy (rdx/cuda/sm_copy.cuh): a copy by a kernel, usable as a same_host_options::copier.
cudaError_t sm_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t s) noexcept;
}  // namespace rdx_test
