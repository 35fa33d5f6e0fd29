// rdma tests (loopback): the threading rules (docs/design.md, "Threading").
// [threads]: the supported pattern, run under ThreadSanitizer in CI: one
// connection per thread, sharing a context and a protection domain, and a
// stop request from another thread ending a bounded co_await.
// [thread_check]: the debug check aborts when two threads use one
// connection at once (built with RDX_THREAD_CHECKS=1 in every preset).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <stop_token>
#include <thread>

#include "channel_support.hpp"
#include <sys/wait.h>
#include <unistd.h>

using namespace std::chrono_literals;

namespace {

// Two connected connections of pd, exchanging n checked messages.
void ping_pong(const rdx::protection_domain& pd, std::uint64_t salt, int n, std::atomic<int>& bad) {
  rdx::connection a(pd, {.recv_depth = 8, .message_size = 64});
  rdx::connection b(pd, {.recv_depth = 8, .message_size = 64});
  rdx::connect_pair(a, b);
  rdx::channel<std::uint64_t> ta(a), tb(b);
  for (int i = 0; i < n; ++i) {
    auto s = ta.send(salt + static_cast<std::uint64_t>(i));
    auto r = tb.receive();
    if (r.wait(10s) || r.value() != salt + static_cast<std::uint64_t>(i) || s.wait(10s)) ++bad;
  }
}

}  // namespace

TEST_CASE("one connection per thread, a shared protection domain, a stop from another thread", "[threads]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  std::atomic<int> bad{0};
  std::stop_source stop;
  std::atomic<bool> waiting{false};
  std::error_code canceled;
  std::thread t1([&] { ping_pong(pd, 1000, 200, bad); });
  std::thread t2([&] {
    ping_pong(pd, 5000, 200, bad);
    // A bounded await on this thread, stopped from the main thread.
    rdx::connection a(pd, {.recv_depth = 4, .message_size = 64});
    rdx::connection b(pd, {.recv_depth = 4, .message_size = 64});
    rdx::connect_pair(a, b);
    rdx::channel<std::uint64_t> tb(b);
    bool resumed = false;
    auto t = [](rdx::channel<std::uint64_t>& ch, std::stop_token tok, std::error_code& ec,
                bool& flag) -> channel_test::task {
      auto op = ch.receive();
      ec = co_await op.stop_on(tok);
      flag = true;
    }(tb, stop.get_token(), canceled, resumed);
    waiting = true;
    const auto end = std::chrono::steady_clock::now() + 20s;
    while (!resumed && std::chrono::steady_clock::now() < end) b.progress();
  });
  while (!waiting) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(50ms);
  stop.request_stop();
  t1.join();
  t2.join();
  CHECK(bad == 0);
  CHECK(canceled == rdx::errc::operation_canceled);
}

TEST_CASE("the debug check stops a connection used from two threads at once", "[thread_check]") {
  rdx::context ctx = channel_test::open_device();
  const pid_t child = ::fork();
  if (child == 0) {
    rdx::protection_domain pd(ctx);
    rdx::connection a(pd, {.recv_depth = 4, .message_size = 64});
    std::atomic<bool> go{false};
    auto hammer = [&] {
      while (!go) {}
      for (int i = 0; i < 50'000'000; ++i) a.progress();
    };
    std::thread x(hammer), y(hammer);
    go = true;
    x.join();
    y.join();
    ::_exit(0);  // not reached when the check works
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("status " << status);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
}
