// pingpong's payloads: the pattern of its own modes and ibv_rc_pingpong's
// fill, each written and checked byte by byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "options.hpp"
#include <unistd.h>

namespace pingpong {

// Every byte differs from the same byte of the previous two round trips, so a
// payload that did not arrive (stale data) or arrived shifted is caught.
inline std::uint8_t pattern_byte(std::size_t i, std::uint32_t iter, std::uint32_t seed) noexcept {
  return static_cast<std::uint8_t>(((i * 131u) ^ (i >> 8)) + iter * 13u + seed);
}
inline void fill_pattern(std::byte* p, std::size_t n, std::uint32_t iter, std::uint32_t seed) noexcept {
  for (std::size_t i = 0; i < n; ++i) p[i] = std::byte{pattern_byte(i, iter, seed)};
}
// Index of the first wrong byte, or n.
inline std::size_t check_pattern(const std::byte* p, std::size_t n, std::uint32_t iter,
                                 std::uint32_t seed) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != std::byte{pattern_byte(i, iter, seed)}) return i;
  return n;
}

// ibv_rc_pingpong fills its buffer with 0x7b and, with -c, writes 0 into the
// first byte of every page; its server echoes what it receives.
inline std::size_t page_size() {
  return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}
inline void fill_rc(std::byte* p, std::size_t n, bool page_marks) {
  std::memset(p, 0x7b, n);
  if (page_marks)
    for (std::size_t i = 0; i < n; i += page_size()) p[i] = std::byte{0};
}
inline std::size_t check_rc(const std::byte* p, std::size_t n, bool page_marks) {
  const std::size_t ps = page_size();
  for (std::size_t i = 0; i < n; ++i) {
    const std::byte want = (page_marks && i % ps == 0) ? std::byte{0} : std::byte{0x7b};
    if (p[i] != want) return i;
  }
  return n;
}

inline std::string byte_text(std::byte b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", std::to_integer<unsigned>(b));
  return buf;
}

// Whether this side's payload for `iter` is right; throws naming the first wrong byte.
inline void check_payload(const std::byte* p, const options& o, std::uint32_t iter, std::uint32_t seed,
                          const char* who) {
  const std::size_t bad = check_pattern(p, o.size, iter, seed);
  if (bad != o.size)
    throw failure(std::string(who) + " of round trip " + std::to_string(iter) + " is wrong at byte " +
                  std::to_string(bad) + ": " + byte_text(p[bad]) + ", expected " +
                  byte_text(std::byte{pattern_byte(bad, iter, seed)}));
}

}  // namespace pingpong
