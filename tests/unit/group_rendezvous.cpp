// Unit tests (no device): the rendezvous of rdx::group on the host's loopback
// TCP, ranks as threads: every rank gets every rank's bytes; a rank that never
// comes, two claims of one rank, a different job size and a rank that leaves
// mid-set-up are named to every rank; a stranger's bytes on the port are
// dropped while the others are served.
#include <rdx/group/rendezvous.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/socket.h>

using namespace std::chrono_literals;

namespace {
// Ports of their own (loopback): one per case, so that a case never meets
// the last one's listener in TIME_WAIT.
std::uint16_t port_for(int k) {
  return static_cast<std::uint16_t>(24100 + k);
}

std::vector<std::byte> bytes_of(std::uint32_t rank) {
  std::vector<std::byte> b(16 + rank % 13);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(rank * 31 + i);
  return b;
}

struct outcome {
  std::optional<rdx::group::rendezvous_table> table;
  std::error_code code;
  std::string what;
};

outcome run_rank(std::uint32_t rank, std::uint32_t size, std::uint16_t port,
                 std::chrono::milliseconds timeout, std::uint32_t claimed_size = 0) {
  outcome o;
  try {
    rdx::group::rank_info me = rdx::group::given(rank, size, 0, 1, "127.0.0.1", port);
    me.size = claimed_size != 0 ? claimed_size : size;  // a rank that disagrees about the size
    o.table = rdx::group::rendezvous(me, bytes_of(rank), {.timeout = timeout});
  } catch (const rdx::error& e) {
    o.code = e.code();
    o.what = e.what();
  }
  return o;
}

// Runs ranks [0, size) as threads, `skip` left out, `twice` run twice.
std::vector<outcome> run_job(std::uint32_t size, std::uint16_t port, std::chrono::milliseconds timeout,
                             std::optional<std::uint32_t> skip = {}, std::optional<std::uint32_t> twice = {},
                             std::optional<std::uint32_t> wrong_size = {}) {
  std::vector<outcome> out(size + 1);
  std::vector<std::thread> ts;
  for (std::uint32_t r = 0; r < size; ++r) {
    if (skip && *skip == r) continue;
    const std::uint32_t claimed = wrong_size && *wrong_size == r ? size + 1 : 0;
    ts.emplace_back([&, r, claimed] { out[r] = run_rank(r, size, port, timeout, claimed); });
  }
  if (twice) ts.emplace_back([&] { out[size] = run_rank(*twice, size, port, timeout); });
  for (auto& t : ts) t.join();
  return out;
}

// A raw client on the port: sends `bytes`, then closes (or keeps the
// socket open until `hold` has passed).
void raw_client(std::uint16_t port, std::vector<std::byte> bytes, std::chrono::milliseconds hold = 0ms) {
  rdx::tcp::socket s = rdx::tcp::connect("127.0.0.1", port, 10s);
  s.send_all(bytes, rdx::tcp::clock::now() + 5s);
  std::this_thread::sleep_for(hold);
}

// A rank told why the job failed, or one that came after rank 0 had given up
// (its connection refused, closed, or reset from the closed listener's
// backlog): both are fine, a table is not.
bool told_or_late(const outcome& o, const std::string& why) {
  return !o.table &&
         (o.what.find(why) != std::string::npos || o.what.find("connect to") != std::string::npos ||
          o.what.find("closed the connection") != std::string::npos ||
          o.what.find("reset by peer") != std::string::npos);
}

std::vector<std::byte> hello(std::uint32_t rank, std::uint32_t size, std::uint32_t length) {
  std::vector<std::byte> h(rdx::group::detail::rv_hello_size);
  rdx::group::detail::put32(h.data(), rdx::group::detail::rv_magic);
  rdx::group::detail::put16(h.data() + 4, rdx::group::detail::rv_version);
  rdx::group::detail::put32(h.data() + 8, rank);
  rdx::group::detail::put32(h.data() + 12, size);
  rdx::group::detail::put32(h.data() + 16, length);
  return h;
}
}  // namespace

