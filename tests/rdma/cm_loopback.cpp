// rdma_cm on one node: an rdx connection set up through rdma_cm between two
// threads of one process (server and client on the node's own address), for
// 1 and 2 queue pairs with data checked; a port with no listener; a request
// of a wrong version, and one whose settings differ (both rejected with the
// reason, which the client reads); too many grants; a peer that connects and
// vanishes (the listener goes on); the peer's DISCONNECTED failing pending
// operations at once, next to the retry-timeout bound; the error_code forms
// of cm::connect and cm::accept, and a client that waits for a listener
// starting after it (and for one that never does). Run under the
// asan-ubsan preset as well.
#include <rdx/cm/cm.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "channel_support.hpp"
#include "cm_support.hpp"

using namespace std::chrono_literals;
using rdx::rights;
using clk = std::chrono::steady_clock;
using cm_test::node_address;

namespace {

// A server thread's outcome, checked on the main thread.
struct outcome {
  std::exception_ptr error;
  std::string text;
};

void rethrow(const outcome& o) {
  if (o.error) std::rethrow_exception(o.error);
}

constexpr std::size_t words = 4096 + 512;  // 36 KiB: striped over 2 queue pairs in 4 KiB chunks

}  // namespace

TEST_CASE("a connection over rdma_cm carries window data and messages, for 1 and 2 queue pairs", "[cm]") {
  const std::string addr = node_address();
  for (std::uint32_t k : {1u, 2u}) {
    CAPTURE(k);
    rdx::context ctx = channel_test::open_device();
    rdx::protection_domain pd(ctx);
    const rdx::connection_attr attr{
        .queue_pairs = k, .recv_depth = 8, .message_size = 256, .chunk_size = 4096};
    rdx::cm::listener l(0, addr);
    const std::uint16_t port = l.port();
    REQUIRE(port != 0);
    outcome srv;
    std::thread server([&] {
      try {
        rdx::connection conn(pd, attr);
        rdx::channel<std::uint64_t> ch(conn);
        auto win = rdx::make_window_buffer<std::uint64_t, rights::read | rights::write>(pd, words);
        const rdx::grant<std::uint64_t, rights::read | rights::write> g(conn, win);
        const rdx::window_descriptor grants[] = {g.descriptor()};
        std::optional<rdx::cm::request> r = l.next(20s);
        if (!r) throw std::runtime_error("no request within 20 s");
        if (r->queue_pairs() != k)
          throw std::runtime_error("request with " + std::to_string(r->queue_pairs()) + " ids");
        const rdx::peer_offer offer = rdx::cm::accept(std::move(*r), conn, grants);
        if (!offer.windows.empty()) throw std::runtime_error("the client offered a window");
        auto m = ch.receive();
        if (m.wait(20s)) throw std::runtime_error("receive: " + m.error().message());
        // The client wrote the window before its message: check, then answer with the sum.
        std::uint64_t sum = 0;
        for (std::size_t i = 0; i < words; ++i) sum += win[i];
        auto s = ch.send(sum + m.value());
        if (s.wait(20s)) throw std::runtime_error("send: " + s.error().message());
        auto bye = ch.receive();
        if (bye.wait(20s)) throw std::runtime_error("final receive: " + bye.error().message());
      } catch (...) {
        srv.error = std::current_exception();
      }
    });
    {
      rdx::connection conn(pd, attr);
      rdx::channel<std::uint64_t> ch(conn);
      const rdx::peer_offer offer = rdx::cm::connect(conn, addr, port);
      REQUIRE(offer.windows.size() == 1);
      CHECK(offer.windows[0].keys.size() == k);
      rdx::remote_window<std::uint64_t, rights::read | rights::write> w(conn, offer.windows[0]);
      rdx::registered_buffer<std::uint64_t> src(pd, words), back(pd, words);
      std::uint64_t sum = 0;
      for (std::size_t i = 0; i < words; ++i) {
        src[i] = i * 2654435761u + k;
        sum += src[i];
      }
      const auto posted = conn.posted_count();
      auto wr = w.write(src, 0);
      REQUIRE_FALSE(wr.wait(20s));
      CHECK(conn.posted_count() - posted >= 9);  // 36 KiB in 4 KiB chunks
      auto rd = w.read(back, 0);
      REQUIRE_FALSE(rd.wait(20s));
      CHECK(std::memcmp(src.data(), back.data(), words * 8) == 0);
      auto m = ch.send(7);
      REQUIRE_FALSE(m.wait(20s));
      auto answer = ch.receive();
      REQUIRE_FALSE(answer.wait(20s));
      CHECK(answer.value() == sum + 7);
      auto bye = ch.send(0);
      REQUIRE_FALSE(bye.wait(20s));
      server.join();
      rethrow(srv);
    }
  }
}

