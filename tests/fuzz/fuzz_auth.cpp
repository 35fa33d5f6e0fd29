// libFuzzer target: the pure parts of authenticated set-up (target rdx::auth):
// the 40-byte message decoder (auth/detail/message.hpp) and the hex key
// reader psk_key::from_hex.
//
// Whatever parses as a message encodes back to the same bytes. Whatever reads
// as a key has one byte per two digits and reads again once its white space
// is dropped and its digits are written in lower case; a refused key text has
// a reason: a character that is not a hex digit, an odd number of digits, or
// fewer than min_key_size bytes.
#include <rdx/auth/psk.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"

namespace {

namespace a = rdx::auth;
using rdx::errc;
using rdx::fuzz::accepted;

void message(std::span<const std::byte> in) {
  a::detail::message m;
  if (!accepted([&] { m = a::detail::parse_message(in); }, errc::wire_format)) {
    return;
  }
  RDX_FUZZ_REQUIRE(in.size() == a::detail::message_size);
  const auto t = static_cast<unsigned>(m.type);
  RDX_FUZZ_REQUIRE(t >= 1 && t <= 3);
  std::array<std::byte, a::detail::message_size> again{};
  a::detail::encode_message(m.type, m.body, again);
  RDX_FUZZ_REQUIRE(std::memcmp(again.data(), in.data(), in.size()) == 0);
}

void key(std::span<const std::byte> in) {
  const std::string_view text(reinterpret_cast<const char*>(in.data()), in.size());
  std::string digits;
  bool foreign = false;
  for (const char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      continue;
    }
    const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    foreign = foreign || !hex;
    digits += c >= 'A' && c <= 'F' ? static_cast<char>(c - 'A' + 'a') : c;
  }
  std::shared_ptr<a::psk_key> k;
  if (!accepted([&] { k = a::psk_key::from_hex(text); }, errc::invalid_argument)) {
    RDX_FUZZ_REQUIRE(foreign || digits.size() % 2 != 0 || digits.size() / 2 < a::min_key_size);
    return;
  }
  RDX_FUZZ_REQUIRE(!foreign && digits.size() % 2 == 0);
  RDX_FUZZ_REQUIRE(k->size() == digits.size() / 2 && k->size() >= a::min_key_size);
  // Anything read once reads again in its plainest spelling: no rdx::error may escape here.
  RDX_FUZZ_REQUIRE(a::psk_key::from_hex(digits)->size() == k->size());
}

}  // namespace

// NOLINTNEXTLINE(readability-identifier-naming)
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return rdx::fuzz::run_checks(data, size, message, key);
}
