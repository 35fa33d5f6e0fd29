// rdma tests: rdx::registration_cache over a loopback pair of RC queue pairs: hits, misses and
// merges counted; LRU eviction at the bounds, never of an entry in use; memory unmapped and mapped
// again at the same address gets a fresh registration after invalidate() (the peer receives the
// new bytes); concurrent get() from four threads; and the cost of a hit and a miss.
#include <rdx/verbs/registration_cache.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "rdma_support.hpp"
#include <sys/mman.h>
#include <unistd.h>

using rdx_test::loopback;
using rdx_test::wait_one;

namespace {

const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

struct free_deleter {
  void operator()(char* p) const noexcept { std::free(p); }
};
//! Page-aligned heap memory of n pages, touched.
std::unique_ptr<char, free_deleter> pages(std::size_t n) {
  auto* p = static_cast<char*>(std::aligned_alloc(page, n * page));
  REQUIRE(p != nullptr);
  std::memset(p, 0, n * page);
  return std::unique_ptr<char, free_deleter>(p);
}

void fill(char* p, std::size_t n, char seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<char>(seed + static_cast<char>(i % 61));
}

//! Bytes of [p, p + n) that differ from fill(seed).
std::size_t mismatches(const char* p, std::size_t n, char seed) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != static_cast<char>(seed + static_cast<char>(i % 61))) ++bad;
  }
  return bad;
}

//! RDMA-writes what h was asked for to the start of win and waits for it.
void write_to(loopback& lb, const rdx::cached_region& h, const rdx::registered_buffer<char>& win) {
  REQUIRE(!lb.a.post_send(rdx::wr::write(h.sge(), rdx::at(win.remote()))));
  auto c = wait_one(lb.cq_a);
  INFO(c.error().message());
  REQUIRE(c.ok());
}

std::optional<long> mr_count(const loopback& lb) {
  auto m = rdx_test::resource_counts(lb.ctx.name());
  if (!m || m->count("mr") == 0) return std::nullopt;
  return m->at("mr");
}

}  // namespace

TEST_CASE("reg_cache: hits and misses counted, ranges page-rounded, overlaps merged", "[reg_cache]") {
  loopback lb;
  auto mem = pages(16);
  rdx::registration_cache cache(lb.pd);
  char* buf = mem.get();
  fill(buf, 16 * page, 'h');

  auto h1 = cache.get(buf + 10, 100);
  CHECK(cache.stats().misses == 1);
  CHECK(cache.stats().hits == 0);
  CHECK(h1.region().addr() == buf);
  CHECK(h1.region().length() == page);
  CHECK(h1.data() == buf + 10);
  CHECK(h1.size() == 100);
  CHECK(h1.sge().addr == reinterpret_cast<std::uint64_t>(buf + 10));
  CHECK(h1.sge().length == 100);

  auto h2 = cache.get(buf + 200, 300);  // same page
  CHECK(cache.stats().hits == 1);
  CHECK(h2.lkey() == h1.lkey());

  auto h3 = cache.get(buf + page - 10, 20);  // spans pages 0 and 1: merged with page 0's entry
  auto s = cache.stats();
  CHECK(s.misses == 2);
  CHECK(s.merges == 1);
  CHECK(s.entries == 1);
  CHECK(s.bytes == 2 * page);
  CHECK(h3.region().addr() == buf);
  CHECK(h3.region().length() == 2 * page);

  auto h4 = cache.get(buf, 10, rdx::access::remote_write);  // more rights: a new registration
  s = cache.stats();
  CHECK(s.misses == 3);
  CHECK(s.merges == 2);
  CHECK(rdx::has(h4.rights(), rdx::access::remote_write | rdx::access::local_write));
  CHECK(h4.region().length() == 2 * page);
  auto h5 = cache.get(buf + page + 5, 5);  // local write only: the superset answers
  CHECK(cache.stats().hits == 2);
  CHECK(h5.lkey() == h4.lkey());
  (void)cache.get(buf, 4, rdx::access::remote_write);  // hit, a temporary handle
  CHECK(cache.stats().hits == 3);

  // h1 still holds the first registration, replaced in the cache but registered for its user.
  rdx::registered_buffer<char> win(lb.pd, 16 * page, rdx::access::remote_write);
  write_to(lb, h1, win);
  CHECK(std::memcmp(win.data(), buf + 10, 100) == 0);
  write_to(lb, h3, win);
  CHECK(std::memcmp(win.data(), buf + page - 10, 20) == 0);

  // A span, and a range of many pages merging the two-page entry.
  auto h6 = cache.get(std::span<char>(buf, 16 * page));
  CHECK(cache.stats().entries == 1);
  CHECK(h6.region().length() == 16 * page);
  write_to(lb, h6, win);
  CHECK(mismatches(win.data(), 16 * page, 'h') == 0);

  CHECK_THROWS_MATCHES(cache.get(buf, 0), rdx::error, Catch::Predicate<rdx::error>([](const rdx::error& e) {
                         return e.code() == rdx::errc::invalid_argument;
                       }));
  rdx::registration_cache small(lb.pd, {.max_entries = 4, .max_bytes = 2 * page});
  CHECK_THROWS_MATCHES(small.get(buf, 3 * page), rdx::error,
                       Catch::Predicate<rdx::error>(
                           [](const rdx::error& e) { return e.code() == rdx::errc::limit_exceeded; }));
  CHECK(small.stats().entries == 0);
}

