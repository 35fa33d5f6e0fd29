// rdma tests: connection set-up against bad and hostile peers over the TCP
// bootstrap (docs/design.md, "Trust"). One deadline covers the whole
// exchange; a silent or slow client costs only its own slot; malformed
// settings fail with what arrived (in ec with the error_code form); with a pre-shared key (rdx::auth), a
// wrong key, a changed byte, a replay and a peer without a key all fail
// before any queue pair is connected.
#include <rdx/connect/settings.hpp>
#include <rdx/connect/wire.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "channel_support.hpp"
#include <sys/socket.h>

#if RDX_TEST_AUTH
#include <rdx/auth/psk.hpp>
#endif

using namespace std::chrono_literals;
using rdx::rights;
using clk = std::chrono::steady_clock;

namespace {

struct node {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
};

// What one side of a set-up ended with.
struct outcome {
  bool connected = false;
  std::error_code ec{};
  std::string what;
  rdx::qp_state state = rdx::qp_state::unknown;
  double seconds = 0;
};

// Runs exchange_and_connect on c over s, catching its error.
outcome run_side(const rdx::tcp::socket& s, rdx::connection& c,
                 std::span<const rdx::window_descriptor> grants, const rdx::exchange_options& o) {
  outcome r;
  const auto t0 = clk::now();
  try {
    (void)rdx::exchange_and_connect(s, c, grants, o);
    r.connected = true;
  } catch (const rdx::error& e) {
    r.ec = e.code();
    r.what = e.what();
  }
  r.seconds = std::chrono::duration<double>(clk::now() - t0).count();
  r.state = c.qp(0).state();
  return r;
}

// A TCP pair on loopback: server side accepted, client side connected.
struct tcp_pair {
  rdx::tcp::listener l = rdx::tcp::listener::bind("127.0.0.1", 0);
  rdx::tcp::socket client = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
  rdx::tcp::socket server = l.accept(5s);
};

// A peer that speaks the first part of the protocol correctly (from a real
// connection's info) and then sends `tail` instead of its settings.
void fake_peer(const rdx::tcp::socket& s, const rdx::connection_info& info, std::span<const std::byte> tail) {
  const auto deadline = clk::now() + 5s;
  const rdx::remote_descriptor credit[] = {info.credit_word};
  s.send_message(info.endpoints[0], credit, deadline);
  (void)s.recv_message(deadline);
  s.send_all(tail, deadline, "fake settings");
}

// Runs c's side of an exchange against a peer that sends what `speak` sends,
// and checks that c refused it as malformed, naming `says`, with its queue
// pairs never moved towards the peer.
void expect_refused(rdx::connection& c, const std::function<void(const rdx::tcp::socket&)>& speak,
                    const char* says) {
  tcp_pair t;
  std::thread peer([&] {
    try {
      speak(t.client);
    } catch (const rdx::error&) {}
  });
  const outcome r = run_side(t.server, c, {}, rdx::exchange_options{.timeout = 5s});
  peer.join();
  INFO(r.what);
  CHECK_FALSE(r.connected);
  CHECK(r.ec == rdx::errc::wire_format);
  CHECK(r.what.find(says) != std::string::npos);
  CHECK(r.state == rdx::qp_state::init);
}

}  // namespace

