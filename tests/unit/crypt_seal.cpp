// AES-256-GCM sealing of messages (rdx/auth/aes_gcm.hpp) with no device:
// both sides' seals agree, every byte of every size comes back, one changed
// byte anywhere, a replay, a reorder or another key is refused and nothing
// unauthenticated reaches the caller, a million sequence numbers never
// repeat, and a pre-shared-key set-up over loopback TCP keys them.
#include <rdx/auth/aes_gcm.hpp>
#include <rdx/auth/psk.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <openssl/evp.h>
#include <openssl/kdf.h>

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using rdx::auth::aes_gcm_seal;
using rdx::auth::session_keys;

namespace {

using bytes = std::vector<std::byte>;

std::array<std::byte, 32> secret(unsigned char seed) {
  std::array<std::byte, 32> k{};
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<std::byte>(seed + 13 * i);
  }
  return k;
}

// A 40-byte hello as the set-up sends it: same header, nonce from `seed`.
std::array<std::byte, 40> hello(unsigned char seed) {
  std::array<std::byte, 40> h{};
  std::memcpy(h.data(), "RDXA\x01\x01\x00\x00", 8);
  for (std::size_t i = 8; i < h.size(); ++i) {
    h[i] = static_cast<std::byte>(seed * 31 + i);
  }
  return h;
}

// Both sides of one set-up: a sees (h1, h2), b sees (h2, h1); the digests
// are those of the lo-to-hi and hi-to-lo streams, the same for both.
struct key_pair {
  session_keys a;
  session_keys b;
};

key_pair derive_pair(unsigned char key_seed, unsigned char h1, unsigned char h2) {
  const auto k = secret(key_seed);
  const auto ha = hello(h1);
  const auto hb = hello(h2);
  std::array<std::byte, 32> lo_hi{};
  std::array<std::byte, 32> hi_lo{};
  lo_hi.fill(std::byte{0x5a});
  hi_lo.fill(std::byte{0xa5});
  return {rdx::auth::derive_session_keys(k, ha, hb, lo_hi, hi_lo),
          rdx::auth::derive_session_keys(k, hb, ha, lo_hi, hi_lo)};
}

bytes pattern(std::size_t n, unsigned seed) {
  bytes b(n);
  std::uint32_t x = seed * 2654435761U + 1;
  for (auto& v : b) {
    x = x * 1664525U + 1013904223U;
    v = static_cast<std::byte>(x >> 24);
  }
  return b;
}

bytes seal(aes_gcm_seal& s, const bytes& plain) {
  bytes out(plain.size() + rdx::sealed_message_overhead);
  REQUIRE_FALSE(s.seal(plain, out.data()));
  return out;
}

std::uint64_t header(const bytes& sealed) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    v = (v << 8) | std::to_integer<std::uint64_t>(sealed[i]);
  }
  return v;
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

TEST_CASE("crypt: both sides' seals interoperate, every byte of every size", "[crypt]") {
  const auto [ka, kb] = derive_pair(1, 10, 20);
  CHECK(ka.send_direction != kb.send_direction);
  CHECK(ka.send_direction == kb.receive_direction);
  aes_gcm_seal a(ka);
  aes_gcm_seal b(kb);
  std::uint64_t messages = 0;
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{64},
                              std::size_t{4096}, std::size_t{1} << 20}) {
    for (int dir = 0; dir < 2; ++dir) {
      INFO("payload " << n << " bytes, direction " << dir);
      aes_gcm_seal& tx = dir == 0 ? a : b;
      aes_gcm_seal& rx = dir == 0 ? b : a;
      const bytes plain = pattern(n, static_cast<unsigned>(n + dir));
      bytes first = seal(tx, plain);
      bytes second = seal(tx, plain);
      CHECK(header(first) == messages);
      CHECK(header(second) == messages + 1);
      const auto c1 = std::span(first).subspan(rdx::sealed_payload_offset);
      const auto c2 = std::span(second).subspan(rdx::sealed_payload_offset);
      CHECK_FALSE(same(c1, c2));  // same plaintext, another IV: another ciphertext and tag
      if (n >= 16) {
        CHECK_FALSE(same(c1.first(n), plain));
      }
      // The first opened into the caller's buffer, the second in place.
      bytes out(n, std::byte{0xEE});
      REQUIRE_FALSE(rx.open(first, out.data()));
      CHECK(same(out, plain));
      REQUIRE_FALSE(rx.open(second, nullptr));
      CHECK(same(c2.first(n), plain));
      CHECK(rx.failure() == std::string());
    }
    messages += 2;
  }
  CHECK(a.sent() == messages);
  CHECK(a.opened() == messages);
  CHECK(b.sent() == messages);
  CHECK(b.opened() == messages);
}

