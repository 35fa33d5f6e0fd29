// Connection-settings codec: round trips, exact bytes, and every rejection
// the decoder and the header check promise.
#include <rdx/connect/settings.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace w = rdx::wire;

namespace {

w::settings sample_settings(std::size_t windows) {
  w::settings s{.queue_pairs = 4, .recv_depth = 64, .message_size = 4096, .windows = {}};
  for (std::size_t i = 0; i < windows; ++i)
    s.windows.push_back({static_cast<std::uint32_t>(1 + i % 7), static_cast<std::uint32_t>(8 * (i + 1))});
  return s;
}

void put32(std::vector<std::byte>& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = std::byte(v >> (24 - 8 * i));
}

// Runs `f`, expecting an rdx::error with `code` whose message contains `needle`.
template <class F>
void require_error(F&& f, rdx::errc code, const std::string& needle) {
  try {
    f();
    FAIL("accepted; expected an error containing \"" << needle << "\"");
  } catch (const rdx::error& e) {
    INFO("message: " << e.what());
    CHECK(e.code() == code);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

void require_rejected(const std::vector<std::byte>& bytes, const std::string& needle) {
  require_error([&] { (void)w::decode_settings(bytes); }, rdx::errc::wire_format, needle);
}

void require_header_rejected(const std::vector<std::byte>& bytes, const std::string& needle) {
  require_error([&] { (void)w::settings_window_count(bytes); }, rdx::errc::wire_format, needle);
}

}  // namespace

TEST_CASE("settings: a block without windows round-trips in 20 bytes") {
  const auto s = sample_settings(0);
  const auto bytes = w::encode_settings(s);
  REQUIRE(bytes.size() == w::settings_header_size);
  REQUIRE(w::settings_header_size == 20);
  CHECK(w::settings_window_count(bytes) == 0);
  CHECK(w::decode_settings(bytes) == s);
}

TEST_CASE("settings: windows round-trip, up to the most one block may list") {
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, w::max_settings_windows}) {
    const auto s = sample_settings(n);
    const auto bytes = w::encode_settings(s);
    REQUIRE(bytes.size() == 20 + 8 * n);
    CHECK(w::settings_window_count(bytes) == n);
    CHECK(w::decode_settings(bytes) == s);
  }
  CHECK(w::max_settings_windows == w::max_descriptors - 1);
}

TEST_CASE("settings: exact bytes, big-endian") {
  const w::settings s{.queue_pairs = 0x01020304,
                      .recv_depth = 0x05060708,
                      .message_size = 0x090a0b0c,
                      .windows = {{7, 0x0d0e0f10}}};
  const auto bytes = w::encode_settings(s);
  const std::vector<unsigned> want = {'R', 'D', 'X', 'C', 1, 2, 3, 4, 5, 6, 7,  8,  9,  10,
                                      11,  12,  0,   0,   0, 1, 0, 0, 0, 7, 13, 14, 15, 16};
  REQUIRE(bytes.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("byte " << i);
    CHECK(std::to_integer<unsigned>(bytes[i]) == want[i]);
  }
}

TEST_CASE("settings: the header check reads only the header") {
  const auto bytes = w::encode_settings(sample_settings(5));
  const std::span<const std::byte> head(bytes.data(), w::settings_header_size);
  CHECK(w::settings_window_count(head) == 5);
}

TEST_CASE("settings: the header check refuses a short header, a wrong magic, too many windows") {
  auto bytes = w::encode_settings(sample_settings(0));
  require_header_rejected({bytes.begin(), bytes.begin() + 19},
                          "truncated: 19 bytes, the header alone needs 20");
  require_header_rejected({}, "truncated: 0 bytes");

  auto foreign = bytes;
  put32(foreign, 0, 0x12345678);
  require_header_rejected(foreign, "wrong magic 0x12345678");
  require_header_rejected(foreign, "not an rdx connection");

  auto endpoint_msg = bytes;
  put32(endpoint_msg, 0, w::magic);
  require_header_rejected(endpoint_msg, "more queue pairs than this side");

  auto many = bytes;
  put32(many, 16, 256);
  require_header_rejected(many, "256 windows, at most 255");
  put32(many, 16, 0xffff);
  require_header_rejected(many, "65535 windows");
  // decode_settings says the same before it looks at the length.
  require_rejected(many, "65535 windows");
  // Flags other than "sealed" (bit 0 of the u16 at 16) are a newer peer's.
  auto flagged = bytes;
  put32(flagged, 16, 0x00020000);
  require_header_rejected(flagged, "unknown flags 0x2");
  require_rejected(flagged, "a newer rdx");
}

