// Pre-shared-key authentication of set-up over loopback TCP: the right key,
// a wrong one, a peer without a key, a man in the middle that flips one byte
// of every message, a replayed set-up, and reflected hellos and proofs.
#include <rdx/auth/psk.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using rdx::auth::psk_key;
using steady = rdx::tcp::clock;

namespace {

std::shared_ptr<psk_key> make_key(unsigned char seed) {
  std::array<std::byte, 32> k{};
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<std::byte>(seed + 7 * i);
  }
  return std::make_shared<psk_key>(k);
}

// What one side ended with.
struct outcome {
  bool ok = false;
  std::error_code code;
  std::string what;
  std::vector<std::byte> received;
};

// The payloads each side sends between begin() and finish(): 64 then 10 bytes.
constexpr std::size_t payload_sizes[] = {64, 10};
constexpr std::size_t auth_message = rdx::auth::detail::message_size;
// Where each message starts in either direction's byte stream.
constexpr std::size_t hello_at = 0, proof_at = 40, payload1_at = 80, payload2_at = 144, mac_at = 154,
                      stream_size = 194;

outcome run_keyed(rdx::tcp::socket s, std::shared_ptr<const psk_key> key, unsigned char fill,
                  steady::duration timeout = 2s) {
  outcome r;
  try {
    const auto deadline = steady::now() + timeout;
    rdx::auth::psk_authenticator a(std::move(key));
    a.begin(s, deadline);
    {
      const rdx::tcp::socket::recording hook(s, &a);
      for (const std::size_t n : payload_sizes) {
        const std::vector<std::byte> out(n, std::byte{fill});
        s.send_all(out, deadline, "send payload");
        std::vector<std::byte> in(n);
        s.recv_exact(in, deadline, "receive payload");
        r.received.insert(r.received.end(), in.begin(), in.end());
      }
    }
    a.finish(s, deadline);
    r.ok = true;
  } catch (const rdx::error& e) {
    r.code = e.code();
    r.what = e.what();
  }
  return r;
}

// A side that has no key: it sends its endpoint message at once.
outcome run_unkeyed(const rdx::tcp::socket& s) {
  outcome r;
  try {
    rdx::endpoint e;
    e.qpn = 0x11;
    e.psn = 0x22;
    e.mtu = IBV_MTU_1024;
    e.port = 1;
    (void)rdx::tcp::exchange(s, e, {}, 2s);
    r.ok = true;
  } catch (const rdx::error& e) {
    r.code = e.code();
    r.what = e.what();
  }
  return r;
}

// A TCP relay between a client and the server that may change bytes in
// flight. tamper(direction, stream offset, byte) sees every byte; direction
// 0 is client to server. It keeps what the client sent.
class relay {
public:
  using tamper_fn = std::function<void(int, std::size_t, std::byte&)>;

  relay(std::uint16_t server_port, tamper_fn tamper)
      : front_(rdx::tcp::listener::bind("127.0.0.1", 0)),
        thread_([this, server_port, t = std::move(tamper)] { run(server_port, t); }) {}
  relay(const relay&) = delete;
  relay& operator=(const relay&) = delete;
  relay(relay&&) = delete;
  relay& operator=(relay&&) = delete;
  ~relay() { join(); }

