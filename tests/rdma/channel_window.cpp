// rdma tests: one-sided windows over a loopback pair of connections: every
// operation with the data checked, range checks before posting, rights,
// striping over 1, 2 and 4 queue pairs, selective signaling, and the three
// ways to complete (wait, test, co_await) plus event mode.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "channel_support.hpp"
#include <sys/epoll.h>
#include <unistd.h>

using namespace std::chrono_literals;
using channel_test::pair;
using rdx::rights;

namespace {
void fill(std::span<std::uint32_t> s, std::uint32_t seed) {
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = seed * 2654435761u + static_cast<std::uint32_t>(i);
}
}  // namespace

TEST_CASE("window write, read, fetch_add and compare_swap, data checked") {
  // By the extended post API (Soft-RoCE offers it) and by ibv_post_send.
  const rdx::post_api api = GENERATE(rdx::post_api::automatic, rdx::post_api::classic);
  pair p(rdx::connection_attr{.post = api});
  INFO("post " << rdx::to_string(api) << ", extended " << p.a.qp(0).extended_post());
  if (api == rdx::post_api::classic) CHECK_FALSE(p.a.qp(0).extended_post());
  auto target = rdx::make_window_buffer<std::uint32_t, rights::read | rights::write>(p.pd, 1024);
  rdx::grant<std::uint32_t, rights::read | rights::write> g(p.b, target);
  rdx::remote_window<std::uint32_t, rights::read | rights::write> w(p.a, g.descriptor());
  CHECK(w.size() == 1024);

  rdx::registered_buffer<std::uint32_t> src(p.pd, 256), dst(p.pd, 256);
  fill(src.span(), 7);
  auto wop = w.write(src, 100);
  REQUIRE(wop.wait(20s) == std::error_code{});
  CHECK(std::memcmp(target.data() + 100, src.data(), 256 * 4) == 0);
  CHECK(target[99] == 0);
  CHECK(target[356] == 0);

  auto rop = w.read(dst, 100);
  REQUIRE(rop.wait(20s) == std::error_code{});
  CHECK(std::memcmp(dst.data(), src.data(), 256 * 4) == 0);

  auto counters = rdx::make_window_buffer<std::uint64_t, rights::atomic>(p.pd, 8);
  counters[3] = 40;
  rdx::grant<std::uint64_t, rights::atomic> cw_grant(p.b, counters);
  rdx::remote_window<std::uint64_t, rights::atomic> cw(p.a, cw_grant.descriptor());
  auto fa = cw.fetch_add(3, 2);
  REQUIRE(fa.wait(20s) == std::error_code{});
  CHECK(fa.old_value() == 40);
  CHECK(counters[3] == 42);
  auto cs_fail = cw.compare_swap(3, 41, 100);
  REQUIRE(cs_fail.wait(20s) == std::error_code{});
  CHECK(cs_fail.old_value() == 42);
  CHECK(counters[3] == 42);
  auto cs = cw.compare_swap(3, 42, 100);
  REQUIRE(cs.wait(20s) == std::error_code{});
  CHECK(cs.old_value() == 42);
  CHECK(counters[3] == 100);
}

TEST_CASE("bad ranges fail before anything is posted") {
  pair p;
  auto target = rdx::make_window_buffer<std::uint64_t, rights::read | rights::write>(p.pd, 64);
  rdx::grant<std::uint64_t, rights::read | rights::write> w_grant(p.b, target);
  rdx::remote_window<std::uint64_t, rights::read | rights::write> w(p.a, w_grant.descriptor());
  rdx::registered_buffer<std::uint64_t> src(p.pd, 128);
  rdx::local_span<std::uint64_t> s(src);
  const auto posted = p.a.posted_count();
  constexpr std::size_t huge = std::numeric_limits<std::size_t>::max();

  struct bad {
    std::size_t offset, count;
    rdx::errc want;
  };
  for (bad b : {bad{0, 0, rdx::errc::invalid_argument},            // zero length
                bad{64, 1, rdx::errc::out_of_range},               // one past the end
                bad{60, 5, rdx::errc::out_of_range},               // crosses the end
                bad{0, 65, rdx::errc::out_of_range},               // longer than the window
                bad{huge, 1, rdx::errc::out_of_range},             // offset overflow
                bad{1, huge, rdx::errc::out_of_range},             // offset + count wraps
                bad{huge / 8 + 1, 1, rdx::errc::out_of_range}}) {  // offset * 8 overflows
    INFO("offset " << b.offset << " count " << b.count);
    CHECK(w.check(b.offset, b.count) == b.want);
    if (b.count <= src.size()) {
      auto op = w.write(s.subspan(0, b.count), b.offset);
      CHECK(op.done());
      CHECK(op.error() == b.want);
      auto rop = w.read(s.subspan(0, b.count), b.offset);
      CHECK(rop.done());
      CHECK(rop.error() == b.want);
    }
  }
  CHECK(p.a.posted_count() == posted);
  CHECK_FALSE(p.a.failed());

  // Atomics: the index is checked the same way.
  auto counters = rdx::make_window_buffer<std::uint64_t, rights::atomic>(p.pd, 4);
  rdx::grant<std::uint64_t, rights::atomic> cw_grant(p.b, counters);
  rdx::remote_window<std::uint64_t, rights::atomic> cw(p.a, cw_grant.descriptor());
  auto fa = cw.fetch_add(4, 1);
  CHECK(fa.error() == rdx::errc::out_of_range);
  auto cs = cw.compare_swap(huge, 0, 1);
  CHECK(cs.error() == rdx::errc::out_of_range);
  CHECK(p.a.posted_count() == posted);

  // The connection still works.
  auto ok = w.write(s.subspan(0, 64), 0);
  CHECK(ok.wait(20s) == std::error_code{});
}