TEST_CASE("oversize and impossible settings from a peer fail with what arrived; nothing connects",
          "[hostile]") {
  node n;
  rdx::connection donor(n.pd, rdx::connection_attr{.recv_depth = 4});
  struct bad_case {
    const char* name;
    std::vector<std::byte> bytes;
    const char* says;
  };
  std::vector<bad_case> cases;
  {
    rdx::wire::settings st{1, 4, 4096, {}};
    auto b = rdx::wire::encode_settings(st);
    rdx::wire::detail::put32(b.data() + 16, 100000);  // a window count no peer may send
    cases.push_back({"oversize window count", b, "windows"});
  }
  {
    auto b = rdx::wire::encode_settings(rdx::wire::settings{1, 4, 4096, {{1, 8}}});
    rdx::wire::detail::put32(b.data() + 20, 9);  // rights 9: no such right
    cases.push_back({"unknown rights", b, "rights 9"});
  }
  {
    auto b = rdx::wire::encode_settings(rdx::wire::settings{1, 4, 4096, {}});
    b[0] = std::byte{'X'};
    cases.push_back({"wrong magic", b, "magic"});
  }
  for (const auto& bc : cases) {
    INFO(bc.name);
    rdx::connection c(n.pd, rdx::connection_attr{.recv_depth = 4});
    expect_refused(
        c, [&](const rdx::tcp::socket& s) { fake_peer(s, donor.local_info(), bc.bytes); }, bc.says);
  }
}

TEST_CASE(
    "exchange_and_connect's error_code form: garbage or silence from the peer is in ec, nothing connects",
    "[hostile]") {
  node n;
  for (const bool silent : {false, true}) {
    INFO((silent ? "a silent peer" : "a peer that sends garbage"));
    rdx::connection c(n.pd, rdx::connection_attr{.recv_depth = 4});
    tcp_pair t;
    std::thread peer([&] {
      if (!silent) {
        const std::vector<std::byte> garbage(64, std::byte{0x58});
        try {
          t.client.send_all(garbage, clk::now() + 5s, "garbage");
        } catch (const rdx::error&) {}
      }
    });
    std::error_code ec = make_error_code(rdx::errc::protocol_error);
    const rdx::peer_offer offer =
        rdx::exchange_and_connect(t.server, c, {}, rdx::exchange_options{.timeout = 300ms}, ec);
    peer.join();
    CHECK(ec == (silent ? rdx::errc::timed_out : rdx::errc::wire_format));
    CHECK(offer.windows.empty());
    CHECK(offer.info.endpoints.empty());
    CHECK(c.qp(0).state() == rdx::qp_state::init);
  }
}

TEST_CASE(
    "endpoint messages that disagree on a window, or lack the credit word, fail before anything connects",
    "[hostile]") {
  node n;
  const rdx::connection_attr two{.queue_pairs = 2, .recv_depth = 4};
  rdx::connection donor(n.pd, two);
  const rdx::connection_info info = donor.local_info();
  const rdx::remote_descriptor window{0x10000, 0x1234, 4096};
  struct bad_case {
    const char* name;
    std::vector<rdx::remote_descriptor> first, second;
    const char* says;
  };
  const std::vector<bad_case> cases = {
      {"no credit word", {}, {}, "no credit word"},
      {"a window missing from the second message", {info.credit_word, window}, {}, "window keys"},
      {"the window names other memory on queue pair 1",
       {info.credit_word, window},
       {{window.addr + 64, 0x5678, window.length}},
       "names other memory for queue pair 1"},
  };
  for (const auto& bc : cases) {
    INFO(bc.name);
    rdx::connection c(n.pd, two);
    expect_refused(
        c,
        [&](const rdx::tcp::socket& s) {
          const auto deadline = clk::now() + 5s;
          (void)rdx::tcp::exchange(s, info.endpoints[0], bc.first, deadline);
          (void)rdx::tcp::exchange(s, info.endpoints[1], bc.second, deadline);
        },
        bc.says);
  }
  // A peer's window with keys for another number of queue pairs is refused at setup.
  rdx::window_descriptor three_keys{window, rights::write, 8, {1, 2, 3}};
  three_keys.memory.rkey = 1;
  CHECK_THROWS_WITH((rdx::remote_window<std::uint64_t, rights::write>(donor, three_keys)),
                    Catch::Contains("keys for 3 queue pairs, the connection has 2"));
  // A grant made on a connection of one queue pair cannot be offered on one of two.
  rdx::connection one(n.pd, rdx::connection_attr{.recv_depth = 4});
  auto region = rdx::make_window_buffer<std::uint64_t>(n.pd, 8);
  rdx::grant<std::uint64_t, rights::write> g(one, region);
  const rdx::window_descriptor offered[] = {g.descriptor()};
  tcp_pair t;
  CHECK_THROWS_WITH(rdx::exchange_and_connect(t.server, donor, offered, rdx::exchange_options{.timeout = 1s}),
                    Catch::Contains("made on another connection"));
}