TEST_CASE("connecting to a port where nothing listens fails fast, naming the peer", "[cm]") {
  const std::string addr = node_address();
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  rdx::connection conn(pd, {});
  std::string what;
  const auto t0 = clk::now();
  const std::error_code ec = channel_test::code_of([&] { (void)rdx::cm::connect(conn, addr, 1); }, &what);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0);
  std::printf("cm: no listener: %s after %lld ms\n", what.c_str(), static_cast<long long>(took.count()));
  CHECK(ec == std::errc::connection_refused);
  CHECK(what.find(addr + ":1") != std::string::npos);
  CHECK(what.find("nothing listens") != std::string::npos);
  CHECK(took < 10s);
}

TEST_CASE(
    "the error_code forms: a refusal is in ec; waiting for a late listener connects, for none ends refused",
    "[cm]") {
  const std::string addr = node_address();
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  std::uint16_t port = 0;
  {
    rdx::cm::listener probe(0, addr);  // a port nothing listens on once it is gone
    port = probe.port();
  }
  REQUIRE(port != 0);

  SECTION("no listener, no waiting: refused at once") {
    rdx::connection conn(pd, {});
    std::error_code ec = make_error_code(rdx::errc::protocol_error);
    const auto t0 = clk::now();
    const rdx::peer_offer offer = rdx::cm::connect(conn, addr, port, {}, {}, ec);
    CHECK(ec == std::errc::connection_refused);
    CHECK(offer.windows.empty());
    CHECK(conn.qp(0).state() != rdx::qp_state::rts);
    CHECK(clk::now() - t0 < 5s);
  }
  SECTION("a listener that starts 500 ms after the client: the retry connects") {
    outcome srv;
    std::error_code server_ec = make_error_code(rdx::errc::protocol_error);
    std::thread server([&] {
      std::this_thread::sleep_for(500ms);
      try {
        rdx::cm::listener l(port, addr);
        rdx::connection conn(pd, {});
        if (std::optional<rdx::cm::request> r = l.next(10s)) {
          (void)rdx::cm::accept(std::move(*r), conn, {}, {}, server_ec);  // ESTABLISHED on both sides
        }
      } catch (...) {
        srv.error = std::current_exception();
      }
    });
    rdx::connection conn(pd, {});
    rdx::cm::options o;
    o.wait_for_listener = true;
    std::error_code ec = make_error_code(rdx::errc::protocol_error);
    const auto t0 = clk::now();
    (void)rdx::cm::connect(conn, addr, port, {}, o, ec);
    const auto took = clk::now() - t0;
    server.join();
    rethrow(srv);
    INFO(ec.message());
    CHECK_FALSE(ec);
    CHECK_FALSE(server_ec);
    CHECK(conn.qp(0).state() == rdx::qp_state::rts);
    CHECK(took >= 400ms);
    CHECK(took < o.timeout);
  }
  SECTION("waiting, and nothing ever listens: refused, not timed out, at the timeout") {
    rdx::connection conn(pd, {});
    rdx::cm::options o;
    o.timeout = 1500ms;
    o.wait_for_listener = true;
    std::error_code ec;
    const auto t0 = clk::now();
    (void)rdx::cm::connect(conn, addr, port, {}, o, ec);
    const auto took = clk::now() - t0;
    std::printf("cm: waited %lld ms for a listener: %s\n",
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
                ec.message().c_str());
    CHECK(ec == std::errc::connection_refused);
    CHECK(took >= 1000ms);  // retries go on while 400 ms are left
    CHECK(took < 1500ms + 1s);
  }
}

