// Encrypted connections (connection_attr::encrypt) on one device: every
// byte of sealed messages checked; a sender that flips a byte, replays a
// message, skips one or seals with another key is refused and nothing wrong
// is delivered; one-sided work refused; over TCP, keys come from the
// authenticated set-up, a mismatched setting is refused with both named, and
// every set-up has new keys. `ctest -R crypt` selects these.
#include <rdx/auth/aes_gcm.hpp>
#include <rdx/auth/psk.hpp>
#include <rdx/channel/sealed_fetch.hpp>
#include <rdx/channel/sealed_window.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "channel_support.hpp"

using namespace std::chrono_literals;
using channel_test::code_of;
using rdx::rights;
using clk = std::chrono::steady_clock;

namespace {

constexpr std::uint32_t msg_size = 4096;

std::array<std::byte, 40> hello(unsigned char seed) {
  std::array<std::byte, 40> h{};
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::byte>(seed * 7 + i);
  return h;
}

// Keys for side `first` of a set-up with secret seed s (both sides agree).
rdx::auth::session_keys keys_for(unsigned char s, bool first) {
  std::array<std::byte, 32> secret{};
  for (std::size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<std::byte>(s + i);
  const auto h1 = hello(1);
  const auto h2 = hello(2);
  std::array<std::byte, 32> d1{}, d2{};
  d1.fill(std::byte{0x11});
  d2.fill(std::byte{0x22});
  return first ? rdx::auth::derive_session_keys(secret, h1, h2, d1, d2)
               : rdx::auth::derive_session_keys(secret, h2, h1, d1, d2);
}

std::unique_ptr<rdx::auth::aes_gcm_seal> seal_for(
    unsigned char s, bool first, rdx::auth::seal_lane lane = rdx::auth::seal_lane::messages) {
  return std::make_unique<rdx::auth::aes_gcm_seal>(keys_for(s, first), lane);
}

// A sender's seal that misbehaves at message `at`.
enum class misdeed { none, flip, replay, skip, other_key };

class hostile_seal final : public rdx::message_seal {
public:
  hostile_seal(misdeed m, std::uint64_t at, std::size_t flip_at = 0,
               rdx::auth::seal_lane lane = rdx::auth::seal_lane::messages)
      : inner_(seal_for(5, true, lane)), other_(seal_for(6, true, lane)), m_(m), at_(at), flip_at_(flip_at) {}
  std::error_code seal(std::span<const std::byte> plain, std::byte* out) noexcept override {
    const std::uint64_t k = n_++;
    if (k == at_ && m_ == misdeed::skip) {
      std::vector<std::byte> burn(plain.size() + rdx::sealed_message_overhead);
      (void)inner_->seal(plain, burn.data());  // takes a sequence number that never arrives
    }
    if (k == at_ && m_ == misdeed::replay) {
      std::memcpy(out, last_.data(), last_.size());
      return {};
    }
    if (m_ == misdeed::other_key && k != at_) {
      // The other key's sequence keeps in step, so only the key is wrong at `at`.
      std::vector<std::byte> scratch(plain.size() + rdx::sealed_message_overhead);
      (void)other_->seal(plain, scratch.data());
    }
    const std::error_code ec =
        (k == at_ && m_ == misdeed::other_key) ? other_->seal(plain, out) : inner_->seal(plain, out);
    if (k == at_ && m_ == misdeed::flip) {
      out[flip_at_] ^= std::byte{0x01};
    }
    last_.assign(out, out + plain.size() + rdx::sealed_message_overhead);
    return ec;
  }
  std::error_code open(std::span<std::byte> sealed, std::byte* out) noexcept override {
    return inner_->open(sealed, out);
  }
  const char* failure() const noexcept override { return inner_->failure(); }

private:
  std::unique_ptr<rdx::auth::aes_gcm_seal> inner_, other_;
  misdeed m_;
  std::uint64_t at_;
  std::size_t flip_at_;
  std::uint64_t n_ = 0;
  std::vector<std::byte> last_;
};

rdx::connection_attr sealed_attr() {
  return rdx::connection_attr{.recv_depth = 16, .message_size = msg_size, .encrypt = true};
}

// Two encrypted connections of one device; a's seal may misbehave.
struct sealed_pair {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
  rdx::connection a{pd, sealed_attr()};
  rdx::connection b{pd, sealed_attr()};
  explicit sealed_pair(std::unique_ptr<rdx::message_seal> a_seal = seal_for(5, true)) {
    a.seal_with(std::move(a_seal));
    b.seal_with(seal_for(5, false));
    rdx::connect_pair(a, b);
  }
  template <class Op>
  void run(Op& op, clk::duration limit = 10s) {
    const auto end = clk::now() + limit;
    while (!op.done() && clk::now() < end) {
      a.progress();
      b.progress();
    }
  }
};

std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& c : v) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<std::byte>(x >> 24);
  }
  return v;
}

}  // namespace