TEST_CASE("crypt: a seal sealed in place opens", "[crypt]") {
  const auto [ka, kb] = derive_pair(1, 10, 20);
  aes_gcm_seal a(ka);
  aes_gcm_seal b(kb);
  const bytes plain = pattern(100, 3);
  bytes buf(plain.size() + rdx::sealed_message_overhead);
  std::memcpy(buf.data() + rdx::sealed_payload_offset, plain.data(), plain.size());
  REQUIRE_FALSE(a.seal(std::span(buf).subspan(rdx::sealed_payload_offset, plain.size()), buf.data()));
  bytes out(plain.size());
  REQUIRE_FALSE(b.open(buf, out.data()));
  CHECK(same(out, plain));
}

TEST_CASE("crypt: one byte changed anywhere is refused and nothing reaches the caller", "[crypt]") {
  const auto [ka, kb] = derive_pair(2, 30, 40);
  const bytes plain = pattern(64, 7);
  const std::size_t total = plain.size() + rdx::sealed_message_overhead;
  for (std::size_t at = 0; at < total; ++at) {
    INFO("byte " << at << " flipped");
    aes_gcm_seal tx(ka);
    aes_gcm_seal rx(kb);
    const bytes good = seal(tx, plain);
    bytes bad = good;
    bad[at] ^= std::byte{0x01};
    bytes out(plain.size(), std::byte{0xC3});
    const bytes untouched = out;
    CHECK(rx.open(bad, out.data()) == rdx::errc::integrity_failed);
    CHECK(same(out, untouched));
    const std::string why = rx.failure();
    if (at < rdx::sealed_payload_offset) {
      CHECK_THAT(why, Contains("sequence") && Contains("reordered"));
    } else {
      CHECK_THAT(why, Contains("message 0 failed its authentication tag"));
      // The unauthenticated bytes decrypted in place were wiped.
      CHECK(std::all_of(bad.begin() + rdx::sealed_payload_offset,
                        bad.begin() + static_cast<std::ptrdiff_t>(rdx::sealed_payload_offset + plain.size()),
                        [](std::byte v) { return v == std::byte{0}; }));
    }
    // Sticky: the genuine message fails too, and the first reason stays.
    bytes again = good;
    CHECK(rx.open(again, out.data()) == rdx::errc::integrity_failed);
    CHECK(same(out, untouched));
    CHECK(rx.failure() == why);
    CHECK(rx.opened() == 0);
  }
}

TEST_CASE("crypt: a short message is refused", "[crypt]") {
  const auto [ka, kb] = derive_pair(2, 30, 40);
  aes_gcm_seal rx(kb);
  bytes tiny(23);
  CHECK(rx.open(tiny, nullptr) == rdx::errc::integrity_failed);
  CHECK_THAT(std::string(rx.failure()), Contains("23 bytes, shorter than the 24"));
}

TEST_CASE("crypt: replay, reorder and another key are refused by name", "[crypt]") {
  const auto [ka, kb] = derive_pair(3, 50, 60);
  const bytes plain = pattern(32, 9);
  bytes out(plain.size());

  SECTION("replay") {
    aes_gcm_seal tx(ka);
    aes_gcm_seal rx(kb);
    const bytes m0 = seal(tx, plain);
    bytes copy = m0;
    REQUIRE_FALSE(rx.open(copy, out.data()));
    copy = m0;
    CHECK(rx.open(copy, out.data()) == rdx::errc::integrity_failed);
    CHECK_THAT(std::string(rx.failure()), Contains("sequence 0 arrived again: 1 was expected"));
  }
  SECTION("reorder") {
    aes_gcm_seal tx(ka);
    aes_gcm_seal rx(kb);
    bytes m0 = seal(tx, plain);
    bytes m1 = seal(tx, plain);
    CHECK(rx.open(m1, out.data()) == rdx::errc::integrity_failed);
    CHECK_THAT(std::string(rx.failure()),
               Contains("sequence 1 arrived where 0 was expected") && Contains("reordered"));
    CHECK(rx.open(m0, out.data()) == rdx::errc::integrity_failed);  // sticky
  }
  SECTION("another key") {
    const auto [other, unused] = derive_pair(4, 50, 60);
    aes_gcm_seal tx(other);
    aes_gcm_seal rx(kb);
    bytes m0 = seal(tx, plain);
    CHECK(rx.open(m0, out.data()) == rdx::errc::integrity_failed);
    CHECK_THAT(std::string(rx.failure()), Contains("failed its authentication tag"));
  }
  SECTION("reflected to its sender") {
    aes_gcm_seal tx(ka);
    bytes m0 = seal(tx, plain);
    CHECK(tx.open(m0, out.data()) == rdx::errc::integrity_failed);
    CHECK_THAT(std::string(tx.failure()), Contains("failed its authentication tag"));
  }
}

