// rdx: random values from the OS CSPRNG (getrandom).
#pragma once

#include <rdx/error.hpp>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>

#include <sys/random.h>

namespace rdx::detail {

//! Fills buf with bytes from getrandom(2); throws rdx::error if the OS cannot.
inline void os_random(void* buf, std::size_t n) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    ssize_t r = ::getrandom(p, n, 0);
    if (r < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw_errno("getrandom", "packet sequence number", errno);
    }
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

//! A starting packet sequence number: 24 random bits.
[[nodiscard]] inline std::uint32_t random_psn() {
  std::uint32_t v = 0;
  os_random(&v, sizeof v);
  return v & 0xffffffu;
}

//! A key to replace a memory window's key old: the same index (upper 24
//! bits), a random key byte that is not old's, and never one away from any of
//! the last four keys this process chose. A type 2 window chooses its next key
//! when it is allocated and again at each bind, so the key a grant uses was
//! chosen two choices back; remembering four keeps consecutive grants' keys
//! from stepping.
[[nodiscard]] inline std::uint32_t fresh_window_key(std::uint32_t old) {
  constexpr std::size_t kept = 4;
  static std::atomic<std::uint32_t> recent[kept]{};
  static std::atomic<std::size_t> next{0};
  for (;;) {
    unsigned char b = 0;
    os_random(&b, 1);
    const std::uint32_t k = (old & 0xffffff00u) | b;
    bool steps = k == old;
    for (const auto& r : recent) {
      const std::uint32_t prev = r.load(std::memory_order_relaxed);
      steps = steps || k - prev == 1 || prev - k == 1;
    }
    if (steps) {
      continue;
    }
    recent[next.fetch_add(1, std::memory_order_relaxed) % kept].store(k, std::memory_order_relaxed);
    return k;
  }
}

}  // namespace rdx::detail