TEST_CASE("grants carry exact rights; a window claims only granted rights") {
  pair p;
  rdx::registered_buffer<std::uint32_t> local_only(p.pd, 64);
  rdx::registered_buffer<std::uint32_t> remote_rw(p.pd, 64,
                                                  rdx::access::local_write | rdx::access::remote_write);
  auto ro = rdx::make_window_buffer<std::uint32_t, rights::read>(p.pd, 64);
  // The region needs no remote rights of its own (its rkey would reach all of it).
  CHECK_FALSE((rdx::grant<std::uint32_t, rights::read>(p.b, local_only)).revoked());
  CHECK_THROWS_WITH((rdx::grant<std::uint32_t, rights::read>(p.b, remote_rw)),
                    Catch::Contains("itself allows remote write"));
  CHECK_THROWS_WITH((rdx::grant<std::uint32_t, rights::read>(p.b, ro.region(), std::span<std::uint32_t>())),
                    Catch::Contains("zero elements"));
  rdx::grant<std::uint32_t, rights::read> g(p.b, ro);
  CHECK(g.backing() == rdx::grant_backing::memory_window);
  CHECK(g.keys().size() == 1);
  CHECK(g.keys()[0] != ro.region().rkey());
  CHECK(g.descriptor().granted == rights::read);
  CHECK(g.descriptor().element_size == 4);
  CHECK(g.descriptor().memory.length == 256);
  // A window claiming write on a read grant is refused at setup.
  CHECK_THROWS_WITH((rdx::remote_window<std::uint32_t, rights::write>(p.a, g.descriptor())),
                    Catch::Contains("granted read"));
  // Element size, alignment and wraparound of a peer's descriptor are checked.
  CHECK_THROWS_WITH((rdx::remote_window<std::uint64_t, rights::read>(p.a, g.descriptor())),
                    Catch::Contains("elements"));
  auto d = g.descriptor();
  d.memory.addr += 2;
  CHECK_THROWS_WITH((rdx::remote_window<std::uint32_t, rights::read>(p.a, d)), Catch::Contains("aligned"));
  d = g.descriptor();
  d.memory.addr = UINT64_MAX - 63;
  d.memory.length = 128;
  CHECK_THROWS_WITH((rdx::remote_window<std::uint32_t, rights::read>(p.a, d)), Catch::Contains("wraps"));
  d = g.descriptor();
  d.memory.length = 255;
  CHECK_THROWS_WITH((rdx::remote_window<std::uint32_t, rights::read>(p.a, d)),
                    Catch::Contains("whole number"));
  // Sub-spans of a region: inside is fine, outside throws.
  std::vector<std::uint32_t> unregistered(8);
  CHECK_THROWS_AS(
      (rdx::local_span<std::uint32_t>(local_only.region(), std::span<std::uint32_t>(unregistered))),
      rdx::error);
  rdx::local_span<std::uint32_t> inside(local_only.region(), local_only.span().subspan(8, 8));
  CHECK(inside.size() == 8);
}

TEST_CASE("striping: large writes and reads split in 512 KiB chunks over K queue pairs") {
  for (std::uint32_t k : {1u, 2u, 4u}) {
    DYNAMIC_SECTION("K = " << k) {
      pair p(rdx::connection_attr{.queue_pairs = k, .recv_depth = 4});
      constexpr std::size_t n = (2u << 20) / 4 + 1024;  // 2 MiB + 4 KiB of uint32
      auto target = rdx::make_window_buffer<std::uint32_t, rights::read | rights::write>(p.pd, n + 2048);
      rdx::grant<std::uint32_t, rights::read | rights::write> w_grant(p.b, target);
      rdx::remote_window<std::uint32_t, rights::read | rights::write> w(p.a, w_grant.descriptor());
      rdx::registered_buffer<std::uint32_t> src(p.pd, n), back(p.pd, n);
      fill(src.span(), k);
      const auto posted = p.a.posted_count();
      // Offset 1000 elements: the first chunk ends at the next 512 KiB boundary.
      auto wop = w.write(src, 1000);
      REQUIRE(wop.wait(60s) == std::error_code{});
      const auto chunks = p.a.posted_count() - posted;
      CHECK(chunks >= 5);  // 2 MiB + 4 KiB, unaligned start: at least 5 pieces
      CHECK(std::memcmp(target.data() + 1000, src.data(), n * 4) == 0);
      auto rop = w.read(back, 1000);
      REQUIRE(rop.wait(60s) == std::error_code{});
      CHECK(std::memcmp(back.data(), src.data(), n * 4) == 0);
      for (std::uint32_t i = 0; i < k; ++i) {
        INFO("queue pair " << i);
        CHECK(p.a.outstanding(i) <= 1);  // at most a probe left
      }
    }
  }
}

