// rdx::group::detail: a rank's side of the rendezvous (every rank but 0):
// its hello and bytes (keyed: its nonce, then its MAC once rank 0's
// challenge came), then the table, read in one go and checked entry by
// entry, or rank 0's reason.
#pragma once

#include <rdx/connect/authenticator.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/tcp_socket.hpp>
#include <rdx/detail/random.hpp>
#include <rdx/error.hpp>
#include <rdx/group/detail/rendezvous_wire.hpp>
#include <rdx/group/environment.hpp>
#include <rdx/group/rendezvous_options.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace rdx::group::detail {

// A rank other than 0: hello, bytes, then the table or rank 0's reason.
inline rendezvous_table rendezvous_client(const rank_info& me, std::span<const std::byte> mine,
                                          const rendezvous_options& o) {
  const auto deadline = tcp::clock::now() + o.timeout;
  const std::string where = me.rendezvous_host + ":" + std::to_string(me.rendezvous_port);
  tcp::socket s = tcp::connect(me.rendezvous_host, me.rendezvous_port, o.timeout);
  const keyed_mac* key = o.key.get();
  std::vector<std::byte> hello(rv_hello_size);
  put32(hello.data(), rv_magic);
  put16(hello.data() + 4, rv_version);
  put16(hello.data() + 6, key != nullptr ? rv_keyed : 0);
  put32(hello.data() + 8, me.rank);
  put32(hello.data() + 12, me.size);
  put32(hello.data() + 16, static_cast<std::uint32_t>(mine.size()));
  rv_mac cn{};  // keyed: this rank's nonce
  if (key != nullptr) {
    rdx::detail::os_random(cn.data(), cn.size());
    hello.insert(hello.end(), cn.begin(), cn.end());
  }
  hello.insert(hello.end(), mine.begin(), mine.end());
  s.send_all(hello, deadline, "rendezvous hello");
  // Rank 0 names the ranks missing at its own deadline; its reason gets a
  // grace period to arrive. Rank 0's deadline began when it listened, which
  // can be after this one's (ranks start unevenly): once this rank's bytes
  // are in, rank 0 says how long it may still wait (rv_waiting), and this
  // rank waits that long, never more than one timeout from then. Only the
  // first such word counts: more cannot move the deadline again.
  const auto grace = std::max<std::chrono::milliseconds>(std::chrono::seconds(2), o.timeout / 10);
  auto reply_by = deadline + grace;
  bool told = false;
  std::array<std::byte, rv_reply_size> h{};
  auto read_header = [&] {
    for (;;) {
      s.recv_exact(h, reply_by, "rendezvous reply (rank 0 waits for every rank)");
      if (get32(h.data()) != rv_magic || get16(h.data() + 4) != rv_version) {
        throw error(errc::wire_format, "rendezvous at " + where +
                                           ": the reply is not rdx::group's (another program on the port?)");
      }
      if (get16(h.data() + 6) != rv_waiting) {
        return;
      }
      if (std::exchange(told, true)) {
        continue;
      }
      const auto left =
          std::min<std::chrono::milliseconds>(std::chrono::milliseconds(get32(h.data() + 8)), o.timeout);
      reply_by = std::max(reply_by, tcp::clock::now() + left + grace);
    }
  };
  read_header();
  rv_mac sn{};  // keyed: rank 0's nonce
  if (key != nullptr && get16(h.data() + 6) == rv_challenge && get32(h.data() + 8) == sn.size()) {
    s.recv_exact(sn, reply_by, "rendezvous challenge");
    const rv_mac m =
        key->mac({rv_label(rv_hello_label), sn, cn, std::span(hello).first(rv_hello_size), mine});
    s.send_all(m, deadline, "rendezvous proof");
    read_header();
  } else if (key != nullptr && get16(h.data() + 6) == rv_ok) {
    throw error(errc::authentication_failed, "rendezvous at " + where +
                                                 ": rank 0 sent a table without asking for the key (it has "
                                                 "none: give every rank the same key, or none)");
  }
  const std::uint16_t status = get16(h.data() + 6);
  const std::uint32_t n = get32(h.data() + 8);
  if (status == rv_failed || status == rv_refused) {
    if (n > 4096) {
      throw error(errc::wire_format,
                  "rendezvous at " + where + ": a failure reply of " + std::to_string(n) + " bytes");
    }
    std::string text(n, '\0');
    s.recv_exact(std::as_writable_bytes(std::span(text)), reply_by, "rendezvous failure reply");
    if (status == rv_refused) {
      throw error(errc::authentication_failed, text);
    }
    throw error(errc::operation_failed, "rendezvous at " + where + " failed: " + text);
  }
  if (status != rv_ok) {
    throw error(errc::wire_format,
                "rendezvous at " + where + ": a reply of status " + std::to_string(status) +
                    (status == rv_challenge ? " (a key asked for: this rank has none; give "
                                              "every rank the same key, or none)"
                                            : ""));
  }
  if (n != me.size) {
    throw error(errc::protocol_error, "rendezvous at " + where + ": a table of " + std::to_string(n) +
                                          " ranks for a job of " + std::to_string(me.size));
  }
  // The table in one read: its length first, bounded by what n ranks may
  // hand in, so a forged length cannot make this rank allocate more.
  std::array<std::byte, 8> len{};
  s.recv_exact(len, reply_by, "rendezvous table");
  const std::uint64_t body = get64(len.data());
  if (body < 4ull * n || body > std::uint64_t{n} * (4ull + o.max_bytes)) {
    throw error(errc::protocol_error, "rendezvous at " + where + ": a table of " + std::to_string(body) +
                                          " bytes for " + std::to_string(n) + " ranks of at most " +
                                          std::to_string(o.max_bytes) + " bytes each");
  }
  std::vector<std::byte> all(static_cast<std::size_t>(body));
  s.recv_exact(all, reply_by, "rendezvous table");
  if (key != nullptr) {
    rv_mac theirs{};
    s.recv_exact(theirs, reply_by, "rendezvous table's MAC");
    const rv_mac digest = key->mac({rv_label(rv_digest_label), h, len, all});
    if (!rv_same(key->mac({rv_label(rv_table_label), sn, cn, digest}), theirs)) {
      throw error(errc::authentication_failed,
                  "rendezvous at " + where +
                      ": the table's MAC is wrong (rank 0 holds another key, or the table was altered)");
    }
  }
  rendezvous_table table(n);
  std::size_t at = 0;
  for (std::uint32_t r = 0; r < n; ++r) {
    const std::uint32_t l = at + 4 <= all.size() ? get32(all.data() + at) : 0xffffffffu;
    if (l > o.max_bytes || at + 4 + l > all.size()) {
      throw error(errc::protocol_error, "rendezvous at " + where + ": rank " + std::to_string(r) +
                                            "'s entry runs past the table or above the limit " +
                                            std::to_string(o.max_bytes));
    }
    table[r].assign(all.begin() + static_cast<std::ptrdiff_t>(at + 4),
                    all.begin() + static_cast<std::ptrdiff_t>(at + 4 + l));
    at += 4 + l;
  }
  if (at != all.size()) {
    throw error(errc::protocol_error, "rendezvous at " + where + ": " + std::to_string(all.size() - at) +
                                          " bytes past the table's last entry");
  }
  return table;
}

}  // namespace rdx::group::detail
