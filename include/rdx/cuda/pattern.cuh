// rdx::cuda: GPU kernels that fill and check the pattern of rdx/cuda/pattern.hpp.
// Device code: include it only from files compiled by nvcc.
#pragma once

#if !defined(__CUDACC__)
#error "rdx/cuda/pattern.cuh holds CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/pattern.hpp>

#include <cstddef>
#include <cstdint>

namespace rdx::cuda {

namespace detail {
// Word-wise when the buffer and offset are 8-byte aligned (the usual case),
// byte-wise otherwise; grid-stride loops so any size fits one launch.
// Templates, so that several .cu files of one program may include this.
template <int Unused = 0>
__global__ void fill_pattern_kernel(unsigned char* p, std::size_t n, std::uint64_t seed,
                                    std::uint64_t offset) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if ((reinterpret_cast<std::uintptr_t>(p) % 8) == 0 && (offset % 8) == 0) {
    auto* w = reinterpret_cast<std::uint64_t*>(p);
    const std::size_t words = n / 8;
    for (std::size_t k = tid; k < words; k += stride) {
      w[k] = pattern_word(seed, offset / 8 + k);
    }
    for (std::size_t i = words * 8 + tid; i < n; i += stride) {
      p[i] = pattern_byte(seed, offset + i);
    }
  } else {
    for (std::size_t i = tid; i < n; i += stride) {
      p[i] = pattern_byte(seed, offset + i);
    }
  }
}

template <int Unused = 0>
__global__ void check_pattern_kernel(const unsigned char* p, std::size_t n, std::uint64_t seed,
                                     std::uint64_t offset, pattern_result* out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long bad = 0;
  unsigned long long first = ~0ull;
  if ((reinterpret_cast<std::uintptr_t>(p) % 8) == 0 && (offset % 8) == 0) {
    const auto* w = reinterpret_cast<const std::uint64_t*>(p);
    const std::size_t words = n / 8;
    for (std::size_t k = tid; k < words; k += stride) {
      if (w[k] != pattern_word(seed, offset / 8 + k)) {
        ++bad;
        if (first == ~0ull) {
          first = offset + k * 8;
        }
      }
    }
    for (std::size_t i = words * 8 + tid; i < n; i += stride) {
      if (p[i] != pattern_byte(seed, offset + i)) {
        ++bad;
        if (first == ~0ull) {
          first = offset + i;
        }
      }
    }
  } else {
    for (std::size_t i = tid; i < n; i += stride) {
      if (p[i] != pattern_byte(seed, offset + i)) {
        ++bad;
        if (first == ~0ull) {
          first = offset + i;
        }
      }
    }
  }
  if (bad != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&out->mismatches), bad);
    atomicMin(reinterpret_cast<unsigned long long*>(&out->first_bad_offset), first);
  }
}

inline unsigned pattern_grid(std::size_t n) {
  const std::size_t blocks = (n / 8 + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}
}  // namespace detail

//! Queues a fill of device bytes [p, p + n) with the pattern at [offset, offset + n).
inline void fill_pattern(void* p, std::size_t n, std::uint64_t seed, std::uint64_t offset = 0,
                         cudaStream_t s = nullptr) {
  if (n == 0) {
    return;
  }
  detail::fill_pattern_kernel<>
      <<<detail::pattern_grid(n), 256, 0, s>>>(static_cast<unsigned char*>(p), n, seed, offset);
  RDX_CUDA_TRY(cudaGetLastError());
}

//! Checks device bytes [p, p + n) against the pattern at [offset, offset + n);
//! waits for the stream. mismatches counts wrong 8-byte words (bytes where unaligned).
[[nodiscard]] inline pattern_result check_pattern(const void* p, std::size_t n, std::uint64_t seed,
                                                  std::uint64_t offset = 0, cudaStream_t s = nullptr) {
  pattern_result init;
  if (n == 0) {
    return init;
  }
  device_buffer<pattern_result> out(1);
  RDX_CUDA_TRY(cudaMemcpyAsync(out.data(), &init, sizeof init, cudaMemcpyHostToDevice, s));
  detail::check_pattern_kernel<><<<detail::pattern_grid(n), 256, 0, s>>>(static_cast<const unsigned char*>(p),
                                                                         n, seed, offset, out.data());
  RDX_CUDA_TRY(cudaGetLastError());
  pattern_result r;
  RDX_CUDA_TRY(cudaMemcpyAsync(&r, out.data(), sizeof r, cudaMemcpyDeviceToHost, s));
  RDX_CUDA_TRY(cudaStreamSynchronize(s));
  return r;
}

}  // namespace rdx::cuda
