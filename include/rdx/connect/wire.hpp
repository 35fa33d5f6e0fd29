// rdx: the wire format that carries an endpoint and its remote memory
// descriptors between two hosts.
//
// All integers are big-endian (network byte order). A message is
//
//   header, 16 bytes
//     0  u32  magic 0x52445845 ("RDXE")
//     4  u16  version (1)
//     6  u16  number of descriptors
//     8  u32  total length of the message in bytes, header included
//    12  u32  reserved, zero
//   endpoint, 32 bytes
//     0  16   GID, raw bytes in order
//    16  u16  LID
//    18  u8   port number
//    19  u8   GID index
//    20  u32  QP number (24 bits)
//    24  u32  starting PSN (24 bits)
//    28  u8   MTU as ibv_mtu (1 = 256 ... 5 = 4096)
//    29  3    reserved, zero
//   descriptors, 24 bytes each
//     0  u64  address
//     8  u64  length
//    16  u32  rkey
//    20  u32  reserved, zero
//
// The decoder trusts nothing: every length, count, range and reserved field
// is checked, and a failure throws rdx::error with errc::wire_format naming
// what is wrong and where.
#pragma once

#include <rdx/error.hpp>
#include <rdx/verbs/endpoint.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

//! The endpoint wire format: one versioned, big-endian message that carries an endpoint and its
//! remote memory descriptors, decoded with every field checked.
namespace rdx::wire {

inline constexpr std::uint32_t magic = 0x52445845;  //!< "RDXE", the first word of every endpoint message
//! First word of every message of authenticated set-up (rdx/auth/detail/message.hpp).
inline constexpr std::uint32_t auth_magic = 0x52445841;  // "RDXA"
inline constexpr std::uint16_t version = 1;              //!< the version this side writes and accepts
inline constexpr std::size_t header_size = 16;           //!< bytes of the header
inline constexpr std::size_t endpoint_size = 32;         //!< bytes of the endpoint that follows it
inline constexpr std::size_t descriptor_size = 24;       //!< bytes of each descriptor after that
//! Most descriptors one message may carry.
inline constexpr std::size_t max_descriptors = 256;
//! Largest valid message: the decoder refuses anything longer before reading it.
inline constexpr std::size_t max_message_size =
    header_size + endpoint_size + max_descriptors * descriptor_size;

//! Bytes a message with `descriptors` descriptors occupies.
[[nodiscard]] constexpr std::size_t encoded_size(std::size_t descriptors) noexcept {
  return header_size + endpoint_size + descriptors * descriptor_size;
}

//! A decoded message: the peer's endpoint and the memory it exposes.
struct message {
  endpoint ep;                                 //!< the peer's queue pair: GID, LID, port, QP number, PSN, MTU
  std::vector<remote_descriptor> descriptors;  //!< the memory it exposes, in its order
};

//! What the fixed-size header says; enough to know how many bytes follow.
struct header {
  std::uint16_t version = 0;           //!< the sender's version (decode_header accepts only ours)
  std::uint16_t descriptor_count = 0;  //!< descriptors after the endpoint
  std::uint32_t length = 0;            //!< whole message, header included
};

namespace detail {

inline void put16(std::byte* p, std::uint16_t v) noexcept {
  p[0] = static_cast<std::byte>(v >> 8);
  p[1] = static_cast<std::byte>(v);
}
inline void put32(std::byte* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) {
    p[i] = static_cast<std::byte>(v >> (24 - 8 * i));
  }
}
inline void put64(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) {
    p[i] = static_cast<std::byte>(v >> (56 - 8 * i));
  }
}
inline std::uint16_t get16(const std::byte* p) noexcept {
  return static_cast<std::uint16_t>((std::to_integer<unsigned>(p[0]) << 8) | std::to_integer<unsigned>(p[1]));
}
inline std::uint32_t get32(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v = (v << 8) | std::to_integer<std::uint32_t>(p[i]);
  }
  return v;
}
inline std::uint64_t get64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) {
    v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  }
  return v;
}

[[noreturn]] inline void fail(errc e, const std::string& what) {
  throw error(e, "rdx wire message: " + what);
}

inline std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

//! True when the bytes look like ibv_rc_pingpong's text ("0000:000000:..."),
//! the usual cause of a wrong magic: one side runs in rc_pingpong mode.
inline bool looks_like_rc_pingpong(std::span<const std::byte> in) noexcept {
  if (in.size() < 5) {
    return false;
  }
  for (std::size_t i = 0; i < 4; ++i) {
    const char c = static_cast<char>(in[i]);
    const bool hexdigit = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!hexdigit) {
      return false;
    }
  }
  return static_cast<char>(in[4]) == ':';
}

