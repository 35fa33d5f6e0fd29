// rdma tests: the checked record that the many-peers tests send (its pair,
// a sequence number and a check word derived from both), and the peer
// count read from the environment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace peer_test {

struct record {
  std::uint32_t pair;
  std::uint32_t seq;
  std::uint64_t check;
};

inline record make_record(std::uint32_t pair, std::uint32_t seq) {
  return record{pair, seq, (std::uint64_t{pair} << 32 | seq) * 0x9e3779b97f4a7c15ull};
}

// The environment's count, or fallback when it is unset or empty.
inline std::size_t env_count(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? static_cast<std::size_t>(std::strtoul(v, nullptr, 10)) : fallback;
}

}  // namespace peer_test
