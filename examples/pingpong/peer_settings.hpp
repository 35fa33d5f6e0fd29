// What both sides of pingpong must share (mode, size, round trips) and the
// client's pattern seed: a 24-byte block, "RDXP" and four big-endian fields
// (apps/settings.hpp), swapped before any RDMA traffic.
#pragma once

#include <rdx/connect/tcp_socket.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "options.hpp"

namespace pingpong {

struct settings {
  std::uint32_t mode = 0;
  std::uint32_t iters = 0;
  std::uint64_t size = 0;
  std::uint32_t seed = 0;
};

inline constexpr std::size_t settings_size = 24;

//! Writes this side's block into the settings_size bytes at `out`.
void encode_settings(std::byte* out, const settings& mine);

// The peer's settings from its 24 bytes; a mismatch with ours throws, naming
// what differs (each side reports it before any RDMA traffic).
settings decode_settings(std::span<const std::byte> in, const settings& mine, const std::string& who);

// Both sides send their settings; the server takes the client's seed. A
// mismatch is reported on both sides before any RDMA traffic. `deadline` is
// the whole set-up's: the endpoint exchange that follows gets what is left.
settings exchange_settings(const rdx::tcp::socket& s, const settings& mine, steady::time_point deadline);

}  // namespace pingpong
