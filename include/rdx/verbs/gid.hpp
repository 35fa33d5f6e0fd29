// rdx: GID table entries and automatic, explainable GID selection.
#pragma once

#include <rdx/detail/env.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/endpoint.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <arpa/inet.h>

namespace rdx {

//! What a GID table entry is for: InfiniBand, or RoCE (Ethernet) v1 or v2.
enum class gid_type : std::uint8_t {
  ib = IBV_GID_TYPE_IB,            //!< InfiniBand
  roce_v1 = IBV_GID_TYPE_ROCE_V1,  //!< RoCE v1: Ethernet frames, not routable
  roce_v2 = IBV_GID_TYPE_ROCE_V2,  //!< RoCE v2: UDP/IP, routable
};

//! "IB", "RoCE v1" or "RoCE v2".
[[nodiscard]] constexpr std::string_view to_string(gid_type t) noexcept {
  switch (t) {
    case gid_type::ib: return "IB";
    case gid_type::roce_v1: return "RoCE v1";
    case gid_type::roce_v2: return "RoCE v2";
  }
  return "unknown";
}

//! True for \::ffff:a.b.c.d, the form RoCE v2 gives an IPv4 address.
[[nodiscard]] inline bool gid_is_ipv4_mapped(const ibv_gid& g) noexcept {
  for (int i = 0; i < 10; ++i) {
    if (g.raw[i] != 0) {
      return false;
    }
  }
  return g.raw[10] == 0xff && g.raw[11] == 0xff;
}
//! True for fe80::/10 (link-local, from the interface's MAC): never routable.
[[nodiscard]] inline bool gid_is_link_local(const ibv_gid& g) noexcept {
  return g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80;
}
//! Parses an IPv6 or IPv4 text into a GID (IPv4 becomes \::ffff:a.b.c.d); nullopt for neither.
[[nodiscard]] inline std::optional<ibv_gid> parse_gid(std::string_view text) {
  std::string s(text);
  ibv_gid g{};
  if (::inet_pton(AF_INET6, s.c_str(), g.raw) == 1) {
    return g;
  }
  unsigned char v4[4];
  if (::inet_pton(AF_INET, s.c_str(), v4) == 1) {
    g.raw[10] = 0xff;
    g.raw[11] = 0xff;
    std::memcpy(g.raw + 12, v4, 4);
    return g;
  }
  return std::nullopt;
}

//! One valid entry of a port's GID table.
struct gid_entry {
  ibv_gid gid{};                   //!< the 16 bytes: an IPv6 address, or an IPv4-mapped one
  std::uint32_t index = 0;         //!< the entry's index in the port's GID table
  std::uint8_t port = 0;           //!< the port number, from 1
  gid_type type = gid_type::ib;    //!< IB, RoCE v1 or RoCE v2
  std::uint32_t ndev_ifindex = 0;  //!< 0 when not bound to a netdev or unknown

