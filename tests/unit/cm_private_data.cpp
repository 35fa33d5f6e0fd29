// rdma_cm private-data codec: round trips at queue pair 0 and i > 0, the
// exact bytes of the documented layout, and every refusal, in decode
// (errc::wire_format) and in encode (errc::invalid_argument).
#include <rdx/cm/private_data.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cm = rdx::cm;
using cm::message_kind;
using bytes_t = std::vector<std::byte>;

namespace {

constexpr message_kind hello_kinds[] = {message_kind::request, message_kind::reply};

cm::window_entry sample_window(std::size_t i) {
  return {.addr = 0x7f0000000000ull + (i << 24),
          .length = 4096ull << i,
          .key = 0x100u + static_cast<std::uint32_t>(i),
          .rights = static_cast<std::uint8_t>(1 + i % 7),
          .element_size = static_cast<std::uint16_t>(8u << (i % 3))};
}

// The hello for queue pair 0 of a 4-queue-pair connection, with n windows.
cm::hello first_hello(message_kind k, std::size_t windows) {
  cm::hello h{.kind = k,
              .qp_index = 0,
              .qp_count = 4,
              .tag = 0xdeadbeef,
              .recv_depth = 64,
              .message_size = 4096,
              .credit_key = 0x77,
              .credit_addr = 0x7f1000000008ull,
              .windows = {},
              .keys = {}};
  for (std::size_t i = 0; i < windows; ++i) h.windows.push_back(sample_window(i));
  return h;
}

// The hello for queue pair `index` > 0, with n keys.
cm::hello later_hello(message_kind k, std::uint8_t index, std::size_t keys) {
  cm::hello h{.kind = k, .qp_index = index, .qp_count = 4, .tag = 0xdeadbeef, .windows = {}, .keys = {}};
  for (std::size_t i = 0; i < keys; ++i) h.keys.push_back(0xabc00000u + static_cast<std::uint32_t>(i));
  return h;
}

bytes_t of(std::initializer_list<unsigned> v) {
  bytes_t b;
  for (unsigned x : v) b.push_back(std::byte(x));
  return b;
}

void require_bytes(const bytes_t& got, const bytes_t& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("byte " << i);
    CHECK(std::to_integer<unsigned>(got[i]) == std::to_integer<unsigned>(want[i]));
  }
}

// Matches an rdx::error with `code` whose message contains `needle`.
class refusal : public Catch::MatcherBase<rdx::error> {
public:
  refusal(rdx::errc code, std::string needle) : code_(code), needle_(std::move(needle)) {}
  bool match(const rdx::error& e) const override {
    return e.code() == code_ && std::string_view(e.what()).find(needle_) != std::string_view::npos;
  }
  std::string describe() const override {
    return "is an rdx::error (" + rdx::make_error_code(code_).message() + ") containing \"" + needle_ + "\"";
  }

private:
  rdx::errc code_;
  std::string needle_;
};

refusal malformed(std::string needle) {
  return {rdx::errc::wire_format, std::move(needle)};
}
refusal invalid(std::string needle) {
  return {rdx::errc::invalid_argument, std::move(needle)};
}

}  // namespace

TEST_CASE("cm private data: capacities are IB CM's, less rdma_cm's header") {
  CHECK(cm::capacity_of(message_kind::request) == 56);
  CHECK(cm::capacity_of(message_kind::reply) == 196);
  CHECK(cm::capacity_of(message_kind::reject) == 148);
  CHECK(cm::max_windows(message_kind::request) == 1);  // 33 + 23 = 56
  // 33 + 7 * 23 = 194 <= 196 (the header comment says six)
  CHECK(cm::max_windows(message_kind::reply) == 7);
}

TEST_CASE("cm private data: queue pair 0 round-trips with 0, 1 and the most windows") {
  for (message_kind k : hello_kinds) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, cm::max_windows(k)}) {
      INFO("kind " << static_cast<int>(k) << ", " << n << " windows");
      const cm::hello h = first_hello(k, n);
      const bytes_t b = cm::encode_hello(h);
      REQUIRE(b.size() == cm::capacity_of(k));
      CHECK(cm::is_rdx(b));
      CHECK(cm::decode_hello(b, k) == h);
      // Zero-padded after the content.
      for (std::size_t i = cm::hello_first_size + n * cm::window_entry_size; i < b.size(); ++i) {
        INFO("byte " << i);
        CHECK(b[i] == std::byte{0});
      }
    }
  }
}

