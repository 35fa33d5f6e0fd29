// rdx_crypt_fabric: the plan both sides run, and what travels on TCP before
// any RDMA traffic: the client's plan once (a fixed block, apps/settings.hpp),
// then the point each fresh connection is for, so that the two sides can
// never measure different things.
#pragma once

#include <rdx/connect/tcp_socket.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "options.hpp"
#include "pattern.hpp"
#include "settings.hpp"

namespace crypt_fabric {

//! What a point measures: messages of one size (throughput, then latency), one
//! transfer (written by the client into the server), or one fetch (read by
//! the client from the server).
enum class kind : std::uint32_t { message = 1, transfer = 2, fetch = 3 };
//! Plain (encrypt = false) or sealed (encrypt = true) connections.
enum class mode : std::uint32_t { plain = 0, sealed = 1 };

inline const char* kind_name(kind k) {
  return k == kind::message ? "message" : k == kind::transfer ? "transfer" : "fetch";
}
inline const char* mode_name(mode m) {
  return m == mode::plain ? "plain" : "sealed";
}

//! "64 B", "4 KiB", "1 MiB", "1536 B".
inline std::string size_name(std::uint64_t n) {
  if (n >= mib && n % mib == 0) {
    return std::to_string(n / mib) + " MiB";
  }
  if (n >= kib && n % kib == 0) {
    return std::to_string(n / kib) + " KiB";
  }
  return std::to_string(n) + " B";
}

//! One measurement on one fresh connection pair.
struct point {
  std::uint32_t round = 0;
  kind what = kind::message;
  mode how = mode::plain;
  std::uint64_t size = 0;  //!< message size, or transfer size
  std::size_t row = 0;     //!< its row of the table: sizes first, then transfers, then fetches
};

inline std::string describe(const point& p) {
  return std::string(kind_name(p.what)) + " " + size_name(p.size) + " " + mode_name(p.how) + ", round " +
         std::to_string(p.round + 1);
}

//! The client's options that decide what both sides do.
struct plan {
  std::uint64_t seed = 0;  //!< the run's: patterns of another run never match
  std::uint32_t rounds = 1;
  bool quick = false;
  std::uint64_t iters = 0;
  std::uint64_t latency_iters = 0;
  std::uint64_t chunk = 0;
  std::vector<std::uint64_t> sizes;
  std::vector<std::uint64_t> bulk;
};

//! Every point, in the order both sides run them: per round, each message
//! size, each transfer, then each fetch (of the transfer sizes), plain and sealed back to back (sealed first
//! in odd rounds, so that neither mode always runs on the link the other warmed).
inline std::vector<point> schedule(const plan& p) {
  std::vector<point> out;
  for (std::uint32_t r = 0; r < p.rounds; ++r) {
    const mode first = r % 2 == 0 ? mode::plain : mode::sealed;
    const mode second = r % 2 == 0 ? mode::sealed : mode::plain;
    std::size_t row = 0;
    for (kind k : {kind::message, kind::transfer, kind::fetch}) {
      for (std::uint64_t s : k == kind::message ? p.sizes : p.bulk) {
        out.push_back({r, k, first, s, row});
        out.push_back({r, k, second, s, row});
        ++row;
      }
    }
  }
  return out;
}

//! The seed of a point's bytes.
inline std::uint64_t point_seed(const plan& pl, const point& p) {
  std::uint64_t h = mix(pl.seed + p.round);
  h = mix(h + static_cast<std::uint64_t>(p.what));
  h = mix(h + static_cast<std::uint64_t>(p.how));
  return mix(h + p.size);
}

//! Messages of a throughput point: about 1 s on a link of 1 Gb/s or 50000 messages/s.
inline std::uint64_t message_count(const plan& p, std::uint64_t size) {
  if (p.iters != 0) {
    return p.iters;
  }
  if (p.quick) {
    return 32;
  }
  return std::clamp<std::uint64_t>(128 * mib / size, 200, 50000);
}

//! Measured round trips of a latency point (N/10 more go first, unmeasured).
inline std::uint64_t latency_count(const plan& p, std::uint64_t size) {
  if (p.latency_iters != 0) {
    return p.latency_iters;
  }
  if (p.quick) {
    return 20;
  }
  return size >= 256 * kib ? std::clamp<std::uint64_t>(128 * mib / size, 50, 500) : 500;
}

//! Message buffers each side for payloads of this size: 64, fewer for large
//! ones (16 MiB of payload in the ring, at least 4 buffers).
inline std::uint32_t ring_depth(std::uint64_t payload) {
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(16 * mib / payload, 4, 64));
}

