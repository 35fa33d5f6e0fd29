// The host-staged pipeline's GPU halves: device to pinned host and back,
// chunked, in order, every byte right.
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/pattern.hpp>
#include <rdx/cuda/staging.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "gpu_skip.hpp"
#include "patterns.hpp"

namespace {
[[maybe_unused]] const bool gpu_present = rdx_test::require_gpu_or_skip("cuda_staging_test");

struct recording_sink {
  std::uint64_t seed;
  std::vector<rdx::cuda::staged_chunk> seen;
  std::uint64_t bad = 0;
  void operator()(const rdx::cuda::staged_chunk& c) {
    seen.push_back(c);
    bad += rdx::cuda::check_pattern_host(c.host.data(), c.host.size(), seed, c.offset).mismatches;
  }
};

struct waiting_sink {
  std::vector<std::size_t> waits;
  std::size_t chunks = 0;
  void operator()(const rdx::cuda::staged_chunk&) { ++chunks; }
  void wait_slot(std::size_t slot) { waits.push_back(slot); }
};

// Stands in for staged_rdma's sink: each chunk's "write" stays in flight
// until `lag` later chunks have been handed over (or wait_slot asks for it).
// At completion it checks that the slot still holds what it held when the
// chunk was handed over: a refill while the write is in flight is counted.
struct polling_sink {
  std::size_t depth;
  std::size_t lag;
  std::uint64_t seed;
  struct in_flight {
    bool busy = false;
    std::size_t chunk = 0;
    std::size_t handed_at = 0;
    std::span<std::byte> host;
    std::vector<std::byte> copy;
  };
  std::vector<in_flight> slots = std::vector<in_flight>(depth);
  std::size_t handed = 0;
  std::uint64_t bad = 0;          // bytes wrong when handed over
  std::uint64_t overwritten = 0;  // slots refilled while their write was in flight
  std::size_t polls_done = 0, waits = 0, max_busy = 0;
  void operator()(const rdx::cuda::staged_chunk& c) {
    bad += rdx::cuda::check_pattern_host(c.host.data(), c.host.size(), seed, c.offset).mismatches;
    in_flight& f = slots[c.slot];
    if (f.busy) ++overwritten;  // handed a slot whose write had not completed
    f = {true, c.index, handed++, c.host, std::vector<std::byte>(c.host.begin(), c.host.end())};
    std::size_t busy = 0;
    for (const auto& s : slots) busy += s.busy ? 1 : 0;
    max_busy = std::max(max_busy, busy);
  }
  void complete(in_flight& f) {
    if (!f.busy) return;
    if (!std::equal(f.copy.begin(), f.copy.end(), f.host.begin())) ++overwritten;
    f.busy = false;
  }
  bool slot_done(std::size_t slot) {
    in_flight& f = slots[slot];
    if (f.busy && handed - f.handed_at > lag) complete(f);
    if (!f.busy) ++polls_done;
    return !f.busy;
  }
  void wait_slot(std::size_t slot) {
    ++waits;
    complete(slots[slot]);
  }
};

// Stands in for staged_rdma's source: fills each chunk, and records when
// each slot is handed back.
struct releasing_source {
  std::size_t depth;
  std::uint64_t seed;
  std::vector<std::size_t> released;
  std::size_t asked = 0;
  std::uint64_t early = 0;  // a chunk asked for before its slot was handed back
  void operator()(const rdx::cuda::staged_chunk& c) {
    if (c.index >= depth &&
        (released.size() < c.index - depth + 1 || released[c.index - depth] != c.index - depth))
      ++early;
    ++asked;
    rdx::cuda::fill_pattern_host(c.host.data(), c.host.size(), seed, c.offset);
  }
  void slot_released(std::size_t k) { released.push_back(k); }
};
}  // namespace

static_assert(rdx::cuda::slot_poller<polling_sink>);
static_assert(!rdx::cuda::slot_poller<waiting_sink>);
static_assert(rdx::cuda::slot_releaser<releasing_source>);
static_assert(rdx::cuda::chunk_sink<recording_sink>);
static_assert(rdx::cuda::slot_waiter<waiting_sink>);
static_assert(!rdx::cuda::slot_waiter<recording_sink>);
static_assert(!rdx::cuda::chunk_sink<int>);

