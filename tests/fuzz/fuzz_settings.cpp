// libFuzzer target: the connection-settings block (connect/settings.hpp).
//
// Decoding direction: settings_window_count and decode_settings on the raw
// bytes; the encoding is unique, so whatever decodes encodes back to the same
// bytes. Encoding direction: the bytes read as settings; whatever encodes
// decodes equal, and a refusal has a reason.
#include <rdx/connect/settings.hpp>

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
  std::uint32_t n = 0;
  const bool header_ok = accepted([&] { n = w::settings_window_count(in); }, errc::wire_format);
  if (header_ok) {
    RDX_FUZZ_REQUIRE(n <= w::max_settings_windows);
  }
  w::settings s;
  if (!accepted([&] { s = w::decode_settings(in); }, errc::wire_format)) {
    return;
  }
  RDX_FUZZ_REQUIRE(header_ok);
  RDX_FUZZ_REQUIRE(n == s.windows.size());
  RDX_FUZZ_REQUIRE(w::settings_size(n) == in.size());
  // A stream reader hands settings_window_count only the header.
  RDX_FUZZ_REQUIRE(w::settings_window_count(in.first(w::settings_header_size)) == n);
  // Anything decoded encodes: no rdx::error may escape here.
  const std::vector<std::byte> again = w::encode_settings(s);
  RDX_FUZZ_REQUIRE(again.size() == in.size());
  RDX_FUZZ_REQUIRE(std::memcmp(again.data(), in.data(), in.size()) == 0);
  RDX_FUZZ_REQUIRE(w::decode_settings(again) == s);
}

void encoding(std::span<const std::byte> in) {
  rdx::fuzz::reader r(in);
  w::settings s;
  s.queue_pairs = r.u32();
  s.recv_depth = r.u32();
  s.message_size = r.u32();
  s.windows.resize(r.u16() % (w::max_settings_windows + 3));
  for (auto& x : s.windows) {
    x.rights = r.u8();
    x.element_size = r.u32();
  }
  std::vector<std::byte> out;
  bool valid = s.queue_pairs != 0 && s.recv_depth != 0 && s.message_size != 0 &&
               s.windows.size() <= w::max_settings_windows;
  for (const auto& x : s.windows) {
    valid = valid && x.rights <= 7 && x.element_size != 0;
  }
  if (!accepted([&] { out = w::encode_settings(s); }, errc::invalid_argument)) {
    RDX_FUZZ_REQUIRE(!valid);
    return;
  }
  RDX_FUZZ_REQUIRE(valid);
  RDX_FUZZ_REQUIRE(out.size() == w::settings_size(s.windows.size()));
  RDX_FUZZ_REQUIRE(w::decode_settings(out) == s);
}

}  // namespace

// libFuzzer calls this name.
// NOLINTNEXTLINE(readability-identifier-naming)
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return rdx::fuzz::run_checks(data, size, decoding, encoding);
}
