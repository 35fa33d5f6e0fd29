// rdx: connecting a connection over the TCP bootstrap, together with the
// window grants each side offers.
//
// After the standard endpoint messages (one per queue pair; the first carries
// the credit word and the windows' memory descriptors), each side sends one
// block, all integers big-endian:
//   0  u32  magic 0x52445843 ("RDXC")
//   4  u32  queue pairs
//   8  u32  recv_depth
//  12  u32  message_size
//  16  u32  number of windows
//  then per window: u32 rights, u32 element size
// Anything malformed throws rdx::error (errc::wire_format).
#pragma once

#include <rdx/channel/connection.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/wire.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace rdx {

//! What the peer offered: its connection and its window grants, in its order.
struct peer_offer {
  connection_info info;
  std::vector<window_descriptor> windows;
};

//! Sends this side's connection info and grants over s, receives the peer's,
//! and connects c to the peer; both sides call it, then barrier() so no
//! message meets a queue pair that is not ready. @throws rdx::error.
inline peer_offer exchange_and_connect(const tcp::socket& s, connection& c,
                                       std::span<const window_descriptor> grants,
                                       std::chrono::milliseconds timeout = tcp::default_timeout,
                                       const connect_options& opt = {}) {
  if (grants.size() + 1 > wire::max_descriptors) {
    detail::throw_rdx(errc::invalid_argument, "exchange_and_connect: too many windows");
  }
  const connection_info mine = c.local_info();
  std::vector<remote_descriptor> desc{mine.credit_word};
  for (const auto& g : grants) desc.push_back(g.memory);

  peer_offer peer;
  wire::message first = tcp::exchange(s, mine.endpoints[0], desc, timeout);
  peer.info.endpoints.push_back(first.ep);
  for (std::size_t i = 1; i < mine.endpoints.size(); ++i) {
    peer.info.endpoints.push_back(tcp::exchange(s, mine.endpoints[i], {}, timeout).ep);
  }
  if (first.descriptors.empty())
    throw error(errc::wire_format, "exchange_and_connect: the peer sent no credit word");

  const auto deadline = tcp::clock::now() + timeout;
  std::vector<std::byte> out(20 + 8 * grants.size());
  auto put = [&](std::size_t at, std::uint32_t v) { wire::detail::put32(out.data() + at, v); };
  put(0, 0x52445843u);
  put(4, static_cast<std::uint32_t>(mine.endpoints.size()));
  put(8, mine.recv_depth);
  put(12, mine.message_size);
  put(16, static_cast<std::uint32_t>(grants.size()));
  for (std::size_t i = 0; i < grants.size(); ++i) {
    put(20 + 8 * i, static_cast<unsigned>(grants[i].granted));
    put(24 + 8 * i, grants[i].element_size);
  }
  s.send_all(out, deadline, "send connection settings");
  std::byte head[20];
  s.recv_exact(head, deadline, "receive connection settings");
  auto get = [](const std::byte* p) { return wire::detail::get32(p); };
  if (get(head) != 0x52445843u)
    throw error(errc::wire_format, "exchange_and_connect: the peer is not an rdx connection");
  const std::uint32_t nqp = get(head + 4);
  peer.info.recv_depth = get(head + 8);
  peer.info.message_size = get(head + 12);
  const std::uint32_t nwin = get(head + 16);
  if (nqp != peer.info.endpoints.size() || nwin + 1 != first.descriptors.size()) {
    throw error(errc::wire_format,
                "exchange_and_connect: the peer's settings disagree with its endpoint messages (" +
                    std::to_string(nqp) + " queue pairs, " + std::to_string(nwin) + " windows)");
  }
  std::vector<std::byte> rest(8 * std::size_t{nwin});
  if (!rest.empty()) s.recv_exact(rest, deadline, "receive window grants");
  peer.info.credit_word = first.descriptors[0];
  for (std::uint32_t i = 0; i < nwin; ++i) {
    const std::uint32_t r = get(rest.data() + 8 * i);
    if (r > 7)
      throw error(errc::wire_format,
                  "exchange_and_connect: window " + std::to_string(i) + " has rights " + std::to_string(r));
    peer.windows.push_back({first.descriptors[i + 1], static_cast<rights>(r), get(rest.data() + 8 * i + 4)});
  }
  c.connect(peer.info, opt);
  tcp::barrier(s, timeout);
  return peer;
}

//! Connects two connections of this process to each other (loopback tests).
inline void connect_pair(connection& a, connection& b, const connect_options& opt = {}) {
  const connection_info ia = a.local_info();
  const connection_info ib = b.local_info();
  a.connect(ib, opt);
  b.connect(ia, opt);
}

}  // namespace rdx