TEST_CASE("rendezvous: every rank gets every rank's bytes, indexed by rank") {
  constexpr std::uint32_t n = 64;
  const auto out = run_job(n, port_for(0), 20s);
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << out[r].what);
    REQUIRE(out[r].table.has_value());
    REQUIRE(out[r].table->size() == n);
    for (std::uint32_t k = 0; k < n; ++k) CHECK((*out[r].table)[k] == bytes_of(k));
  }
}

TEST_CASE("rendezvous: a job of one rank needs no address; bad input is refused before any socket") {
  const auto t = rdx::group::rendezvous(rdx::group::given(0, 1, 0, 1), bytes_of(0));
  REQUIRE(t.size() == 1);
  CHECK(t[0] == bytes_of(0));
  CHECK_THROWS_WITH(rdx::group::rendezvous(rdx::group::given(1, 2, 0, 1), bytes_of(1)),
                    Catch::Contains("no rendezvous address"));
  CHECK_THROWS_WITH(rdx::group::rendezvous(rdx::group::given(1, 2, 0, 1, "127.0.0.1", port_for(1)),
                                           std::vector<std::byte>(100), {.max_bytes = 64}),
                    Catch::Contains("100 bytes to hand in, above max_bytes 64"));
}

TEST_CASE("rendezvous: a rank that never comes is named to every rank within the deadline") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = run_job(8, port_for(2), 1500ms, /*skip=*/5u);
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(out[0].code == rdx::errc::timed_out);
  CHECK_THAT(out[0].what, Catch::Contains("rank 5 of 8 never arrived") && Catch::Contains("(7 did)"));
  for (std::uint32_t r = 1; r < 8; ++r) {
    if (r == 5) continue;
    INFO("rank " << r << ": " << out[r].what);
    CHECK(out[r].code == rdx::errc::operation_failed);  // every other rank was there: each is told
    CHECK_THAT(out[r].what, Catch::Contains("rank 5 of 8 never arrived"));
  }
  CHECK(took < 5s);
}

TEST_CASE("rendezvous: two processes claiming one rank fail the job, naming both") {
  // Rank 5 stays away, so the job cannot complete before both claims are in.
  const auto out = run_job(6, port_for(3), 10s, /*skip=*/5u, /*twice=*/3u);
  CHECK(out[0].code == rdx::errc::invalid_argument);
  CHECK_THAT(out[0].what, Catch::Contains("two processes claim rank 3"));
  int told = 0;
  for (std::uint32_t r = 1; r <= 6; ++r) {
    if (r == 5) continue;
    INFO("rank " << r << ": " << out[r].what);
    CHECK(told_or_late(out[r], "two processes claim rank 3"));
    if (out[r].what.find("two processes claim rank 3") != std::string::npos) ++told;
  }
  CHECK(told >= 1);  // the claimant that came second at least (its hello was the news)
}

TEST_CASE("rendezvous: a rank that says the job has another size fails it") {
  const auto out = run_job(4, port_for(4), 10s, {}, {}, /*wrong_size=*/2u);
  CHECK_THAT(out[0].what,
             Catch::Contains("rank 2") && Catch::Contains("says the job has 5 ranks, rank 0 says 4"));
  for (std::uint32_t r = 1; r < 4; ++r) {
    INFO("rank " << r << ": " << out[r].what);
    CHECK(told_or_late(out[r], "says the job has 5 ranks"));
  }
}

TEST_CASE("rendezvous: a stranger's bytes and an oversized hello are dropped, the others served") {
  const std::uint16_t port = port_for(5);
  std::vector<outcome> out;
  // Rank 3 comes last, after the strangers: the job waits for it meanwhile.
  std::thread job([&] { out = run_job(4, port, 10s, /*skip=*/3u); });
  std::this_thread::sleep_for(200ms);
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  CHECK_NOTHROW(raw_client(
      port, std::vector<std::byte>(reinterpret_cast<const std::byte*>(http.data()),
                                   reinterpret_cast<const std::byte*>(http.data()) + http.size())));
  CHECK_NOTHROW(raw_client(port, hello(1, 4, 1u << 30)));      // claims a gigabyte: not a rank of ours
  CHECK_NOTHROW(raw_client(port, std::vector<std::byte>(3)));  // closes halfway through a hello
  std::this_thread::sleep_for(100ms);
  const outcome last = run_rank(3, 4, port, 10s);
  job.join();
  out[3] = last;
  for (std::uint32_t r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << out[r].what);
    CHECK(out[r].table.has_value());
  }
}