  [[nodiscard]] std::uint16_t port() const noexcept { return front_.port(); }
  //! Waits until both ends have closed.
  void join() {
    if (thread_.joinable()) {
      thread_.join();
    }
  }
  //! What the client sent; complete after join().
  std::vector<std::byte> from_client;
  std::size_t counts[2] = {0, 0};

private:
  void run(std::uint16_t server_port, const tamper_fn& tamper) {
    try {
      rdx::tcp::socket a = front_.accept(2s);
      rdx::tcp::socket b = rdx::tcp::connect("127.0.0.1", server_port, 2s);
      const int fd[2] = {a.native_handle(), b.native_handle()};
      bool open[2] = {true, true};
      const auto deadline = steady::now() + 5s;
      constexpr decltype(pollfd::events) event_in = POLLIN;
      constexpr decltype(pollfd::events) event_none = 0;
      while ((open[0] || open[1]) && steady::now() < deadline) {
        pollfd p[2] = {{fd[0], open[0] ? event_in : event_none, 0},
                       {fd[1], open[1] ? event_in : event_none, 0}};
        if (::poll(p, 2, 50) <= 0) {
          continue;
        }
        for (int dir = 0; dir < 2; ++dir) {
          if (!open[dir] || p[dir].revents == 0) {
            continue;
          }
          std::byte buf[4096];
          const ssize_t n = ::recv(fd[dir], buf, sizeof buf, 0);
          if (n <= 0) {
            open[dir] = false;
            ::shutdown(fd[1 - dir], SHUT_WR);
            continue;
          }
          for (ssize_t i = 0; i < n; ++i) {
            if (tamper) {
              tamper(dir, counts[dir] + static_cast<std::size_t>(i), buf[i]);
            }
            if (dir == 0) {
              from_client.push_back(buf[i]);
            }
          }
          counts[dir] += static_cast<std::size_t>(n);
          if (::send(fd[1 - dir], buf, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) {
            open[dir] = false;
          }
        }
      }
    } catch (const rdx::error&) {
      // A side that failed before connecting leaves the relay nothing to do.
    }
  }

  rdx::tcp::listener front_;
  std::thread thread_;
};

struct pair_outcome {
  outcome client;
  outcome server;
};

// One set-up between a client and a server thread, through a relay when
// `tamper` is given or the client's bytes are wanted.
pair_outcome set_up(const std::shared_ptr<const psk_key>& client_key,
                    const std::shared_ptr<const psk_key>& server_key, relay::tamper_fn tamper = {},
                    std::vector<std::byte>* client_bytes = nullptr) {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto server = std::async(std::launch::async, [&] { return run_keyed(l.accept(2s), server_key, 0xAA); });
  pair_outcome r;
  if (tamper || client_bytes != nullptr) {
    relay mitm(l.port(), std::move(tamper));
    r.client = run_keyed(rdx::tcp::connect("127.0.0.1", mitm.port(), 2s), client_key, 0xCC);
    r.server = server.get();
    mitm.join();
    if (client_bytes != nullptr) {
      *client_bytes = mitm.from_client;
    }
    return r;
  }
  r.client = run_keyed(rdx::tcp::connect("127.0.0.1", l.port(), 2s), client_key, 0xCC);
  r.server = server.get();
  return r;
}

bool has(const outcome& o, std::string_view text) {
  return o.what.find(text) != std::string::npos;
}

constexpr std::string_view wrong_key = "wrong key (the peer's proof does not match)";
constexpr std::string_view mac_mismatch = "transcript MAC mismatch (a byte was changed in transit)";
constexpr std::string_view bad_message = "rdx authentication message: ";

}  // namespace

TEST_CASE("auth: the right key succeeds and the payloads arrive unchanged") {
  const auto r = set_up(make_key(1), make_key(1));
  INFO(r.client.what << " / " << r.server.what);
  REQUIRE(r.client.ok);
  REQUIRE(r.server.ok);
  REQUIRE(r.client.received == std::vector<std::byte>(64 + 10, std::byte{0xAA}));
  REQUIRE(r.server.received == std::vector<std::byte>(64 + 10, std::byte{0xCC}));
}

TEST_CASE("auth: a wrong key fails on both sides") {
  const auto r = set_up(make_key(1), make_key(2));
  REQUIRE_FALSE(r.client.ok);
  REQUIRE_FALSE(r.server.ok);
  CHECK(r.client.code == rdx::errc::authentication_failed);
  CHECK(r.server.code == rdx::errc::authentication_failed);
  CHECK(has(r.client, wrong_key));
  CHECK(has(r.server, wrong_key));
}

TEST_CASE("auth: a relay that changes nothing passes, and the streams have the documented layout") {
  std::vector<std::byte> bytes;
  const auto r = set_up(
      make_key(1), make_key(1), [](int, std::size_t, std::byte&) {}, &bytes);
  REQUIRE(r.client.ok);
  REQUIRE(r.server.ok);
  REQUIRE(bytes.size() == stream_size);
  CHECK(bytes[hello_at] == std::byte{'R'});
  CHECK(bytes[proof_at + 5] == std::byte{2});
  CHECK(bytes[mac_at + 5] == std::byte{3});
  CHECK(mac_at + auth_message == stream_size);
}

