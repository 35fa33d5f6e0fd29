// Wire format of endpoints and remote descriptors: round trips, byte order,
// and every rejection the decoder promises.
#include <rdx/connect/wire.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

namespace {

rdx::endpoint sample_endpoint() {
  rdx::endpoint e;
  const unsigned char gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1};
  std::memcpy(e.gid.raw, gid, 16);
  e.lid = 0xbeef;
  e.qpn = 0x123456;
  e.psn = 0xabcdef;
  e.mtu = IBV_MTU_4096;
  e.port = 2;
  e.gid_index = 3;
  return e;
}

std::vector<rdx::remote_descriptor> sample_descriptors(std::size_t n) {
  std::vector<rdx::remote_descriptor> d(n);
  for (std::size_t i = 0; i < n; ++i) {
    d[i].addr = 0x7f0000000000ull + i * 0x10000;
    d[i].rkey = 0x1000u + static_cast<std::uint32_t>(i);
    d[i].length = 4096 * (i + 1);
  }
  return d;
}

// Decodes `bytes`, expecting an rdx::error with errc::wire_format whose
// message contains `needle`.
void require_rejected(const std::vector<std::byte>& bytes, const std::string& needle) {
  try {
    (void)rdx::wire::decode(bytes);
    FAIL("decode accepted a bad message; expected an error containing \"" << needle << "\"");
  } catch (const rdx::error& e) {
    INFO("message: " << e.what());
    CHECK(e.code() == rdx::errc::wire_format);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

void put32(std::vector<std::byte>& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = std::byte(v >> (24 - 8 * i));
}

}  // namespace

TEST_CASE("wire: endpoint without descriptors round-trips") {
  const auto e = sample_endpoint();
  const auto bytes = rdx::wire::encode(e);
  REQUIRE(bytes.size() == rdx::wire::encoded_size(0));
  REQUIRE(bytes.size() == 48);
  const auto m = rdx::wire::decode(bytes);
  CHECK(m.ep == e);
  CHECK(m.descriptors.empty());
}

TEST_CASE("wire: endpoint with descriptors round-trips") {
  const auto e = sample_endpoint();
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, rdx::wire::max_descriptors}) {
    const auto d = sample_descriptors(n);
    const auto bytes = rdx::wire::encode(e, d);
    REQUIRE(bytes.size() == rdx::wire::encoded_size(n));
    const auto m = rdx::wire::decode(bytes);
    CHECK(m.ep == e);
    CHECK(m.descriptors == d);
  }
}

TEST_CASE("wire: extreme field values round-trip") {
  rdx::endpoint e;
  std::memset(e.gid.raw, 0xff, 16);
  e.lid = 0xffff;
  e.qpn = 0xffffff;
  e.psn = 0xffffff;
  e.mtu = IBV_MTU_256;
  e.port = 255;
  e.gid_index = 255;
  const rdx::remote_descriptor d[] = {{0, 0xffffffffu, 0}, {0xffffffffffff0000ull, 1, 0x10000}};
  const auto m = rdx::wire::decode(rdx::wire::encode(e, d));
  CHECK(m.ep == e);
  REQUIRE(m.descriptors.size() == 2);
  CHECK(m.descriptors[0] == d[0]);
  CHECK(m.descriptors[1] == d[1]);
}

TEST_CASE("wire: fields are big-endian at their documented offsets") {
  const auto e = sample_endpoint();
  const rdx::remote_descriptor d[] = {{0x0102030405060708ull, 0xa1b2c3d4u, 0x1112131415161718ull}};
  const auto b = rdx::wire::encode(e, d);
  auto u8 = [&](std::size_t i) { return std::to_integer<unsigned>(b[i]); };
  // magic "RDXE", version 1, one descriptor, total length 72
  CHECK(u8(0) == 'R');
  CHECK(u8(1) == 'D');
  CHECK(u8(2) == 'X');
  CHECK(u8(3) == 'E');
  CHECK((u8(4) == 0 && u8(5) == 1));
  CHECK((u8(6) == 0 && u8(7) == 1));
  CHECK((u8(8) == 0 && u8(9) == 0 && u8(10) == 0 && u8(11) == 72));
  // GID raw at 16, LID at 32, port 34, GID index 35, QPN 36, PSN 40, MTU 44
  CHECK(u8(16 + 10) == 0xff);
  CHECK(u8(16 + 12) == 10);
  CHECK((u8(32) == 0xbe && u8(33) == 0xef));
  CHECK(u8(34) == 2);
  CHECK(u8(35) == 3);
  CHECK((u8(36) == 0x00 && u8(37) == 0x12 && u8(38) == 0x34 && u8(39) == 0x56));
  CHECK((u8(40) == 0x00 && u8(41) == 0xab && u8(42) == 0xcd && u8(43) == 0xef));
  CHECK(u8(44) == IBV_MTU_4096);
  // descriptor at 48: addr, length, rkey
  CHECK((u8(48) == 0x01 && u8(55) == 0x08));
  CHECK((u8(56) == 0x11 && u8(63) == 0x18));
  CHECK((u8(64) == 0xa1 && u8(67) == 0xd4));
}

