// rdx fuzzing: what every libFuzzer target shares. A broken property aborts
// with a message (libFuzzer saves the input); an rdx::error with the code a
// decoder promises is an expected rejection; anything else escapes and is a
// finding.
#pragma once

#include <rdx/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

namespace rdx::fuzz {

[[noreturn]] inline void broken(const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: property broken: %s\n", file, line, what);
  std::abort();
}

#define RDX_FUZZ_REQUIRE(cond) ((cond) ? void(0) : ::rdx::fuzz::broken(#cond, __FILE__, __LINE__))

//! Runs f and returns true when it returned; false when it threw an rdx::error
//! with `expected`. An rdx::error with any other code breaks the property.
template <class F>
bool accepted(F&& f, errc expected) {
  try {
    f();
    return true;
  } catch (const error& e) {
    if (e.code() != expected) {
      std::fprintf(stderr, "rejected with the wrong code %s: %s\n", e.code().message().c_str(), e.what());
      broken("the rejection carries the promised errc", __FILE__, __LINE__);
    }
    return false;
  }
}

//! Runs every check on one input, for LLVMFuzzerTestOneInput: a decoding check
//! reads the raw bytes, an encoding check reads them as a value to encode.
template <class... Checks>
int run_checks(const std::uint8_t* data, std::size_t size, Checks... checks) {
  const auto in = std::as_bytes(std::span(data, size));
  (checks(in), ...);
  return 0;
}

//! Reads integers off the fuzzer's bytes, big-endian, and zeros once they run out,
//! so one input can also describe a value to encode.
class reader {
public:
  explicit reader(std::span<const std::byte> in) noexcept : in_(in) {}
  std::uint64_t take(int bytes) noexcept {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
      v <<= 8;
      if (at_ < in_.size()) v |= std::to_integer<std::uint64_t>(in_[at_++]);
    }
    return v;
  }
  std::uint8_t u8() noexcept { return static_cast<std::uint8_t>(take(1)); }
  std::uint16_t u16() noexcept { return static_cast<std::uint16_t>(take(2)); }
  std::uint32_t u32() noexcept { return static_cast<std::uint32_t>(take(4)); }
  std::uint64_t u64() noexcept { return take(8); }

private:
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
};

}  // namespace rdx::fuzz