TEST_CASE("settings: the sealed flag (connection_attr::encrypt) round-trips in the u16 at 16") {
  auto s = sample_settings(2);
  s.encrypt = true;
  const auto bytes = w::encode_settings(s);
  CHECK(bytes[16] == std::byte{0});
  CHECK(bytes[17] == std::byte{1});
  CHECK(bytes[18] == std::byte{0});
  CHECK(bytes[19] == std::byte{2});
  CHECK(w::settings_window_count(bytes) == 2);
  const auto back = w::decode_settings(bytes);
  CHECK(back.encrypt);
  CHECK(back == s);
  s.encrypt = false;
  CHECK_FALSE(w::decode_settings(w::encode_settings(s)).encrypt);
}

TEST_CASE("settings: decode refuses a block of the wrong length") {
  const auto bytes = w::encode_settings(sample_settings(2));
  require_rejected({bytes.begin(), bytes.end() - 1}, "truncated: 35 of 36 bytes (2 windows)");
  require_rejected({bytes.begin(), bytes.begin() + 20}, "truncated: 20 of 36 bytes");
  require_rejected({bytes.begin(), bytes.begin() + 3}, "truncated: 3 bytes, the header alone needs 20");
  auto longer = bytes;
  longer.push_back(std::byte{0});
  require_rejected(longer, "oversized: 37 bytes for 2 windows, which make 36");
}

TEST_CASE("settings: decode refuses zero counts") {
  const auto good = w::encode_settings(sample_settings(1));
  auto b = good;
  put32(b, 4, 0);
  require_rejected(b, "0 queue pairs");
  b = good;
  put32(b, 8, 0);
  require_rejected(b, "recv_depth 0");
  b = good;
  put32(b, 12, 0);
  require_rejected(b, "message_size 0");
}

TEST_CASE("settings: decode refuses unknown rights and a zero element size, naming the window") {
  const auto good = w::encode_settings(sample_settings(4));
  auto b = good;
  put32(b, 20 + 8 * 3, 9);
  require_rejected(b, "window 3 has rights 9 (known: read 1, write 2, atomic 4)");
  b = good;
  put32(b, 20, 0x80000000);
  require_rejected(b, "window 0 has rights 2147483648");
  b = good;
  put32(b, 20 + 8 * 2 + 4, 0);
  require_rejected(b, "window 2 has element size 0");
  // Rights 0 (a window offered for nothing) is well-formed; the window layer decides.
  b = good;
  put32(b, 20, 0);
  CHECK(w::decode_settings(b).windows[0].rights == 0);
}

TEST_CASE("settings: encode refuses what decode would refuse") {
  auto s = sample_settings(1);
  s.queue_pairs = 0;
  require_error([&] { (void)w::encode_settings(s); }, rdx::errc::invalid_argument, "0 queue pairs");
  s = sample_settings(1);
  s.windows[0].rights = 8;
  require_error([&] { (void)w::encode_settings(s); }, rdx::errc::invalid_argument, "window 0 has rights 8");
  s = sample_settings(1);
  s.windows[0].element_size = 0;
  require_error([&] { (void)w::encode_settings(s); }, rdx::errc::invalid_argument, "element size 0");
  s = sample_settings(w::max_settings_windows + 1);
  require_error([&] { (void)w::encode_settings(s); }, rdx::errc::invalid_argument,
                "256 windows, at most 255");
}
