// rdx: the messages of authenticated set-up, and their pure decoder (no
// socket, no cryptography, so a fuzzer can drive it alone).
//
// Every message is 40 bytes, integers big-endian:
//   0  u32  magic 0x52445841 ("RDXA")
//   4  u8   version (1)
//   5  u8   type: 1 hello, 2 proof, 3 transcript MAC
//   6  u16  reserved, zero
//   8  32   body: the sender's nonce (hello) or an HMAC-SHA256 (proof, MAC)
#pragma once

#include <rdx/connect/wire.hpp>
#include <rdx/error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace rdx::auth::detail {

inline constexpr std::uint8_t message_version = 1;
inline constexpr std::size_t body_size = 32;
inline constexpr std::size_t message_size = 8 + body_size;

enum class message_type : std::uint8_t { hello = 1, proof = 2, transcript_mac = 3 };

inline const char* type_name(message_type t) noexcept {
  switch (t) {
    case message_type::hello: return "hello";
    case message_type::proof: return "proof";
    case message_type::transcript_mac: return "transcript MAC";
  }
  return "unknown message";
}

struct message {
  message_type type = message_type::hello;
  std::array<std::byte, body_size> body{};
};

//! Writes one message; `out` holds exactly message_size bytes.
inline void encode_message(message_type t, std::span<const std::byte, body_size> body,
                           std::span<std::byte, message_size> out) noexcept {
  wire::detail::put32(out.data(), wire::auth_magic);
  out[4] = std::byte{message_version};
  out[5] = std::byte{static_cast<std::uint8_t>(t)};
  out[6] = std::byte{0};
  out[7] = std::byte{0};
  std::memcpy(out.data() + 8, body.data(), body_size);
}

//! Decodes one message; `in` must hold it and nothing more.
//! @throws rdx::error (errc::wire_format) naming what is wrong: the length,
//!         the magic, the version, the type or a reserved byte.
[[nodiscard]] inline message parse_message(std::span<const std::byte> in) {
  auto fail = [](const std::string& what) {
    throw error(errc::wire_format, "rdx authentication message: " + what);
  };
  if (in.size() != message_size) {
    fail(std::to_string(in.size()) + " bytes, a message has " + std::to_string(message_size));
  }
  const std::uint32_t m = wire::detail::get32(in.data());
  if (m != wire::auth_magic) {
    fail("wrong magic " + wire::detail::hex(m) + " (expected " + wire::detail::hex(wire::auth_magic) +
         ", \"RDXA\"): the peer does not speak rdx's authenticated set-up");
  }
  const auto v = std::to_integer<unsigned>(in[4]);
  if (v != message_version) {
    fail("unsupported version " + std::to_string(v) + " (this side speaks version " +
         std::to_string(message_version) + ")");
  }
  const auto t = std::to_integer<unsigned>(in[5]);
  if (t < 1 || t > 3) {
    fail("unknown message type " + std::to_string(t));
  }
  if (in[6] != std::byte{0} || in[7] != std::byte{0}) {
    fail("reserved bytes at offset 6 are not zero");
  }
  message out;
  out.type = static_cast<message_type>(t);
  std::memcpy(out.body.data(), in.data() + 8, body_size);
  return out;
}

}  // namespace rdx::auth::detail
