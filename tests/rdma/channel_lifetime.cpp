// rdma tests (loopback): every order of destruction, cancellation, deadlines
// and dead peers. Registered four times with tag filters, as lifetime_*,
// cancel_*, deadline_* and dead_peer_*; meant for the asan-ubsan preset,
// where a resumed destroyed coroutine or a touched freed operation is a
// sanitizer report.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "channel_support.hpp"
#include "rdma_support.hpp"

using namespace std::chrono_literals;
using channel_test::task;
using clk = std::chrono::steady_clock;

namespace {

// A coroutine with suspend_never at both ends: it frees its own frame when it
// finishes; the test may destroy it while suspended through the handle.
struct detached {
  struct promise_type {
    detached get_return_object() noexcept {
      return detached{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
  std::coroutine_handle<promise_type> h;
};

// Two connections of one device; either may be destroyed first.
struct sides {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
  std::unique_ptr<rdx::connection> a, b;
  explicit sides(const rdx::connection_attr& attr = {
                     .send_depth = 64, .signal_interval = 16, .recv_depth = 4, .message_size = 64}) {
    a = std::make_unique<rdx::connection>(pd, attr);
    b = std::make_unique<rdx::connection>(pd, attr);
    rdx::connect_pair(*a, *b);
  }
};

// Drives both connections until pred() or the timeout.
template <class P>
bool drive(sides& s, P pred, std::chrono::milliseconds timeout = 10s) {
  const auto end = clk::now() + timeout;
  while (!pred()) {
    if (s.a) s.a->progress();
    if (s.b) s.b->progress();
    if (clk::now() > end) return false;
  }
  return true;
}

// Waits for op while driving both sides (a deferred operation needs its own
// connection's progress; the peer's needs the other's).
template <class Op>
std::error_code wait_both(sides& s, Op& op, std::chrono::milliseconds timeout = 10s) {
  if (!drive(
          s, [&] { return op.done(); }, timeout))
    return rdx::errc::timed_out;
  return op.error();
}

// Counts what reaches the log hook (failed destroys, a drain that timed out).
std::atomic<int> logged{0};
void count_log(std::string_view m) noexcept {
  std::fprintf(stderr, "log hook: %.*s\n", static_cast<int>(m.size()), m.data());
  ++logged;
}

// Runs destroy() with count_log installed: how long it took and what it logged.
struct teardown {
  std::chrono::milliseconds took;
  int logged;
};
template <class F>
teardown timed_teardown(F&& destroy) {
  const auto old_hook = rdx::set_log_hook(&count_log);
  logged = 0;
  const auto t0 = clk::now();
  destroy();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0);
  rdx::set_log_hook(old_hook);
  return {took, logged.load()};
}

}  // namespace

TEST_CASE("connection destroyed before its pending operations: each ends once, aborted", "[lifetime]") {
  const std::string dev = channel_test::open_device().name();
  rdx_test::leak_guard guard(dev);
  auto s = std::make_unique<sides>();
  rdx::channel<std::uint64_t> ta(*s->a);
  rdx::channel<std::uint64_t> tb(*s->b);
  // Four sends use the peer's four credits; two more are deferred.
  std::vector<rdx::operation> sends;
  for (std::uint64_t i = 0; i < 6; ++i) sends.push_back(ta.send(1000 + i));
  CHECK(sends[4].deferred());
  CHECK(sends[5].deferred());
  auto receive = ta.receive();  // nothing will come
  bool resumed = false;
  rdx::operation awaited = ta.next_notification();
  auto waiter = [](rdx::operation& op, bool& flag) -> task {
    (void)co_await op;
    flag = true;
  }(awaited, resumed);
  REQUIRE(sends[3].wait(10s) == std::error_code{});

  // Pending: two deferred sends, a receive, a notification wait.
  const teardown a = timed_teardown([&] { s->a.reset(); });
  INFO("teardown took " << a.took.count() << " ms");
  CHECK(a.logged == 0);   // the drain did not time out, no destroy failed
  CHECK(a.took < 500ms);  // bounded by drain_timeout (2 s), and far below it

  for (int i = 0; i < 4; ++i) CHECK(sends[i].ok());
  CHECK(sends[4].error() == rdx::errc::operation_aborted);
  CHECK(sends[5].error() == rdx::errc::operation_aborted);
  CHECK(receive.done());
  CHECK(receive.error() == rdx::errc::operation_aborted);
  CHECK(awaited.error() == rdx::errc::operation_aborted);
  CHECK_FALSE(resumed);  // a destroyed connection resumes nothing
  // The four posted messages arrived, intact; the deferred two never left.
  for (std::uint64_t i = 0; i < 4; ++i) {
    auto r = tb.receive();
    REQUIRE(r.wait(10s) == std::error_code{});
    CHECK(r.value() == 1000 + i);
  }
  CHECK(s->b->messages_waiting() == 0);
  // Destroying the operations now touches nothing (ASan would tell).
  sends.clear();
  // b reported credits with unsignaled writes: its teardown must still be quick.
  const teardown b = timed_teardown([&] { s.reset(); });
  CHECK(b.logged == 0);
  CHECK(b.took < 500ms);
  guard.check();
}

TEST_CASE("a connection destroyed while message views hold its ring: the views let go safely", "[lifetime]") {
  const std::string dev = channel_test::open_device().name();
  rdx_test::leak_guard guard(dev);
  auto s = std::make_unique<sides>();
  rdx::channel<std::uint64_t> ta(*s->a);
  rdx::channel<std::uint64_t> tb(*s->b);
  auto s0 = ta.send(std::uint64_t{41});
  auto s1 = ta.send(std::uint64_t{42});
  auto v0 = tb.receive_view();
  auto v1 = tb.receive_view();
  REQUIRE(v0.wait(10s) == std::error_code{});
  REQUIRE(v1.wait(10s) == std::error_code{});
  REQUIRE(v0.view()[0] == 41);
  REQUIRE(v1.view()[0] == 42);
  REQUIRE(s0.wait(10s) == std::error_code{});
  REQUIRE(s1.wait(10s) == std::error_code{});
  auto pending = tb.receive_view();  // nothing will come
  // b goes first: the ring the views point into is freed with it.
  const teardown t = timed_teardown([&] { s->b.reset(); });
  CHECK(t.logged == 0);
  CHECK_FALSE(v0.holds());
  CHECK(v0.view().empty());
  CHECK(v1.view().empty());
  CHECK(pending.error() == rdx::errc::operation_aborted);
  v1.release();  // touches nothing (ASan would tell)
  {
    rdx::message_view<std::uint64_t> moved = std::move(v0);
    CHECK(moved.view().empty());
  }
  s.reset();
  guard.check();
}

TEST_CASE("a connection destroyed with a write in flight drains before deregistering", "[lifetime]") {
  const std::string dev = channel_test::open_device().name();
  rdx_test::leak_guard guard(dev);  // contexts, PDs, CQs, QPs, MRs
  {
    sides s({.queue_pairs = 2, .send_depth = 64, .signal_interval = 16, .recv_depth = 4, .chunk_size = 4096});
    auto target = rdx::make_window_buffer<std::byte, rdx::rights::write>(s.pd, 1 << 20);
    rdx::grant<std::byte, rdx::rights::write> w_grant(*s.b, target);
    rdx::remote_window<std::byte, rdx::rights::write> w(*s.a, w_grant.descriptor());
    rdx::registered_buffer<std::byte> src(s.pd, 1 << 20);
    auto op = w.write(src, 0);  // 256 chunks over two queue pairs: partly deferred
    CHECK(op.deferred());
    const teardown t = timed_teardown([&] {
      s.a.reset();
      s.b.reset();
    });
    CHECK(t.logged == 0);
    CHECK(op.done());
    CHECK((op.ok() || op.error() == rdx::errc::operation_aborted));
  }
  guard.check();
}

TEST_CASE("a paced connection destroyed with chunks in flight and a tail deferred behind its window",
          "[lifetime]") {
  const std::string dev = channel_test::open_device().name();
  rdx_test::leak_guard guard(dev);
  {
    sides s({.queue_pairs = 2, .recv_depth = 4, .pacing = true});
    constexpr std::size_t n = 8 << 20;
    auto target = rdx::make_window_buffer<std::byte, rdx::rights::write>(s.pd, n);
    rdx::grant<std::byte, rdx::rights::write> w_grant(*s.b, target);
    rdx::remote_window<std::byte, rdx::rights::write> w(*s.a, w_grant.descriptor());
    rdx::registered_buffer<std::byte> src(s.pd, n);
    auto op = w.write(src, 0);  // the window (256 KiB at first) holds back most of 8 MiB
    CHECK(op.deferred());
    // A chunk goes while less than the window is in flight.
    CHECK(s.a->pacing().in_flight < s.a->pacing().window + s.a->pacing().chunk);
    const teardown t = timed_teardown([&] {
      s.a.reset();
      s.b.reset();
    });
    CHECK(t.logged == 0);
    CHECK(op.done());
    CHECK(op.error() == rdx::errc::operation_aborted);
  }
  guard.check();
}

TEST_CASE("operations destroyed before completion withdraw or detach, and nothing is lost", "[lifetime]") {
  sides s;
  rdx::channel<std::uint64_t> ta(*s.a);
  rdx::channel<std::uint64_t> tb(*s.b);
  {
    auto gone = tb.receive();  // destroyed while waiting: takes no message
  }
  {
    std::vector<rdx::operation> sends;
    for (std::uint64_t i = 0; i < 5; ++i) sends.push_back(ta.send(i));
    REQUIRE(sends[4].deferred());
  }  // four posted ones detach and still arrive; the deferred fifth is withdrawn
  for (std::uint64_t i = 0; i < 4; ++i) {
    auto r = tb.receive();
    REQUIRE(r.wait(10s) == std::error_code{});
    CHECK(r.value() == i);
  }
  REQUIRE(s.a->drain(10s) == std::error_code{});
  auto next = ta.send(77);
  auto r = tb.receive();
  REQUIRE(r.wait(10s) == std::error_code{});
  CHECK(r.value() == 77);  // not 4: the withdrawn send never left
  REQUIRE(next.wait(10s) == std::error_code{});
}

TEST_CASE("moving pending operations keeps them whole", "[lifetime]") {
  sides s;
  rdx::channel<std::uint64_t> ta(*s.a);
  rdx::channel<std::uint64_t> tb(*s.b);
  std::vector<rdx::receive_operation<std::uint64_t>> receives;
  for (int i = 0; i < 3; ++i) receives.push_back(tb.receive());  // reallocations move waiting receives
  std::vector<rdx::operation> sends;
  for (std::uint64_t i = 0; i < 3; ++i) sends.push_back(ta.send(40 + i));
  for (std::uint64_t i = 0; i < 3; ++i) {
    REQUIRE(receives[i].wait(10s) == std::error_code{});
    CHECK(receives[i].value() == 40 + i);
  }
  for (auto& op : sends) CHECK(op.wait(10s) == std::error_code{});
  rdx::operation empty;
  CHECK(empty.wait(1ms) == rdx::errc::not_ready);
}

TEST_CASE("a coroutine destroyed while suspended is never resumed", "[lifetime]") {
  sides s;
  rdx::channel<std::uint64_t> ta(*s.a);
  rdx::channel<std::uint64_t> tb(*s.b);
  bool resumed = false;
  std::stop_source stop;
  SECTION("suspend_always final_suspend, plain and bounded awaits") {
    {
      auto t1 = [](rdx::channel<std::uint64_t>& ch, bool& flag) -> task {
        auto r = co_await ch.receive();
        flag = true;
        (void)r;
      }(tb, resumed);
      auto t2 = [](rdx::channel<std::uint64_t>& ch, bool& flag, std::stop_token tok) -> task {
        auto op = ch.receive();
        (void)co_await op.within(10s, tok);
        flag = true;
      }(tb, resumed, stop.get_token());
      CHECK_FALSE(t1.done());
    }                     // both frames destroyed while suspended
    stop.request_stop();  // its callback was removed with the frame
  }
  SECTION("suspend_never final_suspend, destroyed through its handle") {
    detached d = [](rdx::channel<std::uint64_t>& ch, bool& flag) -> detached {
      auto r = co_await ch.receive();
      flag = true;
      (void)r;
    }(tb, resumed);
    d.h.destroy();
  }
  // The messages go to the next receives, whole.
  (void)ta.send(5);
  (void)ta.send(6);
  auto r = tb.receive();
  REQUIRE(r.wait(10s) == std::error_code{});
  CHECK(r.value() == 5);
  CHECK_FALSE(resumed);
}

TEST_CASE("a coroutine that destroys a sibling completed in the same poll", "[lifetime]") {
  sides s;
  rdx::channel<std::uint64_t> ta(*s.a);
  rdx::channel<std::uint64_t> tb(*s.b);
  auto first = std::make_unique<rdx::receive_operation<std::uint64_t>>(tb.receive());
  auto second = std::make_unique<rdx::receive_operation<std::uint64_t>>(tb.receive());
  bool first_resumed = false, second_resumed = false;
  std::uint64_t got = 0;
  auto t1 = [](rdx::receive_operation<std::uint64_t>& op,
               std::unique_ptr<rdx::receive_operation<std::uint64_t>>& sibling, bool& flag,
               std::uint64_t& v) -> task {
    auto r = co_await op;
    v = r.value;
    sibling.reset();  // completed in the same poll, waiting to be resumed
    flag = true;
  }(*first, second, first_resumed, got);
  auto t2 = [](rdx::receive_operation<std::uint64_t>& op, bool& flag) -> task {
    (void)co_await op;
    flag = true;
  }(*second, second_resumed);
  auto s1 = ta.send(1);
  auto s2 = ta.send(2);
  // Both messages land (the sends are acknowledged) before b polls once.
  REQUIRE(s1.wait(10s) == std::error_code{});
  REQUIRE(s2.wait(10s) == std::error_code{});
  std::this_thread::sleep_for(50ms);
  s.b->progress();
  REQUIRE(first_resumed);
  CHECK(got == 1);
  CHECK_FALSE(second_resumed);
  s.b->progress();
  CHECK_FALSE(second_resumed);
}

TEST_CASE("co_await canceled by its stop token, from this thread and from another", "[cancel]") {
  sides s({.send_depth = 64, .signal_interval = 16, .recv_depth = 4, .message_size = 64, .events = true});
  rdx::channel<std::uint64_t> ta(*s.a);
  rdx::channel<std::uint64_t> tb(*s.b);
  std::error_code result;
  bool resumed = false;
  std::stop_source stop;
  auto t = [](rdx::channel<std::uint64_t>& ch, std::stop_token tok, std::error_code& ec, bool& flag) -> task {
    auto op = ch.receive();
    ec = co_await op.stop_on(tok);
    flag = true;
  }(tb, stop.get_token(), result, resumed);
  SECTION("stopped here") {
    stop.request_stop();
    s.b->progress();
  }
  SECTION("stopped by another thread while this one sleeps on the completion channel") {
    std::thread other([&] {
      std::this_thread::sleep_for(200ms);
      stop.request_stop();
    });
    const auto t0 = clk::now();
    (void)s.b->wait_event(10s);
    const auto took = clk::now() - t0;
    other.join();
    if (!resumed) (void)s.b->wait_event(1s);
    INFO("woke after " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
    CHECK(took < 5s);
  }
  REQUIRE(resumed);
  CHECK(result == rdx::errc::operation_canceled);
  // The canceled receive was withdrawn: the next message goes to the next receive.
  auto nine = ta.send(9);
  auto r = tb.receive();
  REQUIRE(wait_both(s, r) == std::error_code{});
  CHECK(r.value() == 9);
}

TEST_CASE("cancel() of a deferred send: it never leaves", "[cancel]") {
  sides s;
  rdx::channel<std::uint64_t> ta(*s.a);
  rdx::channel<std::uint64_t> tb(*s.b);
  std::vector<rdx::operation> sends;
  for (std::uint64_t i = 0; i < 5; ++i) sends.push_back(ta.send(i));
  REQUIRE(sends[4].deferred());
  CHECK(sends[4].cancel());
  CHECK(sends[4].error() == rdx::errc::operation_canceled);
  CHECK_FALSE(sends[4].cancel());  // ended once
  auto extra = ta.send(99);
  for (std::uint64_t want : {0, 1, 2, 3, 99}) {
    auto r = tb.receive();
    REQUIRE(wait_both(s, r) == std::error_code{});
    CHECK(r.value() == want);
  }
}

TEST_CASE("a co_await that hits its deadline", "[deadline]") {
  const bool events = GENERATE(false, true);
  INFO((events ? "event mode" : "poll mode"));
  sides s({.send_depth = 64, .signal_interval = 16, .recv_depth = 4, .message_size = 64, .events = events});
  rdx::channel<std::uint64_t> ta(*s.a);
  rdx::channel<std::uint64_t> tb(*s.b);
  std::error_code result;
  bool resumed = false;
  const auto t0 = clk::now();
  auto t = [](rdx::channel<std::uint64_t>& ch, std::error_code& ec, bool& flag) -> task {
    auto op = ch.receive();
    ec = co_await op.within(300ms);
    flag = true;
  }(tb, result, resumed);
  const auto mode = events ? rdx::wait_mode::events : rdx::wait_mode::poll;
  while (!resumed && clk::now() - t0 < 10s) (void)s.b->run_until(clk::now() + 50ms, mode);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0);
  INFO("resumed after " << took.count() << " ms");
  REQUIRE(resumed);
  CHECK(result == rdx::errc::timed_out);
  CHECK(took >= 300ms);
  CHECK(took < 3s);
  (void)ta.send(3);
  auto r = tb.receive();
  REQUIRE(r.wait(10s, mode) == std::error_code{});
  CHECK(r.value() == 3);
}

TEST_CASE("a deferred send that hits its deadline, and wait_until leaving an operation pending",
          "[deadline]") {
  sides s;
  rdx::channel<std::uint64_t> ta(*s.a);
  rdx::channel<std::uint64_t> tb(*s.b);
  std::vector<rdx::operation> sends;
  for (std::uint64_t i = 0; i < 4; ++i) sends.push_back(ta.send(i));
  auto late = ta.send(4);
  REQUIRE(late.deferred());
  std::error_code result;
  auto t = [](rdx::operation& op, std::error_code& ec) -> task { ec = co_await op.within(100ms); }(late,
                                                                                                   result);
  REQUIRE(drive(
      s, [&] { return late.done(); }, 5s));
  CHECK(result == rdx::errc::timed_out);
  auto pending = tb.next_notification();
  CHECK(pending.wait_until(clk::now() + 50ms) == rdx::errc::timed_out);
  CHECK_FALSE(pending.done());  // still waiting
  auto note = ta.notify(7);
  for (std::uint64_t i = 0; i < 4; ++i) {
    auto r = tb.receive();
    REQUIRE(wait_both(s, r) == std::error_code{});
    CHECK(r.value() == i);
  }
  REQUIRE(wait_both(s, pending) == std::error_code{});
  CHECK(pending.tag() == 7);
  CHECK(s.b->messages_waiting() == 0);  // the timed-out send never left
}

TEST_CASE("a peer that stops answering: receives alone notice, within the bound", "[dead_peer]") {
  sides s({.send_depth = 64, .signal_interval = 16, .recv_depth = 4, .message_size = 64, .keepalive = 500ms});
  rdx::channel<std::uint64_t> ta(*s.a);
  auto r = ta.receive();
  auto n = ta.next_notification();
  s.b.reset();  // its queue pairs are gone: nothing answers any more
  const auto t0 = clk::now();
  const std::error_code ec = r.wait(30s);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0);
  const auto bound = s.a->detection_bound();
  std::printf("dead_peer loopback (receives only): detected in %lld ms, bound %lld ms\n",
              static_cast<long long>(took.count()), static_cast<long long>(bound.count()));
  INFO(ec.message());
  REQUIRE(ec);
  CHECK(ec == rdx::make_wc_error_code(IBV_WC_RETRY_EXC_ERR));
  CHECK(took <= bound);
  CHECK(n.done());
  CHECK(n.error() == ec);
  CHECK(s.a->failed());
  auto after = ta.send(1);  // later operations fail at once
  CHECK(after.error() == rdx::errc::operation_failed);
}

TEST_CASE("a peer that never posts receives: bounded, clear error", "[dead_peer]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  rdx::connection a(pd, {.send_depth = 64, .signal_interval = 16, .recv_depth = 4, .message_size = 64});
  rdx::completion_queue cq(ctx, 16);
  rdx::queue_pair raw(pd, cq, cq, rdx::queue_pair_attr{.max_send_wr = 4, .max_recv_wr = 4});
  rdx::registered_buffer<std::uint64_t> word(pd, 1, rdx::access::local_write | rdx::access::remote_write);
  rdx::connection_info peer{{raw.local_endpoint()}, word.remote(), 4, 64};
  a.connect(peer);
  raw.connect(a.local_info().endpoints[0]);
  rdx::channel<std::uint64_t> ch(a);
  const auto t0 = clk::now();
  auto op = ch.send(1);
  const std::error_code ec = op.wait(30s);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0);
  std::printf("peer without receives: failed in %lld ms (%s)\n", static_cast<long long>(took.count()),
              ec.message().c_str());
  CHECK(ec == rdx::make_wc_error_code(IBV_WC_RNR_RETRY_EXC_ERR));
  CHECK(ec.message().find("receiver not ready") != std::string::npos);
  CHECK(took < a.detection_bound());
}