TEST_CASE("reg_cache: LRU eviction at the bounds; an entry in use is not deregistered under its user",
          "[reg_cache]") {
  loopback lb;
  rdx_test::leak_guard guard(lb.ctx.name());
  {
    auto mem = pages(8);
    char* const a = mem.get();
    char* const b = a + 2 * page;
    char* const c = a + 4 * page;
    char* const d = a + 6 * page;
    fill(a, 8 * page, 'e');
    rdx::registered_buffer<char> win(lb.pd, page, rdx::access::remote_write);
    rdx::registration_cache cache(lb.pd, {.max_entries = 2});

    (void)cache.get(a, page);
    (void)cache.get(b, page);
    (void)cache.get(a, page);  // hit: a is now the most recently used
    (void)cache.get(c, page);  // evicts b
    auto s = cache.stats();
    CHECK(s.evictions == 1);
    CHECK(s.entries == 2);
    (void)cache.get(a, page);
    CHECK(cache.stats().hits == 2);
    (void)cache.get(b, page);  // miss, evicts c
    CHECK(cache.stats().misses == 4);
    CHECK(cache.stats().evictions == 2);

    // a in use and least recently used: the idle b goes instead.
    auto ha = cache.get(a, 100);
    (void)cache.get(b, page);
    (void)cache.get(c, page);
    s = cache.stats();
    CHECK(s.evictions == 3);
    (void)cache.get(a, page);
    CHECK(cache.stats().hits == s.hits + 1);  // still cached

    // Every entry in use: the bound holds and get() says so, changing nothing.
    auto hc = cache.get(c, page);
    s = cache.stats();
    CHECK_THROWS_MATCHES(cache.get(d, page), rdx::error,
                         Catch::Predicate<rdx::error>(
                             [](const rdx::error& e) { return e.code() == rdx::errc::limit_exceeded; }));
    CHECK(cache.stats().entries == 2);
    CHECK(cache.stats().evictions == s.evictions);
    hc = {};
    (void)cache.get(d, page);  // c idle again: evicted
    CHECK(cache.stats().evictions == s.evictions + 1);

    // Invalidating an entry in use defers its deregistration to the last handle.
    auto before = mr_count(lb);
    CHECK(cache.invalidate(a, 1) == 1);
    CHECK(cache.stats().invalidations == 1);
    CHECK(cache.stats().entries == 1);
    CHECK(mr_count(lb) == before);
    write_to(lb, ha, win);
    CHECK(mismatches(win.data(), 100, 'e') == 0);
    ha = {};
    if (before) {
      CHECK(mr_count(lb) == *before - 1);
    }

    // A byte bound evicts too.
    rdx::registration_cache by_bytes(lb.pd, {.max_entries = 100, .max_bytes = 2 * page});
    (void)by_bytes.get(a, page);
    (void)by_bytes.get(b, page);
    (void)by_bytes.get(c, page);
    CHECK(by_bytes.stats().evictions == 1);
    CHECK(by_bytes.stats().bytes == 2 * page);
  }
  guard.check();  // the caches and their registrations are gone
}

