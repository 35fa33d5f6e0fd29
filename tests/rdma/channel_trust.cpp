// rdma tests: least privilege and hostile peers (docs/design.md, "Trust").
// A grant is a type 2 memory window per queue pair over exactly its range:
// the NIC refuses a byte outside it, a key used on another connection, and
// any access after revoke(); keys are random, never stepped. Queue pairs
// enable only what the grants need. Bad peer input fails with a message that
// says what arrived. Each negative case uses a fresh pair: the peer's access
// error breaks its connection.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "channel_support.hpp"

using namespace std::chrono_literals;
using channel_test::pair;
using rdx::rights;
using clk = std::chrono::steady_clock;

namespace {

using namespace channel_test::trust_case;

// A 1 MiB region filled with 0xAA and the remote write that is expected to fail.
struct subrange {
  pair p{rdx::connection_attr{.recv_depth = 4}};
  rdx::registered_buffer<std::byte> region = rdx::make_window_buffer<std::byte>(p.pd, region_bytes);
  rdx::registered_buffer<std::byte> src{p.pd, 4096};
  std::optional<rdx::grant<std::byte, rw>> g;
  explicit subrange(rdx::grant_options opt = {}) {
    std::memset(region.data(), 0xAA, region_bytes);
    std::memset(src.data(), 0x55, 4096);
    g.emplace(p.b, region.region(), std::span<std::byte>(region.data() + grant_at, grant_bytes), opt);
  }
  // Every byte outside [grant_at, grant_at + inside) is still 0xAA.
  [[nodiscard]] std::size_t changed_outside(std::size_t inside) const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < region_bytes; ++i) {
      if ((i < grant_at || i >= grant_at + inside) && region[i] != std::byte{0xAA}) ++n;
    }
    return n;
  }
};

// Drives both connections for a while (the granting side's view of a peer's error).
void settle(pair& p, std::chrono::milliseconds d = 300ms) {
  const auto end = clk::now() + d;
  while (clk::now() < end) {
    p.a.progress();
    p.b.progress();
  }
}

}  // namespace

TEST_CASE("a sub-range grant: one byte past it fails at the NIC and nothing outside changes", "[grant]") {
  subrange s;
  const rdx::window_descriptor d = s.g->descriptor();
  CHECK(d.memory.length == grant_bytes);
  CHECK(d.memory.addr == reinterpret_cast<std::uint64_t>(s.region.data() + grant_at));
  REQUIRE(s.g->backing() == rdx::grant_backing::memory_window);
  CHECK(d.memory.rkey != s.region.region().rkey());
  INFO(s.g->description());
  CHECK(s.g->description().find("type 2 memory window") != std::string::npos);

  // The whole grant is reachable.
  rdx::remote_window<std::byte, rw> w(s.p.a, d);
  REQUIRE(w.write(rdx::local_span<const std::byte>(s.src).subspan(0, grant_bytes), 0).wait(20s) ==
          std::error_code{});
  rdx::registered_buffer<std::byte> back(s.p.pd, grant_bytes);
  REQUIRE(w.read(rdx::local_span<std::byte>(back), 0).wait(20s) == std::error_code{});
  CHECK(
      std::all_of(back.data(), back.data() + grant_bytes, [](std::byte b) { return b == std::byte{0x55}; }));
  CHECK(s.changed_outside(grant_bytes) == 0);

  // The local check refuses offset 64; a window told the grant is 1 MiB posts it.
  CHECK(w.check(grant_bytes, 1) == rdx::errc::out_of_range);
  auto forced = rdx::remote_window<std::byte, rw>::unchecked_for_testing(s.p.a, d, region_bytes);
  auto past = forced.write(rdx::local_span<const std::byte>(s.src).subspan(0, 1), grant_bytes);
  const std::error_code ec = past.wait(30s);
  INFO("the peer's write one byte past the grant: " << ec.message());
  CHECK(ec.category() == rdx::wc_category());
  CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
  CHECK(s.p.a.failed());
  settle(s.p);
  std::printf("grant: after the peer's remote access error the granting side is %s (%s)\n",
              s.p.b.failed() ? "failed" : "healthy", s.p.b.failed() ? s.p.b.failure_message().c_str() : "-");
  CHECK(s.changed_outside(grant_bytes) == 0);
}