TEST_CASE("one deadline for the whole exchange: a silent and a slow client cost only their own slot",
          "[hostile]") {
  node n;
  rdx::tcp::listener l = rdx::tcp::listener::bind("127.0.0.1", 0);
  const auto timeout = 3s;
  std::atomic<bool> stop{false};
  // The silent client connects and sends nothing.
  std::thread silent([&] {
    rdx::tcp::socket s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    while (!stop.load()) std::this_thread::sleep_for(10ms);
  });
  // The slow client sends a valid endpoint message one byte every 200 ms:
  // a timeout per step would let it hold its slot far longer.
  rdx::connection donor(n.pd, rdx::connection_attr{.recv_depth = 4});
  std::thread slow([&] {
    rdx::tcp::socket s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    const rdx::remote_descriptor credit[] = {donor.local_info().credit_word};
    const auto bytes = rdx::wire::encode(donor.local_info().endpoints[0], credit);
    for (std::size_t i = 0; i < bytes.size() && !stop.load(); ++i) {
      try {
        s.send_all(std::span(&bytes[i], 1), clk::now() + 1s, "slow byte");
      } catch (const rdx::error&) {
        break;
      }
      std::this_thread::sleep_for(200ms);
    }
    while (!stop.load()) std::this_thread::sleep_for(10ms);
  });
  std::this_thread::sleep_for(200ms);  // both hold a slot before the good client comes
  // The good client, with real data afterwards.
  rdx::connection good_client(n.pd, rdx::connection_attr{.recv_depth = 4});
  outcome client_side;
  std::thread good([&] {
    rdx::tcp::socket s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    client_side = run_side(s, good_client, {}, rdx::exchange_options{.timeout = timeout});
  });

  // The server: one thread and one connection per client, each with its own deadline.
  std::vector<std::unique_ptr<rdx::connection>> conns;
  std::vector<outcome> served(3);
  std::vector<std::thread> slots;
  const auto t0 = clk::now();
  for (int i = 0; i < 3; ++i) {
    conns.push_back(std::make_unique<rdx::connection>(n.pd, rdx::connection_attr{.recv_depth = 4}));
    rdx::tcp::socket s = l.accept(5s);
    // The thread gets its connection itself: conns grows while earlier slots run.
    slots.emplace_back([&, i, c = conns.back().get(), s = std::move(s)]() mutable {
      served[i] = run_side(s, *c, {}, rdx::exchange_options{.timeout = timeout});
    });
  }
  good.join();
  const double good_at = std::chrono::duration<double>(clk::now() - t0).count();
  for (auto& t : slots) t.join();
  stop = true;
  silent.join();
  slow.join();
  INFO(client_side.what);
  REQUIRE(client_side.connected);
  std::printf("setup: the good client was served in %.2f s beside a silent and a slow client\n", good_at);
  CHECK(good_at < 2.0);
  int timed_out = 0;
  for (int i = 0; i < 3; ++i) {
    INFO("slot " << i << ": " << served[i].what);
    if (served[i].connected) continue;
    CHECK(served[i].ec == rdx::errc::timed_out);
    std::printf("setup: slot %d ended after %.2f s: %s\n", i, served[i].seconds, served[i].what.c_str());
    CHECK(served[i].seconds < 3.0 + 0.5);  // the whole exchange's deadline, not one per step
    CHECK(served[i].state == rdx::qp_state::init);
    ++timed_out;
  }
  CHECK(timed_out == 2);
  // The good client's connection carries data.
  const auto good_slot = static_cast<std::size_t>(
      std::find_if(served.begin(), served.end(), [](const outcome& o) { return o.connected; }) -
      served.begin());
  REQUIRE(good_slot < 3);
  rdx::channel<std::uint64_t> tx(good_client), rx(*conns[good_slot]);
  auto r = rx.receive();
  auto sent = tx.send(0x600d);
  const auto end = clk::now() + 10s;
  while (!r.done() && clk::now() < end) {
    good_client.progress();
    conns[good_slot]->progress();
  }
  REQUIRE(r.error() == std::error_code{});
  CHECK(r.value() == 0x600d);
}