//! The settings block: magic, version, then the plan in fixed fields.
inline constexpr std::uint32_t plan_version = 2;
inline constexpr std::size_t plan_block_size = 4 + 4 + 8 + 4 + 4 + 8 + 8 + 8 + 2 * (4 + 8 * max_list);
inline constexpr const char* plan_magic = "CRFB";

inline std::array<std::byte, plan_block_size> encode_plan(const plan& p) {
  std::array<std::byte, plan_block_size> b{};
  app::settings_writer w(b);
  w.magic(plan_magic).u32(plan_version).u64(p.seed).u32(p.rounds).u32(p.quick ? 1 : 0);
  w.u64(p.iters).u64(p.latency_iters).u64(p.chunk);
  for (const auto* list : {&p.sizes, &p.bulk}) {
    w.u32(static_cast<std::uint32_t>(list->size()));
    for (std::size_t i = 0; i < max_list; ++i) {
      w.u64(i < list->size() ? (*list)[i] : 0);
    }
  }
  return b;
}

//! The client's plan from its block (only its version from the server's).
//! @throws failure for another version or values out of range.
inline plan decode_plan(std::span<const std::byte> b, const std::string& who, bool server_block) {
  app::settings_reader r(b);
  (void)r.magic(plan_magic);  // checked by exchange_settings
  if (const std::uint32_t v = r.u32(); v != plan_version) {
    throw failure("the peer at " + who + " speaks version " + std::to_string(v) +
                  " of rdx_crypt_fabric's plan, " + "this side " + std::to_string(plan_version) +
                  ": run the same build on both sides");
  }
  if (server_block) {
    return {};
  }
  plan p;
  p.seed = r.u64();
  p.rounds = r.u32();
  p.quick = r.u32() != 0;
  p.iters = r.u64();
  p.latency_iters = r.u64();
  p.chunk = r.u64();
  for (auto* list : {&p.sizes, &p.bulk}) {
    const std::uint32_t n = r.u32();
    for (std::size_t i = 0; i < max_list; ++i) {
      const std::uint64_t v = r.u64();
      if (i < n) {
        list->push_back(v);
      }
    }
  }
  const auto bad = [](std::uint64_t v, std::uint64_t hi) { return v == 0 || v > hi; };
  bool wrong = p.rounds == 0 || p.rounds > 1000 || bad(p.chunk, max_message) || p.sizes.size() > max_list ||
               p.bulk.size() > max_list;
  for (std::uint64_t s : p.sizes) {
    wrong = wrong || bad(s, max_message);
  }
  for (std::uint64_t s : p.bulk) {
    wrong = wrong || bad(s, max_transfer);
  }
  if (wrong) {
    throw failure("the plan from " + who + " is out of range: run the same build on both sides");
  }
  return p;
}

//! Sends the plan (client) or receives it (server; its own block says only
//! who it is), both before deadline. @throws failure for a peer that is not rdx_crypt_fabric.
inline plan agree_plan(const rdx::tcp::socket& s, const plan* mine,
                       std::chrono::steady_clock::time_point deadline) {
  std::array<std::byte, plan_block_size> out = encode_plan(mine != nullptr ? *mine : plan{});
  std::array<std::byte, plan_block_size> in{};
  app::exchange_settings<failure>(s, out, in, deadline, "rdx_crypt_fabric");
  plan theirs = decode_plan(in, s.peer(), mine != nullptr);
  return mine != nullptr ? *mine : theirs;
}

//! The point header: which point this connection is for.
inline constexpr std::size_t point_block_size = 4 + 4 + 4 + 4 + 8;

//! Both sides say which point the fresh socket is for. @throws failure when they disagree.
inline void agree_point(const rdx::tcp::socket& s, const point& p,
                        std::chrono::steady_clock::time_point deadline) {
  std::array<std::byte, point_block_size> out{};
  app::settings_writer(out)
      .magic("CRFP")
      .u32(p.round)
      .u32(static_cast<std::uint32_t>(p.what))
      .u32(static_cast<std::uint32_t>(p.how))
      .u64(p.size);
  std::array<std::byte, point_block_size> in{};
  app::exchange_settings<failure>(s, out, in, deadline, "rdx_crypt_fabric");
  if (in != out) {
    throw failure("the peer at " + s.peer() +
                  " is out of step: it set up a connection for another point than " + describe(p));
  }
}

}  // namespace crypt_fabric
