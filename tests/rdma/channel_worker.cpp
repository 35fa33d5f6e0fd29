// rdma tests: many connections on one worker (rdx/channel/worker.hpp), one
// thread: checked messages on every pair, one peer's failure ending only its
// own operations, connections joining and leaving during traffic, the
// worker and its connections destroyed in either order, a completion queue
// too small refused with its numbers, and event mode through the worker's
// one descriptor in an epoll loop of the test's own (no wake-up lost).
// RDX_TEST_PEERS sets the pair count of the many-peers case (default 32).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "channel_support.hpp"
#include "device_count.hpp"
#include "peer_record.hpp"
#include <poll.h>
#include <sys/epoll.h>

using namespace std::chrono_literals;
using channel_test::code_of;

namespace {

using device_count::counts;
using peer_test::env_count;
using peer_test::make_record;
using peer_test::record;

// Small rings: an idle peer costs little, and hundreds fit one VM.
rdx::connection_attr small_attr() {
  return rdx::connection_attr{.send_depth = 16, .signal_interval = 8, .recv_depth = 8, .message_size = 64};
}

// A client connection on one worker and its server on another, connected.
struct link_pair {
  rdx::connection client;
  rdx::connection server;
  rdx::channel<record> tx{client};
  rdx::channel<record> rx{server};
  link_pair(rdx::worker& wc, rdx::worker& ws, const rdx::protection_domain& pd,
            const rdx::connection_attr& attr = small_attr())
      : client(wc, pd, attr), server(ws, pd, attr) {
    rdx::connect_pair(client, server);
  }
};

struct fabric {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
};

// Sends n messages on every pair and receives them, driving both workers
// from this thread only; every message's pair, order and check are verified.
void exchange(rdx::worker& wc, rdx::worker& ws, std::vector<std::unique_ptr<link_pair>>& pairs,
              std::uint32_t n, std::uint32_t first_seq = 0) {
  struct flow {
    std::optional<rdx::operation> send;
    std::optional<rdx::receive_operation<record>> recv;
    std::uint32_t sent = 0, got = 0;
  };
  std::vector<flow> f(pairs.size());
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  std::size_t finished = 0;
  while (finished < pairs.size()) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      auto& p = *pairs[i];
      flow& x = f[i];
      if (x.got == n) continue;
      if (x.sent < n && (!x.send || x.send->done())) {
        if (x.send) REQUIRE(x.send->error() == std::error_code{});
        x.send.emplace(p.tx.send(make_record(static_cast<std::uint32_t>(i), first_seq + x.sent)));
        ++x.sent;
      }
      if (!x.recv) x.recv.emplace(p.rx.receive());
      if (x.recv->done()) {
        REQUIRE(x.recv->error() == std::error_code{});
        const record r = x.recv->value();
        const record want = make_record(static_cast<std::uint32_t>(i), first_seq + x.got);
        REQUIRE(r.pair == want.pair);
        REQUIRE(r.seq == want.seq);
        REQUIRE(r.check == want.check);
        x.recv.reset();
        if (++x.got == n) ++finished;
      }
    }
    wc.progress();
    ws.progress();
  }
  for (auto& x : f) {
    if (x.send) REQUIRE(x.send->wait(20s) == std::error_code{});
  }
}

}  // namespace