TEST_CASE("auth: one byte flipped in any message fails the set-up, with the right message") {
  struct flip {
    std::size_t at;
    std::string_view expected;
    const char* step;
  };
  const flip flips[] = {
      {hello_at + 0, bad_message, "hello magic"},     {hello_at + 4, bad_message, "hello version"},
      {hello_at + 5, bad_message, "hello type"},      {hello_at + 6, bad_message, "hello reserved"},
      {hello_at + 8, wrong_key, "hello nonce"},       {hello_at + 39, wrong_key, "hello nonce end"},
      {proof_at + 0, bad_message, "proof magic"},     {proof_at + 5, bad_message, "proof type"},
      {proof_at + 8, wrong_key, "proof body"},        {proof_at + 39, wrong_key, "proof body end"},
      {payload1_at, mac_mismatch, "payload 1 start"}, {payload2_at - 1, mac_mismatch, "payload 1 end"},
      {payload2_at, mac_mismatch, "payload 2 start"}, {mac_at - 1, mac_mismatch, "payload 2 end"},
      {mac_at + 0, bad_message, "MAC magic"},         {mac_at + 5, bad_message, "MAC type"},
      {mac_at + 8, mac_mismatch, "MAC body"},         {mac_at + 39, mac_mismatch, "MAC body end"},
  };
  for (int dir = 0; dir < 2; ++dir) {
    for (const flip& f : flips) {
      const auto r = set_up(make_key(1), make_key(1), [&](int d, std::size_t at, std::byte& b) {
        if (d == dir && at == f.at) {
          b ^= std::byte{0x01};
        }
      });
      INFO((dir == 0 ? "client to server, " : "server to client, ")
           << f.step << ": client \"" << r.client.what << "\", server \"" << r.server.what << "\"");
      CHECK_FALSE((r.client.ok && r.server.ok));
      // The receiver of the changed message names the check that failed.
      const outcome& receiver = dir == 0 ? r.server : r.client;
      CHECK_FALSE(receiver.ok);
      CHECK(has(receiver, f.expected));
    }
  }
}

TEST_CASE("auth: a replayed set-up is refused") {
  const auto server_key = make_key(1);
  std::vector<std::byte> recorded;
  const auto first = set_up(
      make_key(1), server_key, [](int, std::size_t, std::byte&) {}, &recorded);
  REQUIRE(first.client.ok);
  REQUIRE(first.server.ok);
  REQUIRE(recorded.size() == stream_size);

  auto replay_to = [&](std::shared_ptr<const psk_key> key) {
    auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
    auto server = std::async(std::launch::async, [&] { return run_keyed(l.accept(2s), key, 0xAA); });
    {
      auto c = rdx::tcp::connect("127.0.0.1", l.port(), 2s);
      c.send_all(recorded, steady::now() + 2s);
      // Read until the server gives up and closes.
      std::byte sink[256];
      const auto deadline = steady::now() + 2s;
      while (steady::now() < deadline && ::recv(c.native_handle(), sink, sizeof sink, 0) > 0) {}
    }
    return server.get();
  };
  // The same key object remembers the nonce it accepted.
  const outcome same_key = replay_to(server_key);
  INFO(same_key.what);
  REQUIRE_FALSE(same_key.ok);
  CHECK(same_key.code == rdx::errc::authentication_failed);
  CHECK(
      has(same_key, "replayed or reflected nonce (this key accepted the peer's nonce in an earlier set-up"));
  // A fresh key object does not, but the old proof does not answer the new challenge.
  const outcome fresh_key = replay_to(make_key(1));
  INFO(fresh_key.what);
  REQUIRE_FALSE(fresh_key.ok);
  CHECK(fresh_key.code == rdx::errc::authentication_failed);
  CHECK(has(fresh_key, wrong_key));
}

TEST_CASE("auth: a side without a key and a side with one both fail, each saying why") {
  for (const bool keyed_is_server : {true, false}) {
    auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
    outcome keyed;
    outcome unkeyed;
    if (keyed_is_server) {
      auto server =
          std::async(std::launch::async, [&] { return run_keyed(l.accept(2s), make_key(1), 0xAA); });
      unkeyed = run_unkeyed(rdx::tcp::connect("127.0.0.1", l.port(), 2s));
      keyed = server.get();
    } else {
      auto server = std::async(std::launch::async, [&] { return run_unkeyed(l.accept(2s)); });
      keyed = run_keyed(rdx::tcp::connect("127.0.0.1", l.port(), 2s), make_key(1), 0xCC);
      unkeyed = server.get();
    }
    INFO("keyed: " << keyed.what << "; unkeyed: " << unkeyed.what);
    REQUIRE_FALSE(keyed.ok);
    REQUIRE_FALSE(unkeyed.ok);
    CHECK(keyed.code == rdx::errc::authentication_failed);
    CHECK(
        has(keyed, "no authentication from peer: the peer sent no authentication: it has no pre-shared key"));
    CHECK(unkeyed.code == rdx::errc::wire_format);
    CHECK(has(unkeyed, "the peer wants authenticated set-up: give this side the pre-shared key"));
  }
}

