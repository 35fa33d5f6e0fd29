// rdx::detail: the debug-build check of "one thread at a time". Each public
// entry of a connection enters a scope; a second thread entering while the
// first is inside aborts with a message that names the rule. Nested entry
// from the same thread (a coroutine resumed inside progress() that sends) is
// allowed. Off when NDEBUG is defined, unless RDX_THREAD_CHECKS=1.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

#ifndef RDX_THREAD_CHECKS
#ifdef NDEBUG
#define RDX_THREAD_CHECKS 0
#else
#define RDX_THREAD_CHECKS 1
#endif
#endif

namespace rdx::detail {

#if RDX_THREAD_CHECKS
class thread_check {
public:
  class scope {
  public:
    scope(thread_check& c, const char* what) noexcept : c_(c) {
      const std::thread::id me = std::this_thread::get_id();
      std::thread::id expected{};
      if (!c_.owner_.compare_exchange_strong(expected, me, std::memory_order_acquire) && expected != me) {
        std::fprintf(stderr,
                     "rdx: a connection was used from two threads at once (%s); a connection and the "
                     "operations started on it, or a worker and every connection on it, are used by one "
                     "thread at a time\n",
                     what);
        std::abort();
      }
      ++c_.depth_;
    }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope() {
      if (--c_.depth_ == 0) {
        c_.owner_.store(std::thread::id{}, std::memory_order_release);
      }
    }

  private:
    thread_check& c_;
  };

private:
  std::atomic<std::thread::id> owner_{};
  unsigned depth_ = 0;
};
#else
class thread_check {
public:
  struct scope {
    scope(thread_check&, const char*) noexcept {}
  };
};
#endif

}  // namespace rdx::detail