TEST_CASE("many connections on one worker each carry checked messages, from one thread",
          "[worker][many_peers]") {
  fabric fb;
  const std::size_t peers = env_count("RDX_TEST_PEERS", 32);
  rdx::worker wc(fb.pd), ws(fb.pd);
  std::vector<std::unique_ptr<link_pair>> pairs;
  const counts before = device_count::read();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < peers; ++i) pairs.push_back(std::make_unique<link_pair>(wc, ws, fb.pd));
  const double setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const counts after = device_count::read();
  if (before.known() && after.known()) {
    // Per connection: one queue pair, no completion queue of its own.
    const auto n = static_cast<long>(2 * peers);
    std::printf(
        "worker: %ld connections: %ld queue pairs, %ld completion queues, %ld memory regions more on the "
        "device (%.1f regions per connection)\n",
        n, after.qp - before.qp, after.cq - before.cq, after.mr - before.mr,
        static_cast<double>(after.mr - before.mr) / static_cast<double>(n));
    std::printf("worker: %lld registered bytes per connection\n",
                (after.mr_bytes - before.mr_bytes) / static_cast<long long>(n));
    CHECK(after.cq == before.cq);
    CHECK(after.qp - before.qp == n);
  } else {
    std::printf(
        "worker: rdma resource show gave no counts here: queue pairs and regions per connection not "
        "checked\n");
  }
  CHECK(ws.connections() == peers);
  CHECK(ws.queue_pairs() == peers);
  CHECK(ws.cq_reserved() == static_cast<int>(peers * (16 + 8 + 1)));
  CHECK(ws.cq_reserved() <= ws.cq_capacity());
  CHECK(pairs[0]->server.on_worker());
  CHECK(pairs[0]->server.cq().native_handle() == ws.cq().native_handle());
  const auto t1 = std::chrono::steady_clock::now();
  exchange(wc, ws, pairs, 20);
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf(
      "worker: %zu connection pairs on two workers, set up in %.2f s (%.0f per second), "
      "%zu checked messages in %.2f s\n",
      peers, setup_s, static_cast<double>(peers) / setup_s, peers * 20, run_s);
  for (auto& p : pairs) {
    CHECK_FALSE(p->client.failed());
    CHECK_FALSE(p->server.failed());
  }
  // Teardown of every connection is bounded, and the worker is empty after.
  const auto t2 = std::chrono::steady_clock::now();
  pairs.clear();
  const double down_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t2).count();
  std::printf("worker: %zu pairs torn down in %.2f s\n", peers, down_s);
  CHECK(down_s < 60.0);
  CHECK(ws.connections() == 0);
  CHECK(ws.cq_reserved() == 0);
}

TEST_CASE("one peer's failure on a worker ends only its own operations", "[worker]") {
  fabric fb;
  rdx::worker wc(fb.pd), ws(fb.pd);
  std::vector<std::unique_ptr<link_pair>> pairs;
  for (int i = 0; i < 8; ++i) pairs.push_back(std::make_unique<link_pair>(wc, ws, fb.pd));
  exchange(wc, ws, pairs, 4);
  // Receives wait on every server; pair 3's queue pair is forced to ERR.
  std::vector<rdx::receive_operation<record>> waiting;
  for (auto& p : pairs) waiting.push_back(p->rx.receive());
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  REQUIRE(::ibv_modify_qp(pairs[3]->server.qp(0).native_handle(), &a, IBV_QP_STATE) == 0);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!waiting[3].done() && std::chrono::steady_clock::now() < deadline) ws.progress();
  REQUIRE(waiting[3].done());
  CHECK(waiting[3].error() != std::error_code{});
  CHECK(pairs[3]->server.failed());
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    if (i == 3) continue;
    CHECK_FALSE(waiting[i].done());
    CHECK_FALSE(pairs[i]->server.failed());
  }
  // The others still carry traffic, checked, while the failed one stays failed.
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    if (i == 3) continue;
    auto s = pairs[i]->tx.send(make_record(static_cast<std::uint32_t>(i), 4));
    REQUIRE(waiting[i].wait(20s) == std::error_code{});
    CHECK(waiting[i].value().seq == 4);
    CHECK(waiting[i].value().pair == i);
    REQUIRE(s.wait(20s) == std::error_code{});
  }
  (void)pairs[3]->server.progress();
  CHECK(pairs[3]->server.failed());
  // Its teardown does not disturb the others.
  pairs.erase(pairs.begin() + 3);
  CHECK(ws.connections() == 7);
  exchange(wc, ws, pairs, 3, 100);
}

