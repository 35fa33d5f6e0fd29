// libFuzzer target: the endpoint wire format (connect/wire.hpp).
//
// Decoding direction: decode_header and decode on the raw bytes. The decoder
// is strict (exact length, reserved fields zero), so an encoding is unique:
// whatever decodes must encode back to the very same bytes and decode equal.
// Encoding direction: the same bytes read as an endpoint and descriptors;
// whatever encodes must decode to what was encoded.
#include <rdx/connect/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_check.hpp"

namespace {

namespace w = rdx::wire;
using rdx::errc;
using rdx::fuzz::accepted;

void decoding(std::span<const std::byte> in) {
  w::header h{};
  const bool header_ok = accepted([&] { h = w::decode_header(in); }, errc::wire_format);
  w::message m;
  if (!accepted([&] { m = w::decode(in); }, errc::wire_format)) {
    return;
  }
  RDX_FUZZ_REQUIRE(header_ok);
  RDX_FUZZ_REQUIRE(h.version == w::version);
  RDX_FUZZ_REQUIRE(h.length == in.size());
  RDX_FUZZ_REQUIRE(h.descriptor_count == m.descriptors.size());
  RDX_FUZZ_REQUIRE(w::encoded_size(m.descriptors.size()) == in.size());
  // A stream reader hands decode_header only the first 16 bytes.
  RDX_FUZZ_REQUIRE(w::decode_header(in.first(w::header_size)).length == h.length);
  // Anything the decoder accepts, the encoder accepts: no rdx::error may escape here.
  const std::vector<std::byte> again = w::encode(m.ep, m.descriptors);
  RDX_FUZZ_REQUIRE(again.size() == in.size());
  RDX_FUZZ_REQUIRE(std::memcmp(again.data(), in.data(), in.size()) == 0);
  const w::message back = w::decode(again);
  RDX_FUZZ_REQUIRE(back.ep == m.ep);
  RDX_FUZZ_REQUIRE(back.descriptors == m.descriptors);
}

void encoding(std::span<const std::byte> in) {
  rdx::fuzz::reader r(in);
  rdx::endpoint ep;
  for (auto& b : ep.gid.raw) {
    b = r.u8();
  }
  ep.lid = r.u16();
  ep.port = r.u8();
  ep.gid_index = r.u8();
  // Sometimes past 24 bits, to reach the encoder's refusals.
  ep.qpn = r.u32() >> (r.u8() % 9);
  ep.psn = r.u32() >> (r.u8() % 9);
  // An ibv_mtu holds 0 to 7 without undefined behaviour; 0, 6 and 7 are refused.
  ep.mtu = static_cast<ibv_mtu>(r.u8() & 7);
  std::vector<rdx::remote_descriptor> d(r.u16() % (w::max_descriptors + 2));
  for (auto& x : d) {
    x.addr = r.u64();
    x.length = r.u64();
    x.rkey = r.u32();
  }
  const std::size_t room = r.u16();

  std::vector<std::byte> out;
  const bool ok = accepted([&] { out = w::encode(ep, d); }, errc::invalid_argument);
  const bool valid = d.size() <= w::max_descriptors && ep.qpn <= 0xffffffu && ep.psn <= 0xffffffu &&
                     ep.port != 0 && ep.mtu >= IBV_MTU_256 && ep.mtu <= IBV_MTU_4096;
  if (!ok) {
    // Only a wrapping descriptor is left to explain a refusal of valid fields.
    bool wraps = false;
    for (const auto& x : d) {
      wraps = wraps || (x.length != 0 && x.length - 1 > UINT64_MAX - x.addr);
    }
    RDX_FUZZ_REQUIRE(!valid || wraps);
    return;
  }
  RDX_FUZZ_REQUIRE(valid);
  RDX_FUZZ_REQUIRE(out.size() == w::encoded_size(d.size()));
  const w::message back = w::decode(out);
  RDX_FUZZ_REQUIRE(back.ep == ep);
  RDX_FUZZ_REQUIRE(back.descriptors == d);

  // The in-place encoder into a buffer of some size: too small is refused, else the same bytes.
  std::vector<std::byte> buf(room % (out.size() + 64));
  std::size_t n = 0;
  if (accepted([&] { n = w::encode(ep, d, buf); }, errc::invalid_argument)) {
    RDX_FUZZ_REQUIRE(n == out.size());
    RDX_FUZZ_REQUIRE(std::memcmp(buf.data(), out.data(), n) == 0);
  } else {
    RDX_FUZZ_REQUIRE(buf.size() < out.size());
  }
}

}  // namespace

// libFuzzer calls this name.
// NOLINTNEXTLINE(readability-identifier-naming)
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return rdx::fuzz::run_checks(data, size, decoding, encoding);
}
