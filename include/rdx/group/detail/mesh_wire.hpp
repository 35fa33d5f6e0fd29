// rdx::group::detail: the mesh's wire, version 2: the job's fingerprint,
// the preamble a connecting rank sends (and its MAC, keyed), each rank's
// rendezvous entry (the address of its acceptor) and the grants a pair
// exchanges; and the address this host reaches the rendezvous host from.
#pragma once

#include <rdx/channel/window.hpp>
#include <rdx/connect/authenticator.hpp>
#include <rdx/detail/random.hpp>
#include <rdx/error.hpp>
#include <rdx/group/detail/rendezvous_wire.hpp>
#include <rdx/group/rendezvous_options.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace rdx::group::detail {

inline constexpr std::uint32_t mesh_magic = 0x5244584d;  // "RDXM"
inline constexpr std::uint16_t mesh_version = 2;
inline constexpr std::size_t mesh_nonce_size = 16;  // in each address: new every job
inline constexpr std::string_view mesh_job_label = "rdx.group.mesh.v2 job";
inline constexpr std::string_view mesh_preamble_label = "rdx.group.mesh.v2 preamble";
inline constexpr std::size_t mesh_max_keys = 64;

// FNV-1a over every rank's entry, its length first: the same on every rank
// of one job, another for the next job (its ports differ).
inline std::uint64_t fingerprint(const rendezvous_table& t) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](std::uint8_t b) {
    h ^= b;
    h *= 0x100000001b3ull;
  };
  for (const auto& e : t) {
    const auto n = static_cast<std::uint32_t>(e.size());
    for (int i = 0; i < 4; ++i) {
      mix(static_cast<std::uint8_t>(n >> (8 * i)));
    }
    for (std::byte b : e) {
      mix(std::to_integer<std::uint8_t>(b));
    }
  }
  return h;
}

// A preamble: magic, version, flags, fingerprint, from rank, to rank (the
// server's names itself as `from` and leaves `to` as ~0). The request flag:
// `from` (a lower rank) asks `to` to connect to it; nothing else follows.
inline constexpr std::uint16_t preamble_request = 1;
inline std::vector<std::byte> preamble(std::uint64_t fp, std::uint32_t from, std::uint32_t to,
                                       std::uint16_t flags = 0) {
  std::vector<std::byte> p(24);
  put32(p.data(), mesh_magic);
  put16(p.data() + 4, mesh_version);
  put16(p.data() + 6, flags);
  put64(p.data() + 8, fp);
  put32(p.data() + 16, from);
  put32(p.data() + 20, to);
  return p;
}
inline constexpr std::size_t preamble_size = 24;

// Keyed: a preamble followed by its MAC over the job's MAC and itself.
inline std::vector<std::byte> keyed_preamble(const keyed_mac* key, std::span<const std::byte> job,
                                             std::vector<std::byte> p) {
  if (key == nullptr) {
    return p;
  }
  const auto m = key->mac({rv_label(mesh_preamble_label), job, p});
  p.insert(p.end(), m.begin(), m.end());
  return p;
}
// Whether a received preamble's MAC is the one its first 24 bytes should have.
inline bool preamble_mac_right(const keyed_mac* key, std::span<const std::byte> job,
                               std::span<const std::byte> p) {
  if (key == nullptr) {
    return p.size() == preamble_size;
  }
  if (p.size() != preamble_size + keyed_mac::mac_size) {
    return false;
  }
  const auto m = key->mac({rv_label(mesh_preamble_label), job, p.first(preamble_size)});
  return rv_same(m, p.subspan(preamble_size));
}

// The address on this host that packets to `host` leave from: a UDP socket
// connected there (connect sends nothing) says it.
inline std::string route_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* ai = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), "9", &hints, &ai) != 0 || ai == nullptr) {
    return "127.0.0.1";
  }
  std::string out = "127.0.0.1";
  const int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      char buf[INET6_ADDRSTRLEN] = {};
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0 &&
          ::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) ==
              0) {
        out = buf;
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(ai);
  return out;
}

// A rank's rendezvous entry: magic, version, port, host length, 16 random
// bytes (new every job), host.
inline constexpr std::size_t address_fixed = 10 + mesh_nonce_size;
inline std::vector<std::byte> address_entry(const std::string& host, std::uint16_t port) {
  std::vector<std::byte> e(address_fixed + host.size());
  put32(e.data(), mesh_magic);
  put16(e.data() + 4, mesh_version);
  put16(e.data() + 6, port);
  put16(e.data() + 8, static_cast<std::uint16_t>(host.size()));
  rdx::detail::os_random(e.data() + 10, mesh_nonce_size);
  std::memcpy(e.data() + address_fixed, host.data(), host.size());
  return e;
}
inline std::pair<std::string, std::uint16_t> read_address(std::span<const std::byte> e, std::uint32_t rank) {
  if (e.size() < address_fixed || get32(e.data()) != mesh_magic || get16(e.data() + 4) != mesh_version ||
      e.size() != address_fixed + std::size_t{get16(e.data() + 8)}) {
    rdx::detail::throw_rdx(errc::wire_format, "mesh: rank " + std::to_string(rank) +
                                                  "'s rendezvous entry is not a mesh address (a rank "
                                                  "of another program, or another rdx version)");
  }
  return {std::string(reinterpret_cast<const char*>(e.data()) + address_fixed, e.size() - address_fixed),
          get16(e.data() + 6)};
}

// Grants as bytes: count, then per grant addr, rkey, length, rights,
// element size, key count and keys.
inline std::vector<std::byte> encode_grants(std::span<const window_descriptor> ds) {
  std::vector<std::byte> out(4);
  put32(out.data(), static_cast<std::uint32_t>(ds.size()));
  for (const auto& d : ds) {
    const std::size_t at = out.size();
    out.resize(at + 32 + 4 * d.keys.size());
    std::byte* p = out.data() + at;
    put64(p, d.memory.addr);
    put32(p + 8, d.memory.rkey);
    put64(p + 12, d.memory.length);
    put32(p + 20, static_cast<std::uint32_t>(d.granted));
    put32(p + 24, d.element_size);
    put32(p + 28, static_cast<std::uint32_t>(d.keys.size()));
    for (std::size_t i = 0; i < d.keys.size(); ++i) {
      put32(p + 32 + 4 * i, d.keys[i]);
    }
  }
  return out;
}

}  // namespace rdx::group::detail