inline void check_endpoint(const endpoint& e, errc code, const char* who) {
  if (e.qpn > 0xffffffu) {
    fail(code, std::string(who) + "QP number " + hex(e.qpn) + " does not fit in 24 bits");
  }
  if (e.psn > 0xffffffu) {
    fail(code, std::string(who) + "PSN " + hex(e.psn) + " does not fit in 24 bits");
  }
  const int m = static_cast<int>(e.mtu);
  if (m < IBV_MTU_256 || m > max_mtu_enum) {
    fail(code, std::string(who) + "MTU value " + std::to_string(m) + " is outside 1 (256 B) to 5 (4096 B)");
  }
  if (e.port == 0) {
    fail(code, std::string(who) + "port number 0 (ports count from 1)");
  }
}

inline void check_descriptor(const remote_descriptor& d, std::size_t i, errc code, const char* who) {
  if (d.length != 0 && d.length - 1 > UINT64_MAX - d.addr) {
    fail(code, std::string(who) + "descriptor " + std::to_string(i) + ": address " + hex(d.addr) +
                   " + length " + hex(d.length) + " wraps past the end of the address space");
  }
}

}  // namespace detail

//! Writes one message into `out` and returns the bytes written; allocates nothing.
//! @throws rdx::error (errc::invalid_argument) when `out` is too small, there are
//!         more than max_descriptors descriptors, or a field is out of range.
inline std::size_t encode(const endpoint& ep, std::span<const remote_descriptor> descriptors,
                          std::span<std::byte> out) {
  if (descriptors.size() > max_descriptors) {
    detail::fail(errc::invalid_argument, "cannot encode " + std::to_string(descriptors.size()) +
                                             " descriptors, at most " + std::to_string(max_descriptors));
  }
  const std::size_t n = encoded_size(descriptors.size());
  if (out.size() < n) {
    detail::fail(errc::invalid_argument, "output buffer of " + std::to_string(out.size()) +
                                             " bytes, the message needs " + std::to_string(n));
  }
  detail::check_endpoint(ep, errc::invalid_argument, "cannot encode endpoint: ");
  for (std::size_t i = 0; i < descriptors.size(); ++i) {
    detail::check_descriptor(descriptors[i], i, errc::invalid_argument, "cannot encode ");
  }

  std::byte* p = out.data();
  std::memset(p, 0, n);
  detail::put32(p + 0, magic);
  detail::put16(p + 4, version);
  detail::put16(p + 6, static_cast<std::uint16_t>(descriptors.size()));
  detail::put32(p + 8, static_cast<std::uint32_t>(n));
  p += header_size;
  std::memcpy(p, ep.gid.raw, 16);
  detail::put16(p + 16, ep.lid);
  p[18] = static_cast<std::byte>(ep.port);
  p[19] = static_cast<std::byte>(ep.gid_index);
  detail::put32(p + 20, ep.qpn);
  detail::put32(p + 24, ep.psn);
  p[28] = static_cast<std::byte>(static_cast<std::uint8_t>(ep.mtu));
  p += endpoint_size;
  for (const auto& d : descriptors) {
    detail::put64(p + 0, d.addr);
    detail::put64(p + 8, d.length);
    detail::put32(p + 16, d.rkey);
    p += descriptor_size;
  }
  return n;
}

//! Encodes one message into a new buffer.
[[nodiscard]] inline std::vector<std::byte> encode(const endpoint& ep,
                                                   std::span<const remote_descriptor> descriptors = {}) {
  if (descriptors.size() > max_descriptors) {
    detail::fail(errc::invalid_argument, "cannot encode " + std::to_string(descriptors.size()) +
                                             " descriptors, at most " + std::to_string(max_descriptors));
  }
  std::vector<std::byte> out(encoded_size(descriptors.size()));
  encode(ep, descriptors, out);
  return out;
}