TEST_CASE("a sub-range grant: a write that crosses its end by one byte or starts before it fails",
          "[grant]") {
  for (const std::size_t offset : {std::size_t{1}, std::size_t{0}}) {
    subrange s;
    const rdx::window_descriptor d = s.g->descriptor();
    rdx::window_descriptor shifted = d;
    if (offset == 0) {
      // One byte before the grant: the peer's address, forged.
      shifted.memory.addr -= 1;
      shifted.memory.length += 1;
      shifted.keys.clear();
    }
    auto forced = rdx::remote_window<std::byte, rw>::unchecked_for_testing(s.p.a, offset == 0 ? shifted : d,
                                                                           region_bytes);
    auto op = forced.write(rdx::local_span<const std::byte>(s.src).subspan(0, grant_bytes), offset);
    const std::error_code ec = op.wait(30s);
    INFO("offset " << offset << ": " << ec.message());
    CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
    CHECK(s.changed_outside(0) == 0);  // not one byte of the refused write landed, inside or out
  }
}

TEST_CASE("the region's own rkey never leaves the process and reaches nothing", "[grant]") {
  subrange s;
  // A peer that guessed the region's rkey (rxe's are an index and 8 random bits).
  rdx::window_descriptor guess = s.g->descriptor();
  guess.memory = {reinterpret_cast<std::uint64_t>(s.region.data()), s.region.region().rkey(), region_bytes};
  guess.keys.clear();
  rdx::remote_window<std::byte, rw> w(s.p.a, guess);
  const std::error_code ec = w.write(rdx::local_span<const std::byte>(s.src).subspan(0, 8), 0).wait(30s);
  INFO(ec.message());
  CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
  CHECK(s.changed_outside(0) == 0);
}

TEST_CASE("a key granted on connection A is refused on connection B", "[grant]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  const rdx::connection_attr attr{.recv_depth = 4};
  rdx::connection a1(pd, attr), b1(pd, attr), a2(pd, attr), b2(pd, attr);
  rdx::connect_pair(a1, b1);
  rdx::connect_pair(a2, b2);
  auto region = rdx::make_window_buffer<std::uint64_t>(pd, 64);
  std::fill(region.data(), region.data() + 64, 7);
  rdx::grant<std::uint64_t, rights::write> g(b1, region);
  rdx::registered_buffer<std::uint64_t> src(pd, 8);
  std::fill(src.data(), src.data() + 8, 42);
  // The peer of b1 may use it.
  rdx::remote_window<std::uint64_t, rights::write> right(a1, g.descriptor());
  REQUIRE(right.write(src, 0).wait(20s) == std::error_code{});
  CHECK(region[0] == 42);
  // The peer of b2, in the same protection domain, may not.
  std::fill(src.data(), src.data() + 8, 99);
  rdx::remote_window<std::uint64_t, rights::write> wrong(a2, g.descriptor());
  const std::error_code ec = wrong.write(src, 8).wait(30s);
  INFO(ec.message());
  CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
  CHECK(std::all_of(region.data() + 8, region.data() + 64, [](std::uint64_t v) { return v == 7; }));
  CHECK_FALSE(a1.failed());
  CHECK(right.write(src, 16).wait(20s) == std::error_code{});
}

TEST_CASE("striped over 2 queue pairs: one window per queue pair, each key only on its own", "[grant]") {
  pair p(rdx::connection_attr{.queue_pairs = 2, .recv_depth = 4, .chunk_size = 4096});
  constexpr std::size_t n = 64 * 1024;
  auto region = rdx::make_window_buffer<std::byte>(p.pd, n);
  rdx::grant<std::byte, rw> g(p.b, region);
  REQUIRE(g.keys().size() == 2);
  CHECK(g.keys()[0] != g.keys()[1]);
  rdx::registered_buffer<std::byte> src(p.pd, n);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<std::byte>(i * 7 + 3);
  rdx::remote_window<std::byte, rw> w(p.a, g.descriptor());
  REQUIRE(w.write(src, 0).wait(30s) == std::error_code{});
  CHECK(std::memcmp(region.data(), src.data(), n) == 0);
  CHECK(p.b.qp(1).remote_access() == (rdx::access::remote_write | rdx::access::remote_read));

  // Queue pair 0's key on queue pair 1: the second chunk fails.
  rdx::window_descriptor one_key = g.descriptor();
  one_key.keys = {one_key.keys[0], one_key.keys[0]};
  std::memset(region.data(), 0, n);
  rdx::remote_window<std::byte, rw> bad(p.a, one_key);
  const std::error_code ec = bad.write(rdx::local_span<const std::byte>(src).subspan(0, 8192), 0).wait(30s);
  INFO(ec.message());
  CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
  CHECK(std::all_of(region.data() + 4096, region.data() + n, [](std::byte b) { return b == std::byte{0}; }));
}