TEST_CASE("a striped transfer rings one doorbell per queue pair") {
  for (std::uint32_t k : {1u, 2u, 4u}) {
    DYNAMIC_SECTION("K = " << k) {
      pair p(rdx::connection_attr{.queue_pairs = k,
                                  .send_depth = 32,
                                  .signal_interval = 8,
                                  .recv_depth = 4,
                                  .chunk_size = 64 * 1024});
      constexpr std::size_t n = (1u << 20) / 4;  // 1 MiB of uint32: 16 chunks of 64 KiB
      auto target = rdx::make_window_buffer<std::uint32_t, rights::read | rights::write>(p.pd, n);
      rdx::grant<std::uint32_t, rights::read | rights::write> g(p.b, target);
      rdx::remote_window<std::uint32_t, rights::read | rights::write> w(p.a, g.descriptor());
      rdx::registered_buffer<std::uint32_t> src(p.pd, n), back(p.pd, n);
      fill(src.span(), 40 + k);
      const auto bells = p.a.send_doorbells();
      const auto posted = p.a.posted_count();
      auto wop = w.write(src, 0);
      CHECK(p.a.posted_count() - posted >= 16);  // 16 or 17: chunks end at 64 KiB boundaries of the target
      CHECK(p.a.send_doorbells() - bells == k);  // one ibv_post_send per queue pair
      REQUIRE(wop.wait(60s) == std::error_code{});
      CHECK(std::memcmp(target.data(), src.data(), n * 4) == 0);
      const auto bells2 = p.a.send_doorbells();
      auto rop = w.read(back, 0);
      CHECK(p.a.send_doorbells() - bells2 == k);
      REQUIRE(rop.wait(60s) == std::error_code{});
      CHECK(std::memcmp(back.data(), src.data(), n * 4) == 0);
      // A one-chunk write is one request and one doorbell, as before.
      const auto bells3 = p.a.send_doorbells();
      auto one = w.write(rdx::local_span<const std::uint32_t>(src).subspan(0, 16), 0);
      CHECK(p.a.send_doorbells() - bells3 == 1);
      REQUIRE(one.wait(20s) == std::error_code{});
    }
  }
}

TEST_CASE("batch: the operations started in it go out with one doorbell per queue pair") {
  for (std::uint32_t k : {1u, 2u}) {
    DYNAMIC_SECTION("K = " << k) {
      pair p(rdx::connection_attr{
          .queue_pairs = k, .send_depth = 64, .signal_interval = 16, .recv_depth = 8, .message_size = 256});
      auto target =
          rdx::make_window_buffer<std::uint64_t, rights::read | rights::write | rights::atomic>(p.pd, 64);
      rdx::grant<std::uint64_t, rights::read | rights::write | rights::atomic> g(p.b, target);
      rdx::remote_window<std::uint64_t, rights::read | rights::write | rights::atomic> w(p.a, g.descriptor());
      rdx::registered_buffer<std::uint64_t> src(p.pd, 64), back(p.pd, 8);
      for (std::size_t i = 0; i < 64; ++i) src[i] = i * 0x0101010101010101ull + k;
      rdx::local_span<const std::uint64_t> s(src);
      rdx::channel<std::uint64_t> tx(p.a), rx(p.b);
      const auto bells = p.a.send_doorbells();
      const auto posted = p.a.posted_count();
      std::array<rdx::operation, 8> writes;
      rdx::operation add, msg;
      p.a.batch([&] {
        for (std::size_t i = 0; i < 8; ++i) writes[i] = w.write(s.subspan(i * 4, 4), i * 4);
        add = w.fetch_add(40, 5);
        msg = tx.send(std::uint64_t{77});      // a value that dies before the batch posts: staged
        CHECK(p.a.send_doorbells() == bells);  // nothing has reached the NIC yet
      });
      const auto requests = p.a.posted_count() - posted;
      CHECK(requests == 10);
      // One doorbell per queue pair that had requests: the atomic and the
      // message are on queue pair 0, the writes round-robin.
      CHECK(p.a.send_doorbells() - bells == k);
      for (auto& o : writes) REQUIRE(o.wait(20s) == std::error_code{});
      REQUIRE(add.wait(20s) == std::error_code{});
      REQUIRE(msg.wait(20s) == std::error_code{});
      CHECK(std::memcmp(target.data(), src.data(), 32 * 8) == 0);
      CHECK(add.old_value() == 0);
      CHECK(target[40] == 5);
      auto r = rx.receive();
      REQUIRE(r.wait(20s) == std::error_code{});
      CHECK(r.value() == 77);

      // A wait inside a batch posts what is held first: it does not hang.
      rdx::operation inner;
      p.a.batch([&] {
        auto first = w.write(s.subspan(0, 8), 48);
        REQUIRE(first.wait(20s) == std::error_code{});
        inner = w.read(rdx::local_span<std::uint64_t>(back), 48);
      });
      REQUIRE(inner.wait(20s) == std::error_code{});
      CHECK(std::memcmp(back.data(), src.data(), 8 * 8) == 0);

      // f throws: what it started is posted, then the exception goes on.
      rdx::operation before;
      CHECK_THROWS_AS(p.a.batch([&] {
        before = w.write(s.subspan(8, 8), 56);
        throw std::runtime_error("the application's own error");
      }),
                      std::runtime_error);
      REQUIRE(before.wait(20s) == std::error_code{});
      CHECK(std::memcmp(target.data() + 56, src.data() + 8, 8 * 8) == 0);
      CHECK_FALSE(p.a.failed());
    }
  }
}