TEST_CASE("connections join and leave a worker during traffic", "[worker]") {
  fabric fb;
  rdx::worker wc(fb.pd), ws(fb.pd);
  std::vector<std::unique_ptr<link_pair>> pairs;
  for (int i = 0; i < 4; ++i) pairs.push_back(std::make_unique<link_pair>(wc, ws, fb.pd));
  for (std::uint32_t round = 0; round < 6; ++round) {
    // Messages in flight on every pair while one joins and one leaves.
    std::vector<rdx::operation> sends;
    std::vector<rdx::receive_operation<record>> recvs;
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      sends.push_back(pairs[i]->tx.send(make_record(static_cast<std::uint32_t>(i), round)));
      recvs.push_back(pairs[i]->rx.receive());
    }
    pairs.push_back(std::make_unique<link_pair>(wc, ws, fb.pd));
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      REQUIRE(recvs[i].wait(20s) == std::error_code{});
      CHECK(recvs[i].value().seq == round);
      CHECK(recvs[i].value().pair == i);
      REQUIRE(sends[i].wait(20s) == std::error_code{});
    }
    sends.clear();
    recvs.clear();
    // The oldest leaves with a message still unreceived at its server.
    auto left = pairs.front()->tx.send(make_record(0, 999));
    REQUIRE(left.wait(20s) == std::error_code{});
    pairs.erase(pairs.begin());
    CHECK(ws.connections() == pairs.size());
    CHECK(wc.connections() == pairs.size());
    // Record numbers follow the vector's order: pair i's messages say i.
    exchange(wc, ws, pairs, 2, 1000 + round * 10);
  }
}

TEST_CASE("a worker and its connections are destroyed in either order", "[worker]") {
  fabric fb;
  std::optional<rdx::worker> wc(std::in_place, fb.pd), ws(std::in_place, fb.pd);
  auto p = std::make_unique<link_pair>(*wc, *ws, fb.pd);
  auto pending = p->rx.receive();
  // The worker handles go first: the connections keep the shared queue.
  wc.reset();
  ws.reset();
  auto s = p->tx.send(make_record(0, 7));
  REQUIRE(pending.wait(20s) == std::error_code{});
  CHECK(pending.value().seq == 7);
  REQUIRE(s.wait(20s) == std::error_code{});
  auto orphan = p->rx.receive();
  p.reset();
  CHECK(orphan.done());
  CHECK(orphan.error() == rdx::errc::operation_aborted);
}

TEST_CASE("a worker refuses what does not fit or does not match, before anything is made", "[worker]") {
  fabric fb;
  rdx::worker small(fb.pd, rdx::worker_attr{.cq_depth = 100});
  CHECK(small.cq_capacity() >= 100);
  std::string what;
  // 1 x 256 + 64 + 1 entries do not fit in about 100.
  CHECK(code_of([&] { rdx::connection c(small, fb.pd); }, &what) == rdx::errc::limit_exceeded);
  CHECK(what.find("needs 321") != std::string::npos);
  CHECK(what.find("cq_depth") != std::string::npos);
  CHECK(small.connections() == 0);
  CHECK(small.cq_reserved() == 0);
  // A connection that fits still works after the refusal.
  {
    rdx::connection c(small, fb.pd,
                      rdx::connection_attr{.send_depth = 8, .signal_interval = 4, .recv_depth = 4});
    CHECK(small.connections() == 1);
  }
  CHECK(small.connections() == 0);
  // Event mode asked of a worker without it.
  CHECK(
      code_of([&] { rdx::connection c(small, fb.pd, rdx::connection_attr{.recv_depth = 4, .events = true}); },
              &what) == rdx::errc::invalid_argument);
  CHECK(what.find("worker_attr::events") != std::string::npos);
  // A protection domain of another open context: the queue pairs could not use the worker's queue.
  rdx::context other = rdx::context::open_default();
  rdx::protection_domain other_pd(other);
  CHECK(code_of([&] { rdx::connection c(small, other_pd, small_attr()); }, &what) ==
        rdx::errc::invalid_argument);
  CHECK(small.connections() == 0);
  CHECK(code_of([&] { rdx::worker w(fb.pd, rdx::worker_attr{.cq_depth = -1}); }) ==
        rdx::errc::invalid_argument);
  // A moved-from worker is empty: it drives nothing, and nothing is made on it.
  rdx::worker moved(fb.pd);
  rdx::worker taker(std::move(moved));
  CHECK(taker);
  CHECK_FALSE(moved);
  CHECK(moved.progress() == 0);
  CHECK(moved.fd() == -1);
  CHECK(moved.wait(1ms) == rdx::errc::not_ready);
  CHECK(moved.connections() == 0);
  CHECK(code_of([&] { rdx::connection c(moved, fb.pd, small_attr()); }, &what) ==
        rdx::errc::invalid_argument);
  CHECK(what.find("moved from") != std::string::npos);
  rdx::worker polled(fb.pd);
  CHECK(polled.fd() == -1);
  CHECK(polled.arm() == rdx::errc::not_ready);
  CHECK(polled.wait(1ms) == rdx::errc::not_ready);
}