TEST_CASE("cm private data: queue pair i > 0 round-trips with its keys") {
  for (message_kind k : hello_kinds) {
    const std::size_t most_keys = (cm::capacity_of(k) - cm::hello_header_size - 1) / 4;
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, most_keys}) {
      for (std::uint8_t index : {std::uint8_t{1}, std::uint8_t{3}}) {
        INFO("kind " << static_cast<int>(k) << ", queue pair " << int{index} << ", " << n << " keys");
        const cm::hello h = later_hello(k, index, n);
        const bytes_t b = cm::encode_hello(h);
        REQUIRE(b.size() == cm::capacity_of(k));
        CHECK(cm::decode_hello(b, k) == h);
      }
    }
  }
  // 64 queue pairs, the last one.
  cm::hello h = later_hello(message_kind::reply, 63, 2);
  h.qp_count = 64;
  CHECK(cm::decode_hello(cm::encode_hello(h), message_kind::reply) == h);
}

TEST_CASE("cm private data: exact bytes of a request for queue pair 0, big-endian") {
  const cm::hello h{.kind = message_kind::request,
                    .qp_index = 0,
                    .qp_count = 3,
                    .tag = 0x0a0b0c0d,
                    .recv_depth = 0x01020304,
                    .message_size = 0x05060708,
                    .credit_key = 0x090a0b0c,
                    .credit_addr = 0x1112131415161718ull,
                    .windows = {{.addr = 0x2122232425262728ull,
                                 .length = 0x3132333435363738ull,
                                 .key = 0x41424344,
                                 .rights = 5,
                                 .element_size = 0x0008}},
                    .keys = {}};
  const bytes_t want = of({
      'R',  'D',  'X',  'M',                           // 0 magic
      1,    1,    0,    3,                             // 4 version, kind, index, count
      0x0a, 0x0b, 0x0c, 0x0d,                          // 8 tag
      0x01, 0x02, 0x03, 0x04,                          // 12 recv_depth
      0x05, 0x06, 0x07, 0x08,                          // 16 message_size
      0x09, 0x0a, 0x0b, 0x0c,                          // 20 credit word key
      0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,  // 24 credit word address
      1,                                               // 32 windows
      0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28,  // 33 address
      0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38,  // 41 length
      0x41, 0x42, 0x43, 0x44,                          // 49 key
      5,                                               // 53 rights
      0x00, 0x08,                                      // 54 element size
  });
  const bytes_t b = cm::encode_hello(h);
  require_bytes(b, want);
  CHECK(cm::decode_hello(want, message_kind::request) == h);
}

TEST_CASE("cm private data: exact bytes of a reply for queue pair i > 0, zero-padded") {
  const cm::hello h{.kind = message_kind::reply,
                    .qp_index = 2,
                    .qp_count = 5,
                    .tag = 0xfedcba98,
                    .windows = {},
                    .keys = {0x01020304, 0xa0b0c0d0}};
  bytes_t want = of({'R', 'D',  'X',  'M',  1,    2,    2,    5,    0xfe, 0xdc, 0xba, 0x98,  //
                     2,   0x01, 0x02, 0x03, 0x04, 0xa0, 0xb0, 0xc0, 0xd0});
  want.resize(cm::reply_capacity);
  const bytes_t b = cm::encode_hello(h);
  require_bytes(b, want);
  CHECK(cm::decode_hello(b, message_kind::reply) == h);
  // A shorter field without the padding decodes the same.
  CHECK(cm::decode_hello(std::span(b).first(21), message_kind::reply) == h);
}

TEST_CASE("cm private data: is_rdx looks only at the magic") {
  CHECK_FALSE(cm::is_rdx({}));
  CHECK_FALSE(cm::is_rdx(of({'R', 'D', 'X'})));
  CHECK(cm::is_rdx(of({'R', 'D', 'X', 'M'})));
  CHECK(cm::is_rdx(of({'R', 'D', 'X', 'M', 9, 9})));
  CHECK_FALSE(cm::is_rdx(of({'R', 'D', 'X', 'E', 0, 1})));
}

