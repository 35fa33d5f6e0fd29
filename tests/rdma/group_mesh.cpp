// rdx::group::mesh on one device: ranks as threads of one process, each
// with its own device context, protection domain and worker, as separate
// processes would have. Every block is written by its peer and checked
// byte for byte; barriers, a rank that stops coming, a rank that leaves,
// bad windows, and (with rdx::auth) a keyed mesh and a rank with another key. `ctest -R group_mesh` selects
// them.
#include <rdx/group/mesh.hpp>
#if defined(RDX_TEST_AUTH)
#include <rdx/auth/psk.hpp>
#endif

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "channel_support.hpp"
#include <unistd.h>

using namespace std::chrono_literals;

namespace {

// A port per test case, apart from the other tests' (a VM runs one test).
std::uint16_t port_for(int i) {
  return static_cast<std::uint16_t>(29400 + 16 * i + (::getpid() % 16));
}

// The byte rank `from` writes at position i of its block at rank `to`.
std::byte pattern(std::uint32_t from, std::uint32_t to, std::size_t i) {
  return static_cast<std::byte>((from * 131 + to * 31 + i * 7 + (i >> 8)) & 0xff);
}

struct rank_env {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
};

// Runs f(rank) on `size` threads; the messages of the ranks that threw.
std::vector<std::string> run_ranks(std::uint32_t size, const std::function<void(std::uint32_t)>& f) {
  std::vector<std::string> err(size);
  std::vector<std::thread> ts;
  for (std::uint32_t r = 0; r < size; ++r) {
    ts.emplace_back([&, r] {
      try {
        f(r);
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  return err;
}

// Every rank ended without an error.
void check_all_ok(const std::vector<std::string>& err) {
  for (std::size_t r = 0; r < err.size(); ++r) {
    INFO("rank " << r << ": " << err[r]);
    CHECK(err[r].empty());
  }
}

}  // namespace

TEST_CASE("a mesh of 8 ranks: every peer writes its block, every byte arrives, reads return it",
          "[group_mesh]") {
  constexpr std::uint32_t n = 8;
  constexpr std::size_t block = 64 * 1024;
  const std::uint16_t port = port_for(0);
  std::atomic<std::uint64_t> checked{0};
  const auto err = run_ranks(n, [&](std::uint32_t me) {
    rank_env env;
    auto window = rdx::make_window_buffer<std::byte>(env.pd, n * block);
    std::fill(window.data(), window.data() + n * block, std::byte{0xee});
    rdx::group::mesh m(rdx::group::given(me, n, me, n, "127.0.0.1", port), env.pd,
                       rdx::group::mesh_window{&window.region(), std::span(window.data(), n * block), block},
                       rdx::group::mesh_options{.timeout = 60s});
    CHECK(m.rank() == me);
    CHECK(m.size() == n);
    CHECK(m.worker().connections() == n - 1);
    CHECK(m.barriers() == 1);
    rdx::registered_buffer<std::byte> src(env.pd, n * block);
    std::vector<rdx::operation> ops;
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me) continue;
      for (std::size_t i = 0; i < block; ++i) src[p * block + i] = pattern(me, p, i);
      CHECK(m.block_of(p).size() == block);
      ops.push_back(m.block_of(p).write(rdx::local_span<const std::byte>(src).subspan(p * block, block), 0));
    }
    for (auto& op : ops) REQUIRE(op.wait(30s) == std::error_code{});
    m.barrier(30s);
    std::uint64_t ok = 0;
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me) continue;
      const auto b = m.local_block(p);
      REQUIRE(b.size() == block);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < block; ++i) bad += b[i] != pattern(p, me, i) ? 1 : 0;
      CHECK(bad == 0);
      ok += bad == 0 ? 1 : 0;
    }
    // This rank's own block is no peer's: untouched.
    CHECK(m.local_block(me)[0] == std::byte{0xee});
    // Reading back what this rank wrote at each peer.
    rdx::registered_buffer<std::byte> back(env.pd, n * block);
    ops.clear();
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me) continue;
      ops.push_back(m.block_of(p).read(rdx::local_span<std::byte>(back).subspan(p * block, block), 0));
    }
    for (auto& op : ops) REQUIRE(op.wait(30s) == std::error_code{});
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me) continue;
      CHECK(std::equal(back.data() + p * block, back.data() + (p + 1) * block, src.data() + p * block));
    }
    m.barrier(30s);
    CHECK(m.barriers() == 3);
    CHECK(m.timings().total >= m.timings().connect);
    checked += ok;
  });
  check_all_ok(err);
  CHECK(checked == n * (n - 1));
}