#if RDX_TEST_AUTH
namespace {

std::array<std::byte, 32> key_bytes(unsigned char seed) {
  std::array<std::byte, 32> k{};
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::byte>(seed + i * 13);
  return k;
}

// Both sides of one set-up, each with its own key (or none), over a relay
// that may change the client's bytes on their way.
struct auth_run {
  outcome server, client;
};

auth_run authenticate(node& n, const std::array<std::byte, 32>* server_key,
                      const std::array<std::byte, 32>* client_key,
                      std::function<void(std::vector<std::byte>&, std::size_t at)> tamper = {}) {
  rdx::connection cs(n.pd, rdx::connection_attr{.recv_depth = 4});
  rdx::connection cc(n.pd, rdx::connection_attr{.recv_depth = 4});
  auto sg = rdx::make_window_buffer<std::uint64_t>(n.pd, 8);
  rdx::grant<std::uint64_t, rights::write> g(cs, sg);
  const rdx::window_descriptor grants[] = {g.descriptor()};
  std::optional<rdx::auth::psk_authenticator> as, ac;
  if (server_key != nullptr) as.emplace(std::span<const std::byte>(*server_key));
  if (client_key != nullptr) ac.emplace(std::span<const std::byte>(*client_key));
  rdx::tcp::listener l = rdx::tcp::listener::bind("127.0.0.1", 0);
  rdx::tcp::listener relay_l = rdx::tcp::listener::bind("127.0.0.1", 0);
  std::atomic<bool> stop{false};
  // The relay: client -> relay -> server, byte by byte from the client's side.
  std::thread relay([&] {
    try {
      rdx::tcp::socket from = relay_l.accept(5s);
      rdx::tcp::socket to = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
      std::size_t at = 0;
      std::vector<std::byte> buf(4096);
      while (!stop.load()) {
        for (auto [src, dst, up] : {std::tuple{&from, &to, true}, std::tuple{&to, &from, false}}) {
          const ssize_t got = ::recv(src->native_handle(), buf.data(), buf.size(), MSG_DONTWAIT);
          if (got == 0) return;
          if (got < 0) continue;
          std::vector<std::byte> chunk(buf.begin(), buf.begin() + got);
          if (up && tamper) tamper(chunk, at);
          if (up) at += chunk.size();
          dst->send_all(chunk, clk::now() + 5s, "relay");
        }
        std::this_thread::sleep_for(1ms);
      }
    } catch (const rdx::error&) {}
  });
  auth_run r;
  std::thread server([&] {
    try {
      rdx::tcp::socket s = l.accept(5s);
      r.server = run_side(s, cs, grants, rdx::exchange_options{.timeout = 5s, .auth = as ? &*as : nullptr});
    } catch (const rdx::error& e) {
      r.server.what = e.what();
    }
  });
  {
    rdx::tcp::socket s = rdx::tcp::connect("127.0.0.1", relay_l.port(), 5s);
    r.client = run_side(s, cc, {}, rdx::exchange_options{.timeout = 5s, .auth = ac ? &*ac : nullptr});
  }
  server.join();
  stop = true;
  relay.join();
  return r;
}

}  // namespace

