// rdma tests: a worker's receive pool (worker_attr::pool): one shared
// receive queue and two registrations for the message buffers and send
// staging of every connection on the worker. Checked messages on many
// pairs; admission by credits (refused with the numbers, admitted again
// when a peer leaves); a busy peer's credits growing from the free buffers
// and giving them up when others wait; a peer that sends beyond its credits
// failing alone; a peer that stops taking messages holding only its own
// credits; fairness; every buffer back in the pool after teardown.
// RDX_TEST_PEERS sets the pair count of the many-peers cases (default 32).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "channel_support.hpp"
#include "device_count.hpp"
#include "peer_record.hpp"

using namespace std::chrono_literals;
using channel_test::code_of;

namespace {

using namespace peer_test;  // record, make_record, env_count

constexpr std::uint32_t depth = 4;

rdx::connection_attr small_attr() {
  return rdx::connection_attr{
      .send_depth = 16, .signal_interval = 8, .recv_depth = depth, .message_size = 64};
}

rdx::worker_attr pool_attr(std::uint32_t buffers) {
  return rdx::worker_attr{.pool = {.buffers = buffers, .buffer_size = 64, .staging = 256}};
}

struct fabric {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
};

// A client (a worker of its own rings) and its server on the pooled worker.
struct link_pair {
  rdx::connection client;
  rdx::connection server;
  rdx::channel<record> tx{client};
  rdx::channel<record> rx{server};
  link_pair(rdx::worker& wc, rdx::worker& ws, const rdx::protection_domain& pd)
      : client(wc, pd, small_attr()), server(ws, pd, small_attr()) {
    rdx::connect_pair(client, server);
  }
};

// A client worker (rings of their own), a server worker on a pool of
// `buffers`, and n connected pairs between them.
struct pool_pairs {
  fabric fb;
  rdx::worker wc{fb.pd};
  rdx::worker ws;
  std::vector<std::unique_ptr<link_pair>> pairs;
  pool_pairs(std::uint32_t buffers, std::size_t n) : ws(fb.pd, pool_attr(buffers)) {
    for (std::size_t i = 0; i < n; ++i) pairs.push_back(std::make_unique<link_pair>(wc, ws, fb.pd));
  }
};

// Each client keeps up to `in_flight` sends going as fast as its credits
// allow, for `span`, and the server takes every message, checked, unless
// skip(i) says that pair's server takes nothing. The flows carry over from
// one call to the next (sequence numbers continue). Returns what each got
// in this call.
struct flow {
  std::vector<std::optional<rdx::operation>> sends;
  std::optional<rdx::receive_operation<record>> recv;
  std::uint32_t sent = 0, got = 0;
};

template <class Skip>
std::vector<std::uint32_t> pump(rdx::worker& wc, rdx::worker& ws,
                                std::vector<std::unique_ptr<link_pair>>& pairs, std::vector<flow>& f,
                                std::chrono::milliseconds span, std::size_t in_flight, Skip skip) {
  f.resize(pairs.size());
  std::vector<std::uint32_t> before;
  for (auto& x : f) {
    if (x.sends.size() < in_flight) x.sends.resize(in_flight);
    before.push_back(x.got);
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < span) {
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      flow& x = f[i];
      for (std::size_t k = 0; k < in_flight; ++k) {
        auto& s = x.sends[k];
        if (s && !s->done()) continue;
        if (s) REQUIRE(s->error() == std::error_code{});
        s.emplace(pairs[i]->tx.send(make_record(static_cast<std::uint32_t>(i), x.sent++)));
      }
      if (skip(i)) continue;
      while (true) {
        if (!x.recv) x.recv.emplace(pairs[i]->rx.receive());
        if (!x.recv->done()) break;
        REQUIRE(x.recv->error() == std::error_code{});
        const record r = x.recv->value();
        const record want = make_record(static_cast<std::uint32_t>(i), x.got);
        REQUIRE(r.pair == want.pair);
        REQUIRE(r.seq == want.seq);
        REQUIRE(r.check == want.check);
        ++x.got;
        x.recv.reset();
      }
    }
    wc.progress();
    ws.progress();
  }
  std::vector<std::uint32_t> got;
  for (std::size_t i = 0; i < f.size(); ++i) got.push_back(f[i].got - before[i]);
  return got;
}

}  // namespace