TEST_CASE("teardown after unsignaled requests that already finished is quick", "[lifetime]") {
  sides s;
  auto target = rdx::make_window_buffer<std::uint64_t, rdx::rights::write>(s.pd, 64);
  rdx::grant<std::uint64_t, rdx::rights::write> w_grant(*s.b, target);
  rdx::remote_window<std::uint64_t, rdx::rights::write> w(*s.a, w_grant.descriptor());
  rdx::registered_buffer<std::uint64_t> src(s.pd, 64);
  for (std::size_t i = 0; i < 64; ++i) src[i] = i + 1;
  {
    // The first is signaled (idle queue), the next three are not; all four
    // are destroyed (detached) without a wait, so nothing covers them.
    std::vector<rdx::operation> ops;
    for (std::size_t i = 0; i < 4; ++i) {
      ops.push_back(w.write(rdx::local_span<const std::uint64_t>(src).subspan(16 * i, 16), 16 * i));
    }
  }
  std::this_thread::sleep_for(200ms);  // the NIC finishes them; the last three leave no completion
  CHECK(s.a->outstanding() >= 3);
  const teardown t = timed_teardown([&] { s.a.reset(); });
  INFO("teardown took " << t.took.count() << " ms");
  CHECK(t.logged == 0);
  CHECK(t.took < 500ms);
  CHECK(std::memcmp(target.data(), src.data(), 64 * 8) == 0);  // the detached writes landed
}

TEST_CASE("a peer credit count that claims more than was sent fails the connection", "[dead_peer]") {
  sides s;
  rdx::channel<std::uint64_t> ta(*s.a);
  // b writes an impossible consumed count (1000; a sent nothing) into a's
  // credit word, the way a hostile peer could.
  const rdx::window_descriptor word{s.a->local_info().credit_word, rdx::rights::write, 8};
  rdx::remote_window<std::uint64_t, rdx::rights::write> forge(*s.b, word);
  rdx::registered_buffer<std::uint64_t> bogus(s.pd, 1);
  bogus[0] = 1000;
  auto w = forge.write(bogus, 0);
  REQUIRE(wait_both(s, w) == std::error_code{});
  auto sent = ta.send(1);
  REQUIRE(wait_both(s, sent) == rdx::errc::protocol_error);
  CHECK(s.a->failed());
  CHECK(s.a->failure_reason() == rdx::errc::protocol_error);
  CHECK(s.b->messages_waiting() == 0);  // nothing was sent on the forged credit
}