TEST_CASE("cm private data: decode refuses what is not an rdx hello of this version and kind") {
  const bytes_t good = cm::encode_hello(first_hello(message_kind::request, 1));
  const auto decode_request = [](const bytes_t& b) { return cm::decode_hello(b, message_kind::request); };

  CHECK_THROWS_MATCHES(decode_request({}), rdx::error, malformed("no private data"));
  CHECK_THROWS_MATCHES(decode_request({}), rdx::error, malformed("connect request"));
  CHECK_THROWS_MATCHES(decode_request(bytes_t(good.begin(), good.begin() + 11)), rdx::error,
                       malformed("11 bytes, the header alone needs 12"));

  bytes_t b = good;
  b[3] = std::byte{'E'};
  CHECK_THROWS_MATCHES(decode_request(b), rdx::error, malformed("magic 0x52445845, expected 0x5244584d"));
  CHECK_THROWS_MATCHES(decode_request(b), rdx::error, malformed("not an rdx peer"));
  CHECK_THROWS_MATCHES(decode_request(bytes_t(56)), rdx::error, malformed("magic 0x0,"));

  b = good;
  b[4] = std::byte{9};
  CHECK_THROWS_MATCHES(decode_request(b), rdx::error, malformed("version 9, this side speaks 1"));
  b[4] = std::byte{0};
  CHECK_THROWS_MATCHES(decode_request(b), rdx::error, malformed("version 0, this side speaks 1"));

  // A reply where a request belongs, and the other way round.
  CHECK_THROWS_MATCHES(decode_request(cm::encode_hello(first_hello(message_kind::reply, 1))), rdx::error,
                       malformed("kind 2 arrived instead"));
  CHECK_THROWS_MATCHES(cm::decode_hello(good, message_kind::reply), rdx::error,
                       malformed("connect reply): kind 1 arrived instead"));
  // An rdx reject is not a hello, nor is a hello asked for as a reject.
  CHECK_THROWS_MATCHES(decode_request(cm::encode_rejection(cm::reject_reason::refused, "no")), rdx::error,
                       malformed("kind 3 arrived instead"));
  b = good;
  b[5] = std::byte{3};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reject), rdx::error,
                       malformed("not a request or reply"));
}

TEST_CASE("cm private data: decode refuses a queue-pair count or index out of range") {
  const bytes_t good = cm::encode_hello(first_hello(message_kind::request, 1));
  bytes_t b = good;
  b[7] = std::byte{0};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::request), rdx::error,
                       malformed("0 queue pairs, need 1 to 64"));
  b[7] = std::byte{65};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::request), rdx::error,
                       malformed("65 queue pairs, need 1 to 64"));
  b[7] = std::byte{64};
  CHECK(cm::decode_hello(b, message_kind::request).qp_count == 64);

  b = cm::encode_hello(later_hello(message_kind::reply, 3, 1));
  b[6] = std::byte{4};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error,
                       malformed("queue pair index 4 of 4"));
  b[6] = std::byte{200};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error,
                       malformed("queue pair index 200 of 4"));
}

TEST_CASE("cm private data: decode refuses more windows or keys than fit, and truncation") {
  // Two windows in a request: the count byte says more than 56 bytes hold.
  bytes_t b = cm::encode_hello(first_hello(message_kind::request, 1));
  b[32] = std::byte{2};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::request), rdx::error,
                       malformed("2 windows do not fit in 56 bytes"));
  // Eight in a reply, even in a longer field than the transport's.
  bytes_t r = cm::encode_hello(first_hello(message_kind::reply, 7));
  r.resize(256);
  r[32] = std::byte{8};
  CHECK_THROWS_MATCHES(cm::decode_hello(r, message_kind::reply), rdx::error,
                       malformed("8 windows do not fit in 256 bytes"));

  // Queue pair 0 cut inside the settings, inside a window.
  const bytes_t one = cm::encode_hello(first_hello(message_kind::request, 1));
  CHECK_THROWS_MATCHES(cm::decode_hello(std::span(one).first(20), message_kind::request), rdx::error,
                       malformed("truncated: 20 bytes"));
  CHECK_THROWS_MATCHES(cm::decode_hello(std::span(one).first(32), message_kind::request), rdx::error,
                       malformed("truncated: 32 bytes"));
  CHECK_THROWS_MATCHES(cm::decode_hello(std::span(one).first(55), message_kind::request), rdx::error,
                       malformed("1 windows do not fit in 55 bytes"));
  // Without windows, 33 bytes are the whole of it.
  const cm::hello none = first_hello(message_kind::request, 0);
  const bytes_t none_bytes = cm::encode_hello(none);
  CHECK(cm::decode_hello(std::span(none_bytes).first(33), message_kind::request) == none);

  // Queue pair i > 0: the key count byte missing, keys cut off, more keys than the kind holds.
  const bytes_t keys = cm::encode_hello(later_hello(message_kind::request, 1, 3));
  CHECK_THROWS_MATCHES(cm::decode_hello(std::span(keys).first(12), message_kind::request), rdx::error,
                       malformed("truncated: 12 bytes"));
  CHECK_THROWS_MATCHES(cm::decode_hello(std::span(keys).first(24), message_kind::request), rdx::error,
                       malformed("3 keys do not fit in 24 bytes"));
  bytes_t k = keys;
  k[12] = std::byte{11};  // 13 + 44 = 57 > 56
  CHECK_THROWS_MATCHES(cm::decode_hello(k, message_kind::request), rdx::error,
                       malformed("11 keys do not fit in 56 bytes"));
  // Room in the bytes handed over is not room in a request.
  k.resize(64);
  CHECK_THROWS_MATCHES(cm::decode_hello(k, message_kind::request), rdx::error,
                       malformed("11 keys do not fit in 56 bytes"));
}