TEST_CASE("a receive pool serves many peers: checked messages, two registrations, all buffers back",
          "[pool][many_peers]") {
  fabric fb;
  const std::size_t peers = env_count("RDX_TEST_PEERS", 32);
  const auto buffers = static_cast<std::uint32_t>(peers * depth + 64);
  rdx::worker wc(fb.pd);
  const device_count::counts c0 = device_count::read();
  rdx::worker ws(fb.pd, pool_attr(buffers));
  const device_count::counts c1 = device_count::read();
  const long mr0 = c0.mr, mr1 = c1.mr;
  CHECK(ws.pool_buffers() == buffers);
  CHECK(ws.pool_free() == buffers);
  // The pool's buffers take their share of the completion queue.
  CHECK(ws.cq_reserved() == static_cast<int>(buffers));
  if (mr0 >= 0 && mr1 >= 0) {
    // Registrations: the pool holds two (buffers, staging); a connection on
    // it two fewer than one with a ring of its own (no ring, no staging).
    std::vector<std::unique_ptr<rdx::connection>> own, pooled, plain;
    const device_count::counts d0 = device_count::read();
    for (int i = 0; i < 8; ++i) own.push_back(std::make_unique<rdx::connection>(wc, fb.pd, small_attr()));
    const device_count::counts d1 = device_count::read();
    for (int i = 0; i < 8; ++i) pooled.push_back(std::make_unique<rdx::connection>(ws, fb.pd, small_attr()));
    const device_count::counts d2 = device_count::read();
    // Today's default connection (connection_attr{}), a ring of its own.
    for (int i = 0; i < 8; ++i) plain.push_back(std::make_unique<rdx::connection>(fb.pd));
    const device_count::counts d3 = device_count::read();
    const long m0 = d0.mr, m1 = d1.mr, m2 = d2.mr;
    std::printf(
        "pool: the pool registers %ld regions; a connection %ld with a ring of its own, %ld on the pool\n",
        mr1 - mr0, (m1 - m0) / 8, (m2 - m1) / 8);
    if (c0.known() && d3.known()) {
      const long long pool_bytes = c1.mr_bytes - c0.mr_bytes;
      std::printf(
          "pool: registered bytes per connection: %lld by default (connection_attr{}), %lld with a ring of "
          "its own (recv_depth %u, 64-byte messages), %lld on the pool; the pool %lld (%zu peers: %lld per "
          "peer with its share)\n",
          (d3.mr_bytes - d2.mr_bytes) / 8, (d1.mr_bytes - d0.mr_bytes) / 8, depth,
          (d2.mr_bytes - d1.mr_bytes) / 8, pool_bytes, peers,
          (d2.mr_bytes - d1.mr_bytes) / 8 + pool_bytes / static_cast<long long>(peers));
      CHECK(d2.mr_bytes - d1.mr_bytes < d1.mr_bytes - d0.mr_bytes);
    }
    CHECK(mr1 - mr0 == 2);
    CHECK((m1 - m0) - (m2 - m1) == 2 * 8);
  }
  std::vector<std::unique_ptr<link_pair>> pairs;
  for (std::size_t i = 0; i < peers; ++i) pairs.push_back(std::make_unique<link_pair>(wc, ws, fb.pd));
  // Each peer holds its recv_depth credits of the pool; a pooled connection
  // reserves no receive entries of the queue.
  CHECK(ws.pool_free() == static_cast<std::int64_t>(buffers - peers * depth));
  CHECK(ws.cq_reserved() == static_cast<int>(buffers + peers * (16 + 1)));
  std::vector<flow> f;
  const auto got = pump(wc, ws, pairs, f, 1500ms, 2, [](std::size_t) { return false; });
  for (std::size_t i = 0; i < peers; ++i) {
    CHECK_FALSE(pairs[i]->server.failed());
    CHECK(got[i] > 0);
  }
  const std::uint64_t doorbells = ws.pool_doorbells();
  std::printf("pool: %zu peers, %llu messages, %llu pool doorbells\n", peers,
              static_cast<unsigned long long>(std::accumulate(got.begin(), got.end(), std::uint64_t{0})),
              static_cast<unsigned long long>(doorbells));
  pairs.clear();
  ws.progress();
  CHECK(ws.connections() == 0);
  CHECK(ws.pool_free() == buffers);
  CHECK(ws.cq_reserved() == static_cast<int>(buffers));
}

