// Unit tests (no device): the rendezvous of rdx::group on the host's loopback
// TCP, ranks as threads: every rank gets every rank's bytes; a rank that never
// comes, two claims of one rank, a different job size and a rank that leaves
// mid-set-up are named to every rank; a stranger's bytes on the port are
// dropped while the others are served. With rdx::auth: the rendezvous with a
// key (an rdx::auth::psk_key): a job whose ranks hold it gets its table; a
// process with another key, or none, is refused by name and cannot claim a
// rank or fail the job; a rank 0 without the key, or a table whose MAC is
// wrong, is refused by the rank.
#include <rdx/group/rendezvous.hpp>
#if defined(RDX_TEST_AUTH)
#include <rdx/auth/psk.hpp>
#endif

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
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
                 std::chrono::milliseconds timeout, std::uint32_t claimed_size = 0,
                 std::shared_ptr<const rdx::keyed_mac> key = nullptr) {
  outcome o;
  try {
    rdx::group::rank_info me = rdx::group::given(rank, size, 0, 1, "127.0.0.1", port);
    me.size = claimed_size != 0 ? claimed_size : size;  // a rank that disagrees about the size
    o.table = rdx::group::rendezvous(me, bytes_of(rank), {.timeout = timeout, .key = std::move(key)});
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

TEST_CASE("rendezvous: ranks that called long before rank 0 listened still hear its verdict") {
  // Ranks start unevenly on a loaded host: ranks 1 to 7 (5 never comes) call
  // 3 s before rank 0 does, with a 4 s timeout, so their own deadline plus
  // its grace (2 s) ends a second before rank 0's verdict. Rank 0 tells each,
  // once its bytes are in, how long it may still wait: each is told.
  const std::uint16_t port = port_for(14);
  constexpr std::uint32_t n = 8;
  std::vector<outcome> out(n);
  std::vector<std::thread> ts;
  for (std::uint32_t r = 1; r < n; ++r) {
    if (r != 5) ts.emplace_back([&, r] { out[r] = run_rank(r, n, port, 4s); });
  }
  std::this_thread::sleep_for(3s);
  out[0] = run_rank(0, n, port, 4s);
  for (auto& t : ts) t.join();
  CHECK(out[0].code == rdx::errc::timed_out);
  CHECK_THAT(out[0].what, Catch::Contains("rank 5 of 8 never arrived"));
  for (std::uint32_t r = 1; r < n; ++r) {
    if (r == 5) continue;
    INFO("rank " << r << ": " << out[r].what);
    CHECK(out[r].code == rdx::errc::operation_failed);
    CHECK_THAT(out[r].what, Catch::Contains("rank 5 of 8 never arrived"));
  }
}

TEST_CASE("rendezvous: rank 0's word on how long to wait is bounded by the rank's own timeout") {
  // A rank 0 that says "wait an hour", says it again 2 s later and then
  // hangs: the rank waits its timeout (1 s) and the grace (2 s) from the
  // first word, not an hour, and the second does not move it (5 s if it did).
  namespace d = rdx::group::detail;
  const std::uint16_t port = port_for(15);
  std::atomic<bool> done{false};
  std::thread fake([&] {
    auto l = rdx::tcp::listener::bind("127.0.0.1", port);
    rdx::tcp::socket s = l.accept(10s);
    std::vector<std::byte> in(d::rv_hello_size + bytes_of(1).size());
    s.recv_exact(in, rdx::tcp::clock::now() + 5s);
    s.send_all(d::rv_reply_header(d::rv_waiting, 3600u * 1000u), rdx::tcp::clock::now() + 5s);
    std::this_thread::sleep_for(2s);
    s.send_all(d::rv_reply_header(d::rv_waiting, 3600u * 1000u), rdx::tcp::clock::now() + 5s);
    while (!done.load()) std::this_thread::sleep_for(10ms);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const outcome o = run_rank(1, 2, port, 1s);
  const auto took = std::chrono::steady_clock::now() - t0;
  done = true;
  fake.join();
  CHECK(o.code == rdx::errc::timed_out);
  CHECK_THAT(o.what, Catch::Contains("rendezvous reply (rank 0 waits for every rank)"));
  CHECK(took >= 2900ms);
  CHECK(took < 4500ms);
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
  // A table longer than two ranks may hand in (64 KiB each by default):
  // refused before anything is allocated for it.
  auto longer = d::rv_reply_header(d::rv_ok, 2);
  longer.resize(longer.size() + 8);
  d::put64(longer.data() + d::rv_reply_size, 2 * (4 + 65536) + 1);
  o = against(port_for(10), longer);
  CHECK(o.code == rdx::errc::protocol_error);
  CHECK_THAT(o.what, Catch::Contains("a table of 131081 bytes for 2 ranks of at most 65536 bytes each"));
  // A table whose first entry claims more than the table holds (and the limit).
  auto big = d::rv_reply_header(d::rv_ok, 2);
  big.resize(big.size() + 8 + 8);
  d::put64(big.data() + d::rv_reply_size, 8);
  d::put32(big.data() + d::rv_reply_size + 8, 1u << 20);
  o = against(port_for(12), big);
  CHECK(o.code == rdx::errc::protocol_error);
  CHECK_THAT(o.what, Catch::Contains("rank 0's entry runs past the table or above the limit 65536"));
  // Two empty entries and two bytes more than they account for.
  auto extra = d::rv_reply_header(d::rv_ok, 2);
  extra.resize(extra.size() + 8 + 10);
  d::put64(extra.data() + d::rv_reply_size, 10);
  o = against(port_for(13), extra);
  CHECK(o.code == rdx::errc::protocol_error);
  CHECK_THAT(o.what, Catch::Contains("2 bytes past the table's last entry"));
  // A failure reply that claims a megabyte of text.
  o = against(port_for(11), d::rv_reply_header(d::rv_failed, 1u << 20));
  CHECK(o.code == rdx::errc::wire_format);
  CHECK_THAT(o.what, Catch::Contains("a failure reply of 1048576 bytes"));
}

#if defined(RDX_TEST_AUTH)
namespace {
namespace d = rdx::group::detail;

std::shared_ptr<const rdx::keyed_mac> key_of(char c) {
  return rdx::auth::psk_key::from_hex(std::string(64, c));
}

outcome keyed_rank(std::uint32_t rank, std::uint32_t size, std::uint16_t port,
                   std::chrono::milliseconds timeout, std::shared_ptr<const rdx::keyed_mac> key) {
  return run_rank(rank, size, port, timeout, 0, std::move(key));
}

bool whole(const outcome& o, std::uint32_t n) {
  if (!o.table || o.table->size() != n) return false;
  for (std::uint32_t k = 0; k < n; ++k) {
    if ((*o.table)[k] != bytes_of(k)) return false;
  }
  return true;
}
}  // namespace

TEST_CASE("rendezvous with a key: every rank that holds it gets every rank's bytes") {
  constexpr std::uint32_t n = 16;
  const auto key = key_of('a');
  std::vector<outcome> out(n);
  std::vector<std::thread> ts;
  for (std::uint32_t r = 0; r < n; ++r)
    ts.emplace_back([&, r] { out[r] = keyed_rank(r, n, port_for(60), 20s, key); });
  for (auto& t : ts) t.join();
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << out[r].what);
    CHECK(whole(out[r], n));
  }
}

TEST_CASE("rendezvous with a key: an impostor with another key cannot take a rank; the real one can") {
  constexpr std::uint32_t n = 4;
  const auto key = key_of('a');
  std::vector<outcome> out(n);
  std::vector<std::thread> ts;
  // Ranks 0, 1 and 3 first; then a process claiming rank 2 with another key;
  // then the real rank 2.
  for (std::uint32_t r : {0u, 1u, 3u})
    ts.emplace_back([&, r] { out[r] = keyed_rank(r, n, port_for(61), 20s, key); });
  std::this_thread::sleep_for(200ms);
  const outcome impostor = keyed_rank(2, n, port_for(61), 5s, key_of('b'));
  out[2] = keyed_rank(2, n, port_for(61), 20s, key);
  for (auto& t : ts) t.join();
  CHECK(impostor.code == rdx::errc::authentication_failed);
  CHECK_THAT(impostor.what, Catch::Contains("rank 0 refused a process at") &&
                                Catch::Contains("claiming rank 2") && Catch::Contains("holds another key"));
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << out[r].what);
    CHECK(whole(out[r], n));
  }
}

