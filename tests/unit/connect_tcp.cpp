// TCP bootstrap on localhost: endpoint exchange, every timeout, refusals and
// a client that starts before its server.
#include <rdx/connect/tcp_bootstrap.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>

#include <sys/socket.h>
#include <unistd.h>

using namespace std::chrono_literals;
using steady = rdx::tcp::clock;

namespace {

rdx::endpoint make_endpoint(std::uint32_t qpn) {
  rdx::endpoint e;
  e.gid.raw[10] = 0xff;
  e.gid.raw[11] = 0xff;
  e.gid.raw[12] = 127;
  e.gid.raw[15] = static_cast<std::uint8_t>(qpn);
  e.qpn = qpn;
  e.psn = 0x424242;
  e.mtu = IBV_MTU_1024;
  e.port = 1;
  e.gid_index = 1;
  return e;
}

// A port that was free a moment ago.
std::uint16_t free_port() {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  return l.port();
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rdx::error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("tcp: both sides exchange endpoints and descriptors") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  REQUIRE(l.port() != 0);
  const auto server_ep = make_endpoint(0x11);
  const auto client_ep = make_endpoint(0x22);
  const rdx::remote_descriptor server_mem[] = {{0x1000, 7, 4096}, {0x9000, 8, 64}};

  auto client = std::async(std::launch::async, [&] {
    auto s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    auto m = rdx::tcp::exchange(s, client_ep, {}, 5s);
    rdx::tcp::barrier(s, 5s);
    return m;
  });
  auto s = l.accept(5s);
  CHECK(s.peer().rfind("127.0.0.1:", 0) == 0);
  const auto from_client = rdx::tcp::exchange(s, server_ep, server_mem, 5s);
  rdx::tcp::barrier(s, 5s);
  const auto from_server = client.get();

  CHECK(from_client.ep == client_ep);
  CHECK(from_client.descriptors.empty());
  CHECK(from_server.ep == server_ep);
  REQUIRE(from_server.descriptors.size() == 2);
  CHECK(from_server.descriptors[0] == server_mem[0]);
  CHECK(from_server.descriptors[1] == server_mem[1]);
}

TEST_CASE("tcp: a listener on every address serves an IPv4 client") {
  auto l = rdx::tcp::listener::bind("", 0);
  auto client = std::async(std::launch::async, [&] {
    auto s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    return rdx::tcp::exchange(s, make_endpoint(1), {}, 5s);
  });
  auto s = l.accept(5s);
  CHECK(s.peer().rfind("127.0.0.1:", 0) == 0);
  CHECK(rdx::tcp::exchange(s, make_endpoint(2), {}, 5s).ep == make_endpoint(1));
  CHECK(client.get().ep == make_endpoint(2));
}

TEST_CASE("tcp: accept times out with a clear error") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  const auto t0 = steady::now();
  try {
    (void)l.accept(200ms);
    FAIL("accept returned without a client");
  } catch (const rdx::error& e) {
    const auto waited = steady::now() - t0;
    CHECK(e.code() == rdx::errc::timed_out);
    CHECK(std::string(e.what()).find("no client connected within 0.2 s") != std::string::npos);
    CHECK(waited >= 200ms);
    CHECK(waited < 5s);
  }
}

TEST_CASE("tcp: connect to a closed port retries until its deadline, then names the cause") {
  const auto port = free_port();
  const auto t0 = steady::now();
  try {
    (void)rdx::tcp::connect("127.0.0.1", port, 400ms);
    FAIL("connect succeeded to a closed port");
  } catch (const rdx::error& e) {
    const auto waited = steady::now() - t0;
    INFO(e.what());
    CHECK(e.code() == std::errc::connection_refused);
    const std::string w = e.what();
    CHECK(w.find("connect to 127.0.0.1:" + std::to_string(port)) == 0);
    CHECK(w.find("is the server running?") != std::string::npos);
    CHECK(w.find("Connection refused") != std::string::npos);
    CHECK(waited >= 400ms);
    CHECK(waited < 5s);
  }
}

TEST_CASE("tcp: the error_code forms of accept and connect report the failure without throwing") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  std::error_code ec = make_error_code(rdx::errc::protocol_error);  // cleared or replaced
  auto t0 = steady::now();
  rdx::tcp::socket s = l.accept(200ms, ec);
  CHECK(ec == rdx::errc::timed_out);
  CHECK_FALSE(s.is_open());
  CHECK(steady::now() - t0 >= 200ms);

  const auto port = free_port();
  t0 = steady::now();
  s = rdx::tcp::connect("127.0.0.1", port, 300ms, ec);
  INFO(ec.message());
  CHECK(ec == std::errc::connection_refused);
  CHECK_FALSE(s.is_open());
  CHECK(steady::now() - t0 >= 300ms);
  CHECK(steady::now() - t0 < 5s);

  s = rdx::tcp::connect("no-such-host.invalid", 1, 300ms, ec);
  CHECK(ec == rdx::errc::invalid_argument);
  CHECK_FALSE(s.is_open());

  // Success clears ec.
  ec = make_error_code(rdx::errc::protocol_error);
  rdx::tcp::socket client = rdx::tcp::connect("127.0.0.1", l.port(), 5s, ec);
  CHECK_FALSE(ec);
  CHECK(client.is_open());
  ec = make_error_code(rdx::errc::protocol_error);
  rdx::tcp::socket server = l.accept(5s, ec);
  CHECK_FALSE(ec);
  CHECK(server.is_open());
  CHECK(server.peer().rfind("127.0.0.1:", 0) == 0);
}