TEST_CASE("crypt: sealed messages arrive whole, every byte checked", "[crypt]") {
  sealed_pair p;
  CHECK(p.a.encrypted());
  CHECK(p.a.message_size() == msg_size - rdx::sealed_message_overhead);
  rdx::channel<std::byte> tx(p.a), rx(p.b);
  std::uint32_t seed = 0;
  for (std::size_t n : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{1000},
                        std::size_t{msg_size - rdx::sealed_message_overhead}}) {
    for (int round = 0; round < 40; ++round) {
      const auto data = pattern(n, ++seed);
      std::vector<std::byte> got(msg_size, std::byte{0xee});
      auto r = rx.receive(std::span(got));
      auto s = tx.send(std::span<const std::byte>(data));
      p.run(r);
      REQUIRE(r.error() == std::error_code{});
      REQUIRE(r.byte_count() == n);
      REQUIRE(std::memcmp(got.data(), data.data(), n) == 0);
      p.run(s);
      REQUIRE(s.error() == std::error_code{});
    }
  }
  // A view holds the opened payload in the ring's buffer.
  const auto data = pattern(512, 99);
  auto v = rx.receive_view();
  auto s = tx.send(std::span<const std::byte>(data));
  p.run(v);
  REQUIRE(v.error() == std::error_code{});
  REQUIRE(v.view().size() == 512);
  CHECK(std::memcmp(v.view().data(), data.data(), 512) == 0);
  // The largest payload is message_size - 24; one more byte is refused before the NIC.
  const auto big = pattern(msg_size - rdx::sealed_message_overhead + 1, 7);
  auto too_big = tx.send(std::span<const std::byte>(big));
  CHECK(too_big.error() == rdx::errc::limit_exceeded);
  CHECK_FALSE(p.a.failed());
}

TEST_CASE("crypt: a long run of sealed messages keeps its sequence", "[crypt]") {
  sealed_pair p;
  rdx::channel<std::uint64_t> tx(p.a), rx(p.b);
  constexpr std::uint64_t count = 20000;
  std::uint64_t received = 0;
  std::uint64_t sent = 0;
  const auto end = clk::now() + 120s;
  while (received < count && clk::now() < end) {
    // Eight in flight, half the receive ring's depth.
    std::vector<rdx::receive_operation<std::uint64_t>> rs;
    std::vector<rdx::operation> ss;
    for (int i = 0; i < 8; ++i) rs.push_back(rx.receive());
    for (int i = 0; i < 8; ++i) ss.push_back(tx.send(sent++ * 0x9e3779b97f4a7c15ULL));
    for (std::size_t i = 0; i < rs.size(); ++i) {
      p.run(rs[i]);
      REQUIRE(rs[i].error() == std::error_code{});
      REQUIRE(rs[i].value() == received++ * 0x9e3779b97f4a7c15ULL);
    }
    for (auto& s : ss) {
      p.run(s);
      REQUIRE(s.error() == std::error_code{});
    }
  }
  CHECK(received == count);
}

TEST_CASE("crypt: a changed, replayed, skipped or foreign message is never delivered", "[crypt]") {
  struct scenario {
    misdeed m;
    std::size_t flip_at;
    const char* named;
  };
  // Message 3 misbehaves: a byte of its sequence number (the first makes it
  // far ahead, the last makes it 2 again), its ciphertext or its tag
  // flipped; message 2 again; sequence 3 skipped; another key.
  const scenario cases[] = {
      {misdeed::flip, 0, "reordered"}, {misdeed::flip, 7, "again"},     {misdeed::flip, 8, "tag"},
      {misdeed::flip, 8 + 63, "tag"},  {misdeed::flip, 8 + 64, "tag"},  {misdeed::flip, 8 + 64 + 15, "tag"},
      {misdeed::replay, 0, "again"},   {misdeed::skip, 0, "reordered"}, {misdeed::other_key, 0, "tag"},
  };
  for (const scenario& sc : cases) {
    INFO("misdeed " << static_cast<int>(sc.m) << " at byte " << sc.flip_at);
    sealed_pair p(std::make_unique<hostile_seal>(sc.m, 3, sc.flip_at));
    rdx::channel<std::byte> tx(p.a), rx(p.b);
    for (std::uint32_t k = 0; k < 5; ++k) {
      const auto data = pattern(64, 1000 + k);
      std::vector<std::byte> got(64, std::byte{0xee});
      auto r = rx.receive(std::span(got));
      auto s = tx.send(std::span<const std::byte>(data));
      p.run(r);
      if (k < 3) {
        REQUIRE(r.error() == std::error_code{});
        REQUIRE(std::memcmp(got.data(), data.data(), 64) == 0);
        continue;
      }
      // Refused: not delivered, the receive's memory untouched, the connection failed and says why.
      CHECK(r.error() == rdx::errc::integrity_failed);
      CHECK(std::all_of(got.begin(), got.end(), [](std::byte c) { return c == std::byte{0xee}; }));
      CHECK(p.b.failed());
      const std::string why = p.b.failure_message();
      INFO(why);
      CHECK(why.find("a sealed message failed its integrity check: ") != std::string::npos);
      CHECK(why.find(sc.named) != std::string::npos);
    }
  }
}

