// ibv_rc_pingpong's address exchange: exact bytes, strict parsing, and both
// roles over TCP on localhost, byte for byte as ibv_rc_pingpong does them.
#include <rdx/connect/rc_pingpong_exchange.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

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

// Reads from a raw descriptor until `n` bytes or the end of the stream (or
// an error); returns how many came.
std::size_t read_raw(int fd, char* buf, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, buf + got, n - got);
    if (r <= 0) {
      break;
    }
    got += static_cast<std::size_t>(r);
  }
  return got;
}

// Checks in the fake peer's thread, where Catch's assertions may not run:
// a failure throws, and the future hands it to the test's thread.
void must(bool ok, const char* what) {
  if (!ok) {
    throw std::runtime_error(std::string("fake peer: ") + what);
  }
}

void write_all(int fd, const char* data, std::size_t n) {
  must(::write(fd, data, n) == static_cast<ssize_t>(n), "write failed");
}

// Sends `bytes` one at a time, `gap` before each; stops at the first failed
// send (the other side has closed).
void trickle(int fd, std::span<const char> bytes, std::chrono::milliseconds gap) {
  for (const char c : bytes) {
    std::this_thread::sleep_for(gap);
    if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) {
      return;
    }
  }
}

constexpr char client_address[] = "0000:000abc:123456:00000000000000000000ffff0a4d0002";
constexpr char server_address[] = "0000:000011:abcdef:00000000000000000000ffff0a4d0001";

struct server_run {
  std::error_code code;    // empty when server_exchange returned
  std::string what;        // its message otherwise
  bool connected = false;  // whether the connect step ran
  std::size_t unread = 0;  // bytes of the server's that the fake client had not read itself
  std::chrono::duration<double> elapsed{};
};

// Runs server_exchange (rdx's address is server_address) against a fake
// client: `send(fd)` plays its part, then it reads what the server still
// sends until the server closes. `on_connect` runs in the connect step.
template <class Send, class OnConnect>
server_run run_server(Send send, std::chrono::milliseconds timeout, OnConnect on_connect) {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto peer = std::async(std::launch::async, [&] {
    auto c = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    send(c.native_handle());
    char rest[2 * rcp::message_size];
    return read_raw(c.native_handle(), rest, sizeof rest);
  });
  server_run r;
  {
    auto s = l.accept(5s);
    const auto t0 = rdx::tcp::clock::now();
    try {
      (void)rcp::server_exchange(
          s, roce_endpoint(),
          [&](const rdx::endpoint& remote) {
            r.connected = true;
            on_connect(remote);
          },
          IBV_MTU_1024, timeout);
    } catch (const rdx::error& e) {
      r.code = e.code();
      r.what = e.what();
    }
    r.elapsed = rdx::tcp::clock::now() - t0;
  }  // closes the server's socket: the fake client's read ends
  r.unread = peer.get();
  return r;
}

template <class Send>
server_run run_server(Send send, std::chrono::milliseconds timeout) {
  return run_server(send, timeout, [](const rdx::endpoint&) {});
}

