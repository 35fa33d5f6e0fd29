// rdx_crypt_fabric: the bytes it sends and checks. Every stream of bytes
// comes from a seed (xorshift64 words); a point's seed mixes the run's seed
// with the round, kind, mode and size of the point, so no byte of one point
// can pass for one of another. Messages cycle through a pool of payloads made
// before the clock starts, each stamped with its index when it is sent.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace crypt_fabric {

//! splitmix64's finalizer: a 64-bit mix in which every input bit moves every output bit.
[[nodiscard]] inline std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

//! Fills out with the stream of seed.
inline void fill(std::span<std::byte> out, std::uint64_t seed) noexcept {
  std::uint64_t x = mix(seed) | 1;  // xorshift64 needs a state other than 0
  std::size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, 8);
  }
  if (i < out.size()) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, out.size() - i);
  }
}

//! Where got first differs from the stream of seed: its byte offset, the byte
//! expected there and the byte found; offset == got.size() when all match.
struct mismatch {
  std::size_t offset = 0;
  unsigned expected = 0;
  unsigned found = 0;
};

//! Compares got with the stream of seed, 64 KiB at a time.
[[nodiscard]] inline mismatch first_mismatch(std::span<const std::byte> got, std::uint64_t seed) {
  constexpr std::size_t block = std::size_t{64} * 1024;
  std::vector<std::byte> want(std::min(block, got.size()));
  // The stream of one seed is one sequence of words: regenerate it whole and
  // compare block by block (a block boundary is a multiple of 8).
  std::uint64_t x = mix(seed) | 1;
  for (std::size_t at = 0; at < got.size(); at += block) {
    const std::size_t n = std::min(block, got.size() - at);
    for (std::size_t i = 0; i < n; i += 8) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      std::memcpy(want.data() + i, &x, std::min<std::size_t>(8, n - i));
    }
    if (std::memcmp(want.data(), got.data() + at, n) != 0) {
      std::size_t i = 0;
      while (want[i] == got[at + i]) {
        ++i;
      }
      return {at + i, static_cast<unsigned>(want[i]), static_cast<unsigned>(got[at + i])};
    }
  }
  return {got.size(), 0, 0};
}

//! The payloads the messages of one point cycle through (at most 16 MiB of
//! them), the same on both sides. Message k is payload k % count() with its
//! first 8 bytes (fewer for shorter messages) replaced by a stamp of k.
class message_pool {
public:
  //! Payloads of size bytes for messages messages of the point of seed.
  message_pool(std::size_t size, std::uint64_t messages, std::uint64_t seed)
      : size_(size),
        count_(std::max<std::size_t>(1, std::min<std::size_t>(messages, (16u << 20) / size))),
        seed_(seed),
        bytes_(size * count_) {
    for (std::size_t i = 0; i < count_; ++i) {
      fill(std::span(bytes_).subspan(i * size_, size_), mix(seed + i + 1));
    }
  }

  //! Message k: its payload, stamped now (valid until message(k + count()) is asked for).
  [[nodiscard]] std::span<const std::byte> message(std::uint64_t k) noexcept {
    std::byte* p = bytes_.data() + (k % count_) * size_;
    const std::uint64_t stamp = mix(seed_ ^ (k * 0x9e3779b97f4a7c15ull));
    std::memcpy(p, &stamp, std::min<std::size_t>(8, size_));
    return {p, size_};
  }
  //! The first byte where got differs from message k (stamped now), or none.
  [[nodiscard]] mismatch check(std::uint64_t k, std::span<const std::byte> got) noexcept {
    const std::span<const std::byte> want = message(k);
    if (got.size() == want.size() && std::memcmp(got.data(), want.data(), want.size()) == 0) {
      return {got.size(), 0, 0};
    }
    std::size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) {
      ++i;
    }
    return {i, i < want.size() ? static_cast<unsigned>(want[i]) : 0u,
            i < got.size() ? static_cast<unsigned>(got[i]) : 0u};
  }

private:
  std::size_t size_;
  std::size_t count_;
  std::uint64_t seed_;
  std::vector<std::byte> bytes_;
};

//! The running checksum of a message stream both sides compute: its first
//! and last 8 bytes and its length, for every message, folded.
[[nodiscard]] inline std::uint64_t fold(std::uint64_t sum, std::span<const std::byte> m) noexcept {
  std::uint64_t head = 0;
  std::uint64_t tail = 0;
  const std::size_t n = std::min<std::size_t>(8, m.size());
  std::memcpy(&head, m.data(), n);
  std::memcpy(&tail, m.data() + m.size() - n, n);
  return mix(sum ^ head) + tail + m.size();
}

}  // namespace crypt_fabric