TEST_CASE(
    "rendezvous with a key: a rank with the wrong key is refused, and the job names it at the deadline") {
  constexpr std::uint32_t n = 4;
  const auto key = key_of('a');
  std::vector<outcome> out(n);
  std::vector<std::thread> ts;
  for (std::uint32_t r = 0; r < n; ++r) {
    ts.emplace_back([&, r] { out[r] = keyed_rank(r, n, port_for(62), 1500ms, r == 3 ? key_of('c') : key); });
  }
  for (auto& t : ts) t.join();
  CHECK(out[3].code == rdx::errc::authentication_failed);
  CHECK_THAT(out[3].what, Catch::Contains("holds another key"));
  CHECK(out[0].code == rdx::errc::timed_out);
  CHECK_THAT(out[0].what, Catch::Contains("rank 3 of 4 never arrived") &&
                              Catch::Contains("refused: a process at 127.0.0.1") &&
                              Catch::Contains("claiming rank 3: its MAC is wrong"));
  for (std::uint32_t r = 1; r < 3; ++r) {
    INFO("rank " << r << ": " << out[r].what);
    CHECK(out[r].code == rdx::errc::operation_failed);
    CHECK_THAT(out[r].what, Catch::Contains("rank 3 of 4 never arrived"));
  }
}