TEST_CASE("reg_cache: memory unmapped and mapped again at the same address gets a fresh registration",
          "[reg_cache]") {
  loopback lb;
  rdx::registration_cache cache(lb.pd);
  constexpr std::size_t n = 256 * 1024;
  rdx::registered_buffer<char> win(lb.pd, n, rdx::access::remote_write);

  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  auto* cp = static_cast<char*>(p);
  fill(cp, n, 'A');
  write_to(lb, cache.get(p, n), win);
  CHECK(mismatches(win.data(), n, 'A') == 0);

  REQUIRE(::munmap(p, n) == 0);
  void* q = ::mmap(p, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  REQUIRE(q == p);
  fill(cp, n, 'B');

  // What happens without invalidate(): a hit on the old registration, whose pinned pages the
  // process no longer sees.
  {
    auto stale = cache.get(p, n);
    CHECK(cache.stats().hits == 1);
    std::memset(win.data(), 0, n);
    write_to(lb, stale, win);
    const bool old = mismatches(win.data(), n, 'A') == 0;
    std::printf("reg_cache: without invalidate() a remapped buffer's cached registration sent the %s\n",
                old ? "OLD bytes (stale)" : "new bytes");
  }

  CHECK(cache.invalidate(p, n) == 1);
  CHECK(cache.stats().invalidations == 1);
  auto fresh = cache.get(p, n);
  CHECK(cache.stats().misses == 2);
  std::memset(win.data(), 0, n);
  write_to(lb, fresh, win);
  CHECK(mismatches(win.data(), n, 'B') == 0);

  // A send from the fresh registration carries the new bytes too.
  rdx::registered_buffer<char> dst(lb.pd, 4096);
  REQUIRE(!lb.b.post_recv(rdx::wr::recv(dst.sge())));
  REQUIRE(!lb.a.post_send(rdx::wr::send(fresh.sge(cp + 1000, 4096))));
  REQUIRE(wait_one(lb.cq_a).ok());
  auto r = wait_one(lb.cq_b);
  REQUIRE(r.ok());
  CHECK(r.byte_len() == 4096);
  CHECK(std::memcmp(dst.data(), cp + 1000, 4096) == 0);
  fresh = {};
  (void)cache.invalidate(p, n);  // the rule: before unmapping (allocate() may return p next)
  REQUIRE(::munmap(p, n) == 0);

  // allocate()/deallocate(): deallocate invalidates, so nothing stale survives a reuse.
  void* m1 = cache.allocate(n);
  fill(static_cast<char*>(m1), n, 'C');
  write_to(lb, cache.get(m1, n), win);
  CHECK(mismatches(win.data(), n, 'C') == 0);
  const auto inv = cache.stats().invalidations;
  cache.deallocate(m1, n);
  CHECK(cache.stats().invalidations == inv + 1);
  void* m2 = cache.allocate(n);
  std::printf("reg_cache: allocate() after deallocate() returned %s address\n",
              m2 == m1 ? "the same" : "another");
  fill(static_cast<char*>(m2), n, 'D');
  const auto misses = cache.stats().misses;
  std::memset(win.data(), 0, n);
  write_to(lb, cache.get(m2, n), win);
  CHECK(cache.stats().misses == misses + 1);
  CHECK(mismatches(win.data(), n, 'D') == 0);
  cache.deallocate(m2, n);
  CHECK(cache.stats().entries == 0);
}

TEST_CASE("reg_cache: concurrent get() from 4 threads", "[reg_cache][threads]") {
  loopback lb;
  constexpr int threads = 4, iterations = 3000, buffers = 32;
  auto mem = pages(buffers * 4);  // buffer i: pages 4i and 4i+1
  rdx::registration_cache cache(lb.pd, {.max_entries = 16});
  std::atomic<int> bad{0}, refused{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::uint32_t x = 12345u + static_cast<std::uint32_t>(t) * 7919u;
      auto next = [&x] { return x = x * 1664525u + 1013904223u, x >> 8; };
      rdx::cached_region held;  // one handle kept across iterations: entries in use
      for (int i = 0; i < iterations; ++i) {
        char* base = mem.get() + (next() % buffers) * 4 * page;
        std::size_t off = next() % page, len = 1 + next() % page;
        auto want = next() % 3 == 0 ? rdx::access::remote_write : rdx::access::local_write;
        try {
          auto h = cache.get(base + off, len, want);
          auto* r = static_cast<char*>(h.region().addr());
          if (r > base + off || r + h.region().length() < base + off + len || !rdx::has(h.rights(), want) ||
              h.sge().addr != reinterpret_cast<std::uint64_t>(base + off)) {
            ++bad;
          }
          if (next() % 4 == 0) held = h;
        } catch (const rdx::error&) {
          ++refused;
        }
        if (i % 500 == 499) (void)cache.invalidate(base, 2 * page);
      }
    });
  }
  std::thread watcher([&] {
    while (!done.load()) {
      auto s = cache.stats();
      if (s.entries > 16) ++bad;
      std::this_thread::yield();
    }
  });
  for (auto& th : pool) th.join();
  done = true;
  watcher.join();
  auto s = cache.stats();
  CHECK(bad.load() == 0);
  CHECK(refused.load() == 0);  // at most 8 handles live at once, under the bound of 16
  CHECK(s.hits + s.misses == std::uint64_t{threads} * iterations);
  CHECK(s.entries <= 16);
  std::printf(
      "reg_cache: 4 threads x %d gets over %d buffers, 16 entries: hits %llu, misses %llu, "
      "evictions %llu, merges %llu, invalidations %llu\n",
      iterations, buffers, static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.misses),
      static_cast<unsigned long long>(s.evictions), static_cast<unsigned long long>(s.merges),
      static_cast<unsigned long long>(s.invalidations));

  // A handle from the cache still moves data afterwards.
  rdx::registered_buffer<char> win(lb.pd, page, rdx::access::remote_write);
  fill(mem.get(), page, 't');
  write_to(lb, cache.get(mem.get(), page), win);
  CHECK(mismatches(win.data(), page, 't') == 0);
}