TEST_CASE("selective signaling: one signaled request per 64, the send queue never overflows") {
  pair p(rdx::connection_attr{.send_depth = 32, .signal_interval = 16, .recv_depth = 4});
  auto target = rdx::make_window_buffer<std::uint64_t, rights::write>(p.pd, 512);
  rdx::grant<std::uint64_t, rights::write> w_grant(p.b, target);
  rdx::remote_window<std::uint64_t, rights::write> w(p.a, w_grant.descriptor());
  rdx::registered_buffer<std::uint64_t> src(p.pd, 512);
  for (std::size_t i = 0; i < 512; ++i) src[i] = i * 3 + 1;
  rdx::local_span<const std::uint64_t> s(src);
  const auto posted = p.a.posted_count();
  const auto signaled = p.a.signaled_count();
  // 200 writes in flight at once (more than the queue holds): started in a
  // row, each waits for room by polling, none overflows.
  std::uint32_t max_outstanding = 0;
  // Operations are not movable: eight live at a time in this frame.
  auto start = [&](std::size_t i) { return w.write(s.subspan(i % 500, 8), (i * 8) % 504); };
  std::size_t done_count = 0;
  for (std::size_t round = 0; round < 25; ++round) {
    auto o0 = start(round * 8 + 0), o1 = start(round * 8 + 1), o2 = start(round * 8 + 2),
         o3 = start(round * 8 + 3);
    auto o4 = start(round * 8 + 4), o5 = start(round * 8 + 5), o6 = start(round * 8 + 6),
         o7 = start(round * 8 + 7);
    max_outstanding = std::max(max_outstanding, p.a.outstanding(0));
    for (rdx::operation* o : {&o0, &o1, &o2, &o3, &o4, &o5, &o6, &o7}) {
      REQUIRE(o->wait(20s) == std::error_code{});
      ++done_count;
    }
  }
  CHECK(done_count == 200);
  CHECK(max_outstanding <= 32);
  const auto n_posted = p.a.posted_count() - posted;
  const auto n_signaled = p.a.signaled_count() - signaled;
  INFO("posted " << n_posted << ", signaled " << n_signaled);
  CHECK(n_posted >= 200);
  CHECK(n_signaled < n_posted);
}

TEST_CASE("a stream of writes signals every interval and covers the tail when waited") {
  pair p(rdx::connection_attr{.send_depth = 256, .signal_interval = 64, .recv_depth = 4});
  auto target = rdx::make_window_buffer<std::uint64_t, rights::write>(p.pd, 4096);
  rdx::grant<std::uint64_t, rights::write> w_grant(p.b, target);
  rdx::remote_window<std::uint64_t, rights::write> w(p.a, w_grant.descriptor());
  rdx::registered_buffer<std::uint64_t> src(p.pd, 4096);
  for (std::size_t i = 0; i < 4096; ++i) src[i] = i ^ 0x5555;
  rdx::local_span<const std::uint64_t> s(src);
  const auto signaled = p.a.signaled_count();
  const auto posted = p.a.posted_count();
  // 128 writes in flight, started without polling; only the last is waited for.
  auto ops = std::make_unique<std::array<std::optional<rdx::operation>, 128>>();
  for (std::size_t i = 0; i < 128; ++i) {
    (*ops)[i] = w.write(s.subspan(i * 32, 32), i * 32);
  }
  CHECK(p.a.signaled_count() - signaled <= 3);  // the first (idle queue), then every 64th
  REQUIRE((*ops)[127]->wait(20s) == std::error_code{});
  for (auto& o : *ops) CHECK(o->ok());
  CHECK(std::memcmp(target.data(), src.data(), 4096 * 8) == 0);
  INFO("posted " << p.a.posted_count() - posted << ", signaled " << p.a.signaled_count() - signaled);
  CHECK(p.a.posted_count() - posted >= 128);
}