TEST_CASE("rendezvous with a key: a key on one side only is refused, naming the fix") {
  // Rank 0 keyed, rank 1 without a key.
  {
    outcome r0, r1;
    std::thread t([&] { r0 = keyed_rank(0, 2, port_for(63), 1500ms, key_of('a')); });
    std::this_thread::sleep_for(100ms);
    r1 = keyed_rank(1, 2, port_for(63), 5s, nullptr);
    t.join();
    CHECK(r1.code == rdx::errc::authentication_failed);
    CHECK_THAT(r1.what, Catch::Contains("rank 0 requires the job's key and it came without one"));
    CHECK(r0.code == rdx::errc::timed_out);
    CHECK_THAT(r0.what, Catch::Contains("came without one"));
  }
  // Rank 0 without a key, rank 1 keyed.
  {
    outcome r0, r1;
    std::thread t([&] { r0 = keyed_rank(0, 2, port_for(64), 1500ms, nullptr); });
    std::this_thread::sleep_for(100ms);
    r1 = keyed_rank(1, 2, port_for(64), 5s, key_of('a'));
    t.join();
    CHECK(r1.code == rdx::errc::authentication_failed);
    CHECK_THAT(r1.what, Catch::Contains("it came with a key and rank 0 has none"));
    CHECK(r0.code == rdx::errc::timed_out);
  }
}

TEST_CASE("rendezvous with a key: unchecked claims cannot fail the job") {
  // Keyed hellos that claim another job size, or a rank beyond it, and then
  // leave: without a checked MAC they are strangers, dropped.
  constexpr std::uint32_t n = 3;
  const std::uint16_t port = port_for(65);
  const auto key = key_of('a');
  std::vector<outcome> out(n);
  std::thread r0([&] { out[0] = keyed_rank(0, n, port, 10s, key); });
  std::this_thread::sleep_for(200ms);
  for (std::uint32_t claim : {7u, 1u}) {
    std::vector<std::byte> h(d::rv_hello_size + d::rv_nonce_size + 4);
    d::put32(h.data(), d::rv_magic);
    d::put16(h.data() + 4, d::rv_version);
    d::put16(h.data() + 6, d::rv_keyed);
    d::put32(h.data() + 8, claim);
    d::put32(h.data() + 12, claim == 7 ? 9 : n);
    d::put32(h.data() + 16, 4);
    rdx::tcp::socket s = rdx::tcp::connect("127.0.0.1", port, 5s);
    s.send_all(h, rdx::tcp::clock::now() + 5s);
    std::array<std::byte, d::rv_reply_size + d::rv_nonce_size> challenge{};
    s.recv_exact(challenge, rdx::tcp::clock::now() + 5s);
    CHECK(d::get16(challenge.data() + 6) == d::rv_challenge);
  }  // each leaves before its MAC
  std::thread r1([&] { out[1] = keyed_rank(1, n, port, 10s, key); });
  out[2] = keyed_rank(2, n, port, 10s, key);
  r1.join();
  r0.join();
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << out[r].what);
    CHECK(whole(out[r], n));
  }
}

TEST_CASE("rendezvous with a key: a table whose MAC is wrong is refused") {
  // A fake rank 0 that asks for the key, takes any proof and sends a table
  // with a MAC it made up.
  const std::uint16_t port = port_for(66);
  std::thread fake([port] {
    auto l = rdx::tcp::listener::bind("127.0.0.1", port);
    rdx::tcp::socket s = l.accept(10s);
    std::vector<std::byte> in(d::rv_hello_size + d::rv_nonce_size + bytes_of(1).size());
    s.recv_exact(in, rdx::tcp::clock::now() + 5s);
    auto c = d::rv_reply_header(d::rv_challenge, 32);
    c.resize(c.size() + 32);
    s.send_all(c, rdx::tcp::clock::now() + 5s);
    std::array<std::byte, 32> proof{};
    s.recv_exact(proof, rdx::tcp::clock::now() + 5s);
    auto t = d::rv_reply_header(d::rv_ok, 2);
    t.resize(t.size() + 8 + 8 + 32);  // two empty entries, then 32 bytes of "MAC"
    d::put64(t.data() + d::rv_reply_size, 8);
    s.send_all(t, rdx::tcp::clock::now() + 5s);
    std::byte end[1];
    (void)::recv(s.native_handle(), end, 1, 0);
  });
  const outcome o = keyed_rank(1, 2, port, 5s, key_of('a'));
  fake.join();
  CHECK(o.code == rdx::errc::authentication_failed);
  CHECK_THAT(o.what, Catch::Contains("the table's MAC is wrong"));
}
#endif
