// rdx: reading RDX_* environment overrides.
#pragma once

#include <rdx/error.hpp>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace rdx::detail {

//! The value of an environment variable, or nullopt when unset or empty.
inline std::optional<std::string> env_string(const char* name) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read at set-up; rdx never sets one
  if (v == nullptr || *v == '\0') {
    return std::nullopt;
  }
  return std::string(v);
}

//! Parses a decimal unsigned integer; nullopt unless the whole text is a number <= max.
inline std::optional<std::uint64_t> parse_unsigned(std::string_view s, std::uint64_t max) noexcept {
  if (s.empty()) {
    return std::nullopt;
  }
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 10);
  if (ec != std::errc{} || p != s.data() + s.size() || v > max) {
    return std::nullopt;
  }
  return v;
}

//! An unsigned environment override; throws when set but not a number <= max.
inline std::optional<std::uint64_t> env_unsigned(const char* name, std::uint64_t max) {
  auto s = env_string(name);
  if (!s) {
    return std::nullopt;
  }
  auto v = parse_unsigned(*s, max);
  if (!v) {
    throw_rdx(errc::invalid_argument,
              std::string(name) + "=" + *s + ": not a number from 0 to " + std::to_string(max));
  }
  return v;
}

}  // namespace rdx::detail