TEST_CASE("a write with more chunks than its send queue holds completes: the deferred tail is covered") {
  // Regression: chunks posted later from the deferred list (after wait()
  // covered the queues) could end unsignaled, and the write never completed.
  // Four entries per queue pair, 64 KiB chunks: a 4 MiB write is 64 chunks.
  for (std::uint32_t qps : {1u, 4u}) {
    CAPTURE(qps);
    pair p(rdx::connection_attr{.queue_pairs = qps,
                                .send_depth = 4,
                                .signal_interval = 2,
                                .recv_depth = 4,
                                .message_size = 64,
                                .chunk_size = 64 * 1024});
    constexpr std::size_t words = (4u << 20) / 8;
    auto target = rdx::make_window_buffer<std::uint64_t, rights::read | rights::write>(p.pd, words);
    rdx::grant<std::uint64_t, rights::read | rights::write> g(p.b, target);
    rdx::remote_window<std::uint64_t, rights::read | rights::write> w(p.a, g.descriptor());
    rdx::registered_buffer<std::uint64_t> src(p.pd, words), back(p.pd, words);
    for (std::size_t i = 0; i < words; ++i) src[i] = i * 0x9e3779b97f4a7c15ull + qps;
    auto wop = w.write(src, 0);
    CHECK(wop.deferred());
    REQUIRE(wop.wait(30s) == std::error_code{});
    CHECK(std::memcmp(target.data(), src.data(), words * 8) == 0);
    // A read of the same size, awaited by a coroutine rather than wait().
    auto rop = w.read(back, 0);
    int resumed = 0;
    std::error_code got = rdx::make_error_code(rdx::errc::not_ready);
    auto waiter = [](rdx::operation& o, std::error_code& out, int& n) -> channel_test::task {
      out = co_await o;
      ++n;
    }(rop, got, resumed);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (resumed == 0 && std::chrono::steady_clock::now() < deadline) (void)p.a.progress();
    REQUIRE(resumed == 1);
    CHECK(got == std::error_code{});
    CHECK(std::memcmp(back.data(), src.data(), words * 8) == 0);
  }
}

namespace {
channel_test::task copy_by_coroutine(rdx::remote_window<std::uint32_t, rights::read | rights::write>& w,
                                     rdx::local_span<std::uint32_t> src, rdx::local_span<std::uint32_t> dst,
                                     int rounds, int& good) {
  for (int r = 0; r < rounds; ++r) {
    src[0] = static_cast<std::uint32_t>(r);
    std::error_code ec = co_await w.write(src, 0);
    if (ec) co_return;
    ec = co_await w.read(dst, 0);
    if (ec || dst[0] != static_cast<std::uint32_t>(r) ||
        std::memcmp(dst.data(), src.data(), src.size_bytes()) != 0) {
      co_return;
    }
    ++good;
  }
}
}  // namespace

TEST_CASE("co_await: operations complete in the coroutine frame, resumed by progress") {
  pair p;
  auto target = rdx::make_window_buffer<std::uint32_t, rights::read | rights::write>(p.pd, 256);
  rdx::grant<std::uint32_t, rights::read | rights::write> w_grant(p.b, target);
  rdx::remote_window<std::uint32_t, rights::read | rights::write> w(p.a, w_grant.descriptor());
  rdx::registered_buffer<std::uint32_t> src(p.pd, 256), dst(p.pd, 256);
  fill(src.span(), 3);
  int good = 0;
  auto t = copy_by_coroutine(w, src, dst, 50, good);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!t.done() && std::chrono::steady_clock::now() < deadline) p.a.progress();
  CHECK(t.done());
  CHECK(good == 50);
}

TEST_CASE("test() completes without blocking; event mode waits on the completion channel") {
  pair p(rdx::connection_attr{.recv_depth = 4, .events = true});
  CHECK(p.a.fd() >= 0);
  auto target = rdx::make_window_buffer<std::uint32_t, rights::read | rights::write>(p.pd, 256);
  rdx::grant<std::uint32_t, rights::read | rights::write> w_grant(p.b, target);
  rdx::remote_window<std::uint32_t, rights::read | rights::write> w(p.a, w_grant.descriptor());
  rdx::registered_buffer<std::uint32_t> src(p.pd, 256), dst(p.pd, 256);
  for (int r = 0; r < 20; ++r) {
    fill(src.span(), static_cast<std::uint32_t>(r));
    auto wop = w.write(src, 0);
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!wop.test() && std::chrono::steady_clock::now() < deadline) {}
    REQUIRE(wop.ok());
    auto rop = w.read(dst, 0);
    REQUIRE(rop.wait(20s, rdx::wait_mode::events) == std::error_code{});
    REQUIRE(std::memcmp(dst.data(), src.data(), 1024) == 0);
  }
  // Nothing pending: wait_event times out cleanly.
  CHECK(p.a.wait_event(50ms) == rdx::errc::timed_out);
  // A polled connection has no channel.
  pair q;
  CHECK(q.a.fd() == -1);
  CHECK(q.a.wait_event(1ms) == rdx::errc::not_ready);
}