TEST_CASE("crypt: 2^20 messages take 2^20 sequence numbers, none twice, all open in order", "[crypt]") {
  const auto [ka, kb] = derive_pair(5, 70, 80);
  aes_gcm_seal tx(ka);
  aes_gcm_seal rx(kb);
  constexpr std::uint64_t count = std::uint64_t{1} << 20;
  constexpr std::size_t n = 16;
  std::array<std::byte, n> plain{};
  std::array<std::byte, n + rdx::sealed_message_overhead> sealed{};
  std::array<std::byte, n> out{};
  std::vector<bool> seen(count, false);
  std::uint64_t wrong_header = 0;
  std::uint64_t repeated = 0;
  std::uint64_t failed = 0;
  std::uint64_t wrong_payload = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::memcpy(plain.data(), &i, sizeof i);
    if (tx.seal(plain, sealed.data())) {
      ++failed;
      continue;
    }
    std::uint64_t h = 0;
    for (std::size_t j = 0; j < 8; ++j) {
      h = (h << 8) | std::to_integer<std::uint64_t>(sealed[j]);
    }
    wrong_header += h != i ? 1 : 0;
    if (h < count) {
      repeated += seen[h] ? 1 : 0;
      seen[h] = true;
    }
    if (rx.open(sealed, out.data())) {
      ++failed;
    }
    wrong_payload += out != plain ? 1 : 0;
  }
  CHECK(failed == 0);
  CHECK(wrong_header == 0);
  CHECK(repeated == 0);
  CHECK(wrong_payload == 0);
  CHECK(std::all_of(seen.begin(), seen.end(), [](bool v) { return v; }));
  CHECK(tx.sent() == count);
  CHECK(rx.opened() == count);
}

TEST_CASE("crypt: key ids match across sides and differ between set-ups", "[crypt]") {
  const auto [a1, b1] = derive_pair(6, 1, 2);
  const auto [a2, b2] = derive_pair(6, 3, 4);  // same key, other hellos: another set-up
  const aes_gcm_seal sa1(a1);
  const aes_gcm_seal sb1(b1);
  const aes_gcm_seal sa2(a2);
  const aes_gcm_seal sb2(b2);
  CHECK(sa1.send_key_id() == sb1.receive_key_id());
  CHECK(sa1.receive_key_id() == sb1.send_key_id());
  CHECK(sa1.send_key_id() != sa1.receive_key_id());
  CHECK(sa2.send_key_id() == sb2.receive_key_id());
  CHECK(sa1.send_key_id() != sa2.send_key_id());
  CHECK(sa1.receive_key_id() != sa2.receive_key_id());
  CHECK(sb1.send_key_id() != sb2.send_key_id());

  // Other digests (another transcript) give other keys too.
  const auto k = secret(6);
  const auto h1 = hello(1);
  const auto h2 = hello(2);
  std::array<std::byte, 32> d{};
  const aes_gcm_seal sa3(rdx::auth::derive_session_keys(k, h1, h2, d, d));
  CHECK(sa3.send_key_id() != sa1.send_key_id());
  CHECK_THROWS_MATCHES(rdx::auth::derive_session_keys(k, h1, h1, d, d), rdx::error,
                       Catch::Matchers::Predicate<rdx::error>(
                           [](const rdx::error& e) { return e.code() == rdx::errc::invalid_argument; }));
}