// The server failed with `code`, saying `needle`, and never connected.
void require_failed_unconnected(const server_run& r, rdx::errc code, const std::string& needle) {
  INFO(r.what);
  REQUIRE(static_cast<bool>(r.code));
  CHECK(r.code == code);
  CHECK(r.what.find(needle) != std::string::npos);
  CHECK_FALSE(r.connected);
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
    if (::write(s.native_handle(), client_address, sizeof client_address) != sizeof client_address) {
      return std::string("write failed");
    }
    char theirs[rcp::message_size] = {};
    if (read_raw(s.native_handle(), theirs, sizeof theirs) != sizeof theirs) {
      return std::string("read failed");
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
  CHECK(peer.get() == server_address);
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
  REQUIRE(read_raw(s.native_handle(), msg, sizeof msg) == sizeof msg);
  CHECK(std::string(msg) == "0000:000011:abcdef:00000000000000000000ffff0a4d0001");
  const char mine[] = "0000:000def:654321:00000000000000000000ffff0a4d0002";
  REQUIRE(::write(s.native_handle(), mine, sizeof mine) == sizeof mine);
  char done[rcp::message_size] = {};
  const std::size_t d = read_raw(s.native_handle(), done, sizeof done);  // until the client closes
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

TEST_CASE("rc_pingpong: a server that gets no \"done\" reports it and does not connect") {
  const auto r = run_server(
      [](int fd) {
        write_all(fd, client_address, sizeof client_address);
        char in[rcp::message_size];
        must(read_raw(fd, in, sizeof in) == sizeof in, "no answer");
        write_all(fd, "nope", sizeof "nope");
      },
      5s);
  require_failed_unconnected(r, rdx::errc::wire_format, "expected \"done\"");
}

// The server's connect step comes after the whole exchange: the fake client
// has its answer and has sent "done" when it runs, and not before.
TEST_CASE("rc_pingpong: the server connects only after its answer is out and \"done\" is in") {
  std::atomic<bool> answered{false};
  std::atomic<bool> done_sent{false};
  std::atomic<bool> connected{false};
  bool connected_before_done = true;
  std::string answer;
  const auto r = run_server(
      [&](int fd) {
        write_all(fd, client_address, sizeof client_address);
        char in[rcp::message_size] = {};
        must(read_raw(fd, in, sizeof in) == sizeof in, "no answer");
        answer.assign(in, sizeof in - 1);
        answered = true;
        std::this_thread::sleep_for(300ms);  // time enough for a connect step that does not wait
        connected_before_done = connected;
        done_sent = true;
        write_all(fd, "done", sizeof "done");
      },
      5s,
      [&](const rdx::endpoint& remote) {
        CHECK(answered.load());
        CHECK(done_sent.load());
        CHECK(remote.qpn == 0xabc);
        connected = true;
      });
  INFO(r.what);
  CHECK_FALSE(static_cast<bool>(r.code));
  CHECK(r.connected);
  CHECK_FALSE(connected_before_done);
  CHECK(answer == server_address);
}

TEST_CASE("rc_pingpong: a malformed or partial address fails the server before any connect step") {
  SECTION("a malformed address: no answer is sent") {
    const auto r = run_server(
        [](int fd) {
          const char bad[] = "0000:000abc-123456:00000000000000000000ffff0a4d0002";
          write_all(fd, bad, sizeof bad);
        },
        5s);
    require_failed_unconnected(r, rdx::errc::wire_format, "expected ':' at byte 11");
    CHECK(r.unread == 0);
  }
  SECTION("part of an address, then the client closes its side") {
    const auto r = run_server(
        [](int fd) {
          write_all(fd, client_address, 30);
          must(::shutdown(fd, SHUT_WR) == 0, "shutdown failed");
        },
        5s);
    require_failed_unconnected(r, rdx::errc::wire_format, "peer closed the connection");
    CHECK(r.unread == 0);
  }
  SECTION("part of an address, then silence") {
    const auto r = run_server([](int fd) { write_all(fd, client_address, 30); }, 500ms);
    require_failed_unconnected(r, rdx::errc::timed_out, "receive address");
    CHECK(r.unread == 0);
  }
}

// One deadline for the whole exchange, not a fresh one per step or per byte.
TEST_CASE("rc_pingpong: a slow client meets the server's one deadline") {
  SECTION("one byte per 100 ms does not extend it") {
    const auto r =
        run_server([](int fd) { trickle(fd, std::span(client_address, sizeof client_address), 100ms); }, 1s);
    require_failed_unconnected(r, rdx::errc::timed_out, "receive address");
    CHECK(r.elapsed >= 950ms);
    CHECK(r.elapsed < 3s);
  }
  SECTION("steps that each fit in the timeout do not, together") {
    // About 0.7 s for the address, then 0.5 s for "done": 1.2 s in all.
    const auto r = run_server(
        [](int fd) {
          constexpr std::size_t late = 7;
          write_all(fd, client_address, sizeof client_address - late);
          trickle(fd, std::span(client_address + sizeof client_address - late, late), 100ms);
          char in[rcp::message_size];
          must(read_raw(fd, in, sizeof in) == sizeof in, "no answer");
          trickle(fd, rcp::done_message, 100ms);
        },
        1s);
    require_failed_unconnected(r, rdx::errc::timed_out, "receive \"done\"");
    CHECK(r.elapsed >= 950ms);
    CHECK(r.elapsed < 3s);
  }
}

TEST_CASE("rc_pingpong: a slow server meets the client's one deadline") {
  auto l = rdx::tcp::listener::bind("127.0.0.1", 0);
  auto client = std::async(std::launch::async, [&] {
    auto s = rdx::tcp::connect("127.0.0.1", l.port(), 5s);
    const auto t0 = rdx::tcp::clock::now();
    try {
      (void)rcp::client_exchange(s, roce_endpoint(), IBV_MTU_1024, 1s);
      return std::pair(std::string("returned"), rdx::tcp::clock::now() - t0);
    } catch (const rdx::error& e) {
      return std::pair(std::string(e.what()), rdx::tcp::clock::now() - t0);
    }
  });
  auto s = l.accept(5s);
  char in[rcp::message_size];
  REQUIRE(read_raw(s.native_handle(), in, sizeof in) == sizeof in);
  trickle(s.native_handle(), std::span(server_address, sizeof server_address),
          100ms);  // until the client closes
  const auto [what, elapsed] = client.get();
  INFO(what);
  CHECK(what.find("receive address") != std::string::npos);
  CHECK(what.find("timed out") != std::string::npos);
  CHECK(elapsed >= 950ms);
  CHECK(elapsed < 3s);
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
