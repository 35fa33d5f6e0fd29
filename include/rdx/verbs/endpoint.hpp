// rdx: what one side of a reliable connection tells the other: its queue
// pair's address (endpoint) and the remote memory it exposes (descriptors).
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>

namespace rdx {

//! Address of one queue pair, as its peer needs it to connect.
//!
//! `gid` and `gid_index` address RoCE ports, `lid` InfiniBand ports; `mtu` is
//! the sender's active path MTU (the connection uses the smaller of both);
//! `port` and `gid_index` are informational for the peer.
struct endpoint {
  ibv_gid gid{};               //!< the port's GID (all zero where only a LID addresses it)
  std::uint16_t lid = 0;       //!< the port's LID (zero on RoCE)
  std::uint32_t qpn = 0;       //!< queue pair number, 24 bits
  std::uint32_t psn = 0;       //!< starting packet sequence number, 24 bits
  ibv_mtu mtu = IBV_MTU_1024;  //!< active MTU of the sender's port
  std::uint8_t port = 1;       //!< port number on the sender's device
  std::uint8_t gid_index = 0;  //!< index of `gid` in the sender's GID table

  //! Field-wise equality (the GID compared byte by byte).
  friend bool operator==(const endpoint& a, const endpoint& b) noexcept {
    return std::memcmp(a.gid.raw, b.gid.raw, sizeof a.gid.raw) == 0 && a.lid == b.lid && a.qpn == b.qpn &&
           a.psn == b.psn && a.mtu == b.mtu && a.port == b.port && a.gid_index == b.gid_index;
  }
};

//! A span of the peer's registered memory that it lets this side access.
//! Only ever used as a remote target: its key is an rkey, never an lkey.
struct remote_descriptor {
  std::uint64_t addr = 0;    //!< virtual address in the peer's address space
  std::uint32_t rkey = 0;    //!< remote key of the peer's memory region
  std::uint64_t length = 0;  //!< bytes from addr

  //! Field-wise equality.
  friend bool operator==(const remote_descriptor&, const remote_descriptor&) noexcept = default;
};

//! The largest ibv_mtu value a wire message may carry.
inline constexpr int max_mtu_enum = IBV_MTU_4096;

//! MTU in bytes for an ibv_mtu (0 for values outside 256..4096).
[[nodiscard]] constexpr int mtu_bytes(ibv_mtu m) noexcept {
  switch (m) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
  }
  return 0;
}

//! ibv_mtu for a size in bytes; returns false for sizes other than 256..4096 powers of two.
[[nodiscard]] constexpr bool mtu_from_bytes(int bytes, ibv_mtu& out) noexcept {
  switch (bytes) {
    case 256: out = IBV_MTU_256; return true;
    case 512: out = IBV_MTU_512; return true;
    case 1024: out = IBV_MTU_1024; return true;
    case 2048: out = IBV_MTU_2048; return true;
    case 4096: out = IBV_MTU_4096; return true;
    default: return false;
  }
}

//! True when the GID is all zero (an InfiniBand endpoint addressed by LID only).
[[nodiscard]] inline bool gid_is_zero(const ibv_gid& g) noexcept {
  return std::ranges::all_of(g.raw, [](std::uint8_t b) { return b == 0; });
}

//! A GID in IPv6 text form ("::ffff:10.77.0.1", "fe80::...").
[[nodiscard]] inline std::string to_string(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (::inet_ntop(AF_INET6, g.raw, buf, sizeof buf) == nullptr) {
    return "?";
  }
  return buf;
}

//! One line describing an endpoint, for logs and error messages.
[[nodiscard]] inline std::string to_string(const endpoint& e) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "LID 0x%04x QPN 0x%06x PSN 0x%06x GID %s (index %u) MTU %d port %u",
                static_cast<unsigned>(e.lid), static_cast<unsigned>(e.qpn), static_cast<unsigned>(e.psn),
                to_string(e.gid).c_str(), static_cast<unsigned>(e.gid_index), mtu_bytes(e.mtu),
                static_cast<unsigned>(e.port));
  return buf;
}

}  // namespace rdx