TEST_CASE("wire: encode into a caller buffer allocates nothing and checks its size") {
  const auto e = sample_endpoint();
  const auto d = sample_descriptors(2);
  std::vector<std::byte> buf(rdx::wire::encoded_size(2));
  CHECK(rdx::wire::encode(e, d, buf) == buf.size());
  CHECK(rdx::wire::decode(buf).descriptors == d);

  std::vector<std::byte> small(buf.size() - 1);
  try {
    (void)rdx::wire::encode(e, d, small);
    FAIL("encode into a short buffer succeeded");
  } catch (const rdx::error& err) {
    CHECK(err.code() == rdx::errc::invalid_argument);
    CHECK(std::string(err.what()).find("needs 96") != std::string::npos);
  }
}

TEST_CASE("wire: encode refuses what the decoder would refuse") {
  auto expect_invalid = [](const rdx::endpoint& e, std::span<const rdx::remote_descriptor> d,
                           const char* needle) {
    try {
      (void)rdx::wire::encode(e, d);
      FAIL("encode accepted a bad endpoint; expected \"" << needle << "\"");
    } catch (const rdx::error& err) {
      INFO(err.what());
      CHECK(err.code() == rdx::errc::invalid_argument);
      CHECK(std::string(err.what()).find(needle) != std::string::npos);
    }
  };
  auto e = sample_endpoint();
  e.qpn = 0x1000000;
  expect_invalid(e, {}, "QP number");
  e = sample_endpoint();
  e.psn = 0x1000000;
  expect_invalid(e, {}, "PSN");
  e = sample_endpoint();
  e.mtu = static_cast<ibv_mtu>(0);
  expect_invalid(e, {}, "MTU");
  e = sample_endpoint();
  e.port = 0;
  expect_invalid(e, {}, "port number 0");
  const auto many = sample_descriptors(rdx::wire::max_descriptors + 1);
  expect_invalid(sample_endpoint(), many, "at most 256");
  const rdx::remote_descriptor wrap[] = {{0xfffffffffffff000ull, 1, 0x2000}};
  expect_invalid(sample_endpoint(), wrap, "wraps");
}

TEST_CASE("wire: truncated input is rejected") {
  const auto good = rdx::wire::encode(sample_endpoint(), sample_descriptors(2));
  require_rejected({}, "truncated: 0 bytes");
  require_rejected(std::vector<std::byte>(good.begin(), good.begin() + 15), "truncated: 15 bytes");
  require_rejected(std::vector<std::byte>(good.begin(), good.begin() + 16), "truncated: 16 of 96");
  require_rejected(std::vector<std::byte>(good.begin(), good.end() - 1), "truncated: 95 of 96");
}

TEST_CASE("wire: oversized input is rejected") {
  auto b = rdx::wire::encode(sample_endpoint(), sample_descriptors(1));
  b.push_back(std::byte{0});
  require_rejected(b, "1 trailing bytes");

  // More descriptors than allowed, length consistent with them.
  auto many = rdx::wire::encode(sample_endpoint());
  many[6] = std::byte{0x01};
  many[7] = std::byte{0x01};  // 257
  put32(many, 8, static_cast<std::uint32_t>(rdx::wire::encoded_size(257)));
  require_rejected(many, "oversized: 257 descriptors");

  // A length field far beyond the maximum: refused from the header alone.
  auto huge = rdx::wire::encode(sample_endpoint());
  put32(huge, 8, 0x7fffffff);
  require_rejected(huge, "oversized: length field says 2147483647");
}

TEST_CASE("wire: a length that disagrees with the descriptor count is rejected") {
  auto b = rdx::wire::encode(sample_endpoint(), sample_descriptors(2));
  put32(b, 8, static_cast<std::uint32_t>(rdx::wire::encoded_size(1)));
  require_rejected(b, "but 2 descriptors make 96");
}

TEST_CASE("wire: wrong magic is rejected, with a hint for ibv_rc_pingpong peers") {
  auto b = rdx::wire::encode(sample_endpoint());
  b[0] = std::byte{'X'};
  require_rejected(b, "wrong magic 0x58445845");
  require_rejected(b, "not an rdx program");

  const char text[] = "0000:000011:abcdef:00000000000000000000ffff0a4d0001";
  std::vector<std::byte> rc(sizeof text);
  std::memcpy(rc.data(), text, sizeof text);
  require_rejected(rc, "ibv_rc_pingpong's text format");
}