TEST_CASE("rendezvous: a rank that leaves after its hello is named to every rank") {
  const std::uint16_t port = port_for(6);
  std::vector<outcome> out;
  std::thread job([&] { out = run_job(5, port, 10s, /*skip=*/4u); });
  std::this_thread::sleep_for(200ms);
  auto h = hello(4, 5, 100);
  h.resize(h.size() + 10);  // 10 of its 100 bytes, then gone
  CHECK_NOTHROW(raw_client(port, h));
  job.join();
  CHECK(out[0].code == rdx::errc::peer_disconnected);
  CHECK_THAT(out[0].what, Catch::Contains("rank 4") && Catch::Contains("left during set-up"));
  for (std::uint32_t r = 1; r < 4; ++r) {
    INFO("rank " << r << ": " << out[r].what);
    CHECK(told_or_late(out[r], "left during set-up"));
  }
}

TEST_CASE("rendezvous: a rank whose rank 0 never listens fails within its deadline, naming the address") {
  const auto t0 = std::chrono::steady_clock::now();
  const outcome o = run_rank(1, 2, port_for(7), 800ms);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK_FALSE(o.table.has_value());
  CHECK_THAT(o.what, Catch::Contains("127.0.0.1:" + std::to_string(port_for(7))));
}

TEST_CASE("rendezvous: a rank refuses a reply that is not rdx::group's, or claims what it cannot be") {
  // A fake rank 0: takes the hello and the bytes, answers with `reply`.
  auto against = [](std::uint16_t port, std::vector<std::byte> reply) {
    std::thread fake([port, reply] {
      auto l = rdx::tcp::listener::bind("127.0.0.1", port);
      rdx::tcp::socket s = l.accept(10s);
      std::vector<std::byte> in(rdx::group::detail::rv_hello_size + bytes_of(1).size());
      s.recv_exact(in, rdx::tcp::clock::now() + 5s);
      s.send_all(reply, rdx::tcp::clock::now() + 5s);
      std::byte end[1];
      (void)::recv(s.native_handle(), end, 1, 0);  // until the rank closes
    });
    const outcome o = run_rank(1, 2, port, 5s);
    fake.join();
    return o;
  };
  namespace d = rdx::group::detail;
  // Another program's bytes.
  std::vector<std::byte> http(d::rv_reply_size, std::byte{'H'});
  outcome o = against(port_for(8), http);
  CHECK(o.code == rdx::errc::wire_format);
  CHECK_THAT(o.what, Catch::Contains("not rdx::group's"));
  // A table of 3 ranks for a job of 2.
  o = against(port_for(9), d::rv_reply_header(d::rv_ok, 3));
  CHECK(o.code == rdx::errc::protocol_error);
  CHECK_THAT(o.what, Catch::Contains("a table of 3 ranks for a job of 2"));
  // An entry above the byte limit (64 KiB by default).
  auto big = d::rv_reply_header(d::rv_ok, 2);
  big.resize(big.size() + 4);
  d::put32(big.data() + d::rv_reply_size, 1u << 20);
  o = against(port_for(10), big);
  CHECK(o.code == rdx::errc::protocol_error);
  CHECK_THAT(o.what, Catch::Contains("rank 0's entry of 1048576 bytes is above the limit 65536"));
  // A failure reply that claims a megabyte of text.
  o = against(port_for(11), d::rv_reply_header(d::rv_failed, 1u << 20));
  CHECK(o.code == rdx::errc::wire_format);
  CHECK_THAT(o.what, Catch::Contains("a failure reply of 1048576 bytes"));
}