//! Checks the 16-byte header at the start of `in` and returns it, so a stream
//! reader knows how many bytes the whole message has before reading them.
//! @throws rdx::error (errc::wire_format) for a short header, a wrong magic or
//!         version, too many descriptors, or a length that disagrees with them.
[[nodiscard]] inline header decode_header(std::span<const std::byte> in) {
  if (in.size() < header_size) {
    detail::fail(errc::wire_format, "truncated: " + std::to_string(in.size()) +
                                        " bytes, the header alone needs " + std::to_string(header_size));
  }
  const std::byte* p = in.data();
  const std::uint32_t m = detail::get32(p);
  if (m != magic) {
    std::string w = "wrong magic " + detail::hex(m) + " (expected " + detail::hex(magic) + ", \"RDXE\")";
    if (m == auth_magic) {
      w += ": the peer wants authenticated set-up: give this side the pre-shared key";
    } else if (detail::looks_like_rc_pingpong(in)) {
      w += ": the peer speaks ibv_rc_pingpong's text format (use --rc-compat on this side)";
    } else {
      w += ": the peer is not an rdx program";
    }
    detail::fail(errc::wire_format, w);
  }
  header h;
  h.version = detail::get16(p + 4);
  h.descriptor_count = detail::get16(p + 6);
  h.length = detail::get32(p + 8);
  if (h.version != version) {
    detail::fail(errc::wire_format, "unsupported version " + std::to_string(h.version) +
                                        " (this side speaks version " + std::to_string(version) + ")");
  }
  if (detail::get32(p + 12) != 0) {
    detail::fail(errc::wire_format, "reserved header field at offset 12 is " +
                                        detail::hex(detail::get32(p + 12)) + ", must be zero");
  }
  if (h.descriptor_count > max_descriptors) {
    detail::fail(errc::wire_format, "oversized: " + std::to_string(h.descriptor_count) +
                                        " descriptors, at most " + std::to_string(max_descriptors));
  }
  if (h.length > max_message_size) {
    detail::fail(errc::wire_format, "oversized: length field says " + std::to_string(h.length) +
                                        " bytes, at most " + std::to_string(max_message_size));
  }
  if (h.length != encoded_size(h.descriptor_count)) {
    detail::fail(errc::wire_format, "length field says " + std::to_string(h.length) + " bytes but " +
                                        std::to_string(h.descriptor_count) + " descriptors make " +
                                        std::to_string(encoded_size(h.descriptor_count)));
  }
  return h;
}

//! Decodes exactly one message; `in` must hold it and nothing more.
//! @throws rdx::error (errc::wire_format) naming the problem: truncated,
//!         oversized, wrong magic or version, a field out of range, or a
//!         reserved field that is not zero.
[[nodiscard]] inline message decode(std::span<const std::byte> in) {
  const header h = decode_header(in);
  if (in.size() < h.length) {
    detail::fail(errc::wire_format,
                 "truncated: " + std::to_string(in.size()) + " of " + std::to_string(h.length) + " bytes");
  }
  if (in.size() > h.length) {
    detail::fail(errc::wire_format, "oversized: " + std::to_string(in.size()) + " bytes for a message of " +
                                        std::to_string(h.length) + " (" +
                                        std::to_string(in.size() - h.length) + " trailing bytes)");
  }
  const std::byte* p = in.data() + header_size;
  message msg;
  endpoint& e = msg.ep;
  std::memcpy(e.gid.raw, p, 16);
  e.lid = detail::get16(p + 16);
  e.port = std::to_integer<std::uint8_t>(p[18]);
  e.gid_index = std::to_integer<std::uint8_t>(p[19]);
  e.qpn = detail::get32(p + 20);
  e.psn = detail::get32(p + 24);
  const auto mtu = std::to_integer<int>(p[28]);
  for (std::size_t i = 29; i < endpoint_size; ++i) {
    if (p[i] != std::byte{0}) {
      detail::fail(errc::wire_format,
                   "reserved endpoint byte at offset " + std::to_string(header_size + i) + " is not zero");
    }
  }
  if (mtu < IBV_MTU_256 || mtu > max_mtu_enum) {
    detail::fail(errc::wire_format,
                 "out of range: MTU value " + std::to_string(mtu) + " is outside 1 (256 B) to 5 (4096 B)");
  }
  e.mtu = static_cast<ibv_mtu>(mtu);
  detail::check_endpoint(e, errc::wire_format, "out of range: ");
  p += endpoint_size;
  msg.descriptors.resize(h.descriptor_count);
  for (std::size_t i = 0; i < h.descriptor_count; ++i, p += descriptor_size) {
    auto& d = msg.descriptors[i];
    d.addr = detail::get64(p + 0);
    d.length = detail::get64(p + 8);
    d.rkey = detail::get32(p + 16);
    if (detail::get32(p + 20) != 0) {
      detail::fail(errc::wire_format, "reserved field of descriptor " + std::to_string(i) + " is not zero");
    }
    detail::check_descriptor(d, i, errc::wire_format, "out of range: ");
  }
  return msg;
}

}  // namespace rdx::wire