TEST_CASE("crypt: one-sided work is refused rather than sent in the clear", "[crypt]") {
  sealed_pair p;
  auto target = rdx::make_window_buffer<std::uint64_t, rights::read | rights::write>(p.pd, 64);
  rdx::grant<std::uint64_t, rights::read | rights::write> g(p.b, target);
  rdx::remote_window<std::uint64_t, rights::read | rights::write> w(p.a, g.descriptor());
  rdx::registered_buffer<std::uint64_t> src(p.pd, 4), dst(p.pd, 4);
  for (std::size_t i = 0; i < 4; ++i) src[i] = i + 1;
  auto wr = w.write(src, 0);
  CHECK(wr.error() == rdx::errc::unsupported);
  auto rd = w.read(dst, 0);
  CHECK(rd.error() == rdx::errc::unsupported);
  CHECK(std::all_of(target.span().begin(), target.span().end(), [](std::uint64_t x) { return x == 0; }));
  // The connection still carries sealed messages.
  rdx::channel<std::uint64_t> tx(p.a), rx(p.b);
  auto r = rx.receive();
  auto s = tx.send(42);
  p.run(r);
  CHECK(r.value() == 42);
}

TEST_CASE("crypt: attributes and seals are checked before anything reaches the NIC", "[crypt]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
  std::string what;
  CHECK(code_of([&] { rdx::connection c(pd, rdx::connection_attr{.message_size = 24, .encrypt = true}); },
                &what) == rdx::errc::invalid_argument);
  CHECK(what.find("at least 25") != std::string::npos);
  rdx::connection plain(pd, rdx::connection_attr{.recv_depth = 4});
  CHECK(code_of([&] { plain.seal_with(seal_for(1, true)); }, &what) == rdx::errc::invalid_argument);
  CHECK(what.find("without connection_attr::encrypt") != std::string::npos);
  // Encrypt without keys, and encrypt against a plain peer: refused by connect().
  rdx::connection a(pd, sealed_attr());
  rdx::connection b(pd, rdx::connection_attr{.recv_depth = 16, .message_size = msg_size});
  CHECK(code_of([&] { a.connect(b.local_info()); }, &what) == rdx::errc::invalid_argument);
  CHECK(what.find("no session keys") != std::string::npos);
  a.seal_with(seal_for(1, true));
  CHECK(code_of([&] { a.connect(b.local_info()); }, &what) == rdx::errc::invalid_argument);
  CHECK(what.find("encrypt is true here but false at the peer") != std::string::npos);
  CHECK(a.qp(0).state() == rdx::qp_state::init);
}

namespace {

struct side_result {
  bool connected = false;
  std::error_code ec{};
  std::string what;
};

// One set-up over TCP loopback between connections cs and cc, each with its
// own authenticator (or none).
void tcp_setup(rdx::connection& cs, rdx::connection& cc, rdx::authenticator* as, rdx::authenticator* ac,
               side_result& rs, side_result& rc) {
  rdx::tcp::listener l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto side = [](const rdx::tcp::socket& s, rdx::connection& c, rdx::authenticator* au, side_result& r) {
    try {
      (void)rdx::exchange_and_connect(s, c, {}, rdx::exchange_options{.timeout = 5s, .auth = au});
      r.connected = true;
    } catch (const rdx::error& e) {
      r.ec = e.code();
      r.what = e.what();
    }
  };
  std::thread server([&] {
    try {
      rdx::tcp::socket s = l.accept(5s);
      side(s, cs, as, rs);
    } catch (const rdx::error& e) {
      rs.what = e.what();
    }
  });
  {
    rdx::tcp::socket s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    side(s, cc, ac, rc);
  }
  server.join();
}

std::array<std::byte, 32> psk_bytes() {
  std::array<std::byte, 32> k{};
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::byte>(0x40 + i * 3);
  return k;
}

}  // namespace