TEST_CASE("a mesh without a window: connections and barriers only; block_of says there is none",
          "[group_mesh]") {
  constexpr std::uint32_t n = 4;
  const std::uint16_t port = port_for(1);
  const auto err = run_ranks(n, [&](std::uint32_t me) {
    rank_env env;
    rdx::group::mesh m(rdx::group::given(me, n, me, n, "127.0.0.1", port), env.pd);
    for (int i = 0; i < 20; ++i) m.barrier(30s);
    CHECK(m.barriers() == 21);
    const std::uint32_t other = (me + 1) % n;
    CHECK(channel_test::code_of([&] { (void)m.block_of(other); }) == rdx::errc::not_ready);
    CHECK(channel_test::code_of([&] { (void)m.peer(me); }) == rdx::errc::out_of_range);
    CHECK(channel_test::code_of([&] { (void)m.peer(n); }) == rdx::errc::out_of_range);
    CHECK_FALSE(m.peer(other).failed());
    m.barrier(30s);
  });
  check_all_ok(err);
}

TEST_CASE("one rank of 1: a mesh with no peers, barriers return at once", "[group_mesh]") {
  rank_env env;
  rdx::group::mesh m(rdx::group::given(0, 1, 0, 1), env.pd);
  m.barrier(1s);
  CHECK(m.size() == 1);
  CHECK(m.worker().connections() == 0);
}

TEST_CASE("a window smaller than a block per rank is refused before anything is set up", "[group_mesh]") {
  rank_env env;
  auto window = rdx::make_window_buffer<std::byte>(env.pd, 4 * 64);
  std::string what;
  CHECK(channel_test::code_of(
            [&] {
              rdx::group::mesh m(
                  rdx::group::given(0, 5, 0, 5, "127.0.0.1", port_for(2)), env.pd,
                  rdx::group::mesh_window{&window.region(), std::span(window.data(), 4 * 64), 64});
            },
            &what) == rdx::errc::invalid_argument);
  CHECK_THAT(what, Catch::Contains("needs 320"));
  CHECK(channel_test::code_of([&] {
          rdx::group::mesh m(rdx::group::given(0, 2, 0, 2, "127.0.0.1", port_for(2)), env.pd,
                             rdx::group::mesh_window{nullptr, std::span(window.data(), 4 * 64), 64});
        }) == rdx::errc::invalid_argument);
}

TEST_CASE("a rank that stops calling barrier is named by every other rank's barrier", "[group_mesh]") {
  constexpr std::uint32_t n = 4;
  const std::uint16_t port = port_for(3);
  std::atomic<int> done{0};
  const auto err = run_ranks(n, [&](std::uint32_t me) {
    rank_env env;
    rdx::group::mesh m(rdx::group::given(me, n, me, n, "127.0.0.1", port), env.pd);
    if (me == 2) {
      // Alive (its connections answer), but it never comes to the barrier.
      while (done.load() < 3) {
        (void)m.worker().progress();
        std::this_thread::sleep_for(1ms);
      }
      return;
    }
    try {
      m.barrier(2s);
    } catch (...) {
      ++done;
      throw;
    }
    ++done;
  });
  for (std::uint32_t r : {0u, 1u, 3u}) {
    INFO("rank " << r << ": " << err[r]);
    CHECK_THAT(err[r], Catch::Contains("barrier 2 of rank " + std::to_string(r) + ": rank 2 did not arrive"));
  }
  CHECK(err[2].empty());
}

TEST_CASE("a rank that leaves after set-up: the others' barrier fails naming it", "[group_mesh]") {
  constexpr std::uint32_t n = 3;
  const std::uint16_t port = port_for(4);
  const auto err = run_ranks(n, [&](std::uint32_t me) {
    rank_env env;
    std::optional<rdx::group::mesh> m;
    m.emplace(rdx::group::given(me, n, me, n, "127.0.0.1", port), env.pd);
    if (me == 1) {
      // Long enough for every peer's first-barrier write to be acknowledged.
      std::this_thread::sleep_for(500ms);
      m.reset();  // its connections are torn down, its slots revoked
      return;
    }
    m->barrier(5s);
  });
  CHECK(err[1].empty());
  for (std::uint32_t r : {0u, 2u}) {
    INFO("rank " << r << ": " << err[r]);
    CHECK_THAT(err[r], Catch::Contains("rank 1"));
    CHECK_THAT(err[r], Catch::Contains("barrier 2 of rank " + std::to_string(r)) ||
                           Catch::Contains("barrier 2: rank " + std::to_string(r) + " with rank 1"));
  }
}

