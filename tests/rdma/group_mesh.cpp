// rdx::group::mesh on one device: ranks as threads of one process, each
// with its own device context, protection domain and worker, as separate
// processes would have. Every block is written by its peer and checked
// byte for byte; barriers, a rank that stops coming, a rank that leaves,
// and bad windows. `ctest -R group_mesh` selects them.
#include <rdx/group/mesh.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
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
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(err[r].empty());
  }
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
  for (std::uint32_t r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << err[r]);
    CHECK(err[r].empty());
  }
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