TEST_CASE("crypt: keys from the authenticated set-up; a mismatch is refused naming both", "[crypt]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
  const auto k = psk_bytes();
  auto ks = std::make_shared<rdx::auth::psk_key>(std::span<const std::byte>(k));
  auto kc = std::make_shared<rdx::auth::psk_key>(std::span<const std::byte>(k));
  SECTION("both encrypt: sealed messages flow both ways") {
    rdx::connection cs(pd, sealed_attr()), cc(pd, sealed_attr());
    rdx::auth::psk_authenticator as(ks), ac(kc);
    side_result rs, rc;
    tcp_setup(cs, cc, &as, &ac, rs, rc);
    INFO(rs.what << " / " << rc.what);
    REQUIRE(rs.connected);
    REQUIRE(rc.connected);
    // A sealed window write under the set-up's window keys.
    {
      auto ws = as.make_window_seal();
      auto wc = ac.make_window_seal();
      CHECK(code_of([&] { (void)as.make_window_seal(); }) == rdx::errc::not_ready);
      rdx::sealed_reader reader(cs, pd, *ws, 1024, 8192);
      rdx::sealed_writer writer(cc, pd, *wc, 1024);
      rdx::grant<std::byte, rights::write> g(cs, reader.landing());
      rdx::remote_window<std::byte, rights::write> w(cc, g.descriptor());
      const auto src = pattern(5000, 77);
      std::vector<std::byte> dst(5000);
      REQUIRE(reader.start(dst) == std::error_code{});
      REQUIRE(writer.start(w, src) == std::error_code{});
      const auto end = clk::now() + 10s;
      bool wrote = false, read = false;
      while ((!wrote || !read) && clk::now() < end) {
        wrote = writer.progress();
        read = reader.progress();
      }
      REQUIRE(writer.error() == std::error_code{});
      REQUIRE(reader.error() == std::error_code{});
      CHECK(dst == src);
    }
    rdx::channel<std::uint64_t> s_ch(cs), c_ch(cc);
    for (std::uint64_t v : {1ULL, 2ULL, 0xfeedULL}) {
      auto r = s_ch.receive();
      auto s = c_ch.send(v);
      auto r2 = c_ch.receive();
      auto s2 = s_ch.send(v + 1);
      const auto end = clk::now() + 10s;
      while ((!r.done() || !r2.done()) && clk::now() < end) {
        cs.progress();
        cc.progress();
      }
      REQUIRE(r.error() == std::error_code{});
      CHECK(r.value() == v);
      REQUIRE(r2.error() == std::error_code{});
      CHECK(r2.value() == v + 1);
    }
  }
  SECTION("one side encrypts, the other does not: both refuse, naming both settings") {
    rdx::connection cs(pd, sealed_attr());
    rdx::connection cc(pd, rdx::connection_attr{.recv_depth = 16, .message_size = msg_size});
    rdx::auth::psk_authenticator as(ks), ac(kc);
    side_result rs, rc;
    tcp_setup(cs, cc, &as, &ac, rs, rc);
    CHECK_FALSE(rs.connected);
    CHECK_FALSE(rc.connected);
    CHECK(rs.ec == rdx::errc::invalid_argument);
    CHECK(rs.what.find("encrypt is true here but false at the peer") != std::string::npos);
    CHECK(rc.what.find("encrypt is false here but true at the peer") != std::string::npos);
    CHECK(cs.qp(0).state() == rdx::qp_state::init);
  }
  SECTION("encrypt without authentication is refused before any byte") {
    rdx::connection cs(pd, sealed_attr()), cc(pd, sealed_attr());
    side_result rs, rc;
    tcp_setup(cs, cc, nullptr, nullptr, rs, rc);
    CHECK(rc.ec == rdx::errc::invalid_argument);
    CHECK(rc.what.find("exchange_options::auth") != std::string::npos);
  }
}

TEST_CASE("crypt: every set-up has new keys", "[crypt]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
  const auto k = psk_bytes();
  auto ks = std::make_shared<rdx::auth::psk_key>(std::span<const std::byte>(k));
  auto kc = std::make_shared<rdx::auth::psk_key>(std::span<const std::byte>(k));
  std::vector<std::uint64_t> ids;
  for (int round = 0; round < 3; ++round) {
    rdx::connection cs(pd, sealed_attr()), cc(pd, sealed_attr());
    rdx::auth::psk_authenticator as(ks), ac(kc);
    side_result rs, rc;
    tcp_setup(cs, cc, &as, &ac, rs, rc);
    REQUIRE(rs.connected);
    REQUIRE(rc.connected);
    // The connections hold the seals; the authenticators name their keys.
    CHECK(as.send_key_id() == ac.receive_key_id());
    CHECK(as.receive_key_id() == ac.send_key_id());
    CHECK(as.send_key_id() != as.receive_key_id());
    CHECK(code_of([&] { (void)as.make_seal(); }) == rdx::errc::not_ready);
    ids.push_back(as.send_key_id());
    ids.push_back(as.receive_key_id());
  }
  std::sort(ids.begin(), ids.end());
  CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
}

namespace {

constexpr std::uint32_t win_chunk = 4096;
constexpr std::size_t win_capacity = 1 << 20;
using rdx::auth::seal_lane;

// A sealed window from a to b on a sealed_pair: b's reader owns the landing
// window, a's writer writes into it. a's window seal may misbehave.
struct sealed_windows {
  sealed_pair& p;
  std::unique_ptr<rdx::message_seal> a_seal;
  std::unique_ptr<rdx::message_seal> b_seal = seal_for(5, false, seal_lane::windows);
  rdx::sealed_writer writer{p.a, p.pd, *a_seal, win_chunk, 4};
  rdx::sealed_reader reader{p.b, p.pd, *b_seal, win_chunk, win_capacity};
  rdx::grant<std::byte, rights::write> g{p.b, reader.landing()};
  rdx::remote_window<std::byte, rights::write> w{p.a, g.descriptor()};

  explicit sealed_windows(sealed_pair& pair,
                          std::unique_ptr<rdx::message_seal> s = seal_for(5, true, seal_lane::windows))
      : p(pair), a_seal(std::move(s)) {}