namespace {

// One side of a pre-shared-key set-up over TCP: begin, 100 bytes each way
// recorded, finish; make_seal() is refused before finish().
struct keyed_side {
  std::unique_ptr<rdx::message_seal> seal;
  bool refused_early = false;
  bool refused_twice = false;                 // a second make_seal() is refused: it would repeat nonces
  std::uint64_t send_id = 0, receive_id = 0;  // the authenticator's names of the keys
};

keyed_side run_side(rdx::tcp::socket s, std::shared_ptr<const rdx::auth::psk_key> key, unsigned char fill) {
  const auto deadline = rdx::tcp::clock::now() + 5s;
  rdx::auth::psk_authenticator a(std::move(key));
  keyed_side r;
  try {
    (void)a.make_seal();
  } catch (const rdx::error& e) {
    r.refused_early = e.code() == rdx::errc::not_ready;
  }
  a.begin(s, deadline);
  {
    const rdx::tcp::socket::recording hook(s, &a);
    const bytes out(100, std::byte{fill});
    s.send_all(out, deadline, "send payload");
    bytes in(100);
    s.recv_exact(in, deadline, "receive payload");
  }
  try {
    (void)a.make_seal();
    r.refused_early = false;
  } catch (const rdx::error& e) {
    r.refused_early = r.refused_early && e.code() == rdx::errc::not_ready &&
                      std::string(e.what()).find("finish() has not succeeded") != std::string::npos;
  }
  a.finish(s, deadline);
  r.send_id = a.send_key_id();
  r.receive_id = a.receive_key_id();
  r.seal = a.make_seal();
  try {
    (void)a.make_seal();
  } catch (const rdx::error& e) {
    r.refused_twice = e.code() == rdx::errc::not_ready &&
                      std::string(e.what()).find("would repeat nonces") != std::string::npos;
  }
  return r;
}

std::pair<keyed_side, keyed_side> keyed_setup(const std::shared_ptr<rdx::auth::psk_key>& server_key,
                                              const std::shared_ptr<rdx::auth::psk_key>& client_key) {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto server = std::async(std::launch::async, [&] { return run_side(l.accept(2s), server_key, 0xAA); });
  keyed_side client = run_side(rdx::tcp::connect("127.0.0.1", l.port(), 2s), client_key, 0xCC);
  return {server.get(), std::move(client)};
}

}  // namespace

TEST_CASE("crypt: a pre-shared-key set-up over TCP keys both sides' seals", "[crypt]") {
  const auto k = secret(9);
  auto server_key = std::make_shared<rdx::auth::psk_key>(k);
  auto client_key = std::make_shared<rdx::auth::psk_key>(k);
  auto [server, client] = keyed_setup(server_key, client_key);
  CHECK(server.refused_early);
  CHECK(client.refused_early);
  REQUIRE(server.seal);
  REQUIRE(client.seal);
  auto& s = dynamic_cast<aes_gcm_seal&>(*server.seal);
  auto& c = dynamic_cast<aes_gcm_seal&>(*client.seal);
  CHECK(s.send_key_id() == c.receive_key_id());
  CHECK(s.receive_key_id() == c.send_key_id());
  CHECK(s.send_key_id() != s.receive_key_id());
  CHECK(server.refused_twice);
  CHECK(client.refused_twice);
  CHECK(server.send_id == s.send_key_id());
  CHECK(server.receive_id == s.receive_key_id());
  for (int i = 0; i < 4; ++i) {
    const bytes plain = pattern(1000 + i, static_cast<unsigned>(i));
    for (int dir = 0; dir < 2; ++dir) {
      bytes m = seal(dir == 0 ? s : c, plain);
      bytes out(plain.size());
      REQUIRE_FALSE((dir == 0 ? c : s).open(m, out.data()));
      CHECK(same(out, plain));
    }
  }

  // The same key objects, a second set-up: new nonces, new keys.
  auto [server2, client2] = keyed_setup(server_key, client_key);
  REQUIRE(server2.seal);
  REQUIRE(client2.seal);
  auto& s2 = dynamic_cast<aes_gcm_seal&>(*server2.seal);
  auto& c2 = dynamic_cast<aes_gcm_seal&>(*client2.seal);
  CHECK(s2.send_key_id() == c2.receive_key_id());
  CHECK(s2.send_key_id() != s.send_key_id());
  CHECK(s2.receive_key_id() != s.receive_key_id());
  // A message of the first set-up does not open under the second's keys.
  bytes m = seal(s, pattern(10, 1));
  m[7] = std::byte{0};  // sequence 0, as c2 expects
  CHECK(c2.open(m, nullptr) == rdx::errc::integrity_failed);
  CHECK_THAT(std::string(c2.failure()), Contains("failed its authentication tag"));
}