TEST_CASE("event mode: the worker's one descriptor in an epoll loop loses no wake-up", "[worker]") {
  fabric fb;
  const std::size_t rounds = env_count("RDX_TEST_WAKEUPS", 2000);
  rdx::worker wc(fb.pd), ws(fb.pd, rdx::worker_attr{.events = true});
  REQUIRE(ws.fd() >= 0);
  std::vector<std::unique_ptr<link_pair>> pairs;
  for (int i = 0; i < 4; ++i) pairs.push_back(std::make_unique<link_pair>(wc, ws, fb.pd));
  // The application's own epoll set holds the worker's descriptor.
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, ws.fd(), &ev) == 0);
  // The clients (and their worker) belong to a sender thread: message r
  // leaves once the receiver has started receive r, so it lands sometimes
  // before the receiver arms and sometimes while it sleeps.
  std::atomic<std::size_t> go{0};
  std::atomic<bool> sender_ok{true};
  std::thread sender([&] {
    for (std::size_t r = 0; r < rounds; ++r) {
      while (go.load(std::memory_order_acquire) <= r) std::this_thread::yield();
      const std::size_t i = r % pairs.size();
      auto send =
          pairs[i]->tx.send(make_record(static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(r)));
      if (send.wait(20s)) sender_ok = false;
    }
  });
  std::uint64_t sleeps = 0, woken = 0, not_slept = 0, spurious = 0;
  const auto t0 = std::chrono::steady_clock::now();
  bool lost = false;
  for (std::size_t r = 0; r < rounds && !lost; ++r) {
    const std::size_t i = r % pairs.size();
    auto recv = pairs[i]->rx.receive();
    go.store(r + 1, std::memory_order_release);
    while (!recv.done()) {
      while (ws.progress() > 0) {}
      if (recv.done()) break;
      const std::error_code armed = ws.arm();
      if (armed == std::errc::resource_unavailable_try_again) {
        ++not_slept;
        continue;
      }
      REQUIRE(armed == std::error_code{});
      ++sleeps;
      epoll_event out{};
      // A lost wake-up would sleep the whole 10 s with the message there.
      if (::epoll_wait(ep, &out, 1, 10000) != 1) {
        lost = true;
        break;
      }
      ++woken;
      ws.ack_events();
      if (ws.progress() == 0) ++spurious;
    }
    if (lost) break;
    REQUIRE(recv.error() == std::error_code{});
    REQUIRE(recv.value().seq == r);
    REQUIRE(recv.value().pair == i);
  }
  if (lost) go.store(rounds + 1);  // let the sender finish
  sender.join();
  REQUIRE_FALSE(lost);
  CHECK(sender_ok);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "worker events: %zu messages, %llu sleeps, %llu wake-ups (%llu with nothing to handle), %llu arms "
      "that found work, %.2f s\n",
      rounds, static_cast<unsigned long long>(sleeps), static_cast<unsigned long long>(woken),
      static_cast<unsigned long long>(spurious), static_cast<unsigned long long>(not_slept), s);
  CHECK(woken == sleeps);
  CHECK(sleeps > 0);  // the sleeping path was taken, not only the polling one
  // A wake-up with nothing to handle comes only from an event raised by a
  // completion that arm()'s own last poll already took: at most one per such arm.
  CHECK(spurious <= not_slept);
  ::close(ep);
  // wait() on the worker: the same protocol inside, bounded by its timeout.
  auto recv = pairs[0]->rx.receive();
  // What is left from the loop (a credit report's completion, a stale event) is handled first.
  std::error_code idle;
  for (int k = 0; k < 100 && idle != rdx::errc::timed_out; ++k) {
    const auto w0 = std::chrono::steady_clock::now();
    idle = ws.wait(50ms);
    if (idle == rdx::errc::timed_out) CHECK(std::chrono::steady_clock::now() - w0 >= 50ms);
  }
  CHECK(idle == rdx::errc::timed_out);
  CHECK_FALSE(recv.done());
  auto send = pairs[0]->tx.send(make_record(0, 5));
  wc.progress();
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!recv.done() && std::chrono::steady_clock::now() < deadline) (void)ws.wait(1000ms);
  REQUIRE(recv.done());
  CHECK(recv.value().seq == 5);
  REQUIRE(send.wait(20s) == std::error_code{});
  // A connection's wait in event mode sleeps on the worker's descriptor.
  auto recv2 = pairs[1]->rx.receive();
  auto send2 = pairs[1]->tx.send(make_record(1, 6));
  wc.progress();
  REQUIRE(recv2.wait(20s, rdx::wait_mode::events) == std::error_code{});
  CHECK(recv2.value().seq == 6);
  REQUIRE(send2.wait(20s) == std::error_code{});
}