  // One transfer of src into dst, both sides driven from this thread.
  std::pair<std::error_code, std::error_code> transfer(std::span<const std::byte> src,
                                                       std::span<std::byte> dst) {
    REQUIRE(reader.start(dst) == std::error_code{});
    REQUIRE(writer.start(w, src) == std::error_code{});
    const auto end = clk::now() + 60s;
    bool wrote = false, read = false;
    // A refused chunk fails b's connection: a's writes then end when the
    // device gives up on them, which this does not wait for.
    while ((!wrote || !read) && !(read && reader.error()) && clk::now() < end) {
      wrote = writer.progress();
      read = reader.progress();
    }
    REQUIRE(read);
    REQUIRE((wrote || reader.error()));
    return {writer.error(), reader.error()};
  }
};

// Misdeeds of a window seal: chunk 3 of the second transfer (window
// sequence 8 + 3 = 11) misbehaves, and the reader names the check.
struct window_misdeed {
  misdeed m;
  std::size_t flip_at;
  const char* named;
};
constexpr window_misdeed window_misdeeds[] = {
    {misdeed::flip, 7, "again"},      {misdeed::flip, 8, "tag"},     {misdeed::flip, 8 + 4095, "tag"},
    {misdeed::flip, 8 + 4096, "tag"}, {misdeed::replay, 0, "again"}, {misdeed::skip, 0, "reordered"},
    {misdeed::other_key, 0, "tag"},
};

// A refused transfer delivered chunks [0, k) of want into got and nothing
// from chunk k on (got was filled with 0xee), and failed c naming `what`.
void check_refused_at(const std::vector<std::byte>& got, const std::vector<std::byte>& want, std::size_t k,
                      std::uint32_t opened, const rdx::connection& c, const std::string& what) {
  CHECK(opened == k);
  CHECK(std::memcmp(got.data(), want.data(), k * win_chunk) == 0);
  CHECK(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(k * win_chunk), got.end(),
                    [](std::byte x) { return x == std::byte{0xee}; }));
  CHECK(c.failed());
  const std::string why = c.failure_message();
  INFO(why);
  CHECK(why.find(what) != std::string::npos);
}

}  // namespace

TEST_CASE("crypt: sealed window writes arrive whole, every byte checked", "[crypt]") {
  sealed_pair p;
  sealed_windows sw(p);
  CHECK(sw.reader.landing().size() == rdx::sealed_window_bytes(win_capacity, win_chunk));
  CHECK(rdx::sealed_window_bytes(4097, 4096) == 4097 + 2 * rdx::sealed_message_overhead);
  std::uint32_t seed = 0;
  for (std::size_t n : {std::size_t{1}, std::size_t{win_chunk - 1}, std::size_t{win_chunk},
                        std::size_t{win_chunk + 1}, std::size_t{65536 + 5}, win_capacity}) {
    INFO(n << " bytes");
    for (int round = 0; round < 3; ++round) {
      const auto src = pattern(n, ++seed);
      std::vector<std::byte> dst(n, std::byte{0xee});
      const auto [we, re] = sw.transfer(src, dst);
      REQUIRE(we == std::error_code{});
      REQUIRE(re == std::error_code{});
      CHECK(sw.reader.chunks_opened() == (n + win_chunk - 1) / win_chunk);
      REQUIRE(std::memcmp(dst.data(), src.data(), n) == 0);
    }
  }
  // What crosses the wire and lands is ciphertext: the landing window, read
  // before the reader opens it, holds no chunk's payload.
  {
    const std::size_t n = 8 * win_chunk;
    const auto src = pattern(n, 4242);
    std::vector<std::byte> dst(n);
    REQUIRE(sw.writer.write(sw.w, src, clk::now() + 10s) == std::error_code{});
    for (std::size_t k = 0; k < 8; ++k) {
      const std::byte* landed = sw.reader.landing().data() + k * (win_chunk + rdx::sealed_message_overhead);
      CHECK(std::memcmp(landed + rdx::sealed_payload_offset, src.data() + k * win_chunk, 64) != 0);
    }
    REQUIRE(sw.reader.read(dst, clk::now() + 10s) == std::error_code{});
    CHECK(dst == src);
  }
  // Messages keep their own sequence beside the windows'.
  rdx::channel<std::uint64_t> tx(p.a), rx(p.b);
  auto r = rx.receive();
  auto s = tx.send(7);
  p.run(r);
  CHECK(r.value() == 7);
  CHECK_FALSE(p.b.failed());
}