TEST_CASE("staging options are checked", "[cuda]") {
  REQUIRE_THROWS_AS((rdx::cuda::staging_pipeline({.chunk_bytes = 0})), rdx::error);
  REQUIRE_THROWS_AS((rdx::cuda::staging_pipeline({.chunk_bytes = 4096 + 512})), rdx::error);
  REQUIRE_THROWS_AS((rdx::cuda::staging_pipeline({.chunk_bytes = 4096, .depth = 1})), rdx::error);
  rdx::cuda::staging_pipeline p;
  REQUIRE(p.options().chunk_bytes == (16u << 20));
  REQUIRE(p.options().depth == 2);
  REQUIRE(p.bounce_buffers().size() == 2 * (16u << 20));
  // chunks sized by the transfer: 4 MiB up to 32 MiB, an eighth above, 16 MiB from 128 MiB
  REQUIRE(p.chunk_count(4096) == 1);
  REQUIRE(p.chunk_count(32u << 20) == 8);
  REQUIRE(p.chunk_count(64u << 20) == 8);
  REQUIRE(p.chunk_count(std::size_t{1} << 30) == 64);
  REQUIRE(p.path() == rdx::cuda::gpu_path::staged);
}

TEST_CASE("send stages every chunk to host in order, each right", "[cuda]") {
  const std::size_t chunk = GENERATE(std::size_t{4096}, std::size_t{1u << 20}, std::size_t{4u << 20});
  const std::size_t depth = GENERATE(std::size_t{2}, std::size_t{3});
  const std::size_t bytes = (10u << 20) + 123;  // a short last chunk
  rdx::cuda::staging_pipeline p({.chunk_bytes = chunk, .depth = depth});
  rdx::cuda::device_buffer<std::byte> src(bytes);
  rdx_test::gpu_fill(src.data(), bytes, 77);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

  recording_sink sink{77, {}, 0};
  const auto st = p.send(src.data(), bytes, sink);
  INFO("chunk " << chunk << " depth " << depth);
  REQUIRE(sink.bad == 0);
  REQUIRE(st.path == rdx::cuda::gpu_path::staged);
  REQUIRE(st.bytes == bytes);
  REQUIRE(st.chunks == (bytes + chunk - 1) / chunk);
  REQUIRE(sink.seen.size() == st.chunks);
  std::size_t total = 0;
  for (std::size_t i = 0; i < sink.seen.size(); ++i) {
    const auto& c = sink.seen[i];
    REQUIRE(c.index == i);
    REQUIRE(c.offset == i * chunk);
    REQUIRE(c.slot == i % depth);
    REQUIRE(c.last == (i + 1 == sink.seen.size()));
    REQUIRE(c.host.data() == p.bounce_buffers().data() + c.slot * chunk);
    total += c.host.size();
  }
  REQUIRE(total == bytes);
}

TEST_CASE("send calls wait_slot before refilling a bounce buffer", "[cuda]") {
  rdx::cuda::staging_pipeline p({.chunk_bytes = 4096, .depth = 2});
  rdx::cuda::device_buffer<std::byte> src(5 * 4096);
  waiting_sink sink;
  (void)p.send(src.data(), src.size_bytes(), sink);
  REQUIRE(sink.chunks == 5);
  REQUIRE(sink.waits == std::vector<std::size_t>{0, 1, 0});
}

TEST_CASE("receive copies each landed chunk to the GPU", "[cuda]") {
  const std::size_t chunk = GENERATE(std::size_t{4096}, std::size_t{4u << 20});
  const std::size_t bytes = (9u << 20) + 4095;
  rdx::cuda::staging_pipeline p({.chunk_bytes = chunk, .depth = 2});
  rdx::cuda::device_buffer<std::byte> dst(bytes);
  REQUIRE(cudaMemset(dst.data(), 0, bytes) == cudaSuccess);
  std::size_t calls = 0;
  const auto st = p.receive(dst.data(), bytes, [&](const rdx::cuda::staged_chunk& c) {
    REQUIRE(c.index == calls);
    ++calls;
    // Stands in for the RDMA write of this chunk landing in the bounce buffer.
    rdx::cuda::fill_pattern_host(c.host.data(), c.host.size(), 555, c.offset);
  });
  REQUIRE(calls == st.chunks);
  REQUIRE(st.bytes == bytes);
  const auto r = rdx_test::gpu_check(dst.data(), bytes, 555);
  INFO("first bad offset " << r.first_bad_offset);
  REQUIRE(r.ok());
}