  //! True for \::ffff:a.b.c.d (RoCE v2 over IPv4).
  [[nodiscard]] bool ipv4_mapped() const noexcept { return gid_is_ipv4_mapped(gid); }
  //! True for fe80::/10 (link-local): never routable.
  [[nodiscard]] bool link_local() const noexcept { return gid_is_link_local(gid); }
  //! True for an all-zero GID, an unused slot.
  [[nodiscard]] bool zero() const noexcept { return gid_is_zero(gid); }
};

namespace detail {
// Reads a GID type from sysfs ("RoCE v2", "IB/RoCE v1"), for kernels without the
// extended GID query.
inline std::optional<gid_type> sysfs_gid_type(const context& ctx, std::uint8_t port, std::uint32_t index) {
  std::ifstream f(std::string(ctx.native_handle()->device->ibdev_path) + "/ports/" + std::to_string(port) +
                  "/gid_attrs/types/" + std::to_string(index));
  std::string t;
  if (!f || !std::getline(f, t)) {
    return std::nullopt;
  }
  if (t.find("v2") != std::string::npos) {
    return gid_type::roce_v2;
  }
  if (t.find("v1") != std::string::npos) {
    return gid_type::roce_v1;
  }
  return gid_type::ib;
}
}  // namespace detail

//! The valid (non-empty) entries of a port's GID table, with their types.
//! @throws rdx::error when the port cannot be queried.
[[nodiscard]] inline std::vector<gid_entry> gid_table(const context& ctx, std::uint8_t port) {
  port_attributes pa = ctx.query_port(port);
  std::vector<gid_entry> out;
  if (pa.gid_table_len <= 0) {
    return out;
  }
  std::vector<ibv_gid_entry> raw(static_cast<std::size_t>(pa.gid_table_len) * ctx.port_count());
  ssize_t n = ::ibv_query_gid_table(ctx.native_handle(), raw.data(), raw.size(), 0);
  if (n >= 0) {
    for (ssize_t i = 0; i < n; ++i) {
      const ibv_gid_entry& e = raw[static_cast<std::size_t>(i)];
      if (e.port_num != port || gid_is_zero(e.gid)) {
        continue;
      }
      out.push_back({e.gid, e.gid_index, port, static_cast<gid_type>(e.gid_type), e.ndev_ifindex});
    }
    return out;
  }
  // Fallback: one ibv_query_gid per slot, types from sysfs.
  for (int i = 0; i < pa.gid_table_len; ++i) {
    ibv_gid g{};
    if (::ibv_query_gid(ctx.native_handle(), port, i, &g) != 0 || gid_is_zero(g)) {
      continue;
    }
    auto idx = static_cast<std::uint32_t>(i);
    gid_type t =
        pa.is_ethernet() ? detail::sysfs_gid_type(ctx, port, idx).value_or(gid_type::roce_v1) : gid_type::ib;
    out.push_back({g, idx, port, t, 0});
  }
  return out;
}

//! The GID (or LID) a queue pair on this port should use, and why.
struct gid_choice {
  std::uint8_t port = 0;         //!< the port number, from 1
  std::uint8_t index = 0;        //!< the GID index a queue pair's address carries (sgid_index)
  ibv_gid gid{};                 //!< the entry at index (on InfiniBand: the first entry, for routing)
  gid_type type = gid_type::ib;  //!< the entry's type (ib on an InfiniBand port)
  bool use_lid = false;          //!< InfiniBand port: addressed by LID, GID only for routing
  std::uint16_t lid = 0;         //!< the port's LID (what InfiniBand addresses by)
  std::string reason;            //!< one line: what was chosen and why
};

namespace detail {
// A validated choice for an explicit index, or an error naming index and table.
inline gid_choice gid_at(const context& ctx, std::uint8_t port, std::uint64_t index, const std::string& why) {
  port_attributes pa = ctx.query_port(port);
  if (index >= static_cast<std::uint64_t>(pa.gid_table_len) || index > 255) {
    throw_rdx(errc::out_of_range, "GID index " + std::to_string(index) + " on " + ctx.name() + " port " +
                                      std::to_string(port) + ": the table has " +
                                      std::to_string(pa.gid_table_len) + " entries");
  }
  for (const gid_entry& e : gid_table(ctx, port)) {
    if (e.index != index) {
      continue;
    }
    gid_choice c;
    c.port = port;
    c.index = static_cast<std::uint8_t>(index);
    c.gid = e.gid;
    c.type = e.type;
    c.use_lid = pa.is_infiniband();
    c.lid = pa.lid;
    c.reason = "GID index " + std::to_string(index) + " (" + std::string(to_string(e.type)) + " " +
               to_string(e.gid) + "): " + why;
    return c;
  }
  throw_rdx(errc::out_of_range, "GID index " + std::to_string(index) + " on " + ctx.name() + " port " +
                                    std::to_string(port) + " is an empty table entry");
}
}  // namespace detail

//! Uses an explicit GID index. @throws rdx::error (errc::out_of_range) for an index
//! past the table or an empty entry.
[[nodiscard]] inline gid_choice use_gid_index(const context& ctx, std::uint8_t port, std::uint32_t index) {
  return detail::gid_at(ctx, port, index, "chosen by the caller");
}

//! Chooses the GID for a port: RDX_GID_INDEX if set; on InfiniBand the LID; on
//! Ethernet RoCE v2 IPv4-mapped first, then RoCE v2 global IPv6, never a zero or
//! link-local entry.
//! @throws rdx::error when no usable entry exists (the message lists the table).
[[nodiscard]] inline gid_choice select_gid(const context& ctx, std::uint8_t port) {
  if (auto v = detail::env_unsigned("RDX_GID_INDEX", 255)) {
    return detail::gid_at(ctx, port, *v, "set by RDX_GID_INDEX");
  }
  port_attributes pa = ctx.query_port(port);
  std::vector<gid_entry> table = gid_table(ctx, port);
  if (pa.is_infiniband()) {
    gid_choice c;
    c.port = port;
    c.use_lid = true;
    c.lid = pa.lid;
    c.type = gid_type::ib;
    if (!table.empty()) {
      c.index = static_cast<std::uint8_t>(table.front().index);
      c.gid = table.front().gid;
    }
    char lid[8];
    std::snprintf(lid, sizeof lid, "0x%04x", pa.lid);
    c.reason = "InfiniBand port: addressed by LID " + std::string(lid) + ", GID index " +
               std::to_string(c.index) + " for routing";
    return c;
  }
  auto pick = [&](auto pred, const char* why) -> std::optional<gid_choice> {
    for (const gid_entry& e : table) {
      if (e.type != gid_type::roce_v2 || e.zero() || e.link_local() || !pred(e) || e.index > 255) {
        continue;
      }
      gid_choice c;
      c.port = port;
      c.index = static_cast<std::uint8_t>(e.index);
      c.gid = e.gid;
      c.type = e.type;
      c.lid = pa.lid;
      c.reason = "GID index " + std::to_string(e.index) + " (RoCE v2 " + to_string(e.gid) + "): " + why;
      return c;
    }
    return std::nullopt;
  };
  if (auto c = pick([](const gid_entry& e) { return e.ipv4_mapped(); }, "first RoCE v2 IPv4-mapped entry")) {
    return *c;
  }
  if (auto c = pick([](const gid_entry& e) { return !e.ipv4_mapped(); },
                    "first RoCE v2 global IPv6 entry (no IPv4-mapped one)")) {
    return *c;
  }
  std::string seen;
  for (const gid_entry& e : table) {
    if (!seen.empty()) {
      seen += ", ";
    }
    seen += std::to_string(e.index) + ":" + std::string(to_string(e.type)) + " " + to_string(e.gid);
  }
  detail::throw_rdx(errc::no_device, ctx.name() + " port " + std::to_string(port) +
                                         ": no RoCE v2 GID with an IPv4 or global IPv6 address (table: " +
                                         (seen.empty() ? std::string("empty") : seen) +
                                         "); assign an address to the netdev or set RDX_GID_INDEX");
}

}  // namespace rdx