TEST_CASE("queue pairs enable only what the grants need", "[grant]") {
  CHECK(rdx::queue_pair_attr{}.remote_access == rdx::access::none);
  pair p(rdx::connection_attr{.recv_depth = 4});
  // Zero-length writes (cover, liveness probe) need remote write; nothing else is on.
  CHECK(p.b.qp(0).remote_access() == rdx::access::remote_write);
  auto region = rdx::make_window_buffer<std::uint64_t>(p.pd, 8);
  {
    rdx::grant<std::uint64_t, rights::atomic> g(p.b, region);
    CHECK(p.b.qp(0).remote_access() == (rdx::access::remote_write | rdx::access::remote_atomic));
    rdx::remote_window<std::uint64_t, rights::atomic> w(p.a, g.descriptor());
    auto add = w.fetch_add(0, 5);
    REQUIRE(add.wait(20s) == std::error_code{});
    CHECK(region[0] == 5);
  }
  // A raw queue pair made with the defaults refuses a peer's RDMA write.
  rdx::completion_queue cq(p.ctx, 8);
  rdx::queue_pair qa(p.pd, cq, cq, rdx::queue_pair_attr{.max_send_wr = 4, .max_recv_wr = 1});
  rdx::queue_pair qb(p.pd, cq, cq, rdx::queue_pair_attr{.max_send_wr = 4, .max_recv_wr = 1});
  qa.connect(qb.local_endpoint());
  qb.connect(qa.local_endpoint());
  rdx::registered_buffer<std::uint64_t> open(p.pd, 8, rdx::access::local_write | rdx::access::remote_write);
  rdx::registered_buffer<std::uint64_t> src(p.pd, 8);
  REQUIRE(!qa.post_send(rdx::wr::write(src.sge(0, 8), rdx::at(open.remote())).signaled()));
  rdx::completion c;
  const auto end = clk::now() + 20s;
  std::size_t got = 0;
  while (got == 0 && clk::now() < end) REQUIRE(!cq.poll(std::span(&c, 1), got));
  REQUIRE(got == 1);
  INFO(c.error().message());
  CHECK(c.status() != IBV_WC_SUCCESS);
  CHECK(open[0] == 0);
}

TEST_CASE("an exact registration backs a grant where windows are not wanted, and says so", "[grant]") {
  subrange s(rdx::grant_options{.backing = rdx::grant_backing::exact_registration});
  CHECK(s.g->backing() == rdx::grant_backing::exact_registration);
  INFO(s.g->description());
  CHECK(s.g->description().find("exact registration") != std::string::npos);
  rdx::remote_window<std::byte, rw> w(s.p.a, s.g->descriptor());
  REQUIRE(w.write(rdx::local_span<const std::byte>(s.src).subspan(0, grant_bytes), 0).wait(20s) ==
          std::error_code{});
  auto forced = rdx::remote_window<std::byte, rw>::unchecked_for_testing(s.p.a, s.g->descriptor(), 4096);
  const std::error_code ec =
      forced.write(rdx::local_span<const std::byte>(s.src).subspan(0, 1), grant_bytes).wait(30s);
  INFO(ec.message());
  CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
  CHECK(s.changed_outside(grant_bytes) == 0);
}