TEST_CASE("a request of another version, or with other settings, is rejected with the reason", "[cm]") {
  const std::string addr = node_address();
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  rdx::cm::listener l(0, addr);
  const std::uint16_t port = l.port();

  SECTION("wrong version: the listener rejects it by itself") {
    std::optional<rdx::cm::request> got;
    std::thread server([&] { got = l.next(5s); });
    rdx::connection conn(pd, {});
    rdx::cm::hello h;
    h.recv_depth = 64;
    h.message_size = 4096;
    std::vector<std::byte> pd9 = rdx::cm::encode_hello(h);
    pd9[4] = std::byte{9};
    std::string what;
    const std::error_code ec =
        channel_test::code_of([&] { (void)rdx::cm::connect(conn.qp(0), addr, port, pd9); }, &what);
    server.join();
    std::printf("cm: version 9: %s\n", what.c_str());
    CHECK(ec == rdx::errc::rejected);
    CHECK(what.find("version 9, this side speaks 1") != std::string::npos);
    CHECK_FALSE(got.has_value());
    CHECK(l.rejected() == 1);
  }
  SECTION("other recv_depth: accept rejects it and both sides say why") {
    outcome srv;
    std::thread server([&] {
      try {
        rdx::connection conn(pd, {.recv_depth = 32});
        std::optional<rdx::cm::request> r = l.next(10s);
        if (!r) throw std::runtime_error("no request");
        (void)rdx::cm::accept(std::move(*r), conn);
      } catch (const rdx::error& e) {
        srv.text = e.what();
      } catch (...) {
        srv.error = std::current_exception();
      }
    });
    rdx::connection conn(pd, {.recv_depth = 16});
    std::string what;
    const std::error_code ec =
        channel_test::code_of([&] { (void)rdx::cm::connect(conn, addr, port); }, &what);
    server.join();
    rethrow(srv);
    std::printf("cm: settings: client: %s\ncm: settings: server: %s\n", what.c_str(), srv.text.c_str());
    CHECK(ec == rdx::errc::rejected);
    CHECK(what.find("recv_depth is 16") != std::string::npos);
    CHECK(srv.text.find("recv_depth is 16") != std::string::npos);
    CHECK_FALSE(conn.failed());
  }
  SECTION("other recv_depth, with accept's error_code form: the reason's code in ec, no queue pair in RTS") {
    std::error_code server_ec;
    rdx::qp_state server_state = rdx::qp_state::unknown;
    std::thread server([&] {
      rdx::connection conn(pd, {.recv_depth = 32});
      if (std::optional<rdx::cm::request> r = l.next(10s)) {
        (void)rdx::cm::accept(std::move(*r), conn, {}, {}, server_ec);
      }
      server_state = conn.qp(0).state();
    });
    rdx::connection conn(pd, {.recv_depth = 16});
    std::error_code ec;
    (void)rdx::cm::connect(conn, addr, port, {}, {}, ec);
    server.join();
    CHECK(ec == rdx::errc::rejected);
    CHECK(server_ec == rdx::errc::invalid_argument);
    CHECK(server_state != rdx::qp_state::rts);
  }
}

TEST_CASE("bad input is refused before anything is sent", "[cm]") {
  const std::string addr = node_address();
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  rdx::connection conn(pd, {});
  auto a = rdx::make_window_buffer<std::uint64_t, rights::write>(pd, 8);
  auto b = rdx::make_window_buffer<std::uint64_t, rights::write>(pd, 8);
  const rdx::grant<std::uint64_t, rights::write> ga(conn, a), gb(conn, b);
  const rdx::window_descriptor two[] = {ga.descriptor(), gb.descriptor()};
  std::string what;
  CHECK(channel_test::code_of([&] { (void)rdx::cm::connect(conn, addr, 1, two); }, &what) ==
        rdx::errc::invalid_argument);
  CHECK(what.find("at most 1") != std::string::npos);
  const std::vector<std::byte> big(57);
  CHECK(channel_test::code_of([&] { (void)rdx::cm::connect(conn.qp(0), addr, 1, big); }) ==
        rdx::errc::invalid_argument);
  CHECK(channel_test::code_of([&] { (void)rdx::cm::connect(conn, "no-such-host.invalid", 1); }) ==
        rdx::errc::address_error);
  // An address on this node's network that no host answers: the address is
  // resolved again each second (the kernel looks at its neighbour table
  // anew) until the deadline, which then names the cause.
  const std::string silent = addr.substr(0, addr.rfind('.')) + ".99";
  std::string why;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(
      channel_test::code_of(
          [&] { (void)rdx::cm::connect(conn, silent, 1, {}, {.timeout = std::chrono::milliseconds(3500)}); },
          &why) == rdx::errc::timed_out);
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO(why);
  CHECK(why.find("no link-layer address") != std::string::npos);
  CHECK(took >= std::chrono::milliseconds(3000));
  CHECK(took < std::chrono::seconds(10));
  CHECK(channel_test::code_of([&] { (void)rdx::cm::connect(conn, addr, 1, {}, {.qp = {.timeout = 0}}); }) ==
        rdx::errc::invalid_argument);
}