TEST_CASE("cm private data: decode refuses bad windows, naming the window") {
  const bytes_t good = cm::encode_hello(first_hello(message_kind::reply, 3));
  const std::size_t w2 = cm::hello_first_size + 2 * cm::window_entry_size;
  bytes_t b = good;
  b[w2 + 20] = std::byte{0};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error,
                       malformed("window 2 has rights 0 (known: read 1, write 2, atomic 4)"));
  b[w2 + 20] = std::byte{8};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error,
                       malformed("window 2 has rights 8"));
  b[w2 + 20] = std::byte{7};
  CHECK(cm::decode_hello(b, message_kind::reply).windows[2].rights == 7);

  b = good;
  b[w2 + 21] = std::byte{0};
  b[w2 + 22] = std::byte{0};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error,
                       malformed("window 2 has element size 0"));

  // Window 1: 8192 bytes of 16-byte elements; one byte more is no whole number.
  b = good;
  b[cm::hello_first_size + cm::window_entry_size + 15] = std::byte{1};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error,
                       malformed("window 1 is 8193 bytes, not a whole number of 16-byte elements"));

  b = good;
  b[31] = std::byte{0x0c};  // credit word at ...0c
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error,
                       malformed("the credit word is not 8-aligned"));
  b = good;
  b[15] = std::byte{0};  // recv_depth 64 -> 0
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error, malformed("recv_depth 0"));
  b = good;
  b[18] = std::byte{0};  // message_size 4096 -> 0
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error, malformed("message_size 0"));
}

TEST_CASE("cm private data: decode refuses non-zero padding") {
  bytes_t b = cm::encode_hello(first_hello(message_kind::request, 0));
  b[55] = std::byte{1};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::request), rdx::error,
                       malformed("byte 55 after the content is not zero"));
  b = cm::encode_hello(later_hello(message_kind::reply, 1, 2));
  b[21] = std::byte{0x80};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error,
                       malformed("byte 21 after the content is not zero"));
  // Past the transport's capacity too.
  b[21] = std::byte{0};
  b.resize(300);
  b[299] = std::byte{1};
  CHECK_THROWS_MATCHES(cm::decode_hello(b, message_kind::reply), rdx::error,
                       malformed("byte 299 after the content is not zero"));
}

TEST_CASE("cm private data: encode refuses what decode refuses, as invalid_argument") {
  using message_kind::reply;
  using message_kind::request;
  const auto refuses = [](const cm::hello& h, const std::string& needle) {
    CHECK_THROWS_MATCHES(cm::encode_hello(h), rdx::error, invalid(needle));
  };
  refuses(first_hello(request, 2), "2 windows, at most 1 fit in its 56 bytes");
  refuses(first_hello(reply, 8), "8 windows, at most 7 fit in its 196 bytes");
  refuses(later_hello(request, 1, 11), "11 keys do not fit in 56 bytes");
  refuses(later_hello(reply, 1, 46), "46 keys do not fit in 196 bytes");

  cm::hello h = first_hello(request, 1);
  h.kind = message_kind::reject;
  refuses(h, "reject): not a request or reply");
  h.kind = message_kind{0};
  refuses(h, "not a request or reply");

  h = first_hello(reply, 1);
  h.qp_count = 0;
  refuses(h, "0 queue pairs, need 1 to 64");
  h.qp_count = 65;
  refuses(h, "65 queue pairs");
  h = later_hello(reply, 4, 1);
  refuses(h, "queue pair index 4 of 4");

  h = first_hello(request, 1);
  h.windows[0].rights = 0;
  refuses(h, "window 0 has rights 0");
  h.windows[0].rights = 8;
  refuses(h, "window 0 has rights 8");
  h = first_hello(request, 1);
  h.windows[0].element_size = 0;
  refuses(h, "window 0 has element size 0");
  h.windows[0].element_size = 3;
  refuses(h, "window 0 is 4096 bytes, not a whole number of 3-byte elements");
  h = first_hello(request, 0);
  h.recv_depth = 0;
  refuses(h, "recv_depth 0");
  h = first_hello(request, 0);
  h.message_size = 0;
  refuses(h, "message_size 0");
  h = first_hello(request, 0);
  h.credit_addr += 4;
  refuses(h, "the credit word is not 8-aligned");

  // Each queue pair carries its own part only.
  h = first_hello(request, 0);
  h.keys = {1};
  refuses(h, "queue pair 0 carries the window table, not a key list");
  h = later_hello(request, 2, 0);
  h.windows = {sample_window(0)};
  refuses(h, "queue pair 2 carries a window table");
  // Only queue pair 0 carries the settings: a later one that sets them would lose them.
  h = later_hello(request, 1, 1);
  h.recv_depth = 64;
  refuses(h, "queue pair 1 carries settings (queue pair 0 does)");
  h = later_hello(reply, 1, 1);
  h.credit_addr = 8;
  refuses(h, "queue pair 1 carries settings");
}

