// rdx: random values from the OS CSPRNG (getrandom).
#pragma once

#include <rdx/error.hpp>

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

}  // namespace rdx::detail