// Coroutines as functions (not lambdas): their parameters live in the frame,
// while a lambda's captures would die with the closure before it resumes.
channel_test::task receive_within(rdx::channel<record>& rx, std::error_code& out) {
  auto r = rx.receive();
  co_await r.within(100ms);
  out = r.error();
}

channel_test::task receive_until_stopped(rdx::channel<record>& rx, std::stop_token token,
                                         std::error_code& out) {
  auto r = rx.receive();
  co_await r.stop_on(token);
  out = r.error();
}

TEST_CASE("arming covers the one connection that posted unsignaled among many idle ones", "[worker]") {
  fabric fb;
  rdx::worker wc(fb.pd, rdx::worker_attr{.events = true}), ws(fb.pd);
  std::vector<std::unique_ptr<link_pair>> pairs;
  for (int i = 0; i < 64; ++i) pairs.push_back(std::make_unique<link_pair>(wc, ws, fb.pd));
  link_pair& p = *pairs[37];
  // An idle queue's first request is signaled, the next is not (signal
  // interval 8): the second send has no completion of its own.
  auto first = p.tx.send(make_record(37, 0));
  auto second = p.tx.send(make_record(37, 1));
  auto r0 = p.rx.receive();
  auto r1 = p.rx.receive();
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!(r0.done() && r1.done())) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    ws.progress();  // the receiver's worker only: the sender's is driven below by arming alone
  }
  REQUIRE(r1.value().seq == 1);
  REQUIRE_FALSE(second.done());
  // Sleeping needs the second send covered (a signaled request behind it):
  // arm() must do it, or the descriptor never becomes readable.
  int sleeps = 0;
  for (int i = 0; i < 100 && !second.done(); ++i) {
    const std::error_code ec = wc.arm();
    if (ec == std::errc::resource_unavailable_try_again) continue;  // arm() polled something: again
    REQUIRE(ec == std::error_code{});
    pollfd pfd{wc.fd(), POLLIN, 0};
    REQUIRE(::poll(&pfd, 1, 5000) == 1);
    ++sleeps;
    wc.ack_events();
    wc.progress();
  }
  CHECK(first.done());
  CHECK(first.error() == std::error_code{});
  REQUIRE(second.done());
  CHECK(second.error() == std::error_code{});
  INFO("sleeps " << sleeps);
  CHECK(sleeps <= 2);
}

