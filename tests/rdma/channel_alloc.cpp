// rdma test: no heap allocation per operation. Global operator new is
// replaced by a counting one; after a warm-up, thousands of window writes,
// reads, atomics, channel sends and receives run in each completion mode
// (wait, test, co_await, event mode), then posts taken by a handler, and the count must stay 0.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <span>
#include <stdexcept>

#include "channel_support.hpp"

namespace {
std::atomic<std::size_t> allocations{0};
}

void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  return ::operator new(n);
}
void* operator new(std::size_t n, std::align_val_t a) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  const auto al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return ::operator new(n, a);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

using namespace std::chrono_literals;
using rdx::rights;

namespace {

int failures = 0;
void expect(bool ok, const char* what, long i) {
  if (!ok && failures++ < 10) std::fprintf(stderr, "FAILED: %s (iteration %ld)\n", what, i);
}

struct setup {
  channel_test::pair p;
  rdx::registered_buffer<std::uint64_t> target;
  rdx::registered_buffer<std::uint64_t> counters;
  rdx::grant<std::uint64_t, rights::read | rights::write> target_grant;
  rdx::grant<std::uint64_t, rights::atomic> counters_grant;
  rdx::remote_window<std::uint64_t, rights::read | rights::write> w;
  rdx::remote_window<std::uint64_t, rights::atomic> cw;
  rdx::registered_buffer<std::uint64_t> src, dst;
  rdx::channel<std::uint64_t> tx, rx;
  explicit setup(bool events)
      : p(rdx::connection_attr{.recv_depth = 16, .message_size = 64, .events = events}),
        target(rdx::make_window_buffer<std::uint64_t, rights::read | rights::write>(p.pd, 64)),
        counters(rdx::make_window_buffer<std::uint64_t, rights::atomic>(p.pd, 8)),
        target_grant(p.b, target),
        counters_grant(p.b, counters),
        w(p.a, target_grant.descriptor()),
        cw(p.a, counters_grant.descriptor()),
        src(p.pd, 64),
        dst(p.pd, 64),
        tx(p.a),
        rx(p.b) {}
};

// One round: write, read back, fetch_add, send, receive; each op finished by `finish`.
template <class Finish>
void round(setup& s, long i, Finish&& finish) {
  s.src[0] = static_cast<std::uint64_t>(i);
  {
    auto op = s.w.write(rdx::local_span<const std::uint64_t>(s.src).subspan(0, 8), 8);
    expect(!finish(op, s.p.a), "write", i);
  }
  {
    auto op = s.w.read(rdx::local_span<std::uint64_t>(s.dst).subspan(0, 8), 8);
    expect(!finish(op, s.p.a) && s.dst[0] == static_cast<std::uint64_t>(i), "read", i);
  }
  {
    auto op = s.cw.fetch_add(1, 1);
    expect(!finish(op, s.p.a) && op.old_value() + 1 == s.counters[1], "fetch_add", i);
  }
  {
    auto snd = s.tx.send(static_cast<std::uint64_t>(i) * 3);
    auto rcv = s.rx.receive();
    expect(!finish(rcv, s.p.b) && rcv.value() == static_cast<std::uint64_t>(i) * 3, "receive", i);
    expect(!finish(snd, s.p.a), "send", i);
  }
}

channel_test::task coro(setup& s, long first, long n) {
  for (long i = first; i < first + n; ++i) {
    s.src[0] = static_cast<std::uint64_t>(i);
    expect(!co_await s.w.write(rdx::local_span<const std::uint64_t>(s.src).subspan(0, 8), 8), "co write", i);
    expect(!co_await s.w.read(rdx::local_span<std::uint64_t>(s.dst).subspan(0, 8), 8) &&
               s.dst[0] == static_cast<std::uint64_t>(i),
           "co read", i);
    expect(!co_await s.cw.fetch_add(1, 1), "co fetch_add", i);
    expect(!co_await s.tx.send(static_cast<std::uint64_t>(i)), "co send", i);
    rdx::received<std::uint64_t> m = co_await s.rx.receive();
    expect(m && m.value == static_cast<std::uint64_t>(i), "co receive", i);
  }
}

template <class F>
std::size_t measure(const char* mode, long warmup, long n, F&& run, int ops = 5) {
  run(0, warmup);
  const std::size_t before = allocations.load();
  run(warmup, n);
  const std::size_t count = allocations.load() - before;
  std::printf("%-10s %ld rounds (%d operations each) after %ld warm-up rounds: %zu heap allocations\n", mode,
              n, ops, warmup, count);
  return count;
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 1000;
  const long warmup = 100;
  std::size_t total = 0;
  try {
    setup s(false);
    total += measure("wait", warmup, n, [&](long first, long count) {
      for (long i = first; i < first + count; ++i) {
        round(s, i, [](rdx::operation& op, rdx::connection&) { return op.wait(20s); });
      }
    });
    total += measure("test", warmup, n, [&](long first, long count) {
      for (long i = first; i < first + count; ++i) {
        round(s, i, [](rdx::operation& op, rdx::connection&) {
          while (!op.test()) {}
          return op.error();
        });
      }
    });
    {
      // The coroutine's frame is one allocation per coroutine, not per operation.
      auto warm = coro(s, 0, warmup);
      while (!warm.done()) {
        s.p.a.progress();
        s.p.b.progress();
      }
      const std::size_t frame_before = allocations.load();
      auto t = coro(s, warmup, n);
      const std::size_t after_frame = allocations.load();
      while (!t.done()) {
        s.p.a.progress();
        s.p.b.progress();
      }
      const std::size_t count = allocations.load() - after_frame;
      std::printf(
          "%-10s %ld rounds (5 operations each) after %ld warm-up rounds: %zu heap allocations "
          "(+%zu for the coroutine frame itself)\n",
          "co_await", n, warmup, count, after_frame - frame_before);
      total += count;
    }
    {
      // post and a handler: no operation on either side, and no allocation either.
      std::uint64_t last = 0, got = 0;
      auto* lp = &last;
      auto* gp = &got;
      if (s.rx.on_message([lp, gp](std::span<const std::uint64_t> m) {
            *lp = m[0];
            ++*gp;
          })) {
        throw std::runtime_error("on_message refused");
      }
      total += measure(
          "handler", warmup, n,
          [&](long first, long count) {
            for (long i = first; i < first + count; ++i) {
              const std::uint64_t before = got;
              while (s.tx.post(static_cast<std::uint64_t>(i) * 5)) {
                s.p.b.progress();
                s.p.a.progress();
              }
              while (got == before) {
                s.p.b.progress();
                s.p.a.progress();
              }
              expect(got == before + 1 && last == static_cast<std::uint64_t>(i) * 5, "handler", i);
            }
          },
          1);
      s.rx.remove_handler();
    }
    setup e(true);
    total += measure("events", warmup, n, [&](long first, long count) {
      for (long i = first; i < first + count; ++i) {
        round(e, i,
              [](rdx::operation& op, rdx::connection&) { return op.wait(20s, rdx::wait_mode::events); });
      }
    });
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "FAILED: %s\n", ex.what());
    return 1;
  }
  std::printf("total heap allocations on the data path: %zu; failed checks: %d\n", total, failures);
  return total == 0 && failures == 0 ? 0 : 1;
}
