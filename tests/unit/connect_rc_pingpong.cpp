// ibv_rc_pingpong's address exchange: exact bytes, strict parsing, and both
// roles over TCP on localhost, byte for byte as ibv_rc_pingpong does them.
#include <rdx/connect/rc_pingpong_exchange.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <future>
#include <string>

#include <sys/socket.h>
#include <unistd.h>

using namespace std::chrono_literals;
namespace rcp = rdx::rc_pingpong;

namespace {

rdx::endpoint roce_endpoint() {
  rdx::endpoint e;
  const unsigned char gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1};
  std::memcpy(e.gid.raw, gid, 16);
  e.lid = 0;
  e.qpn = 0x11;
  e.psn = 0xabcdef;
  return e;
}

rcp::message_t from_text(const char (&text)[rcp::message_size]) {
  rcp::message_t m{};
  std::memcpy(m.data(), text, rcp::message_size);
  return m;
}

void require_parse_error(const rcp::message_t& m, const std::string& needle) {
  try {
    (void)rcp::parse(m);
    FAIL("parse accepted a bad message; expected \"" << needle << "\"");
  } catch (const rdx::error& e) {
    INFO(e.what());
    CHECK(e.code() == rdx::errc::wire_format);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("rc_pingpong: the message is the text ibv_rc_pingpong prints, NUL included") {
  const auto m = rcp::format(roce_endpoint());
  static_assert(rcp::message_size == sizeof "0000:000000:000000:00000000000000000000000000000000");
  CHECK(std::string(m.data()) == "0000:000011:abcdef:00000000000000000000ffff0a4d0001");
  CHECK(m[rcp::message_size - 1] == '\0');

  rdx::endpoint ib;
  ib.lid = 0x1a2b;
  ib.qpn = 0xffffff;
  ib.psn = 0;
  CHECK(std::string(rcp::format(ib).data()) == "1a2b:ffffff:000000:00000000000000000000000000000000");
}

TEST_CASE("rc_pingpong: parse inverts format and takes the agreed MTU") {
  const auto e = roce_endpoint();
  const auto back = rcp::parse(rcp::format(e), IBV_MTU_4096);
  CHECK(std::memcmp(back.gid.raw, e.gid.raw, 16) == 0);
  CHECK(back.lid == e.lid);
  CHECK(back.qpn == e.qpn);
  CHECK(back.psn == e.psn);
  CHECK(back.mtu == IBV_MTU_4096);
  CHECK(rcp::parse(rcp::format(e)).mtu == IBV_MTU_1024);
  // Upper-case hex digits are accepted as well.
  const auto up = rcp::parse(from_text("00AB:0000FF:ABCDEF:FE800000000000000000000000000001"));
  CHECK(up.lid == 0xab);
  CHECK(up.qpn == 0xff);
  CHECK(up.gid.raw[0] == 0xfe);
  CHECK(up.gid.raw[15] == 0x01);
}

TEST_CASE("rc_pingpong: malformed messages are rejected with the position") {
  require_parse_error(from_text("0000-000011:abcdef:00000000000000000000ffff0a4d0001"),
                      "expected ':' at byte 4");
  require_parse_error(from_text("0000:000011:abcdef-00000000000000000000ffff0a4d0001"),
                      "expected ':' at byte 18");
  require_parse_error(from_text("00g0:000011:abcdef:00000000000000000000ffff0a4d0001"), "byte 2 of the LID");
  require_parse_error(from_text("0000:0000x1:abcdef:00000000000000000000ffff0a4d0001"),
                      "byte 9 of the QP number");
  require_parse_error(from_text("0000:000011:abcde :00000000000000000000ffff0a4d0001"), "byte 17 of the PSN");
  require_parse_error(from_text("0000:000011:abcdef:00000000000000000000ffff0a4d00z1"), "byte 49 of the GID");
  auto no_nul = rcp::format(roce_endpoint());
  no_nul[rcp::message_size - 1] = '1';
  require_parse_error(no_nul, "does not end with a NUL");
  auto rdx_msg = rcp::format(roce_endpoint());
  std::memcpy(rdx_msg.data(), "RDXE", 4);
  require_parse_error(rdx_msg, "rdx's own wire format");
  const char short_msg[10] = "0000:0000";
  try {
    (void)rcp::parse(std::span<const char>(short_msg, sizeof short_msg));
    FAIL("parsed a short message");
  } catch (const rdx::error& e) {
    CHECK(std::string(e.what()).find("10 bytes, expected 52") != std::string::npos);
  }
}

TEST_CASE("rc_pingpong: format refuses fields wider than the text allows") {
  auto e = roce_endpoint();
  e.qpn = 0x1000000;
  CHECK_THROWS_AS(rcp::format(e), rdx::error);
}

TEST_CASE("rc_pingpong: rdx client and rdx server exchange in ibv_rc_pingpong's order") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  rdx::endpoint client_ep = roce_endpoint();
  client_ep.qpn = 0x22;
  rdx::endpoint server_ep = roce_endpoint();
  server_ep.qpn = 0x33;

  auto client = std::async(std::launch::async, [&] {
    auto s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    return rcp::client_exchange(s, client_ep, IBV_MTU_1024, 5s);
  });
  auto s = l.accept(5s);
  bool connected = false;
  const auto from_client = rcp::server_exchange(
      s, server_ep,
      [&](const rdx::endpoint& remote) {
        CHECK(remote.qpn == 0x22);
        connected = true;
      },
      IBV_MTU_1024, 5s);
  CHECK(connected);
  CHECK(from_client.qpn == 0x22);
  CHECK(client.get().qpn == 0x33);
}

// The byte sequence of ibv_rc_pingpong's own client: one 52-byte write, one
// read of the server's 52 bytes, then "done" and its NUL, then close.
TEST_CASE("rc_pingpong: rdx server against ibv_rc_pingpong's client byte sequence") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto peer = std::async(std::launch::async, [&] {
    auto s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    const char mine[] = "0000:000abc:123456:00000000000000000000ffff0a4d0002";
    if (::write(s.native_handle(), mine, sizeof mine) != sizeof mine) {
      return std::string("write failed");
    }
    char theirs[rcp::message_size] = {};
    std::size_t got = 0;
    while (got < sizeof theirs) {
      const ssize_t n = ::read(s.native_handle(), theirs + got, sizeof theirs - got);
      if (n <= 0) {
        return std::string("read failed");
      }
      got += static_cast<std::size_t>(n);
    }
    if (::write(s.native_handle(), "done", sizeof "done") != sizeof "done") {
      return std::string("write failed");
    }
    return std::string(theirs, sizeof theirs - 1);
  });
  auto s = l.accept(5s);
  const auto remote = rcp::server_exchange(
      s, roce_endpoint(), [](const rdx::endpoint&) {}, IBV_MTU_1024, 5s);
  CHECK(remote.qpn == 0xabc);
  CHECK(remote.psn == 0x123456);
  CHECK(remote.gid.raw[15] == 2);
  CHECK(peer.get() == "0000:000011:abcdef:00000000000000000000ffff0a4d0001");
}