TEST_CASE("GPU to host to GPU round trip through two pipelines", "[cuda]") {
  const std::size_t bytes = 32u << 20;
  rdx::cuda::staging_pipeline sender;
  rdx::cuda::staging_pipeline receiver({.chunk_bytes = 1u << 20, .depth = 4});
  rdx::cuda::device_buffer<std::byte> a(bytes);
  rdx::cuda::device_buffer<std::byte> b(bytes);
  rdx::cuda::pinned_buffer<std::byte> wire(bytes);
  rdx_test::gpu_fill(a.data(), bytes, 2024);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  (void)sender.send(a.data(), bytes, [&](const rdx::cuda::staged_chunk& c) {
    std::memcpy(wire.data() + c.offset, c.host.data(), c.host.size());
  });
  (void)receiver.receive(b.data(), bytes, [&](const rdx::cuda::staged_chunk& c) {
    std::memcpy(c.host.data(), wire.data() + c.offset, c.host.size());
  });
  REQUIRE(rdx_test::gpu_check(b.data(), bytes, 2024).ok());
}

TEST_CASE("send refills a polled slot only once its write has completed", "[cuda]") {
  const std::size_t depth = GENERATE(std::size_t{2}, std::size_t{3}, std::size_t{4});
  const std::size_t lag = GENERATE(std::size_t{0}, std::size_t{1}, std::size_t{5});
  const std::size_t chunk = 64 * 1024;
  const std::size_t bytes = 40 * chunk + 777;
  INFO("depth " << depth << " lag " << lag);
  rdx::cuda::staging_pipeline p({.chunk_bytes = chunk, .depth = depth});
  rdx::cuda::device_buffer<std::byte> src(bytes);
  rdx_test::gpu_fill(src.data(), bytes, 91);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  polling_sink sink{depth, lag, 91};
  const auto st = p.send(src.data(), bytes, sink);
  REQUIRE(st.chunks == 41);
  REQUIRE(sink.handed == 41);
  REQUIRE(sink.bad == 0);
  REQUIRE(sink.overwritten == 0);
  // Writes overlap: with a lag, more than one is in flight at once.
  if (lag > 0) REQUIRE(sink.max_busy >= std::min(depth, lag + 1));
  // A write that completes at once is found by polling, not waited for.
  if (lag == 0) REQUIRE(sink.waits == 0);
}

TEST_CASE("receive hands each slot back once its copy is done, before the chunk that needs it", "[cuda]") {
  const std::size_t depth = GENERATE(std::size_t{2}, std::size_t{4});
  const std::size_t chunk = 64 * 1024;
  const std::size_t bytes = 25 * chunk + 5;
  INFO("depth " << depth);
  rdx::cuda::staging_pipeline p({.chunk_bytes = chunk, .depth = depth});
  rdx::cuda::device_buffer<std::byte> dst(bytes);
  REQUIRE(cudaMemset(dst.data(), 0, bytes) == cudaSuccess);
  releasing_source source{depth, 313, {}};
  const auto st = p.receive(dst.data(), bytes, source);
  REQUIRE(st.chunks == 26);
  REQUIRE(source.asked == 26);
  REQUIRE(source.early == 0);
  // Every slot that takes a later chunk is handed back once, in order; the
  // last depth chunks have none to take.
  REQUIRE(source.released.size() == 26 - depth);
  for (std::size_t k = 0; k < source.released.size(); ++k) REQUIRE(source.released[k] == k);
  const auto r = rdx_test::gpu_check(dst.data(), bytes, 313);
  INFO("first bad offset " << r.first_bad_offset);
  REQUIRE(r.ok());
}