TEST_CASE("crypt: keys and layout are HKDF-SHA256 and AES-256-GCM as documented", "[crypt]") {
  // The keys, against OpenSSL's other HKDF interface (EVP_PKEY).
  const auto k = secret(11);
  const auto lo = hello(1);  // sorts first: nonce bytes 8 + 31 = 39 < 70
  const auto hi = hello(2);
  REQUIRE(std::memcmp(lo.data(), hi.data(), lo.size()) < 0);
  std::array<std::byte, 32> lo_hi{};
  std::array<std::byte, 32> hi_lo{};
  lo_hi.fill(std::byte{1});
  hi_lo.fill(std::byte{2});
  bytes info;
  for (const auto part : {std::span<const std::byte>(lo), std::span<const std::byte>(hi),
                          std::span<const std::byte>(lo_hi), std::span<const std::byte>(hi_lo)}) {
    info.insert(info.end(), part.begin(), part.end());
  }
  const std::string label = "rdx crypt v1 session keys";
  std::array<unsigned char, 64> okm{};
  std::size_t okm_len = okm.size();
  {
    const std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> p(
        EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr), &EVP_PKEY_CTX_free);
    REQUIRE(p);
    REQUIRE(EVP_PKEY_derive_init(p.get()) == 1);
    REQUIRE(EVP_PKEY_CTX_set_hkdf_md(p.get(), EVP_sha256()) == 1);
    REQUIRE(EVP_PKEY_CTX_set1_hkdf_salt(p.get(), reinterpret_cast<const unsigned char*>(label.data()),
                                        static_cast<int>(label.size())) == 1);
    REQUIRE(EVP_PKEY_CTX_set1_hkdf_key(p.get(), reinterpret_cast<const unsigned char*>(k.data()),
                                       static_cast<int>(k.size())) == 1);
    REQUIRE(EVP_PKEY_CTX_add1_hkdf_info(p.get(), reinterpret_cast<const unsigned char*>(info.data()),
                                        static_cast<int>(info.size())) == 1);
    REQUIRE(EVP_PKEY_derive(p.get(), okm.data(), &okm_len) == 1);
  }
  const session_keys lo_keys = rdx::auth::derive_session_keys(k, lo, hi, lo_hi, hi_lo);
  const session_keys hi_keys = rdx::auth::derive_session_keys(k, hi, lo, lo_hi, hi_lo);
  CHECK(std::memcmp(lo_keys.send.data(), okm.data(), 32) == 0);
  CHECK(std::memcmp(lo_keys.receive.data(), okm.data() + 32, 32) == 0);
  CHECK(lo_keys.send_direction == 1);
  CHECK(lo_keys.receive_direction == 2);
  CHECK(hi_keys.send == lo_keys.receive);
  CHECK(hi_keys.receive == lo_keys.send);
  CHECK(hi_keys.send_direction == 2);
  CHECK(hi_keys.receive_direction == 1);

  // A message: u64 sequence (the AAD), then EVP's own AES-256-GCM of the
  // payload with IV u32 direction || u64 sequence, then the 16-byte tag.
  aes_gcm_seal s(hi_keys);
  const bytes plain = pattern(77, 5);
  (void)seal(s, plain);
  const bytes m = seal(s, plain);  // sequence 1
  const std::array<unsigned char, 12> iv = {0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1};
  const std::array<unsigned char, 8> aad = {0, 0, 0, 0, 0, 0, 0, 1};
  bytes expect(plain.size() + 24);
  std::memcpy(expect.data(), aad.data(), aad.size());
  const std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)> c(EVP_CIPHER_CTX_new(),
                                                                          &EVP_CIPHER_CTX_free);
  int len = 0;
  REQUIRE(EVP_EncryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr,
                             reinterpret_cast<const unsigned char*>(hi_keys.send.data()), iv.data()) == 1);
  REQUIRE(EVP_EncryptUpdate(c.get(), nullptr, &len, aad.data(), 8) == 1);
  REQUIRE(EVP_EncryptUpdate(c.get(), reinterpret_cast<unsigned char*>(expect.data() + 8), &len,
                            reinterpret_cast<const unsigned char*>(plain.data()),
                            static_cast<int>(plain.size())) == 1);
  REQUIRE(EVP_EncryptFinal_ex(c.get(), reinterpret_cast<unsigned char*>(expect.data() + 8), &len) == 1);
  REQUIRE(EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_GET_TAG, 16, expect.data() + 8 + plain.size()) == 1);
  CHECK(same(m, expect));
}
