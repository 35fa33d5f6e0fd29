// rdx::cuda: a reproducible byte pattern for filling and checking buffers on
// the host and, through rdx/cuda/pattern.cuh, on the GPU.
//
// Byte o of a pattern with seed s is byte (o % 8) (little-endian) of
// pattern_word(s, o / 8), so any chunk can be checked on its own given its
// offset in the whole transfer.
#pragma once

//! \file
//! A reproducible byte pattern (pattern_word, pattern_byte) and its host fill and check.

#include <cstddef>
#include <cstdint>
#include <cstring>

//! \def RDX_HOST_DEVICE
//! `__host__ __device__` under nvcc, else nothing: the pattern functions run on both sides.
#if defined(__CUDACC__)
#define RDX_HOST_DEVICE __host__ __device__
#else
#define RDX_HOST_DEVICE
#endif

namespace rdx::cuda {

//! Word k of the pattern with seed s (splitmix64 of s and k): every word
//! differs, and no word repeats with the seed changed by one.
RDX_HOST_DEVICE constexpr std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t k) noexcept {
  std::uint64_t z = seed * 0xD1B54A32D192ED03ull + k * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

//! Byte at offset o of the pattern with seed s.
RDX_HOST_DEVICE constexpr std::uint8_t pattern_byte(std::uint64_t seed, std::uint64_t o) noexcept {
  return static_cast<std::uint8_t>(pattern_word(seed, o / 8) >> (8 * (o % 8)));
}

//! First mismatch and mismatch count of a checked range.
struct pattern_result {
  std::uint64_t mismatches = 0;            //!< wrong bytes (on the GPU: wrong 8-byte words)
  std::uint64_t first_bad_offset = ~0ull;  //!< offset of the first wrong byte or word; ~0 if none
  //! True when nothing mismatched.
  [[nodiscard]] RDX_HOST_DEVICE constexpr bool ok() const noexcept { return mismatches == 0; }
};

//! Fills host bytes [p, p + n) as the pattern at offsets [offset, offset + n).
inline void fill_pattern_host(void* p, std::size_t n, std::uint64_t seed, std::uint64_t offset = 0) noexcept {
  auto* b = static_cast<std::uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    b[i] = pattern_byte(seed, offset + i);
  }
}

//! Checks host bytes [p, p + n) against the pattern at offsets [offset, offset + n).
[[nodiscard]] inline pattern_result check_pattern_host(const void* p, std::size_t n, std::uint64_t seed,
                                                       std::uint64_t offset = 0) noexcept {
  const auto* b = static_cast<const std::uint8_t*>(p);
  pattern_result r;
  std::size_t i = 0;
  // Whole words where the offset is word-aligned: eight times fewer steps.
  if ((offset % 8) == 0) {
    for (; i + 8 <= n; i += 8) {
      std::uint64_t w = 0;
      std::memcpy(&w, b + i, 8);
      const std::uint64_t want = pattern_word(seed, (offset + i) / 8);
      if (w != want) {
        for (std::size_t j = 0; j < 8; ++j) {
          if (b[i + j] != pattern_byte(seed, offset + i + j)) {
            if (r.mismatches == 0) {
              r.first_bad_offset = offset + i + j;
            }
            ++r.mismatches;
          }
        }
      }
    }
  }
  for (; i < n; ++i) {
    if (b[i] != pattern_byte(seed, offset + i)) {
      if (r.mismatches == 0) {
        r.first_bad_offset = offset + i;
      }
      ++r.mismatches;
    }
  }
  return r;
}

}  // namespace rdx::cuda