TEST_CASE("a rank that never comes: the others fail within the deadline, naming it", "[group_mesh]") {
  constexpr std::uint32_t n = 4;
  const std::uint16_t port = port_for(5);
  const auto t0 = std::chrono::steady_clock::now();
  const auto err = run_ranks(n - 1, [&](std::uint32_t me) {
    rank_env env;
    rdx::group::mesh m(rdx::group::given(me, n, me, n, "127.0.0.1", port), env.pd, {},
                       rdx::group::mesh_options{.timeout = 3s});
  });
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took < 15s);
  for (std::uint32_t r = 0; r < n - 1; ++r) {
    INFO("rank " << r << ": " << err[r]);
    CHECK_THAT(err[r], Catch::Contains("rank 3"));
  }
}

TEST_CASE("on demand: set-up is the rendezvous; a rank holds only the pairs it used until a barrier",
          "[group_mesh]") {
  constexpr std::uint32_t n = 6;
  constexpr std::size_t block = 8192;
  const std::uint16_t port = port_for(9);
  std::atomic<std::uint32_t> checked{0}, wrote{0}, counted{0};
  const auto err = run_ranks(n, [&](std::uint32_t me) {
    rank_env env;
    auto window = rdx::make_window_buffer<std::byte>(env.pd, n * block);
    rdx::group::mesh m(rdx::group::given(me, n, me, n, "127.0.0.1", port), env.pd,
                       rdx::group::mesh_window{&window.region(), std::span(window.data(), n * block), block},
                       rdx::group::mesh_options{.timeout = 60s, .on_demand = true});
    CHECK(m.connected() == 0);
    CHECK(m.worker().connections() == 0);
    CHECK(m.barriers() == 0);
    // Each rank writes to the next only: the last one connects to rank 0
    // (the higher rank connects), the others ask the next to connect.
    const std::uint32_t next = (me + 1) % n;
    rdx::registered_buffer<std::byte> src(env.pd, block);
    for (std::size_t i = 0; i < block; ++i) src[i] = pattern(me, next, i);
    REQUIRE(m.block_of(next).write(rdx::local_span<const std::byte>(src), 0).wait(30s) == std::error_code{});
    // Until every rank has written, each serves the others' set-ups (its
    // previous rank asks it to connect): then each holds the ring's two pairs.
    ++wrote;
    while (wrote.load() < n) {
      (void)m.progress();
      std::this_thread::sleep_for(1ms);
    }
    CHECK(m.connected() == 2);
    CHECK(m.worker().connections() == 2);
    ++counted;
    while (counted.load() < n) {
      (void)m.progress();
      std::this_thread::sleep_for(1ms);
    }
    m.barrier(60s);  // connects every pair
    CHECK(m.connected() == n - 1);
    CHECK(m.worker().connections() == n - 1);
    const std::uint32_t prev = (me + n - 1) % n;
    const auto b = m.local_block(prev);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < block; ++i) bad += b[i] != pattern(prev, me, i) ? 1 : 0;
    CHECK(bad == 0);
    checked += bad == 0 ? 1 : 0;
    // Every pair works after the barrier: a read of each peer's block.
    rdx::registered_buffer<std::byte> back(env.pd, block);
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me) continue;
      CHECK(m.block_of(p).read(rdx::local_span<std::byte>(back), 0).wait(30s) == std::error_code{});
    }
    m.barrier(60s);
  });
  check_all_ok(err);
  CHECK(checked == n);
}

TEST_CASE("on demand: a rank that never serves is named by the rank that asked it", "[group_mesh]") {
  // Rank 1 makes its mesh and then sleeps without calling into it: rank 0
  // asks it to connect (rank 1 is higher) and fails at its deadline naming it.
  constexpr std::uint32_t n = 2;
  const std::uint16_t port = port_for(10);
  std::atomic<bool> done{false};
  const auto err = run_ranks(n, [&](std::uint32_t me) {
    rank_env env;
    rdx::group::mesh m(rdx::group::given(me, n, me, n, "127.0.0.1", port), env.pd, {},
                       rdx::group::mesh_options{.timeout = 2s, .on_demand = true});
    if (me == 1) {
      while (!done) std::this_thread::sleep_for(10ms);
      return;
    }
    try {
      (void)m.peer(1);
    } catch (...) {
      done = true;
      throw;
    }
    done = true;
  });
  CHECK_THAT(err[0], Catch::Contains("asked rank 1 to connect (on first use) and it did not within 2000 ms"));
  CHECK(err[1].empty());
}