TEST_CASE("event mode: the completion channel's fd joins an application's epoll loop") {
  pair p(rdx::connection_attr{.recv_depth = 4, .message_size = 64, .events = true});
  rdx::channel<std::uint32_t> tx(p.a), rx(p.b);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u32 = 7;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, p.b.fd(), &ev) == 0);
  int woken = 0;
  for (std::uint32_t r = 0; r < 10; ++r) {
    auto got = rx.receive();
    // Armed before the message is sent: its arrival raises an event.
    REQUIRE(p.b.arm() == std::error_code{});
    auto sent = tx.send(r);
    // The application's loop: sleep in epoll_wait, take the event, progress, re-arm.
    while (!got.done()) {
      epoll_event out{};
      const int n = ::epoll_wait(ep, &out, 1, 20000);
      REQUIRE(n == 1);
      CHECK(out.data.u32 == 7);
      ++woken;
      p.b.ack_event();
      p.b.progress();
      if (!got.done()) {
        // Re-arm, then poll once more: a completion before arming raises no event.
        REQUIRE(p.b.arm() == std::error_code{});
        p.b.progress();
      }
    }
    REQUIRE(got.ok());
    CHECK(got.value() == r);
    REQUIRE(sent.wait(20s) == std::error_code{});
  }
  CHECK(woken >= 1);
  ::close(ep);
}

namespace {
// Two connected RC queue pairs without a connection: qa sends (depth
// requests), qb is written to.
struct raw_pair {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
  rdx::completion_queue cq_a{ctx, 64}, cq_b{ctx, 64};
  rdx::queue_pair qa, qb;
  explicit raw_pair(std::uint32_t depth, rdx::post_api api = rdx::post_api::automatic)
      : qa(pd, cq_a, cq_a, rdx::queue_pair_attr{.max_send_wr = depth, .max_recv_wr = 1, .post = api}),
        qb(pd, cq_b, cq_b,
           rdx::queue_pair_attr{
               .max_send_wr = 4, .max_recv_wr = 1, .remote_access = rdx::access::remote_write}) {
    qa.connect(qb.local_endpoint());
    qb.connect(qa.local_endpoint());
  }
  // Polls qa's completions once and retires them through sq; each record's
  // owner (an int) goes to retired, in the order retired.
  void retire(rdx::send_queue& sq, std::vector<int>& retired) {
    std::array<rdx::completion, 16> wc{};
    std::size_t got = wc.size() + 1;
    REQUIRE(!cq_a.poll(std::span<rdx::completion>(wc), got));
    REQUIRE(got <= wc.size());
    for (std::size_t k = 0; k < got; ++k) {
      sq.retire(wc[k], false, [&](const rdx::sq_record& r, std::error_code ec) {
        CHECK_FALSE(ec);
        if (r.owner != nullptr) retired.push_back(*static_cast<int*>(r.owner));
      });
    }
  }
  // Covers sq and retires until nothing is outstanding (bounded).
  void drain(rdx::send_queue& sq, std::vector<int>& retired) {
    REQUIRE(sq.cover());
    const auto end = std::chrono::steady_clock::now() + 20s;
    while (sq.outstanding() != 0) {
      retire(sq, retired);
      REQUIRE(std::chrono::steady_clock::now() < end);
    }
  }
};
}  // namespace

TEST_CASE("send_queue over a raw queue pair: selective signaling, each request retired once, in order") {
  raw_pair rp(32);
  rdx::protection_domain& pd = rp.pd;
  rdx::queue_pair& qa = rp.qa;
  constexpr int n = 1000;
  rdx::registered_buffer<std::uint64_t> src(pd, n);
  rdx::registered_buffer<std::uint64_t> dst(pd, n, rdx::access::local_write | rdx::access::remote_write);
  rdx::send_queue sq(qa, 32, 8);
  std::vector<int> ids(n), retired;
  std::iota(ids.begin(), ids.end(), 0);
  auto retire = [&] { rp.retire(sq, retired); };
  const auto end = std::chrono::steady_clock::now() + 60s;
  for (int i = 0; i < n; ++i) {
    while (!sq.has_room()) {
      retire();
      REQUIRE(std::chrono::steady_clock::now() < end);
    }
    src[i] = static_cast<std::uint64_t>(i) * 7 + 1;
    auto w = rdx::wr::write(src.sge(i, 1), rdx::remote_ptr{dst.remote().addr + 8 * i, dst.rkey()});
    REQUIRE_FALSE(sq.post(w, &ids[i], 1));
    REQUIRE(sq.outstanding() <= 31);  // one entry stays free for cover()
  }
  REQUIRE(sq.cover());
  while (sq.outstanding() != 0) {
    retire();
    REQUIRE(std::chrono::steady_clock::now() < end);
  }
  CHECK(retired == ids);  // each once, in posting order
  INFO("signaled " << sq.signaled_count() << " of " << sq.posted_count());
  CHECK(sq.signaled_count() <= n / 8 + 40);
  CHECK(std::memcmp(src.data(), dst.data(), n * 8) == 0);
}

