// gpu_pingpong: host-callable fill and check kernels (kernels.cu).
#pragma once

#include <rdx/cuda/pattern.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gpu_pingpong {
void fill(void* p, std::size_t n, std::uint64_t seed, cudaStream_t s);
rdx::cuda::pattern_result check(const void* p, std::size_t n, std::uint64_t seed, cudaStream_t s);
}  // namespace gpu_pingpong
