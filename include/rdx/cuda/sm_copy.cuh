// rdx::cuda: a device-to-device copy by the GPU's multiprocessors (a kernel)
// instead of its copy engines, as a same_host_options::copier. Compile with
// nvcc: the kernel is instantiated in the translation unit that takes
// sm_copy's address.
#pragma once

#if !defined(__CUDACC__)
#error "rdx/cuda/sm_copy.cuh holds a kernel: compile it with nvcc (a .cu file)"
#endif

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace rdx::cuda {
namespace detail {

// Grid-stride copy: 16-byte loads and stores when both ends allow, four in
// flight per thread, then bytes for what is left over.
template <int Unroll = 4>
__global__ void sm_copy_kernel(unsigned char* dst, const unsigned char* src, std::size_t bytes, bool wide) {
  const std::size_t tid = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t done = 0;
  if (wide) {
    const std::size_t n = bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    std::size_t i = tid;
    for (; i + (Unroll - 1) * threads < n; i += Unroll * threads) {
      uint4 v[Unroll];
#pragma unroll
      for (int k = 0; k < Unroll; ++k) {
        v[k] = s[i + k * threads];
      }
#pragma unroll
      for (int k = 0; k < Unroll; ++k) {
        d[i + k * threads] = v[k];
      }
    }
    for (; i < n; i += threads) {
      d[i] = s[i];
    }
    done = n * 16;
  }
  for (std::size_t i = done + tid; i < bytes; i += threads) {
    dst[i] = src[i];
  }
}

}  // namespace detail

//! Copies bytes from src to dst (device memory this device can reach) with a kernel on s.
//! @return the launch status (cudaSuccess when queued)
inline cudaError_t sm_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t s) noexcept {
  if (bytes == 0) {
    return cudaSuccess;
  }
  int device = 0;
  int sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return cudaGetLastError();
  }
  constexpr unsigned threads = 512;
  const std::size_t want = (bytes / 16 + threads * 4 - 1) / (threads * 4);
  const std::size_t cap = static_cast<std::size_t>(sms) * 4;
  const unsigned blocks = static_cast<unsigned>(want == 0 ? 1 : (want < cap ? want : cap));
  const bool wide =
      (reinterpret_cast<std::uintptr_t>(dst) % 16 == 0) && (reinterpret_cast<std::uintptr_t>(src) % 16 == 0);
  detail::sm_copy_kernel<<<blocks, threads, 0, s>>>(static_cast<unsigned char*>(dst),
                                                    static_cast<const unsigned char*>(src), bytes, wide);
  return cudaPeekAtLastError();
}

}  // namespace rdx::cuda