TEST_CASE("crypt: a sealed window refuses chunks changed, replayed, skipped or written without the key",
          "[crypt]") {
  for (const window_misdeed& sc : window_misdeeds) {
    INFO("misdeed " << static_cast<int>(sc.m) << " at byte " << sc.flip_at);
    sealed_pair p;
    sealed_windows sw(p, std::make_unique<hostile_seal>(sc.m, 11, sc.flip_at, seal_lane::windows));
    const std::size_t n = 8 * win_chunk;
    const auto first = pattern(n, 1);
    std::vector<std::byte> got(n, std::byte{0xee});
    auto [we, re] = sw.transfer(first, got);
    REQUIRE(re == std::error_code{});
    REQUIRE(std::memcmp(got.data(), first.data(), n) == 0);
    const auto second = pattern(n, 2);
    std::fill(got.begin(), got.end(), std::byte{0xee});
    std::tie(we, re) = sw.transfer(second, got);
    CHECK(re == rdx::errc::integrity_failed);
    // Chunks 0-2 checked and are delivered; from chunk 3 on nothing is.
    check_refused_at(got, second, 3, sw.reader.chunks_opened(), p.b, "sealed window chunk 3: ");
    CHECK(std::string(p.b.failure_message()).find(sc.named) != std::string::npos);
    CHECK(std::string(sw.reader.failure()).find("chunk 3") != std::string::npos);
    // A later read is refused at once.
    CHECK(sw.reader.start(got) == rdx::errc::integrity_failed);
  }
}

TEST_CASE("crypt: sealed windows check their input before anything reaches the NIC", "[crypt]") {
  sealed_pair p;
  sealed_windows sw(p);
  std::vector<std::byte> src(win_capacity + 1), dst(win_capacity + 1);
  // Larger than the window; empty; a window of another connection.
  CHECK(sw.writer.start(sw.w, src) == rdx::errc::limit_exceeded);
  CHECK(sw.writer.start(sw.w, std::span<const std::byte>()) == rdx::errc::invalid_argument);
  rdx::grant<std::byte, rights::write> g2(p.a, sw.reader.landing());
  rdx::remote_window<std::byte, rights::write> other(p.b, g2.descriptor());
  CHECK(sw.writer.start(other, std::span<const std::byte>(src).first(10)) == rdx::errc::invalid_argument);
  CHECK_FALSE(sw.writer.busy());
  CHECK(sw.reader.start(dst) == rdx::errc::limit_exceeded);
  CHECK(sw.reader.start(std::span<std::byte>()) == rdx::errc::invalid_argument);
  CHECK_FALSE(sw.reader.busy());
  // A read or write already running.
  REQUIRE(sw.reader.start(std::span(dst).first(100)) == std::error_code{});
  CHECK(sw.reader.start(std::span(dst).first(100)) == rdx::errc::not_ready);
  REQUIRE(sw.writer.start(sw.w, std::span<const std::byte>(src).first(100)) == std::error_code{});
  CHECK(sw.writer.start(sw.w, std::span<const std::byte>(src).first(100)) == rdx::errc::not_ready);
  CHECK(sw.writer.finish(clk::now() + 10s) == std::error_code{});
  CHECK(sw.reader.finish(clk::now() + 10s) == std::error_code{});
  // Bad sizes at construction.
  std::string what;
  auto seal = seal_for(9, true, seal_lane::windows);
  CHECK(code_of([&] { rdx::sealed_writer x(p.a, p.pd, *seal, 0); }, &what) == rdx::errc::invalid_argument);
  CHECK(what.find("chunk must be") != std::string::npos);
  CHECK(code_of([&] { rdx::sealed_reader x(p.b, p.pd, *seal, 4096, 0); }, &what) ==
        rdx::errc::invalid_argument);
  CHECK(what.find("capacity") != std::string::npos);
  // Window and message IVs never meet: the same keys, another lane, do not open each other's chunks.
  auto msg_side = seal_for(5, false, seal_lane::messages);
  auto win_side = seal_for(5, true, seal_lane::windows);
  std::vector<std::byte> sealed(64 + rdx::sealed_message_overhead);
  const auto plain = pattern(64, 3);
  REQUIRE(win_side->seal(plain, sealed.data()) == std::error_code{});
  CHECK(msg_side->open(sealed, nullptr) == rdx::errc::integrity_failed);
}

namespace {

// Sealed window reads from a to b: a's source publishes into its window,
// announcing each chunk, and b's fetcher reads it one-sided. a's window seal
// may misbehave.
struct sealed_reads {
  sealed_pair& p;
  std::unique_ptr<rdx::message_seal> a_seal;
  std::unique_ptr<rdx::message_seal> b_seal = seal_for(5, false, seal_lane::windows);
  rdx::sealed_source source{p.a, p.pd, *a_seal, win_chunk, win_capacity};
  rdx::sealed_fetcher fetcher{p.b, p.pd, *b_seal, win_chunk, 4};
  rdx::grant<std::byte, rights::read> g{p.a, source.window()};
  rdx::remote_window<std::byte, rights::read> w{p.b, g.descriptor()};

  explicit sealed_reads(sealed_pair& pair,
                        std::unique_ptr<rdx::message_seal> s = seal_for(5, true, seal_lane::windows))
      : p(pair), a_seal(std::move(s)) {}