TEST_CASE("bounded awaits and stop requests on a worker's connections", "[worker]") {
  fabric fb;
  rdx::worker wc(fb.pd), ws(fb.pd);
  link_pair p(wc, ws, fb.pd);
  link_pair q(wc, ws, fb.pd);
  std::stop_source stop;
  std::error_code timed, stopped;
  auto t1 = receive_within(p.rx, timed);
  auto t2 = receive_until_stopped(q.rx, stop.get_token(), stopped);
  const auto t0 = std::chrono::steady_clock::now();
  while (!t1.done() && std::chrono::steady_clock::now() - t0 < 10s) ws.progress();
  REQUIRE(t1.done());
  CHECK(timed == rdx::errc::timed_out);
  CHECK_FALSE(t2.done());
  std::thread other([&] { stop.request_stop(); });
  other.join();
  while (!t2.done() && std::chrono::steady_clock::now() - t0 < 10s) ws.progress();
  REQUIRE(t2.done());
  CHECK(stopped == rdx::errc::operation_canceled);
}

TEST_CASE("fairness: every peer of a busy worker gets its share", "[worker][many_peers]") {
  fabric fb;
  const std::size_t peers = env_count("RDX_TEST_PEERS", 32);
  rdx::worker wc(fb.pd), ws(fb.pd);
  std::vector<std::unique_ptr<link_pair>> pairs;
  for (std::size_t i = 0; i < peers; ++i) pairs.push_back(std::make_unique<link_pair>(wc, ws, fb.pd));
  // Every client keeps up to 4 messages in flight, as fast as its credits
  // allow; the server takes whatever arrives, from everyone, for 2 seconds.
  constexpr std::size_t in_flight = 4;
  struct flow {
    std::vector<std::optional<rdx::operation>> sends = std::vector<std::optional<rdx::operation>>(in_flight);
    std::optional<rdx::receive_operation<record>> recv;
    std::uint32_t sent = 0, got = 0;
  };
  std::vector<flow> f(peers);
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < 2s) {
    for (std::size_t i = 0; i < peers; ++i) {
      flow& x = f[i];
      for (auto& s : x.sends) {
        if (s && !s->done()) continue;
        if (s) REQUIRE(s->error() == std::error_code{});
        s.emplace(pairs[i]->tx.send(make_record(static_cast<std::uint32_t>(i), x.sent++)));
      }
      while (true) {
        if (!x.recv) x.recv.emplace(pairs[i]->rx.receive());
        if (!x.recv->done()) break;
        REQUIRE(x.recv->error() == std::error_code{});
        REQUIRE(x.recv->value().seq == x.got);
        ++x.got;
        x.recv.reset();
      }
    }
    wc.progress();
    ws.progress();
  }
  std::uint64_t total = 0;
  std::uint32_t least = ~0u, most = 0;
  for (const auto& x : f) {
    total += x.got;
    least = std::min(least, x.got);
    most = std::max(most, x.got);
  }
  const double mean = static_cast<double>(total) / static_cast<double>(peers);
  std::printf(
      "worker fairness: %zu peers, %llu messages in 2 s, per peer least %u, mean %.1f, most %u (least / mean "
      "%.2f)\n",
      peers, static_cast<unsigned long long>(total), least, mean, most, least / mean);
  CHECK(total > peers);
  CHECK(least >= mean / 2);
}
