// rdx: the endpoint exchange of rdma-core's ibv_rc_pingpong, so rdx programs
// and ibv_rc_pingpong can connect to each other in either role.
//
// The format, as ibv_rc_pingpong speaks it over TCP (default port 18515):
//   each side sends one 52-byte message, the text "LLLL:QQQQQQ:PPPPPP:GGGG...G"
//   followed by a NUL byte: LID as 4 hex digits, QP number and PSN as 6 hex
//   digits each, and the GID as 32 hex digits, its 16 raw bytes in order.
//   The client sends first; the server reads it and answers with its own;
//   the client then sends "done" and its NUL (5 bytes) and closes the
//   connection.
// ibv_rc_pingpong's server brings its queue pair to RTR/RTS before it answers;
// rdx's server does so only once the exchange is complete (the client's
// address checked, the answer sent, "done" checked), so a peer that breaks
// off or sends garbage never gets this side's queue pair moved towards it.
// Clients, ibv_rc_pingpong's included, connect and send after "done"; RC
// retransmits until the server's queue pair is ready.
// Each role runs under one deadline, taken when it starts: a slow peer cannot
// stretch the exchange by trickling bytes or by taking each step just in time.
// The path MTU is not exchanged: both sides must agree on it (ibv_rc_pingpong
// uses 1024 unless given -m).
#pragma once

#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/detail/hex.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/endpoint.hpp>

#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>

//! The endpoint exchange of rdma-core's ibv_rc_pingpong, in either role.
namespace rdx::rc_pingpong {

//! Size of one address message, its terminating NUL included.
inline constexpr std::size_t message_size = 52;
//! ibv_rc_pingpong's default TCP port.
inline constexpr std::uint16_t default_port = 18515;
//! ibv_rc_pingpong's default path MTU.
inline constexpr ibv_mtu default_mtu = IBV_MTU_1024;
//! What the client sends after it has read the server's address.
inline constexpr std::array<char, 5> done_message = {'d', 'o', 'n', 'e', '\0'};

//! One address message, its NUL included.
using message_t = std::array<char, message_size>;

namespace detail {
[[noreturn]] inline void fail(const std::string& what) {
  throw error(errc::wire_format, "ibv_rc_pingpong address message: " + what);
}
inline std::string printable(std::span<const char> in) {
  std::string s;
  for (char c : in) {
    if (c == '\0') {
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      s += c;
    } else {
      s += '?';
    }
  }
  return s;
}

//! Reads one address message; refuses an rdx wire message at its first four
//! bytes instead of waiting for bytes that will never come.
inline message_t recv_address(const tcp::socket& s, tcp::clock::time_point deadline) {
  message_t in{};
  auto bytes = std::as_writable_bytes(std::span(in));
  s.recv_exact(bytes.first(4), deadline, "receive address (ibv_rc_pingpong format)");
  if (std::memcmp(in.data(), "RDXE", 4) == 0) {
    fail("the peer speaks rdx's own wire format (run both sides with --rc-compat, or neither)");
  }
  s.recv_exact(bytes.subspan(4), deadline, "receive address (ibv_rc_pingpong format)");
  return in;
}
}  // namespace detail

//! Formats an endpoint as ibv_rc_pingpong's address message.
//! @throws rdx::error (errc::invalid_argument) when the QP number or PSN does not fit in 24 bits.
[[nodiscard]] inline message_t format(const endpoint& ep) {
  if (ep.qpn > 0xffffffu || ep.psn > 0xffffffu) {
    throw error(errc::invalid_argument,
                "ibv_rc_pingpong address message: QP number or PSN does not fit in 24 bits");
  }
  message_t m{};
  std::snprintf(m.data(), m.size(), "%04x:%06x:%06x:", static_cast<unsigned>(ep.lid),
                static_cast<unsigned>(ep.qpn), static_cast<unsigned>(ep.psn));
  static constexpr char digits[] = "0123456789abcdef";
  for (std::size_t i = 0; i < 16; ++i) {
    m[19 + 2 * i] = digits[ep.gid.raw[i] >> 4];
    m[20 + 2 * i] = digits[ep.gid.raw[i] & 0xf];
  }
  m[message_size - 1] = '\0';
  return m;
}

//! Parses ibv_rc_pingpong's address message, strictly: exactly 52 bytes,
//! hex digits and colons where the format has them, a final NUL.
//! @param mtu the path MTU both sides agreed on (the message does not carry one)
//! @throws rdx::error (errc::wire_format) naming the first wrong byte.
[[nodiscard]] inline endpoint parse(std::span<const char> in, ibv_mtu mtu = default_mtu) {
  if (in.size() != message_size) {
    detail::fail(std::to_string(in.size()) + " bytes, expected " + std::to_string(message_size));
  }
  if (std::memcmp(in.data(), "RDXE", 4) == 0) {
    detail::fail("the peer speaks rdx's own wire format (run both sides with --rc-compat, or neither)");
  }
  auto field = [&](std::size_t pos, std::size_t len, const char* name) {
    std::uint32_t v = 0;
    for (std::size_t i = pos; i < pos + len; ++i) {
      const int d = rdx::detail::hex_value(in[i]);
      if (d < 0) {
        detail::fail("byte " + std::to_string(i) + " of the " + name + " is not a hex digit in \"" +
                     detail::printable(in) + "\"");
      }
      v = (v << 4) | static_cast<std::uint32_t>(d);
    }
    return v;
  };
  for (std::size_t pos : {std::size_t{4}, std::size_t{11}, std::size_t{18}}) {
    if (in[pos] != ':') {
      detail::fail("expected ':' at byte " + std::to_string(pos) + " in \"" + detail::printable(in) + "\"");
    }
  }
  if (in[message_size - 1] != '\0') {
    detail::fail("the message does not end with a NUL byte");
  }
  endpoint ep;
  ep.lid = static_cast<std::uint16_t>(field(0, 4, "LID"));
  ep.qpn = field(5, 6, "QP number");
  ep.psn = field(12, 6, "PSN");
  for (std::size_t i = 0; i < 16; ++i) {
    const int hi = rdx::detail::hex_value(in[19 + 2 * i]);
    const int lo = rdx::detail::hex_value(in[20 + 2 * i]);
    if (hi < 0 || lo < 0) {
      detail::fail("byte " + std::to_string(hi < 0 ? 19 + 2 * i : 20 + 2 * i) +
                   " of the GID is not a hex digit in \"" + detail::printable(in) + "\"");
    }
    ep.gid.raw[i] = static_cast<std::uint8_t>((hi << 4) | lo);
  }
  ep.mtu = mtu;
  ep.port = 1;
  ep.gid_index = 0;
  return ep;
}

//! Checks the client's closing message: exactly "done" and a NUL.
//! @throws rdx::error (errc::wire_format) showing what came instead.
inline void check_done(std::span<const char> in) {
  if (in.size() != done_message.size() || std::memcmp(in.data(), done_message.data(), in.size()) != 0) {
    detail::fail(R"(expected "done" and a NUL after the addresses, got ")" + detail::printable(in) + "\" (" +
                 std::to_string(in.size()) + " bytes)");
  }
}