  // Publishes src (unless empty: what was published or announced already)
  // while b fetches it into dst, both driven from this thread.
  std::error_code fetch(std::span<const std::byte> src, std::span<std::byte> dst) {
    if (!src.empty()) {
      REQUIRE(source.start(src) == std::error_code{});
    }
    REQUIRE(fetcher.start(w, dst) == std::error_code{});
    const auto end = clk::now() + 60s;
    bool published = false, fetched = false;
    // A refused chunk fails b's connection, and a's announcements end when
    // the device gives up on them, which this does not wait for.
    while ((!published || !fetched) && !(fetched && fetcher.error()) && clk::now() < end) {
      published = source.progress();
      fetched = fetcher.progress();
    }
    REQUIRE(fetched);
    return fetcher.error();
  }
};

// A hostile owner's announcement of chunk `tag`, with nothing sealed for it.
void announce(rdx::connection& c, std::uint32_t tag) {
  rdx::operation op = rdx::detail::start_access::make(c);
  rdx::detail::start_access::of(c).start_sealed_notify(op, 0, 0, 0, 0, 0, tag);
  REQUIRE(op.wait(5s) == std::error_code{});
}

}  // namespace

TEST_CASE("crypt: sealed window reads arrive whole, every byte checked", "[crypt]") {
  sealed_pair p;
  sealed_reads sr(p);
  CHECK(sr.source.window().size() == rdx::sealed_window_bytes(win_capacity, win_chunk));
  std::uint32_t seed = 100;
  for (std::size_t n : {std::size_t{1}, std::size_t{win_chunk - 1}, std::size_t{win_chunk},
                        std::size_t{win_chunk + 1}, std::size_t{65536 + 5}, win_capacity}) {
    INFO(n << " bytes");
    for (int round = 0; round < 3; ++round) {
      const auto src = pattern(n, ++seed);
      std::vector<std::byte> dst(n, std::byte{0xee});
      REQUIRE(sr.fetch(src, dst) == std::error_code{});
      CHECK(sr.source.published() == n);
      CHECK(sr.fetcher.chunks_opened() == (n + win_chunk - 1) / win_chunk);
      REQUIRE(std::memcmp(dst.data(), src.data(), n) == 0);
    }
  }
  // Published whole before the fetch (8 announcements fit the peer's
  // credits): the window holds ciphertext, no chunk's payload readable there.
  const std::size_t n = 8 * win_chunk;
  const auto src = pattern(n, 4343);
  REQUIRE(sr.source.publish(src, clk::now() + 10s) == std::error_code{});
  CHECK(sr.source.published() == n);
  for (std::size_t k = 0; k < 8; ++k) {
    const std::byte* held = sr.source.window().data() + k * (win_chunk + rdx::sealed_message_overhead);
    CHECK(std::memcmp(held + rdx::sealed_payload_offset, src.data() + k * win_chunk, 64) != 0);
  }
  std::vector<std::byte> dst(n);
  REQUIRE(sr.fetcher.fetch(sr.w, dst, clk::now() + 10s) == std::error_code{});
  CHECK(dst == src);
  // Messages keep their own sequence beside the reads.
  rdx::channel<std::uint64_t> tx(p.a), rx(p.b);
  auto r = rx.receive();
  auto s = tx.send(9);
  p.run(r);
  CHECK(r.value() == 9);
  CHECK_FALSE(p.b.failed());
  CHECK_FALSE(p.a.failed());
}

TEST_CASE(
    "crypt: a sealed window read refuses chunks changed, replayed, skipped or sealed without the "
    "key",
    "[crypt]") {
  const std::size_t n = 8 * win_chunk;
  for (const window_misdeed& sc : window_misdeeds) {
    INFO("misdeed " << static_cast<int>(sc.m) << " at byte " << sc.flip_at);
    sealed_pair p;
    sealed_reads sr(p, std::make_unique<hostile_seal>(sc.m, 11, sc.flip_at, seal_lane::windows));
    const auto first = pattern(n, 1);
    std::vector<std::byte> got(n, std::byte{0xee});
    REQUIRE(sr.fetch(first, got) == std::error_code{});
    REQUIRE(got == first);
    const auto second = pattern(n, 2);
    std::fill(got.begin(), got.end(), std::byte{0xee});
    CHECK(sr.fetch(second, got) == rdx::errc::integrity_failed);
    // Chunks 0-2 checked and are delivered; from chunk 3 on nothing is.
    check_refused_at(got, second, 3, sr.fetcher.chunks_opened(), p.b, "sealed window read chunk 3: ");
    CHECK(std::string(p.b.failure_message()).find(sc.named) != std::string::npos);
    CHECK(sr.fetcher.start(sr.w, got) == rdx::errc::integrity_failed);
  }
}