TEST_CASE("pre-shared key: the right key connects; data moves", "[auth]") {
  node n;
  const auto k = key_bytes(1);
  const auto r = authenticate(n, &k, &k);
  INFO(r.server.what << " / " << r.client.what);
  CHECK(r.server.connected);
  CHECK(r.client.connected);
  CHECK(r.server.state == rdx::qp_state::rts);
}

TEST_CASE("pre-shared key: a wrong key and a peer without a key fail before any queue pair connects",
          "[auth]") {
  node n;
  const auto k = key_bytes(1);
  const auto other = key_bytes(2);
  {
    const auto r = authenticate(n, &k, &other);
    INFO(r.server.what << " / " << r.client.what);
    CHECK(r.server.ec == rdx::errc::authentication_failed);
    CHECK(r.server.what.find("wrong key") != std::string::npos);
    CHECK(r.client.ec == rdx::errc::authentication_failed);
    CHECK(r.server.state == rdx::qp_state::init);
    CHECK(r.client.state == rdx::qp_state::init);
  }
  {
    const auto r = authenticate(n, &k, nullptr);
    INFO(r.server.what << " / " << r.client.what);
    CHECK(r.server.ec == rdx::errc::authentication_failed);
    CHECK(r.server.what.find("no pre-shared key") != std::string::npos);
    CHECK(r.client.ec == rdx::errc::wire_format);
    CHECK(r.client.what.find("give this side the pre-shared key") != std::string::npos);
    CHECK(r.server.state == rdx::qp_state::init);
    CHECK(r.client.state == rdx::qp_state::init);
  }
}

TEST_CASE("pre-shared key: one changed byte in each message fails before the server connects", "[auth]") {
  node n;
  const auto k = key_bytes(3);
  // The client's stream: hello (0..39), proof (40..79), endpoint message (80..), settings, MAC.
  for (const std::size_t at : {std::size_t{5}, std::size_t{60}, std::size_t{100}, std::size_t{130},
                               std::size_t{150}, std::size_t{180}}) {
    const auto r = authenticate(n, &k, &k, [at](std::vector<std::byte>& chunk, std::size_t start) {
      if (at >= start && at < start + chunk.size()) chunk[at - start] ^= std::byte{0x01};
    });
    INFO("byte " << at << ": server: " << r.server.what << " / client: " << r.client.what);
    CHECK_FALSE(r.server.connected);
    CHECK(r.server.state == rdx::qp_state::init);
    CHECK((r.server.ec == rdx::errc::authentication_failed || r.server.ec == rdx::errc::wire_format));
  }
}

TEST_CASE("pre-shared key: a replayed client transcript fails", "[auth]") {
  node n;
  const auto k = key_bytes(4);
  std::vector<std::byte> recorded;
  const auto first = authenticate(n, &k, &k, [&](std::vector<std::byte>& chunk, std::size_t) {
    recorded.insert(recorded.end(), chunk.begin(), chunk.end());
  });
  REQUIRE(first.server.connected);
  // The same client bytes again, to a fresh server session with the key.
  rdx::connection cs(n.pd, rdx::connection_attr{.recv_depth = 4});
  rdx::auth::psk_authenticator as{std::span<const std::byte>(k)};
  rdx::tcp::listener l = rdx::tcp::listener::bind("127.0.0.1", 0);
  std::thread replay([&] {
    try {
      rdx::tcp::socket s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
      s.send_all(recorded, clk::now() + 5s, "replay");
      std::this_thread::sleep_for(1s);
    } catch (const rdx::error&) {}
  });
  rdx::tcp::socket s = l.accept(5s);
  const outcome r = run_side(s, cs, {}, rdx::exchange_options{.timeout = 5s, .auth = &as});
  replay.join();
  INFO(r.what);
  CHECK_FALSE(r.connected);
  CHECK(r.ec == rdx::errc::authentication_failed);
  CHECK(r.state == rdx::qp_state::init);
}
#endif
