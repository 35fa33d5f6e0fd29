// twonode test: least privilege on the fabric (docs/design.md, "Trust").
// Node 0 grants, node 1 is the peer that reaches for more. Modes:
//   --grant   a 64-byte grant inside a 1 MiB region, striped over 2 queue
//             pairs: the peer writes and reads it, then one byte past it
//             (forced past its local checks) fails with a remote access
//             error; node 0 checks that no byte outside the grant changed.
//             Then the grant's key on a second connection fails too.
//   --revoke  the peer writes in a loop; node 0 revokes; the peer's next
//             write fails with a remote access error, and node 0 finds the
//             value of the peer's last successful write, never a later one.
//   --auth    (rdx::auth) the right pre-shared key connects and carries a
//             message; a wrong key fails on both nodes before any queue
//             pair is connected.
// Results and bytes are reported over the TCP bootstrap socket. Exit 0 when
// every check on this node holds.
#include <rdx/channel/channel.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>

#if RDX_TEST_AUTH
#include <rdx/auth/psk.hpp>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "../rdma/channel_support.hpp"

using namespace std::chrono_literals;
using rdx::rights;
using clk = std::chrono::steady_clock;

namespace {

using namespace channel_test::trust_case;
int failures = 0;

void check(bool c, const std::string& what) {
  std::printf("%s: %s\n", c ? "ok  " : "FAIL", what.c_str());
  if (!c) ++failures;
}

rdx::tcp::socket bootstrap(bool granter, const std::string& peer, std::uint16_t port) {
  if (granter) return rdx::tcp::listener::bind("", port).accept(60s);
  return rdx::tcp::connect(peer, port, 60s);
}

void send_u64(const rdx::tcp::socket& s, std::uint64_t v) {
  std::byte b[8];
  std::memcpy(b, &v, 8);
  s.send_all(b, clk::now() + 60s, "send result");
}
std::uint64_t recv_u64(const rdx::tcp::socket& s) {
  std::byte b[8];
  s.recv_exact(b, clk::now() + 60s, "receive result");
  std::uint64_t v = 0;
  std::memcpy(&v, b, 8);
  return v;
}

std::error_code wait(rdx::operation& op) {
  return op.wait(30s);
}

void grant_mode(bool granter, const std::string& peer) {
  rdx::context ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  const rdx::connection_attr attr{.queue_pairs = 2, .recv_depth = 4, .message_size = 64, .chunk_size = 4096};
  rdx::connection a(pd, attr), b(pd, attr);
  if (granter) {
    auto region = rdx::make_window_buffer<std::byte>(pd, region_bytes);
    std::memset(region.data(), 0xAA, region_bytes);
    rdx::grant<std::byte, rw> g(a, region.region(),
                                std::span<std::byte>(region.data() + grant_at, grant_bytes));
    check(g.backing() == rdx::grant_backing::memory_window, "grant: " + g.description());
    const rdx::window_descriptor grants[] = {g.descriptor()};
    rdx::tcp::socket s = bootstrap(true, peer, 18650);
    (void)rdx::exchange_and_connect(s, a, grants, 60s);
    rdx::tcp::socket s2 = bootstrap(true, peer, 18651);
    (void)rdx::exchange_and_connect(s2, b, {}, 60s);
    // The peer works; this side drives its connections until the peer reports.
    std::uint64_t done = 0;
    std::thread reader([&] { done = recv_u64(s); });
    const auto end = clk::now() + 120s;
    while (done == 0 && clk::now() < end) {
      (void)a.progress();
      (void)b.progress();
      std::this_thread::sleep_for(1ms);
    }
    reader.join();
    std::size_t outside = 0, inside = 0;
    for (std::size_t i = 0; i < region_bytes; ++i) {
      const bool in = i >= grant_at && i < grant_at + grant_bytes;
      if (!in && region[i] != std::byte{0xAA}) ++outside;
      if (in && region[i] == std::byte{0x55}) ++inside;
    }
    check(inside == grant_bytes,
          "the peer's write inside the grant landed (" + std::to_string(inside) + " bytes)");
    check(outside == 0, "no byte outside the grant changed (" + std::to_string(outside) + " did)");
    std::printf("info: the granting connection after the peer's access errors: %s\n",
                a.failed() ? a.failure_message().c_str() : "healthy");
    send_u64(s, outside == 0 ? 1 : 2);
    return;
  }
  rdx::tcp::socket s = bootstrap(false, peer, 18650);
  const rdx::peer_offer offer = rdx::exchange_and_connect(s, a, {}, 60s);
  rdx::tcp::socket s2 = bootstrap(false, peer, 18651);
  (void)rdx::exchange_and_connect(s2, b, {}, 60s);
  const rdx::window_descriptor& d = offer.windows.at(0);
  check(d.keys.size() == 2 && d.keys[0] != d.keys[1], "one key per queue pair");
  rdx::registered_buffer<std::byte> src(pd, 4096);
  std::memset(src.data(), 0x55, 4096);
  // The key on the other connection (same protection domain on both nodes): refused.
  rdx::remote_window<std::byte, rw> elsewhere(b, d);
  auto w0 = elsewhere.write(rdx::local_span<const std::byte>(src).subspan(0, 8), 0);
  std::error_code ec = wait(w0);
  check(ec.value() == IBV_WC_REM_ACCESS_ERR, "the key on another connection: " + ec.message());
  rdx::remote_window<std::byte, rw> w(a, d);
  auto w1 = w.write(rdx::local_span<const std::byte>(src).subspan(0, grant_bytes), 0);
  check(!wait(w1), "write of the whole grant");
  rdx::registered_buffer<std::byte> back(pd, grant_bytes);
  auto r1 = w.read(rdx::local_span<std::byte>(back), 0);
  check(!wait(r1) && std::all_of(back.data(), back.data() + grant_bytes,
                                 [](std::byte x) { return x == std::byte{0x55}; }),
        "read back of the whole grant");
  check(w.check(grant_bytes, 1) == rdx::errc::out_of_range, "the local check refuses one byte past");
  auto forced = rdx::remote_window<std::byte, rw>::unchecked_for_testing(a, d, region_bytes);
  auto past = forced.write(rdx::local_span<const std::byte>(src).subspan(0, 1), grant_bytes);
  ec = wait(past);
  check(ec.value() == IBV_WC_REM_ACCESS_ERR, "one byte past the grant: " + ec.message());
  send_u64(s, 1);
  check(recv_u64(s) == 1, "the granting node found no byte outside the grant changed");
}

void revoke_mode(bool granter, const std::string& peer) {
  rdx::context ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  rdx::connection c(pd, rdx::connection_attr{.recv_depth = 4, .message_size = 64});
  auto region = rdx::make_window_buffer<std::uint64_t>(pd, 8);
  if (granter) {
    std::optional<rdx::grant<std::uint64_t, rights::write>> g(std::in_place, c, region);
    const rdx::window_descriptor grants[] = {g->descriptor()};
    rdx::tcp::socket s = bootstrap(true, peer, 18652);
    (void)rdx::exchange_and_connect(s, c, grants, 60s);
    (void)recv_u64(s);  // the peer is writing
    std::this_thread::sleep_for(300ms);
    const auto t0 = clk::now();
    g->revoke();
    const double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
    std::printf("info: revoke() returned in %.1f us\n", us);
    const std::uint64_t seen = region[0];  // nothing can land from here on
    const std::uint64_t last_ok = recv_u64(s);
    std::this_thread::sleep_for(200ms);
    check(region[0] == seen, "nothing landed after revoke() returned");
    check(seen == last_ok, "the window holds the peer's last successful write (" + std::to_string(seen) +
                               " against " + std::to_string(last_ok) + ")");
    send_u64(s, seen == last_ok ? 1 : 2);
    return;
  }
  rdx::tcp::socket s = bootstrap(false, peer, 18652);
  const rdx::peer_offer offer = rdx::exchange_and_connect(s, c, {}, 60s);
  rdx::remote_window<std::uint64_t, rights::write> w(c, offer.windows.at(0));
  rdx::registered_buffer<std::uint64_t> src(pd, 1);
  std::uint64_t last_ok = 0;
  std::error_code ec;
  send_u64(s, 1);
  const auto end = clk::now() + 60s;
  for (std::uint64_t i = 1; clk::now() < end; ++i) {
    src[0] = i;
    auto op = w.write(src, 0);
    ec = wait(op);
    if (ec) break;
    last_ok = i;
  }
  check(ec.value() == IBV_WC_REM_ACCESS_ERR, "the write after the revoke: " + ec.message());
  std::printf("info: %llu writes succeeded before the revoke\n", static_cast<unsigned long long>(last_ok));
  send_u64(s, last_ok);
  check(recv_u64(s) == 1, "the granting node found the last successful write and nothing later");
}

#if RDX_TEST_AUTH
void auth_mode(bool granter, const std::string& peer) {
  rdx::context ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  auto key = rdx::auth::psk_key::from_hex("8f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0");
  {
    rdx::connection c(pd, rdx::connection_attr{.recv_depth = 4, .message_size = 64});
    rdx::auth::psk_authenticator a(key);
    rdx::tcp::socket s = bootstrap(granter, peer, 18653);
    (void)rdx::exchange_and_connect(s, c, {}, rdx::exchange_options{.timeout = 60s, .auth = &a});
    rdx::channel<std::uint64_t> ch(c);
    if (granter) {
      auto r = ch.receive();
      check(!r.wait(30s) && r.value() == 0xa11ce, "the right key: connected, message received");
    } else {
      auto op = ch.send(0xa11ce);
      check(!op.wait(30s), "the right key: connected, message sent");
    }
    rdx::tcp::barrier(s, 30s);
  }
  {
    rdx::connection c(pd, rdx::connection_attr{.recv_depth = 4, .message_size = 64});
    auto wrong =
        rdx::auth::psk_key::from_hex("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
    rdx::auth::psk_authenticator a(granter ? key : wrong);
    rdx::tcp::socket s = bootstrap(granter, peer, 18654);
    std::string what;
    std::error_code ec;
    try {
      (void)rdx::exchange_and_connect(s, c, {}, rdx::exchange_options{.timeout = 30s, .auth = &a});
    } catch (const rdx::error& e) {
      ec = e.code();
      what = e.what();
    }
    check(ec == rdx::errc::authentication_failed, "a wrong key: " + what);
    check(c.qp(0).state() == rdx::qp_state::init, "a wrong key: the queue pair was never connected");
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "-h" || mode == "--help" || mode.empty()) {
    std::puts(
        "usage: trust_peer --grant|--revoke|--auth   (node 0 grants, node 1 is the peer; RDX_NODE, "
        "RDX_PEER_ADDR)");
    return mode.empty() ? 2 : 0;
  }
  const char* node = std::getenv("RDX_NODE");
  const char* peer = std::getenv("RDX_PEER_ADDR");
  if (node == nullptr || peer == nullptr) {
    std::fputs("trust_peer: run by rdx-vm with two nodes (RDX_NODE and RDX_PEER_ADDR unset)\n", stderr);
    return 2;
  }
  const bool granter = std::string(node) == "0";
  try {
    if (mode == "--grant") {
      grant_mode(granter, peer);
    } else if (mode == "--revoke") {
      revoke_mode(granter, peer);
#if RDX_TEST_AUTH
    } else if (mode == "--auth") {
      auth_mode(granter, peer);
#endif
    } else {
      std::fprintf(stderr, "trust_peer: unknown mode %s\n", mode.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trust_peer: %s\n", e.what());
    return 1;
  }
  std::printf("trust_peer %s: %s\n", mode.c_str(), failures == 0 ? "all checks passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