//! Client role: sends this side's address, reads the server's, sends "done",
//! all before one deadline `timeout` from now. Connect the local queue pair
//! to the returned endpoint, then send first: an rdx server may reach RTR a
//! little after this returns, and RC retransmits until it has.
[[nodiscard]] inline endpoint client_exchange(const tcp::socket& s, const endpoint& local,
                                              ibv_mtu mtu = default_mtu,
                                              tcp::milliseconds timeout = tcp::default_timeout) {
  const auto deadline = tcp::clock::now() + timeout;
  const message_t out = format(local);
  s.send_all(std::as_bytes(std::span(out)), deadline, "send address (ibv_rc_pingpong format)");
  const endpoint remote = parse(detail::recv_address(s, deadline), mtu);
  s.send_all(std::as_bytes(std::span(done_message)), deadline, "send \"done\"");
  return remote;
}

//! Server role: reads and parses the client's address, sends this side's,
//! reads and checks the client's "done", all before one deadline `timeout`
//! from now; only then calls `connect(remote)`, which must bring the local
//! queue pair to RTR/RTS (post its receives before). A malformed, partial or
//! late message throws before `connect` runs; so does anything wrong with
//! this side's own address, before anything is read.
//! @returns the client's endpoint, once `connect` has returned.
template <std::invocable<const endpoint&> Connect>
endpoint server_exchange(const tcp::socket& s, const endpoint& local, Connect&& connect,
                         ibv_mtu mtu = default_mtu, tcp::milliseconds timeout = tcp::default_timeout) {
  const auto deadline = tcp::clock::now() + timeout;
  const message_t out = format(local);
  const endpoint remote = parse(detail::recv_address(s, deadline), mtu);
  s.send_all(std::as_bytes(std::span(out)), deadline, "send address (ibv_rc_pingpong format)");
  std::array<char, done_message.size()> done{};
  s.recv_exact(std::as_writable_bytes(std::span(done)), deadline, "receive \"done\"");
  check_done(done);
  std::forward<Connect>(connect)(remote);
  return remote;
}

}  // namespace rdx::rc_pingpong
