// gpu_pingpong: host-callable fill, check and copy kernels (kernels.cu).
#pragma once

#include <rdx/cuda/pattern.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gpu_pingpong {
void fill(void* p, std::size_t n, std::uint64_t seed, cudaStream_t s);
rdx::cuda::pattern_result check(const void* p, std::size_t n, std::uint64_t seed, cudaStream_t s);
//! rdx::cuda::sm_copy: a copy by a kernel, for --same-host --sm-copy.
cudaError_t sm_copy(void* dst, const void* src, std::size_t n, cudaStream_t s) noexcept;
}  // namespace gpu_pingpong