TEST_CASE("tcp: a client may start before its server") {
  const auto port = free_port();
  auto client = std::async(std::launch::async, [&] {
    auto s = rdx::tcp::connect("127.0.0.1", port, 10s);
    return rdx::tcp::exchange(s, make_endpoint(5), {}, 10s);
  });
  std::this_thread::sleep_for(300ms);  // the client is retrying meanwhile
  auto l = rdx::tcp::listener::bind("127.0.0.1", port);
  auto s = l.accept(10s);
  CHECK(rdx::tcp::exchange(s, make_endpoint(6), {}, 10s).ep == make_endpoint(5));
  CHECK(client.get().ep == make_endpoint(6));
}

TEST_CASE("tcp: a silent peer makes the receive time out") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto c = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
  auto s = l.accept(5s);
  const auto t0 = steady::now();
  const auto w = what_of([&] { (void)s.recv_message(steady::now() + 200ms); });
  CHECK(steady::now() - t0 >= 200ms);
  CHECK(w.find("receive endpoint from 127.0.0.1:") == 0);
  CHECK(w.find("timed out with 0 of 16 bytes received") != std::string::npos);

  // The same with part of a message sent.
  const auto bytes = rdx::wire::encode(make_endpoint(3));
  c.send_all(std::span(bytes).first(20), steady::now() + 1s);
  const auto w2 = what_of([&] { (void)s.recv_message(steady::now() + 200ms); });
  CHECK(w2.find("timed out with 4 of 32 bytes received") != std::string::npos);
}

TEST_CASE("tcp: a peer that closes mid-message is reported as truncated") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto c = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
  auto s = l.accept(5s);
  const auto bytes = rdx::wire::encode(make_endpoint(3));
  c.send_all(std::span(bytes).first(10), steady::now() + 1s);
  c.close();
  try {
    (void)s.recv_message(steady::now() + 5s);
    FAIL("received a message from a peer that closed early");
  } catch (const rdx::error& e) {
    CHECK(e.code() == rdx::errc::wire_format);
    CHECK(std::string(e.what()).find("peer closed the connection after 10 of 16 bytes") != std::string::npos);
  }
}

TEST_CASE("tcp: a foreign or oversized header is refused before the body is read") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto c = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
  auto s = l.accept(5s);

  // Only a header that claims a huge body: refused at once, no wait for the body.
  auto bytes = rdx::wire::encode(make_endpoint(3));
  bytes[8] = std::byte{0x7f};
  c.send_all(std::span(bytes).first(rdx::wire::header_size), steady::now() + 1s);
  const auto t0 = steady::now();
  try {
    (void)s.recv_message(steady::now() + 10s);
    FAIL("accepted an oversized header");
  } catch (const rdx::error& e) {
    CHECK(e.code() == rdx::errc::wire_format);
    CHECK(std::string(e.what()).find("oversized") != std::string::npos);
  }
  CHECK(steady::now() - t0 < 5s);

  // ibv_rc_pingpong's text instead of an rdx message.
  auto c2 = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
  auto s2 = l.accept(5s);
  const char text[] = "0000:000011:abcdef:00000000000000000000ffff0a4d0001";
  c2.send_all(std::as_bytes(std::span(text)), steady::now() + 1s);
  const auto w = what_of([&] { (void)s2.recv_message(steady::now() + 5s); });
  CHECK(w.find("ibv_rc_pingpong's text format") != std::string::npos);
}

TEST_CASE("tcp: sending to a peer that has gone fails without killing the process") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto c = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
  { auto s = l.accept(5s); }  // closed by the server
  std::vector<std::byte> big(1 << 20);
  std::string w;
  // The first send may still succeed into the socket buffer; a later one fails (EPIPE/ECONNRESET).
  for (int i = 0; i < 50 && w.empty(); ++i) {
    try {
      c.send_all(big, steady::now() + 2s);
    } catch (const rdx::error& e) {
      w = e.what();
      CHECK((e.code() == std::errc::broken_pipe || e.code() == std::errc::connection_reset));
    }
  }
  CHECK(w.find("send to 127.0.0.1:") == 0);
}

TEST_CASE("tcp: a port in use is reported with a hint") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  try {
    (void)rdx::tcp::listener::bind("127.0.0.1", l.port());
    FAIL("bound a port that is in use");
  } catch (const rdx::error& e) {
    CHECK(e.code() == std::errc::address_in_use);
    CHECK(std::string(e.what()).find("choose another with -p") != std::string::npos);
  }
}

TEST_CASE("tcp: an unresolvable host is an invalid argument") {
  try {
    (void)rdx::tcp::connect("no-such-host.invalid", 18515, 200ms);
    FAIL("connected to an invalid host name");
  } catch (const rdx::error& e) {
    CHECK(e.code() == rdx::errc::invalid_argument);
    CHECK(std::string(e.what()).find("connect to no-such-host.invalid:18515: cannot resolve") == 0);
  }
}

TEST_CASE("tcp: sockets are move-only owners") {
  static_assert(!std::is_copy_constructible_v<rdx::tcp::socket>);
  static_assert(std::is_nothrow_move_constructible_v<rdx::tcp::socket>);
  static_assert(!std::is_copy_constructible_v<rdx::tcp::listener>);
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto c = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
  const int fd = c.native_handle();
  rdx::tcp::socket moved = std::move(c);
  CHECK(!c.is_open());  // NOLINT(bugprone-use-after-move,clang-analyzer-cplusplus.Move): the moved-from state
  CHECK(moved.native_handle() == fd);
  const int raw = moved.release();
  CHECK(!moved.is_open());
  CHECK(::close(raw) == 0);
}