TEST_CASE("crypt: a sealed image read twice, changed in its window or announced out of order is refused",
          "[crypt]") {
  const std::size_t n = 8 * win_chunk;
  SECTION("an image announced again without being sealed again is a replay") {
    sealed_pair p;
    sealed_reads sr(p);
    const auto src = pattern(n, 3);
    std::vector<std::byte> got(n);
    REQUIRE(sr.fetch(src, got) == std::error_code{});
    REQUIRE(got == src);
    std::fill(got.begin(), got.end(), std::byte{0xee});
    for (std::uint32_t k = 0; k < 8; ++k) {
      announce(p.a, k);
    }
    CHECK(sr.fetch({}, got) == rdx::errc::integrity_failed);
    check_refused_at(got, src, 0, sr.fetcher.chunks_opened(), p.b, "sealed window read chunk 0: ");
    CHECK(std::string(p.b.failure_message()).find("again") != std::string::npos);
  }
  SECTION("a byte changed in the window after it was published") {
    sealed_pair p;
    sealed_reads sr(p);
    const auto src = pattern(n, 4);
    std::vector<std::byte> got(n, std::byte{0xee});
    REQUIRE(sr.source.publish(src, clk::now() + 10s) == std::error_code{});
    auto* held = const_cast<std::byte*>(sr.source.window().data());
    held[5 * (win_chunk + rdx::sealed_message_overhead) + 100] ^= std::byte{0x80};
    CHECK(sr.fetch({}, got) == rdx::errc::integrity_failed);
    check_refused_at(got, src, 5, sr.fetcher.chunks_opened(), p.b, "sealed window read chunk 5: ");
  }
  SECTION("a chunk announced before the one due") {
    sealed_pair p;
    sealed_reads sr(p);
    std::vector<std::byte> got(n, std::byte{0xee});
    announce(p.a, 1);
    CHECK(sr.fetch({}, got) == rdx::errc::integrity_failed);
    CHECK(sr.fetcher.chunks_opened() == 0);
    const std::string why = p.b.failure_message();
    INFO(why);
    CHECK(why.find("an announcement tagged 1 of 0 bytes arrived where chunk 0's was expected") !=
          std::string::npos);
    CHECK(std::all_of(got.begin(), got.end(), [](std::byte c) { return c == std::byte{0xee}; }));
  }
}

TEST_CASE("crypt: sealed window reads check their input before anything reaches the NIC", "[crypt]") {
  sealed_pair p;
  sealed_reads sr(p);
  std::vector<std::byte> src(win_capacity + 1), dst(win_capacity + 1);
  CHECK(sr.source.start(src) == rdx::errc::limit_exceeded);
  CHECK(sr.source.start(std::span<const std::byte>()) == rdx::errc::invalid_argument);
  CHECK_FALSE(sr.source.busy());
  CHECK(sr.source.published() == 0);
  // Larger than the window; empty; a window of another connection.
  CHECK(sr.fetcher.start(sr.w, dst) == rdx::errc::limit_exceeded);
  CHECK(sr.fetcher.start(sr.w, std::span<std::byte>()) == rdx::errc::invalid_argument);
  rdx::grant<std::byte, rights::read> g2(p.b, sr.source.window());
  rdx::remote_window<std::byte, rights::read> other(p.a, g2.descriptor());
  CHECK(sr.fetcher.start(other, std::span(dst).first(10)) == rdx::errc::invalid_argument);
  CHECK_FALSE(sr.fetcher.busy());
  // A publish or fetch already running.
  REQUIRE(sr.source.start(std::span<const std::byte>(src).first(100)) == std::error_code{});
  CHECK(sr.source.start(std::span<const std::byte>(src).first(100)) == rdx::errc::not_ready);
  auto other_seal = seal_for(5, true, seal_lane::windows);
  CHECK(sr.source.seal_with(*other_seal) == rdx::errc::not_ready);
  REQUIRE(sr.fetcher.start(sr.w, std::span(dst).first(100)) == std::error_code{});
  CHECK(sr.fetcher.start(sr.w, std::span(dst).first(100)) == rdx::errc::not_ready);
  CHECK(sr.source.finish(clk::now() + 10s) == std::error_code{});
  CHECK(sr.fetcher.finish(clk::now() + 10s) == std::error_code{});
  CHECK(std::memcmp(dst.data(), src.data(), 100) == 0);
  // Bad sizes at construction; a source with no seal.
  std::string what;
  auto seal = seal_for(9, true, seal_lane::windows);
  CHECK(code_of([&] { rdx::sealed_fetcher x(p.b, p.pd, *seal, 4096, 0); }, &what) ==
        rdx::errc::invalid_argument);
  CHECK(what.find("depth") != std::string::npos);
  CHECK(code_of([&] { rdx::sealed_source x(p.a, p.pd, *seal, 0, 4096); }, &what) ==
        rdx::errc::invalid_argument);
  CHECK(what.find("chunk must be") != std::string::npos);
  CHECK(code_of([&] { rdx::sealed_source x(p.a, p.pd, *seal, 4096, 4096, 0); }, &what) ==
        rdx::errc::invalid_argument);
  CHECK(what.find("depth") != std::string::npos);
  rdx::sealed_source unsealed(p.a, p.pd, 4096, 4096);
  CHECK(unsealed.start(std::span<const std::byte>(src).first(10)) == rdx::errc::invalid_argument);
  CHECK_FALSE(p.b.failed());
}