TEST_CASE("send_queue holds requests for one doorbell; refused ones are taken back whole") {
  const rdx::post_api api = GENERATE(rdx::post_api::classic, rdx::post_api::automatic);
  raw_pair rp(16, api);
  rdx::protection_domain& pd = rp.pd;
  rdx::queue_pair& qa = rp.qa;
  rdx::registered_buffer<std::uint64_t> src(pd, 8);
  rdx::registered_buffer<std::uint64_t> dst(pd, 8, rdx::access::local_write | rdx::access::remote_write);
  for (std::size_t i = 0; i < 8; ++i) {
    src[i] = 1000 + i;
    dst[i] = 0;
  }
  rdx::send_queue sq(qa, 16, 4);
  std::array<int, 8> ids{0, 1, 2, 3, 4, 5, 6, 7};
  auto write = [&](std::size_t i) {
    return rdx::wr::write(src.sge(i, 1), rdx::remote_ptr{dst.remote().addr + 8 * i, dst.rkey()});
  };
  std::vector<int> unposted, retired;
  std::vector<std::error_code> unposted_ec;
  auto on_unposted = [&](const rdx::sq_record& r, std::error_code ec) {
    unposted.push_back(*static_cast<int*>(r.owner));
    unposted_ec.push_back(ec);
  };
  auto drain = [&] { rp.drain(sq, retired); };
  // Four requests held, one doorbell at release.
  const auto bells = sq.doorbells();
  sq.hold();
  for (std::size_t i = 0; i < 4; ++i) sq.emplace_held([&] { return write(i); }, &ids[i], 1);
  CHECK(sq.outstanding() == 4);
  CHECK(sq.doorbells() == bells);
  REQUIRE_FALSE(sq.release(on_unposted));
  CHECK(sq.doorbells() - bells == 1);
  drain();
  CHECK(retired == std::vector<int>{0, 1, 2, 3});
  CHECK(unposted.empty());
  for (std::size_t i = 0; i < 4; ++i) CHECK(dst[i] == src[i]);

  // The provider refuses the second of three (inline data longer than the
  // queue pair takes inline). By ibv_post_send the first is posted and the
  // second and third are taken back; by the extended post API, which posts
  // a batch whole or not at all, all three are.
  const bool whole = qa.extended_post();
  INFO("extended post API: " << whole);
  if (api == rdx::post_api::classic) CHECK_FALSE(whole);
  rdx::registered_buffer<std::byte> big(pd, 1024);
  const std::uint32_t too_long = qa.max_inline_data() + 8;
  REQUIRE(too_long <= 1024);
  const auto posted = sq.posted_count();
  sq.hold();
  REQUIRE_FALSE(sq.emplace([&] { return write(4); }, &ids[4], 1));
  REQUIRE_FALSE(sq.emplace(
      [&] {
        rdx::send_wr w = rdx::wr::write(big.sge(0, too_long), rdx::remote_ptr{dst.remote().addr, dst.rkey()});
        w.native().send_flags |= IBV_SEND_INLINE;
        return w;
      },
      &ids[5], 1));
  REQUIRE_FALSE(sq.emplace([&] { return write(6); }, &ids[6], 1));
  CHECK(sq.outstanding() == 3);
  const std::error_code ec = sq.release(on_unposted);
  INFO(ec.message());
  CHECK(ec);
  CHECK(unposted == (whole ? std::vector<int>{4, 5, 6} : std::vector<int>{5, 6}));
  for (const auto& e : unposted_ec) CHECK(e == ec);
  CHECK(sq.outstanding() == (whole ? 0u : 1u));
  CHECK(sq.posted_count() - posted == (whole ? 0u : 1u));
  // The queue is whole: the next request posts, and every one retires once, in order.
  rdx::send_wr last = write(7);
  REQUIRE_FALSE(sq.post(last, &ids[7], 1));
  drain();
  CHECK(retired == (whole ? std::vector<int>{0, 1, 2, 3, 7} : std::vector<int>{0, 1, 2, 3, 4, 7}));
  CHECK(dst[4] == (whole ? 0 : src[4]));
  CHECK(dst[5] == 0);
  CHECK(dst[6] == 0);
  CHECK(dst[7] == src[7]);
}