TEST_CASE("auth: a peer that reflects this side's hello or proof is refused") {
  // The fake peer holds no key: it sends back this side's hello, or a hello
  // with one nonce byte changed and then this side's own proof.
  for (const bool fresh_nonce : {false, true}) {
    auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
    auto fake = std::async(std::launch::async, [&] {
      try {
        const auto s = l.accept(2s);
        const auto deadline = steady::now() + 2s;
        std::array<std::byte, auth_message> msg{};
        s.recv_exact(msg, deadline);
        if (fresh_nonce) {
          msg[20] ^= std::byte{0xff};
        }
        s.send_all(msg, deadline);
        if (fresh_nonce) {
          s.recv_exact(msg, deadline);
          s.send_all(msg, deadline);
        }
        s.recv_exact(msg, deadline);  // until the keyed side hangs up
      } catch (const rdx::error&) {}
    });
    const outcome r = run_keyed(rdx::tcp::connect("127.0.0.1", l.port(), 2s), make_key(1), 0xCC);
    fake.get();
    INFO(r.what);
    CHECK(r.code == rdx::errc::authentication_failed);
    CHECK(has(r, fresh_nonce ? wrong_key
                             : "replayed or reflected nonce (the peer sent this side's own nonce back)"));
  }
}

TEST_CASE("auth: two ends sharing one key object look like a reflection across set-ups") {
  const auto key = make_key(1);
  const auto r = set_up(key, key);
  REQUIRE_FALSE(r.client.ok);
  REQUIRE_FALSE(r.server.ok);
  CHECK(has(r.client,
            "replayed or reflected nonce (the peer's nonce was issued by this key for another set-up"));
  CHECK(has(r.server,
            "replayed or reflected nonce (the peer's nonce was issued by this key for another set-up"));
}

TEST_CASE("auth: a silent peer times out, naming the step") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto silent = std::async(std::launch::async, [&] {
    auto s = l.accept(2s);
    // Reads the hello and says nothing, until the keyed side gives up and closes.
    std::byte sink[64];
    while (::recv(s.native_handle(), sink, sizeof sink, 0) > 0) {}
  });
  const auto t0 = steady::now();
  const outcome r = run_keyed(rdx::tcp::connect("127.0.0.1", l.port(), 2s), make_key(1), 0xCC, 200ms);
  silent.get();
  INFO(r.what);
  CHECK(r.code == rdx::errc::timed_out);
  CHECK(has(r, "authentication: receive the peer's hello"));
  CHECK(steady::now() - t0 < 1500ms);
}

TEST_CASE("auth: misuse of an authenticator is refused") {
  rdx::auth::psk_authenticator a(make_key(1));
  const rdx::tcp::socket none;
  CHECK_THROWS_WITH(a.finish(none, steady::now()), Contains("begin() did not succeed"));
  CHECK_THROWS_WITH(rdx::auth::psk_authenticator(std::shared_ptr<const psk_key>{}), Contains("no key"));
}

TEST_CASE("auth: keys") {
  const std::array<std::byte, 15> short_key{};
  CHECK_THROWS_WITH(psk_key(short_key), Contains("15 bytes, at least 16"));

  const auto k = psk_key::from_hex("00112233445566778899aabbccddeeff\n00112233 44556677 8899AABB CCDDEEFF\n");
  CHECK(k->size() == 32);
  CHECK_THROWS_WITH(psk_key::from_hex("0011223344556677889"), Contains("odd number"));
  // A secret's characters are never shown.
  CHECK_THROWS_WITH(psk_key::from_hex("00112233445566778899aabbccddeeffZZ"),
                    Contains("character 33 is not a hex digit") && !Contains("Z"));
  CHECK_THROWS_WITH(psk_key::from_hex("0011"), Contains("2 bytes, at least 16"));

  char path[] = "/tmp/rdx_auth_key_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const std::string text = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  ::close(fd);
  ::chmod(path, 0600);
  CHECK(psk_key::from_file(path)->size() == 32);
  ::chmod(path, 0644);
  CHECK_THROWS_WITH(psk_key::from_file(path), Contains("has mode 0644"));
  ::unlink(path);
  CHECK_THROWS_WITH(psk_key::from_file(path), Contains("open on key file"));
}

TEST_CASE("auth: the message decoder refuses malformed bytes") {
  using rdx::auth::detail::parse_message;
  std::array<std::byte, auth_message> m{};
  const std::array<std::byte, 32> body{std::byte{7}};
  rdx::auth::detail::encode_message(rdx::auth::detail::message_type::proof, body, m);
  const auto ok = parse_message(m);
  CHECK(ok.type == rdx::auth::detail::message_type::proof);
  CHECK(ok.body == body);
  CHECK_THROWS_WITH(parse_message(std::span(m).first(39)), Contains("39 bytes, a message has 40"));
  struct change {
    std::size_t at;
    std::byte to;
    const char* expected;
  };
  for (const change& c :
       {change{4, std::byte{2}, "unsupported version 2"}, change{5, std::byte{0}, "unknown message type 0"},
        change{7, std::byte{1}, "reserved bytes"}, change{0, std::byte{'X'}, "wrong magic"}}) {
    auto bad = m;
    bad[c.at] = c.to;
    CHECK_THROWS_WITH(parse_message(bad), Contains(c.expected));
  }
}
