// rdx::group::detail: the rendezvous's wire, version 2, and the texts its
// failures name ranks with. A rank sends a hello {magic "RDXG", version,
// flags, rank, size, length} (20 bytes), keyed a 32-byte nonce, then its
// bytes and, keyed, once rank 0's challenge came, a MAC. Rank 0 answers with
// a reply header {magic, version, status, count or text length} (12 bytes):
// a challenge and its nonce, a refusal or failure and its text, or the table
// (its length in bytes, 8 bytes, then each rank's {length, bytes}) and,
// keyed, the table's MAC. Each MAC covers a label of its own first, so no
// MAC of one kind passes for another.
#pragma once

#include <rdx/connect/authenticator.hpp>
#include <rdx/connect/wire.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdx::group::detail {

inline constexpr std::uint32_t rv_magic = 0x52445847;  // "RDXG"
inline constexpr std::uint16_t rv_version = 3;
inline constexpr std::size_t rv_hello_size = 20;  // magic, version, flags, rank, size, length
inline constexpr std::size_t rv_reply_size = 12;  // magic, version, status, count or text length
inline constexpr std::uint16_t rv_ok = 0, rv_failed = 1;
inline constexpr std::uint16_t rv_challenge = 2;  // keyed: rank 0's nonce follows
inline constexpr std::uint16_t rv_refused = 3;    // keyed: this process is refused, the text follows
inline constexpr std::uint16_t rv_waiting = 4;    // its bytes are in: rank 0 decides within count ms
inline constexpr std::uint16_t rv_keyed = 1;      // a hello's flags: a nonce follows, a MAC later
inline constexpr std::size_t rv_nonce_size = 32;
using rv_mac = std::array<std::byte, keyed_mac::mac_size>;

// What each MAC covers starts with its own label.
inline std::span<const std::byte> rv_label(std::string_view l) noexcept {
  return std::as_bytes(std::span(l.data(), l.size()));
}
inline constexpr std::string_view rv_hello_label = "rdx.group.rendezvous.v2 hello";
inline constexpr std::string_view rv_digest_label = "rdx.group.rendezvous.v2 table";
inline constexpr std::string_view rv_table_label = "rdx.group.rendezvous.v2 table for";

// Equal in time that does not depend on where they differ.
inline bool rv_same(std::span<const std::byte> a, std::span<const std::byte> b) noexcept {
  if (a.size() != b.size()) {
    return false;
  }
  unsigned d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d |= std::to_integer<unsigned>(a[i] ^ b[i]);
  }
  return d == 0;
}

// Big-endian fields, as rdx's wire format writes them.
using rdx::wire::detail::get16;
using rdx::wire::detail::get32;
using rdx::wire::detail::get64;
using rdx::wire::detail::put16;
using rdx::wire::detail::put32;
using rdx::wire::detail::put64;

inline std::vector<std::byte> rv_reply_header(std::uint16_t status, std::uint32_t n) {
  std::vector<std::byte> h(rv_reply_size);
  put32(h.data(), rv_magic);
  put16(h.data() + 4, rv_version);
  put16(h.data() + 6, status);
  put32(h.data() + 8, n);
  return h;
}

// "3, 7 and 9" (at most `most` named, then "and N more").
inline std::string rank_list(const std::vector<std::uint32_t>& ranks, std::size_t most = 16) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size() && i < most; ++i) {
    if (i != 0) {
      s += i + 1 == ranks.size() ? " and " : ", ";
    }
    s += std::to_string(ranks[i]);
  }
  if (ranks.size() > most) {
    s += " and " + std::to_string(ranks.size() - most) + " more";
  }
  return s;
}

}  // namespace rdx::group::detail
