// libFuzzer target: ibv_rc_pingpong's text address and its "done"
// (connect/rc_pingpong_exchange.hpp).
//
// Whatever parses must format back to the same text (hex digits in lower
// case, which format writes and parse also accepts in upper case) and parse
// equal; whatever formats must parse to the endpoint it came from.
#include <rdx/connect/rc_pingpong_exchange.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "fuzz_check.hpp"

namespace {

namespace rcp = rdx::rc_pingpong;
using rdx::errc;
using rdx::fuzz::accepted;

char lower(char c) noexcept {
  return c >= 'A' && c <= 'F' ? static_cast<char>(c - 'A' + 'a') : c;
}

void parsing(std::span<const char> in, ibv_mtu mtu) {
  rdx::endpoint ep;
  if (!accepted([&] { ep = rcp::parse(in, mtu); }, errc::wire_format)) {
    return;
  }
  RDX_FUZZ_REQUIRE(in.size() == rcp::message_size);
  RDX_FUZZ_REQUIRE(ep.mtu == mtu && ep.port == 1 && ep.gid_index == 0);
  RDX_FUZZ_REQUIRE(ep.qpn <= 0xffffffu && ep.psn <= 0xffffffu);
  // Anything parsed can be formatted: no rdx::error may escape here.
  const rcp::message_t text = rcp::format(ep);
  for (std::size_t i = 0; i < rcp::message_size; ++i) {
    RDX_FUZZ_REQUIRE(text[i] == lower(in[i]));
  }
  RDX_FUZZ_REQUIRE(rcp::parse(text, mtu) == ep);
}

void done(std::span<const char> in) {
  if (accepted([&] { rcp::check_done(in); }, errc::wire_format)) {
    RDX_FUZZ_REQUIRE(in.size() == rcp::done_message.size());
    RDX_FUZZ_REQUIRE(std::memcmp(in.data(), rcp::done_message.data(), in.size()) == 0);
  }
}

void formatting(std::span<const std::byte> in) {
  rdx::fuzz::reader r(in);
  rdx::endpoint ep;
  ep.lid = r.u16();
  ep.qpn = r.u32() >> (r.u8() % 9);
  ep.psn = r.u32() >> (r.u8() % 9);
  for (auto& b : ep.gid.raw) {
    b = r.u8();
  }
  rcp::message_t text{};
  if (!accepted([&] { text = rcp::format(ep); }, errc::invalid_argument)) {
    RDX_FUZZ_REQUIRE(ep.qpn > 0xffffffu || ep.psn > 0xffffffu);
    return;
  }
  RDX_FUZZ_REQUIRE(text[rcp::message_size - 1] == '\0');
  // port and gid_index do not travel; parse fills in 1 and 0, as the defaults are.
  RDX_FUZZ_REQUIRE(rcp::parse(text, ep.mtu) == ep);
}

}  // namespace

// libFuzzer calls this name.
// NOLINTNEXTLINE(readability-identifier-naming)
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const char> text(reinterpret_cast<const char*>(data), size);
  parsing(text, rcp::default_mtu);
  // A message cut or padded to the exact size, so short inputs reach the field checks too.
  if (size > 0 && size != rcp::message_size) {
    rcp::message_t fixed{};
    std::memcpy(fixed.data(), data, std::min(size, fixed.size()));
    parsing(fixed, IBV_MTU_4096);
  }
  done(text);
  formatting(std::as_bytes(std::span(data, size)));
  return 0;
}
