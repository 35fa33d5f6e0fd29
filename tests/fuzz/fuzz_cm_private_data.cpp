// libFuzzer target: rdma_cm private data (cm/private_data.hpp).
//
// Decoding direction: decode_hello for each kind and decode_rejection on the
// raw bytes. The encoding is unique up to zero padding, so a hello that
// decodes encodes back to the same bytes, padded or cut to its kind's
// capacity, and decodes equal; at most one kind accepts the bytes.
// decode_rejection never throws, and what it returns encodes back to the same
// reason and text. Encoding direction: the bytes read as a hello; encode
// accepts exactly what the documented rules allow, and decodes it equal.
#include <rdx/cm/private_data.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "fuzz_check.hpp"

namespace {

namespace cm = rdx::cm;
using cm::message_kind;
using rdx::errc;
using rdx::fuzz::accepted;

constexpr message_kind all_kinds[] = {message_kind::request, message_kind::reply, message_kind::reject};

std::byte at_or_zero(std::span<const std::byte> b, std::size_t i) noexcept {
  return i < b.size() ? b[i] : std::byte{0};
}

void decoding_hello(std::span<const std::byte> in) {
  int kinds_accepted = 0;
  for (message_kind k : all_kinds) {
    cm::hello h;
    if (!accepted([&] { h = cm::decode_hello(in, k); }, errc::wire_format)) continue;
    ++kinds_accepted;
    RDX_FUZZ_REQUIRE(k != message_kind::reject);
    RDX_FUZZ_REQUIRE(h.kind == k);
    RDX_FUZZ_REQUIRE(cm::is_rdx(in));
    RDX_FUZZ_REQUIRE(h.qp_index < h.qp_count && h.qp_count <= cm::max_queue_pairs);
    RDX_FUZZ_REQUIRE(h.qp_index == 0 ? h.keys.empty() : h.windows.empty());
    RDX_FUZZ_REQUIRE(h.windows.size() <= cm::max_windows(k));
    RDX_FUZZ_REQUIRE(!cm::decode_rejection(in).has_value());
    // Anything decoded encodes: no rdx::error may escape here.
    const std::vector<std::byte> again = cm::encode_hello(h);
    RDX_FUZZ_REQUIRE(again.size() == cm::capacity_of(k));
    for (std::size_t i = 0; i < std::max(in.size(), again.size()); ++i) {
      RDX_FUZZ_REQUIRE(at_or_zero(in, i) == at_or_zero(again, i));
    }
    RDX_FUZZ_REQUIRE(cm::decode_hello(again, k) == h);
  }
  RDX_FUZZ_REQUIRE(kinds_accepted <= 1);
}

void decoding_rejection(std::span<const std::byte> in) {
  // Never throws: an exception escapes LLVMFuzzerTestOneInput and is a finding.
  const std::optional<cm::rejection> r = cm::decode_rejection(in);
  if (!r) {
    RDX_FUZZ_REQUIRE(in.size() < 8 || !cm::is_rdx(in) || in[5] != std::byte{3});
    return;
  }
  RDX_FUZZ_REQUIRE(cm::is_rdx(in) && in[5] == std::byte{3});
  RDX_FUZZ_REQUIRE(r->version == std::to_integer<std::uint8_t>(in[4]));
  RDX_FUZZ_REQUIRE(r->reason == static_cast<cm::reject_reason>(in[6]));
  RDX_FUZZ_REQUIRE(r->text.size() ==
                   std::min({std::to_integer<std::size_t>(in[7]), in.size() - 8, cm::reject_capacity - 8}));
  for (char c : r->text) RDX_FUZZ_REQUIRE(c >= 0x20 && c < 0x7f);

  const std::vector<std::byte> again = cm::encode_rejection(r->reason, r->text);
  RDX_FUZZ_REQUIRE(again.size() == cm::reject_capacity);
  const std::optional<cm::rejection> back = cm::decode_rejection(again);
  RDX_FUZZ_REQUIRE(back.has_value());
  RDX_FUZZ_REQUIRE(back->version == cm::private_version);
  RDX_FUZZ_REQUIRE(back->reason == r->reason);
  // Never more text than a reject holds, so it re-encodes whole.
  RDX_FUZZ_REQUIRE(back->text == r->text);
}

// What check_hello's documentation promises, written out independently.
bool valid_hello(const cm::hello& h) {
  if (h.kind != message_kind::request && h.kind != message_kind::reply) return false;
  if (h.qp_count < 1 || h.qp_count > cm::max_queue_pairs || h.qp_index >= h.qp_count) return false;
  const std::size_t cap = cm::capacity_of(h.kind);
  if (h.qp_index > 0) {
    const bool no_settings =
        h.recv_depth == 0 && h.message_size == 0 && h.credit_key == 0 && h.credit_addr == 0;
    return no_settings && h.windows.empty() && 13 + 4 * h.keys.size() <= cap;
  }
  if (h.recv_depth == 0 || h.message_size == 0 || h.credit_addr % 8 != 0 || !h.keys.empty()) return false;
  if (33 + 23 * h.windows.size() > cap) return false;
  return std::all_of(h.windows.begin(), h.windows.end(), [](const cm::window_entry& w) {
    return w.rights >= 1 && w.rights <= 7 && w.element_size != 0 && w.length % w.element_size == 0;
  });
}

void encoding(std::span<const std::byte> in) {
  rdx::fuzz::reader r(in);
  cm::hello h;
  h.kind = static_cast<message_kind>(r.u8() % 4);
  h.qp_count = static_cast<std::uint8_t>(r.u8() % (cm::max_queue_pairs + 3));
  h.qp_index = static_cast<std::uint8_t>(r.u8() % (cm::max_queue_pairs + 3));
  h.tag = r.u32();
  // The wire has room for these on queue pair 0 only (encode refuses them elsewhere).
  if (h.qp_index == 0 || (r.u8() & 7) == 0) {
    h.recv_depth = r.u32();
    h.message_size = r.u32();
    h.credit_key = r.u32();
    h.credit_addr = r.u64();
  }
  h.windows.resize(r.u8() % (cm::max_windows(message_kind::reply) + 3));
  for (auto& w : h.windows) {
    w.addr = r.u64();
    w.key = r.u32();
    w.rights = static_cast<std::uint8_t>(r.u8() % 9);
    w.element_size = r.u16();
    // Mostly whole elements, sometimes one byte over.
    w.length = std::uint64_t{w.element_size} * r.u32() + (r.u8() & 1);
  }
  h.keys.resize(r.u8() % 50);
  for (auto& k : h.keys) k = r.u32();

  const bool valid = valid_hello(h);
  std::vector<std::byte> out;
  if (!accepted([&] { out = cm::encode_hello(h); }, errc::invalid_argument)) {
    RDX_FUZZ_REQUIRE(!valid);
    return;
  }
  RDX_FUZZ_REQUIRE(valid);
  RDX_FUZZ_REQUIRE(out.size() == cm::capacity_of(h.kind));
  RDX_FUZZ_REQUIRE(cm::decode_hello(out, h.kind) == h);
}

}  // namespace

// libFuzzer calls this name.
// NOLINTNEXTLINE(readability-identifier-naming)
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return rdx::fuzz::run_checks(data, size, decoding_hello, decoding_rejection, encoding);
}