TEST_CASE("a receive pool admits a connection only with its credits, and refuses what does not match",
          "[pool]") {
  fabric fb;
  rdx::worker wc(fb.pd);
  rdx::worker ws(fb.pd, pool_attr(2 * depth));
  auto a = std::make_unique<link_pair>(wc, ws, fb.pd);
  auto b = std::make_unique<link_pair>(wc, ws, fb.pd);
  CHECK(ws.pool_free() == 0);
  auto refused = [&] { rdx::connection c(ws, fb.pd, small_attr()); };
  CHECK_THROWS_WITH(refused(), Catch::Contains("receive pool of 8 buffers has 0 free") &&
                                   Catch::Contains("recv_depth is 4"));
  CHECK(code_of(refused) == rdx::errc::limit_exceeded);
  CHECK(ws.connections() == 2);
  // A peer that leaves gives its credits back: another fits.
  a.reset();
  ws.progress();
  CHECK(ws.pool_free() == depth);
  auto c = std::make_unique<link_pair>(wc, ws, fb.pd);
  CHECK(ws.pool_free() == 0);
  // Messages larger than the pool's buffers, another protection domain, a
  // worker made without one: refused, nothing made.
  rdx::connection_attr big = small_attr();
  big.message_size = 128;
  auto too_big = [&] { rdx::connection x(ws, fb.pd, big); };
  CHECK_THROWS_WITH(too_big(), Catch::Contains("buffers of 64 bytes"));
  CHECK(code_of(too_big) == rdx::errc::invalid_argument);
  rdx::protection_domain other(fb.ctx);
  auto other_pd = [&] { rdx::connection x(ws, other, small_attr()); };
  CHECK_THROWS_WITH(other_pd(), Catch::Contains("another protection domain"));
  auto no_pd = [&] { rdx::worker w(fb.ctx, pool_attr(16)); };
  CHECK_THROWS_WITH(no_pd(), Catch::Contains("make the worker from a protection domain"));
  CHECK(ws.connections() == 2);
  CHECK(ws.pool_free() == 0);
}

TEST_CASE("a busy peer's credits grow from the free buffers and go to those that wait", "[pool]") {
  // Room for 8 peers at recv_depth, and as much again to grow by.
  pool_pairs t(16 * depth, 8);
  auto& [fb, wc, ws, pairs] = t;
  CHECK(ws.pool_free() == 8 * depth);
  // One busy peer: its credits grow past recv_depth, up to 4 x recv_depth.
  std::vector<std::unique_ptr<link_pair>> one;
  one.push_back(std::move(pairs[0]));
  std::uint32_t most = 0;
  std::vector<flow> f;
  for (int round = 0; round < 20; ++round) {
    (void)pump(wc, ws, one, f, 20ms, 8, [](std::size_t) { return false; });
    most = std::max(most, one[0]->client.credits());
  }
  std::printf("pool: one busy peer's credits reached %u (recv_depth %u)\n", most, depth);
  CHECK(most > depth);
  CHECK(most <= 4 * depth);
  CHECK(one[0]->client.credits() <= 4 * depth);
  // All eight busy: the pool's free buffers run out, and the credits are
  // shared so that every peer gets a fair part.
  pairs[0] = std::move(one[0]);
  const auto got = pump(wc, ws, pairs, f, 1500ms, 8, [](std::size_t) { return false; });
  const std::uint32_t least = *std::min_element(got.begin(), got.end());
  const double mean = std::accumulate(got.begin(), got.end(), 0.0) / static_cast<double>(got.size());
  std::printf("pool: 8 busy peers, least %u, mean %.1f, free %lld\n", least, mean,
              static_cast<long long>(ws.pool_free()));
  CHECK(least >= mean / 2);
  CHECK(ws.pool_free() >= 0);
  for (auto& p : pairs) CHECK_FALSE(p->server.failed());
  pairs.clear();
  ws.progress();
  CHECK(ws.pool_free() == 16 * depth);
}

