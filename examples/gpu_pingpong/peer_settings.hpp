// What both sides of gpu_pingpong must agree on: a 40-byte block, "RDXG" and
// seven big-endian fields (apps/settings.hpp), swapped over the bootstrap
// socket, and the path both sides take from the two blocks.
#pragma once

#include <rdx/connect/tcp_socket.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace gpu_pingpong {

// What both sides must agree on; the server takes the client's numbers.
struct settings {
  std::uint32_t path = 0;  // 1 direct, 2 staged: what this side can or must do
  std::uint32_t forced = 0;
  std::uint64_t size = 0;
  std::uint32_t iters = 0;
  std::uint32_t warmup = 0;
  std::uint64_t chunk = 0;
  std::uint32_t depth = 0;
};
inline constexpr std::size_t settings_bytes = 40;

//! Sends this side's settings and returns the peer's, both within `timeout`.
//! @throws failure when the peer is not a gpu_pingpong
settings exchange_settings(const rdx::tcp::socket& sock, const settings& mine, std::chrono::seconds timeout);

inline constexpr std::uint32_t path_direct = 1;
inline constexpr std::uint32_t path_staged = 2;

// Both sides compute the same answer from the two settings.
std::uint32_t agree_path(const settings& client, const settings& server);

}  // namespace gpu_pingpong