TEST_CASE("wire: wrong version is rejected") {
  auto b = rdx::wire::encode(sample_endpoint());
  b[5] = std::byte{2};
  require_rejected(b, "unsupported version 2");
  b[4] = std::byte{1};
  b[5] = std::byte{0};
  require_rejected(b, "unsupported version 256");
  b[4] = std::byte{0};
  require_rejected(b, "unsupported version 0");
}

TEST_CASE("wire: out-of-range endpoint fields are rejected") {
  const auto good = rdx::wire::encode(sample_endpoint());
  auto b = good;
  b[36] = std::byte{0x01};  // QPN 0x01123456
  require_rejected(b, "QP number 0x1123456 does not fit in 24 bits");
  b = good;
  b[40] = std::byte{0xff};
  require_rejected(b, "PSN 0xffabcdef does not fit in 24 bits");
  b = good;
  b[44] = std::byte{0};
  require_rejected(b, "MTU value 0");
  b[44] = std::byte{6};
  require_rejected(b, "MTU value 6");
  b = good;
  b[34] = std::byte{0};
  require_rejected(b, "port number 0");
}

TEST_CASE("wire: out-of-range descriptors are rejected") {
  const rdx::remote_descriptor d[] = {{0x1000, 1, 0x1000}, {0xffffffffffffff00ull, 2, 0x101}};
  // Encode the valid first descriptor twice, then patch the second to wrap.
  const rdx::remote_descriptor ok[] = {d[0], d[0]};
  auto b = rdx::wire::encode(sample_endpoint(), ok);
  const std::size_t at = 48 + 24;
  for (int i = 0; i < 8; ++i) b[at + i] = std::byte(d[1].addr >> (56 - 8 * i));
  for (int i = 0; i < 8; ++i) b[at + 8 + i] = std::byte(d[1].length >> (56 - 8 * i));
  require_rejected(b, "descriptor 1: address 0xffffffffffffff00 + length 0x101 wraps");
}

TEST_CASE("wire: non-zero reserved fields are rejected") {
  const auto good = rdx::wire::encode(sample_endpoint(), sample_descriptors(1));
  auto b = good;
  b[15] = std::byte{1};
  require_rejected(b, "reserved header field");
  b = good;
  b[46] = std::byte{1};
  require_rejected(b, "reserved endpoint byte at offset 46");
  b = good;
  b[71] = std::byte{1};
  require_rejected(b, "reserved field of descriptor 0");
}

TEST_CASE("wire: decode_header tells a stream reader the full length") {
  const auto b = rdx::wire::encode(sample_endpoint(), sample_descriptors(3));
  const auto h = rdx::wire::decode_header(std::span(b).first(rdx::wire::header_size));
  CHECK(h.version == 1);
  CHECK(h.descriptor_count == 3);
  CHECK(h.length == b.size());
}

TEST_CASE("wire: every error is an rdx::error in the rdx category") {
  try {
    (void)rdx::wire::decode({});
    FAIL("no error");
  } catch (const std::system_error& e) {
    CHECK(&e.code().category() == &rdx::rdx_category());
    CHECK(std::string(e.what()).rfind("rdx wire message: ", 0) == 0);
  }
}

TEST_CASE("endpoint: text form names every field") {
  const auto s = rdx::to_string(sample_endpoint());
  CHECK(s == "LID 0xbeef QPN 0x123456 PSN 0xabcdef GID ::ffff:10.77.0.1 (index 3) MTU 4096 port 2");
}

TEST_CASE("wire: damaged messages decode to valid values or fail cleanly, never anything else") {
  // Deterministic mutations of valid messages: flipped bytes, cut and
  // extended buffers. Each must decode to an endpoint that passes the same
  // range checks as the encoder, or throw rdx::error with errc::wire_format.
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const auto good = rdx::wire::encode(sample_endpoint(), sample_descriptors(3));
  std::size_t decoded = 0, rejected = 0;
  for (int round = 0; round < 20000; ++round) {
    auto b = good;
    const int flips = 1 + static_cast<int>(next() % 4);
    for (int f = 0; f < flips; ++f) b[next() % b.size()] ^= std::byte(1u << (next() % 8));
    if (next() % 8 == 0) b.resize(next() % (b.size() + 8));
    try {
      const auto m = rdx::wire::decode(b);
      ++decoded;
      REQUIRE(m.ep.qpn <= 0xffffffu);
      REQUIRE(m.ep.psn <= 0xffffffu);
      REQUIRE(rdx::mtu_bytes(m.ep.mtu) != 0);
      REQUIRE(m.ep.port != 0);
      REQUIRE(m.descriptors.size() <= rdx::wire::max_descriptors);
      // What decodes re-encodes to the same bytes.
      REQUIRE(rdx::wire::encode(m.ep, m.descriptors) == b);
    } catch (const rdx::error& e) {
      ++rejected;
      REQUIRE(e.code() == rdx::errc::wire_format);
    }
  }
  CHECK(decoded > 0);
  CHECK(rejected > 0);
}