TEST_CASE("1000 grants: keys all distinct, no two consecutive ones apart by one", "[grant]") {
  pair p(rdx::connection_attr{.recv_depth = 4});
  constexpr std::size_t n = 1000;
  auto region = rdx::make_window_buffer<std::uint64_t>(p.pd, n * 8);
  std::vector<rdx::grant<std::uint64_t, rights::write>> grants;
  grants.reserve(n);
  const auto t0 = clk::now();
  for (std::size_t i = 0; i < n; ++i) {
    grants.emplace_back(p.b, region.region(), std::span<std::uint64_t>(region.data() + 8 * i, 8));
  }
  const auto us = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / n;
  std::printf(
      "grant: %zu grants on a connected connection, %.1f us each (allocate, bind, wait for the bind)\n", n,
      us);
  std::set<std::uint32_t> keys;
  std::size_t one_apart = 0;
  std::set<std::uint32_t> low_bytes;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t k = grants[i].keys()[0];
    keys.insert(k);
    low_bytes.insert(k & 0xff);
    if (i > 0) {
      const std::uint32_t prev = grants[i - 1].keys()[0];
      if (k - prev == 1 || prev - k == 1) ++one_apart;
    }
  }
  // The cost of the windows alone: the same grants as exact registrations.
  {
    std::vector<rdx::grant<std::uint64_t, rights::write>> exact;
    exact.reserve(n);
    const auto t1 = clk::now();
    for (std::size_t i = 0; i < n; ++i) {
      exact.emplace_back(p.b, region.region(), std::span<std::uint64_t>(region.data() + 8 * i, 8),
                         rdx::grant_options{.backing = rdx::grant_backing::exact_registration});
    }
    const auto exact_us = std::chrono::duration<double, std::micro>(clk::now() - t1).count() / n;
    std::printf(
        "grant: as exact registrations, %.1f us each: the window (allocate, bind, wait) adds %.1f us\n",
        exact_us, us - exact_us);
  }
  CHECK(keys.size() == n);
  CHECK(one_apart == 0);
  CHECK(low_bytes.size() > 200);  // random key bytes cover most of the 256 values
  // A sample of them works: the first, the last, one in the middle.
  rdx::registered_buffer<std::uint64_t> src(p.pd, 8);
  for (std::size_t i : {std::size_t{0}, n / 2, n - 1}) {
    src[0] = 1000 + i;
    rdx::remote_window<std::uint64_t, rights::write> w(p.a, grants[i].descriptor());
    REQUIRE(w.write(rdx::local_span<const std::uint64_t>(src).subspan(0, 1), 0).wait(20s) ==
            std::error_code{});
    CHECK(region[8 * i] == 1000 + i);
  }
}

TEST_CASE("revoke while the peer writes in a loop: nothing after the revoke lands", "[revoke]") {
  pair p(rdx::connection_attr{.send_depth = 64, .signal_interval = 8, .recv_depth = 4});
  auto region = rdx::make_window_buffer<std::uint64_t>(p.pd, 8);
  rdx::grant<std::uint64_t, rights::write> g(p.b, region);
  rdx::remote_window<std::uint64_t, rights::write> w(p.a, g.descriptor());
  constexpr std::size_t writes = 400, revoke_at = 150, depth = 8;
  rdx::registered_buffer<std::uint64_t> src(p.pd, 8 * writes);
  for (std::size_t i = 0; i < writes; ++i) std::fill(src.data() + 8 * i, src.data() + 8 * i + 8, i + 1);
  std::vector<rdx::operation> ops(writes);
  std::size_t started_after = writes;
  double revoke_us = 0;
  for (std::size_t i = 0; i < writes; ++i) {
    if (i >= depth) (void)ops[i - depth].wait(30s);
    if (i == revoke_at) {
      const auto t0 = clk::now();
      g.revoke();
      revoke_us = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
      started_after = i;
    }
    ops[i] = w.write(rdx::local_span<const std::uint64_t>(src).subspan(8 * i, 8), 0);
    p.b.progress();
  }
  for (auto& op : ops) REQUIRE(op.wait(30s) != rdx::errc::timed_out);
  std::printf("revoke: revoke() returned in %.1f us (the windows are deallocated when it returns)\n",
              revoke_us);
  CHECK(g.revoked());
  std::size_t ok_before = 0;
  std::uint64_t last_ok = 0;
  for (std::size_t i = 0; i < writes; ++i) {
    INFO("write " << i << ": " << ops[i].error().message());
    if (i >= started_after) {
      CHECK(ops[i].error());  // every write started after revoke() returned failed
    } else if (ops[i].ok()) {
      ++ok_before;
      last_ok = i + 1;
    }
  }
  CHECK(ok_before >= revoke_at - depth);
  // The window holds one whole write that succeeded before the revoke, never a later one.
  const std::uint64_t v = region[0];
  CHECK(std::all_of(region.data(), region.data() + 8, [&](std::uint64_t x) { return x == v; }));
  CHECK(v <= started_after);
  CHECK(v >= 1);
  CHECK(v <= last_ok);
  // The first failure is the NIC's remote access error.
  const auto first_bad =
      std::find_if(ops.begin(), ops.end(), [](const rdx::operation& o) { return !o.ok(); });
  REQUIRE(first_bad != ops.end());
  CHECK(first_bad->error().value() == IBV_WC_REM_ACCESS_ERR);
}