TEST_CASE("the listener goes on serving after a peer that connects and vanishes", "[cm]") {
  const std::string addr = node_address();
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  rdx::cm::listener l(0, addr);
  const std::uint16_t port = l.port();
  outcome srv;
  int failed_accepts = 0;
  bool served = false;
  std::thread server([&] {
    try {
      // Requests until one is served; the vanished peer's accept fails (bounded).
      for (int n = 0; n < 3 && !served; ++n) {
        std::optional<rdx::cm::request> r = l.next(10s);
        if (!r) throw std::runtime_error("no request within 10 s");
        rdx::connection conn(pd, {});
        rdx::channel<std::uint32_t> ch(conn);
        try {
          (void)rdx::cm::accept(std::move(*r), conn, {}, {.timeout = 3s});
        } catch (const rdx::error& e) {
          ++failed_accepts;
          srv.text = e.what();
          continue;
        }
        auto m = ch.receive();
        if (m.wait(10s) || m.value() != 42) throw std::runtime_error("the client's message");
        auto e = ch.send(43);
        if (e.wait(10s)) throw std::runtime_error("answer");
        auto bye = ch.receive();
        (void)bye.wait(10s);
        served = true;
      }
    } catch (...) {
      srv.error = std::current_exception();
    }
  });
  {
    // Sends its request with a raw id and is gone before it establishes.
    rdx::connection conn(pd, {});
    rdx::cm::hello h;
    h.recv_depth = 64;
    h.message_size = 4096;
    const std::vector<std::byte> hello = rdx::cm::encode_hello(h);
    rdx::cm::detail::dialer d(addr, port, 1, {});
    d.request(0, conn.qp(0), hello, {});
    std::this_thread::sleep_for(300ms);
  }
  {
    rdx::connection conn(pd, {});
    rdx::channel<std::uint32_t> ch(conn);
    (void)rdx::cm::connect(conn, addr, port);
    auto s = ch.send(42);
    REQUIRE_FALSE(s.wait(10s));
    auto r = ch.receive();
    REQUIRE_FALSE(r.wait(10s));
    CHECK(r.value() == 43);
    auto bye = ch.send(0);
    REQUIRE_FALSE(bye.wait(10s));
    server.join();
  }
  rethrow(srv);
  std::printf("cm: vanished peer: %d failed accept(s), last: %s\n", failed_accepts, srv.text.c_str());
  CHECK(served);
  CHECK(failed_accepts >= 1);
}

TEST_CASE("the peer's DISCONNECTED fails pending operations at once", "[cm]") {
  const std::string addr = node_address();
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  rdx::cm::listener l(0, addr);
  const std::uint16_t port = l.port();
  for (const bool events : {false, true}) {
    CAPTURE(events);
    std::atomic<bool> go_away{false};
    outcome srv;
    std::thread server([&] {
      try {
        auto conn = std::make_unique<rdx::connection>(pd, rdx::connection_attr{});
        std::optional<rdx::cm::request> r = l.next(10s);
        if (!r) throw std::runtime_error("no request");
        (void)rdx::cm::accept(std::move(*r), *conn);
        while (!go_away) std::this_thread::sleep_for(1ms);
        conn.reset();  // the process would do this when it dies: the kernel disconnects
      } catch (...) {
        srv.error = std::current_exception();
      }
    });
    rdx::connection conn(pd, {.events = events});
    rdx::channel<std::uint64_t> ch(conn);
    (void)rdx::cm::connect(conn, addr, port);
    auto r = ch.receive();
    REQUIRE_FALSE(r.test());
    const auto t0 = clk::now();
    go_away = true;
    const std::error_code ec = r.wait(30s, events ? rdx::wait_mode::events : rdx::wait_mode::poll);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0);
    server.join();
    rethrow(srv);
    std::printf(
        "cm: DISCONNECTED ended a pending receive in %lld ms (%s mode); the retry-timeout bound is %lld ms\n",
        static_cast<long long>(took.count()), events ? "event" : "poll",
        static_cast<long long>(conn.detection_bound().count()));
    CHECK(ec == rdx::errc::peer_disconnected);
    CHECK(conn.failure_message().find("DISCONNECTED") != std::string::npos);
    CHECK(took < conn.detection_bound() / 2);
    auto later = ch.send(1);
    CHECK(later.wait(1s) == rdx::errc::operation_failed);
  }
}

TEST_CASE("what the peer sent before it disconnected is delivered first", "[cm]") {
  const std::string addr = node_address();
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  rdx::cm::listener l(0, addr);
  const std::uint16_t port = l.port();
  for (int round = 0; round < 10; ++round) {
    CAPTURE(round);
    outcome srv;
    std::thread server([&] {
      try {
        rdx::connection conn(pd, {});
        rdx::channel<std::uint64_t> ch(conn);
        std::optional<rdx::cm::request> r = l.next(10s);
        if (!r) throw std::runtime_error("no request");
        (void)rdx::cm::accept(std::move(*r), conn);
        auto s = ch.send(1000 + static_cast<std::uint64_t>(round));
        if (s.wait(10s)) throw std::runtime_error("send: " + s.error().message());
      } catch (...) {
        srv.error = std::current_exception();
      }
      // The connection goes here, at once: its DREQ races the message's completion.
    });
    rdx::connection conn(pd, {});
    rdx::channel<std::uint64_t> ch(conn);
    (void)rdx::cm::connect(conn, addr, port);
    auto first = ch.receive();
    CHECK_FALSE(first.wait(10s));
    CHECK(first.value() == 1000 + static_cast<std::uint64_t>(round));
    auto second = ch.receive();
    CHECK(second.wait(10s) == rdx::errc::peer_disconnected);
    server.join();
    rethrow(srv);
  }
}