TEST_CASE("send_queue reports each post that may leave it uncovered (watch_cover)") {
  const rdx::post_api api = GENERATE(rdx::post_api::classic, rdx::post_api::automatic);
  raw_pair rp(16, api);
  rdx::protection_domain& pd = rp.pd;
  rdx::registered_buffer<std::uint64_t> src(pd, 8);
  rdx::registered_buffer<std::uint64_t> dst(pd, 8, rdx::access::local_write | rdx::access::remote_write);
  rdx::registered_buffer<std::byte> big(pd, 1024);
  for (std::size_t i = 0; i < 8; ++i) src[i] = 2000 + i;
  rdx::send_queue sq(rp.qa, 16, 4);
  // The owner's watch: its flag, and how often it was raised from clear.
  rdx::send_queue::cover_watch watch;
  int raised = 0;
  watch.first = [](void* n) noexcept { ++*static_cast<int*>(n); };
  watch.ctx = &raised;
  bool& uncovered = watch.uncovered;
  sq.watch_cover(&watch);
  std::array<int, 8> ids{0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int> retired;
  auto write = [&](std::size_t i) {
    return rdx::wr::write(src.sge(i, 1), rdx::remote_ptr{dst.remote().addr + 8 * i, dst.rkey()});
  };
  auto drain = [&] { rp.drain(sq, retired); };
  // The first request of an idle queue is signaled: nothing to report.
  rdx::send_wr w0 = write(0);
  REQUIRE_FALSE(sq.post(w0, &ids[0], 1));
  CHECK(sq.covered());
  CHECK_FALSE(uncovered);
  // The next is not: reported.
  rdx::send_wr w1 = write(1);
  REQUIRE_FALSE(sq.post(w1, &ids[1], 1));
  CHECK_FALSE(sq.covered());
  CHECK(uncovered);
  CHECK(raised == 1);
  // cover() posts signaled, which reports nothing.
  uncovered = false;
  REQUIRE(sq.cover());
  CHECK(sq.covered());
  CHECK_FALSE(uncovered);
  drain();
  CHECK(retired == std::vector<int>{0, 1});

  // A held chain whose last request (signaled: the first after an idle
  // queue is, then every fourth) is refused: by ibv_post_send the four before it stay posted, and the last
  // of them is unsignaled, so the rollback reports the queue uncovered; by
  // the extended API nothing was posted and the queue is as it was.
  const bool whole = rp.qa.extended_post();
  sq.hold();
  for (std::size_t i = 2; i < 6; ++i) sq.emplace_held([&] { return write(i); }, &ids[i], 1);
  sq.emplace_held(
      [&] {
        rdx::send_wr w = rdx::wr::write(big.sge(0, rp.qa.max_inline_data() + 8),
                                        rdx::remote_ptr{dst.remote().addr, dst.rkey()});
        w.native().send_flags |= IBV_SEND_INLINE;
        return w;
      },
      &ids[6], 1);
  CHECK(sq.covered());  // the refused one was recorded signaled
  uncovered = false;
  const int raised_before = raised;
  std::vector<int> unposted;
  const std::error_code ec = sq.release(
      [&](const rdx::sq_record& r, std::error_code) { unposted.push_back(*static_cast<int*>(r.owner)); });
  CHECK(ec);
  CHECK(unposted == (whole ? std::vector<int>{2, 3, 4, 5, 6} : std::vector<int>{6}));
  CHECK(sq.covered() == whole);
  CHECK(uncovered == !whole);
  CHECK(raised == raised_before + (whole ? 0 : 1));  // told once: the flag was clear
  drain();
  CHECK(retired == (whole ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2, 3, 4, 5}));
  for (std::size_t i = 2; i < 6; ++i) CHECK(dst[i] == (whole ? 0 : src[i]));

  // A request refused alone (not held) is taken back: the queue is as it
  // was before it, and the signaling interval goes on as if it never was.
  std::vector<int> before = retired;
  rdx::send_wr w6 = write(6);
  REQUIRE_FALSE(sq.post(w6, &ids[6], 1));  // the queue is idle: signaled
  const auto posted = sq.posted_count();
  const auto signaled = sq.signaled_count();
  const auto bells = sq.doorbells();
  rdx::send_wr bad =
      rdx::wr::write(big.sge(0, rp.qa.max_inline_data() + 8), rdx::remote_ptr{dst.remote().addr, dst.rkey()});
  bad.native().send_flags |= IBV_SEND_INLINE;
  CHECK(sq.post(bad, &ids[0], 1));
  CHECK(sq.outstanding() == 1);
  CHECK(sq.posted_count() == posted);
  CHECK(sq.signaled_count() == signaled);
  CHECK(sq.doorbells() - bells == 1);
  CHECK(sq.covered());
  rdx::send_wr w7 = write(7);
  REQUIRE_FALSE(sq.post(w7, &ids[7], 1));
  CHECK_FALSE(sq.covered());  // the second after a signaled one: unsignaled
  drain();
  before.insert(before.end(), {6, 7});
  CHECK(retired == before);
  CHECK(dst[6] == src[6]);
  CHECK(dst[7] == src[7]);
}