// ibv_rc_pingpong's server: one read of 52 bytes, its answer, then a read
// that must return exactly the 5 bytes of "done".
TEST_CASE("rc_pingpong: rdx client against ibv_rc_pingpong's server byte sequence") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto client = std::async(std::launch::async, [&] {
    auto s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    return rcp::client_exchange(s, roce_endpoint(), IBV_MTU_1024, 5s);
  });
  auto s = l.accept(5s);
  char msg[rcp::message_size] = {};
  std::size_t got = 0;
  while (got < sizeof msg) {
    const ssize_t n = ::read(s.native_handle(), msg + got, sizeof msg - got);
    REQUIRE(n > 0);
    got += static_cast<std::size_t>(n);
  }
  CHECK(std::string(msg) == "0000:000011:abcdef:00000000000000000000ffff0a4d0001");
  const char mine[] = "0000:000def:654321:00000000000000000000ffff0a4d0002";
  REQUIRE(::write(s.native_handle(), mine, sizeof mine) == sizeof mine);
  char done[rcp::message_size] = {};
  std::size_t d = 0;
  for (;;) {
    const ssize_t n = ::read(s.native_handle(), done + d, sizeof done - d);
    REQUIRE(n >= 0);
    if (n == 0) {
      break;
    }
    d += static_cast<std::size_t>(n);
  }
  CHECK(d == sizeof "done");
  CHECK(std::memcmp(done, "done", sizeof "done") == 0);
  const auto remote = client.get();
  CHECK(remote.qpn == 0xdef);
  CHECK(remote.psn == 0x654321);
}