TEST_CASE("cm private data: a reject round-trips its reason and text") {
  const bytes_t b = cm::encode_rejection(cm::reject_reason::settings, "recv_depth 64, mine 128");
  REQUIRE(b.size() == cm::reject_capacity);
  bytes_t want = of({'R', 'D', 'X', 'M', 1, 3, 3, 23});
  for (char c : std::string_view("recv_depth 64, mine 128")) want.push_back(std::byte(c));
  want.resize(cm::reject_capacity);
  require_bytes(b, want);

  const auto r = cm::decode_rejection(b);
  REQUIRE(r.has_value());
  CHECK(r->version == cm::private_version);
  CHECK(r->reason == cm::reject_reason::settings);
  CHECK(r->text == "recv_depth 64, mine 128");

  for (auto why : {cm::reject_reason::malformed, cm::reject_reason::version, cm::reject_reason::incomplete,
                   cm::reject_reason::refused, cm::reject_reason::failed}) {
    const auto e = cm::decode_rejection(cm::encode_rejection(why, ""));
    REQUIRE(e.has_value());
    CHECK(e->reason == why);
    CHECK(e->text.empty());
  }
}

TEST_CASE("cm private data: a reject's text is cut at capacity and made printable") {
  const std::string long_text(300, 'x');
  const bytes_t b = cm::encode_rejection(cm::reject_reason::failed, long_text);
  REQUIRE(b.size() == cm::reject_capacity);
  CHECK(std::to_integer<unsigned>(b[7]) == cm::reject_capacity - 8);
  const auto r = cm::decode_rejection(b);
  REQUIRE(r.has_value());
  CHECK(r->text == std::string(cm::reject_capacity - 8, 'x'));

  const std::string raw(
      "a\nb\x01\x7f\xff"
      "c",
      7);
  const auto p = cm::decode_rejection(cm::encode_rejection(cm::reject_reason::refused, raw));
  REQUIRE(p.has_value());
  CHECK(p->text == "a?b???c");

  // A length byte past the bytes handed over reads what is there.
  bytes_t shorter(b.begin(), b.begin() + 12);
  shorter[7] = std::byte{200};
  const auto s = cm::decode_rejection(shorter);
  REQUIRE(s.has_value());
  CHECK(s->text == "xxxx");

  // Another version's reject still names its version.
  bytes_t v9 = cm::encode_rejection(cm::reject_reason::version, "v9");
  v9[4] = std::byte{9};
  const auto v = cm::decode_rejection(v9);
  REQUIRE(v.has_value());
  CHECK(v->version == 9);
  CHECK(v->reason == cm::reject_reason::version);
}

TEST_CASE("cm private data: decode_rejection says nullopt for anything but an rdx reject") {
  CHECK_FALSE(cm::decode_rejection({}).has_value());
  const bytes_t b = cm::encode_rejection(cm::reject_reason::refused, "busy");
  CHECK_FALSE(cm::decode_rejection(std::span(b).first(7)).has_value());
  CHECK(cm::decode_rejection(std::span(b).first(8)).has_value());
  bytes_t foreign = b;
  foreign[0] = std::byte{'X'};
  CHECK_FALSE(cm::decode_rejection(foreign).has_value());
  CHECK_FALSE(cm::decode_rejection(bytes_t(148)).has_value());
  CHECK_FALSE(cm::decode_rejection(cm::encode_hello(first_hello(message_kind::request, 1))).has_value());
  CHECK_FALSE(cm::decode_rejection(cm::encode_hello(later_hello(message_kind::reply, 1, 2))).has_value());
}