TEST_CASE("a peer that sends beyond its credits fails alone, and the pool gets its buffers back", "[pool]") {
  pool_pairs t(64 * depth, 4);
  auto& [fb, wc, ws, pairs] = t;
  // Pair 0's client posts raw sends on its queue pair, past the credits
  // its server gave it (recv_depth): the shared queue cannot refuse them.
  rdx::connection& hostile = pairs[0]->client;
  rdx::registered_buffer<record> src(fb.pd, 1);
  src.data()[0] = make_record(0, 0);
  for (std::uint32_t k = 0; k < 3 * depth; ++k) {
    auto w = rdx::wr::send_imm(src.sge(), 0);
    w.signaled(k + 1 == 3 * depth);
    w.id(std::uint64_t{1} << 40);  // no receive buffer's index, no send record's tag: ignored there
    REQUIRE(hostile.qp(0).post_send(w) == std::error_code{});
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (!pairs[0]->server.failed() && std::chrono::steady_clock::now() - t0 < 10s) {
    wc.progress();
    ws.progress();
  }
  REQUIRE(pairs[0]->server.failed());
  CHECK(pairs[0]->server.failure_reason() == rdx::errc::protocol_error);
  INFO(pairs[0]->server.failure_message());
  CHECK(pairs[0]->server.failure_message().find("was given credits for 4") != std::string::npos);
  // The others carry checked traffic after it.
  std::vector<std::unique_ptr<link_pair>> rest;
  for (int i = 1; i < 4; ++i) rest.push_back(std::move(pairs[i]));
  std::vector<flow> f;
  const auto got = pump(wc, ws, rest, f, 500ms, 4, [](std::size_t) { return false; });
  for (std::size_t i = 0; i < rest.size(); ++i) {
    CHECK(got[i] > 0);
    CHECK_FALSE(rest[i]->server.failed());
  }
  pairs.clear();
  rest.clear();
  for (int i = 0; i < 100; ++i) ws.progress();
  CHECK(ws.pool_free() == 64 * depth);
}

TEST_CASE("a peer whose messages are not taken holds only its own credits", "[pool]") {
  pool_pairs t(8 * depth, 6);
  auto& [fb, wc, ws, pairs] = t;
  // Server 0 takes nothing: its peer stops when its credits run out (at
  // most 4 x recv_depth messages held); every other peer keeps going.
  std::vector<flow> f;
  const auto got = pump(wc, ws, pairs, f, 1500ms, 8, [](std::size_t i) { return i == 0; });
  std::printf("pool: a stalled receiver holds %u messages; the others got %u to %u\n",
              pairs[0]->server.messages_waiting(), *std::min_element(got.begin() + 1, got.end()),
              *std::max_element(got.begin() + 1, got.end()));
  CHECK(got[0] == 0);
  CHECK(pairs[0]->server.messages_waiting() >= depth);
  CHECK(pairs[0]->server.messages_waiting() <= 4 * depth);
  for (std::size_t i = 1; i < pairs.size(); ++i) CHECK(got[i] > 100);
  for (auto& p : pairs) CHECK_FALSE(p->server.failed());
  pairs.clear();
  ws.progress();
  CHECK(ws.pool_free() == 8 * depth);
}