TEST_CASE("reg_cache: a working set re-registered through the cache (hit and miss cost)",
          "[reg_cache][bench]") {
  loopback lb;
  constexpr std::size_t buffers = 64, bytes = 64 * 1024, rounds = 100;
  auto mem = pages(buffers * (bytes / page + 1));  // a free page between buffers: no merging
  rdx::registration_cache cache(lb.pd);
  auto at = [&](std::size_t i) { return mem.get() + i * (bytes + page); };
  using clock = std::chrono::steady_clock;

  auto t0 = clock::now();
  for (std::size_t i = 0; i < buffers; ++i) (void)cache.get(at(i), bytes);
  auto t1 = clock::now();
  for (std::size_t r = 1; r < rounds; ++r) {
    for (std::size_t i = 0; i < buffers; ++i) (void)cache.get(at(i), bytes);
  }
  auto t2 = clock::now();
  auto s = cache.stats();
  CHECK(s.misses == buffers);
  CHECK(s.hits == buffers * (rounds - 1));

  // Without a cache every round registers and deregisters the set (a few rounds suffice).
  constexpr std::size_t raw_rounds = 5;
  auto t3 = clock::now();
  for (std::size_t r = 0; r < raw_rounds; ++r) {
    for (std::size_t i = 0; i < buffers; ++i) rdx::memory_region mr(lb.pd, at(i), bytes);
  }
  auto t4 = clock::now();

  using ns = std::chrono::duration<double, std::nano>;
  const double miss_us = ns(t1 - t0).count() / 1e3 / static_cast<double>(buffers);
  const double hit_ns = ns(t2 - t1).count() / static_cast<double>(s.hits);
  const double raw_us = ns(t4 - t3).count() / 1e3 / static_cast<double>(raw_rounds * buffers);
  std::printf(
      "reg_cache: working set %zu buffers x %zu bytes, %zu re-registrations: hits %llu, misses %llu; "
      "per get: hit %.0f ns, miss %.1f us\n",
      buffers, bytes, rounds, static_cast<unsigned long long>(s.hits),
      static_cast<unsigned long long>(s.misses), hit_ns, miss_us);
  std::printf("reg_cache: without the cache, ibv_reg_mr + ibv_dereg_mr per buffer: %.1f us\n", raw_us);
}