TEST_CASE("revoke then reuse: a new grant over the same memory has a new key; the old one stays dead",
          "[revoke]") {
  pair p(rdx::connection_attr{.recv_depth = 4});
  auto region = rdx::make_window_buffer<std::uint64_t>(p.pd, 8);
  rdx::registered_buffer<std::uint64_t> src(p.pd, 8);
  std::optional<rdx::grant<std::uint64_t, rights::write>> g1(std::in_place, p.b, region);
  const rdx::window_descriptor old = g1->descriptor();
  {
    rdx::remote_window<std::uint64_t, rights::write> w(p.a, old);
    src[0] = 1;
    REQUIRE(w.write(rdx::local_span<const std::uint64_t>(src).subspan(0, 1), 0).wait(20s) ==
            std::error_code{});
  }
  g1->revoke();
  CHECK(g1->revoked());
  CHECK(g1->description().find("revoked") != std::string::npos);
  g1.reset();  // destroying a revoked grant does nothing more
  rdx::grant<std::uint64_t, rights::write> g2(p.b, region);
  CHECK(g2.keys()[0] != old.keys[0]);
  rdx::remote_window<std::uint64_t, rights::write> w2(p.a, g2.descriptor());
  src[0] = 2;
  REQUIRE(w2.write(rdx::local_span<const std::uint64_t>(src).subspan(0, 1), 0).wait(20s) ==
          std::error_code{});
  CHECK(region[0] == 2);
  rdx::remote_window<std::uint64_t, rights::write> stale(p.a, old);
  src[0] = 3;
  const std::error_code ec =
      stale.write(rdx::local_span<const std::uint64_t>(src).subspan(0, 1), 0).wait(30s);
  INFO(ec.message());
  CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
  CHECK(region[0] == 2);
}

TEST_CASE("destroying the connection revokes its grants; a grant may outlive it", "[revoke]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  auto region = rdx::make_window_buffer<std::uint64_t>(pd, 8);
  auto a = std::make_unique<rdx::connection>(pd, rdx::connection_attr{.recv_depth = 4});
  auto b = std::make_unique<rdx::connection>(pd, rdx::connection_attr{.recv_depth = 4});
  rdx::connect_pair(*a, *b);
  rdx::grant<std::uint64_t, rights::write> g(*b, region);
  rdx::grant<std::uint64_t, rights::write> moved(std::move(g));  // a move keeps it listed
  CHECK(g.revoked());
  CHECK_FALSE(moved.revoked());
  b.reset();
  CHECK(moved.revoked());
  a.reset();
  // A grant on a connection that failed or is gone cannot be made.
  pair p(rdx::connection_attr{.recv_depth = 4});
  auto other = rdx::make_window_buffer<std::uint64_t>(p.pd, 8);
  CHECK_THROWS_WITH((rdx::grant<std::uint64_t, rights::write>(p.b, region)),
                    Catch::Contains("another protection domain"));
  rdx::grant<std::uint64_t, rights::write> ok(p.b, other);
  CHECK_FALSE(ok.revoked());
}

TEST_CASE("a peer credit count that claims more than was sent: the failure says what arrived", "[hostile]") {
  pair p(rdx::connection_attr{.recv_depth = 4});
  rdx::channel<std::uint64_t> ta(p.a);
  // b writes an impossible consumed count into a's credit word, the way a hostile peer could.
  const rdx::window_descriptor word{p.a.local_info().credit_word, rights::write, 8, {}};
  rdx::remote_window<std::uint64_t, rights::write> forge(p.b, word);
  rdx::registered_buffer<std::uint64_t> bogus(p.pd, 1);
  bogus[0] = 1000;
  REQUIRE(forge.write(bogus, 0).wait(20s) == std::error_code{});
  auto sent = ta.send(1);
  const auto end = clk::now() + 10s;
  while (!sent.done() && clk::now() < end) {
    p.a.progress();
    p.b.progress();
  }
  CHECK(sent.error() == rdx::errc::protocol_error);
  INFO(p.a.failure_message());
  CHECK(p.a.failure_message().find("says 1000 messages were consumed, but this side sent 0") !=
        std::string::npos);
  CHECK(p.b.messages_waiting() == 0);
  // The credit word is exactly 8 bytes: the word before it is out of the peer's reach.
  pair q(rdx::connection_attr{.recv_depth = 4});
  rdx::window_descriptor wider{q.a.local_info().credit_word, rights::write, 8, {}};
  CHECK(wider.memory.length == 8);
  wider.memory.addr -= 8;
  wider.memory.length = 16;
  rdx::remote_window<std::uint64_t, rights::write> reach(q.b, wider);
  const std::error_code ec = reach.write(bogus, 0).wait(30s);
  INFO(ec.message());
  CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
}