TEST_CASE("rc_pingpong: an rdx-format peer is refused at once, not after a timeout") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto c = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
  auto s = l.accept(5s);
  const auto bytes = rdx::wire::encode(roce_endpoint());  // 48 bytes: fewer than 52
  c.send_all(bytes, rdx::tcp::clock::now() + 1s);
  const auto t0 = rdx::tcp::clock::now();
  try {
    (void)rcp::server_exchange(
        s, roce_endpoint(), [](const rdx::endpoint&) {}, IBV_MTU_1024, 10s);
    FAIL("accepted an rdx wire message as an ibv_rc_pingpong address");
  } catch (const rdx::error& e) {
    CHECK(e.code() == rdx::errc::wire_format);
    CHECK(std::string(e.what()).find("rdx's own wire format") != std::string::npos);
  }
  CHECK(rdx::tcp::clock::now() - t0 < 5s);
}

TEST_CASE("rc_pingpong: a server that gets no \"done\" reports it") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto peer = std::async(std::launch::async, [&] {
    auto s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    const auto m = rcp::format(roce_endpoint());
    s.send_all(std::as_bytes(std::span(m)), rdx::tcp::clock::now() + 1s);
    rcp::message_t in{};
    s.recv_exact(std::as_writable_bytes(std::span(in)), rdx::tcp::clock::now() + 5s);
    const char bad[5] = {'n', 'o', 'p', 'e', '\0'};
    s.send_all(std::as_bytes(std::span(bad)), rdx::tcp::clock::now() + 1s);
  });
  auto s = l.accept(5s);
  try {
    (void)rcp::server_exchange(
        s, roce_endpoint(), [](const rdx::endpoint&) {}, IBV_MTU_1024, 5s);
    FAIL("accepted a wrong \"done\"");
  } catch (const rdx::error& e) {
    CHECK(std::string(e.what()).find("expected \"done\"") != std::string::npos);
  }
  peer.get();
}

TEST_CASE("rc_pingpong: damaged messages parse to the same text or fail cleanly") {
  std::uint64_t state = 0x2545f4914f6cdd1dull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const auto good = rcp::format(roce_endpoint());
  for (int round = 0; round < 20000; ++round) {
    auto m = good;
    m[next() % m.size()] = static_cast<char>(next() & 0xff);
    try {
      const auto e = rcp::parse(m);
      // Whatever parses formats back to the same text, up to letter case.
      auto back = rcp::format(e);
      for (std::size_t i = 0; i < m.size(); ++i) {
        const char a = m[i] >= 'A' && m[i] <= 'F' ? static_cast<char>(m[i] - 'A' + 'a') : m[i];
        REQUIRE(a == back[i]);
      }
    } catch (const rdx::error& e) {
      REQUIRE(e.code() == rdx::errc::wire_format);
    }
  }
}

TEST_CASE("rc_pingpong: check_done takes exactly \"done\" and a NUL") {
  rcp::check_done(rcp::done_message);
  const char bad[5] = {'d', 'o', 'n', 'E', '\0'};
  const char short_done[4] = {'d', 'o', 'n', 'e'};
  for (std::span<const char> in : {std::span<const char>(bad), std::span<const char>(short_done)}) {
    try {
      rcp::check_done(in);
      FAIL("accepted a wrong \"done\"");
    } catch (const rdx::error& e) {
      CHECK(e.code() == rdx::errc::wire_format);
      CHECK(std::string(e.what()).find("expected \"done\"") != std::string::npos);
    }
  }
}