#if defined(RDX_TEST_AUTH)
namespace {
std::shared_ptr<const rdx::keyed_mac> key_of(char c) {
  return rdx::auth::psk_key::from_hex(std::string(64, c));
}
}  // namespace

TEST_CASE("a keyed mesh of 4 ranks: every block written and checked, the job's key on every step",
          "[group_mesh]") {
  constexpr std::uint32_t n = 4;
  constexpr std::size_t block = 4096;
  const std::uint16_t port = port_for(6);
  const auto key = key_of('5');
  std::atomic<std::uint32_t> checked{0};
  const auto err = run_ranks(n, [&](std::uint32_t me) {
    rank_env env;
    auto window = rdx::make_window_buffer<std::byte>(env.pd, n * block);
    rdx::group::mesh m(rdx::group::given(me, n, me, n, "127.0.0.1", port), env.pd,
                       rdx::group::mesh_window{&window.region(), std::span(window.data(), n * block), block},
                       rdx::group::mesh_options{.timeout = 60s, .key = key});
    rdx::registered_buffer<std::byte> src(env.pd, n * block);
    std::vector<rdx::operation> ops;
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me) continue;
      for (std::size_t i = 0; i < block; ++i) src[p * block + i] = pattern(me, p, i);
      ops.push_back(m.block_of(p).write(rdx::local_span<const std::byte>(src).subspan(p * block, block), 0));
    }
    for (auto& op : ops) REQUIRE(op.wait(30s) == std::error_code{});
    m.barrier(30s);
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me) continue;
      const auto b = m.local_block(p);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < block; ++i) bad += b[i] != pattern(p, me, i) ? 1 : 0;
      CHECK(bad == 0);
      checked += bad == 0 ? 1 : 0;
    }
  });
  check_all_ok(err);
  CHECK(checked == n * (n - 1));
}

TEST_CASE("a keyed mesh: a rank with another key is refused at the rendezvous and named by the others",
          "[group_mesh]") {
  constexpr std::uint32_t n = 4;
  const std::uint16_t port = port_for(7);
  const auto err = run_ranks(n, [&](std::uint32_t me) {
    rank_env env;
    rdx::group::mesh m(rdx::group::given(me, n, me, n, "127.0.0.1", port), env.pd, {},
                       rdx::group::mesh_options{.timeout = 3s, .key = key_of(me == 3 ? '6' : '5')});
  });
  CHECK_THAT(err[3], Catch::Contains("claiming rank 3") && Catch::Contains("holds another key"));
  CHECK_THAT(err[0], Catch::Contains("rank 3 of 4 never arrived") && Catch::Contains("its MAC is wrong"));
  for (std::uint32_t r = 1; r < 3; ++r) {
    INFO("rank " << r << ": " << err[r]);
    CHECK_THAT(err[r], Catch::Contains("rank 3 of 4 never arrived"));
  }
}

TEST_CASE("a keyed mesh over an exchange without a key: a rank with another key connects to no one",
          "[group_mesh]") {
  // The addresses go through rdx's rendezvous without a key (as a PMIx fence
  // would carry them), so only the preambles' MACs keep rank 3 out.
  constexpr std::uint32_t n = 4;
  const std::uint16_t port = port_for(8);
  const auto err = run_ranks(n, [&](std::uint32_t me) {
    rank_env env;
    const auto info = rdx::group::given(me, n, me, n, "127.0.0.1", port);
    rdx::group::mesh_options o{.timeout = 4s, .key = key_of(me == 3 ? '6' : '5')};
    o.exchange = [info](std::span<const std::byte> b) {
      return rdx::group::rendezvous(info, b, {.timeout = std::chrono::seconds(10)});
    };
    rdx::group::mesh m(info, env.pd, {}, o);
  });
  CHECK_THAT(err[3], Catch::Contains("is not rank 0 of this job (or holds another key)"));
  for (std::uint32_t r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << err[r]);
    CHECK_THAT(err[r], Catch::Contains("rank 3") && Catch::Contains("to connect"));
  }
}
#endif
