// rdx: polling helpers over completion_queue::poll (busy poll with a deadline).
#pragma once

#include <rdx/error.hpp>
#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/completion_queue.hpp>

#include <chrono>
#include <cstddef>
#include <span>
#include <system_error>

namespace rdx {

//! Busy-polls cq until at least min_count completions are in out (at most
//! out.size()) or timeout passes. No allocation, no exception.
//! @param filled set to the number of completions written to out.
//! @return empty when min_count arrived; errc::timed_out; or the polling errno.
[[nodiscard]] inline std::error_code poll_for(completion_queue& cq, std::span<completion> out,
                                              std::size_t min_count, std::chrono::nanoseconds timeout,
                                              std::size_t& filled) noexcept {
  filled = 0;
  if (min_count > out.size()) {
    min_count = out.size();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  unsigned spins = 0;
  for (;;) {
    std::size_t n = 0;
    if (std::error_code ec = cq.poll(out.subspan(filled), n)) {
      return ec;
    }
    filled += n;
    if (filled >= min_count) {
      return detail::no_error();
    }
    // Reading the clock every poll would dominate a fast loop.
    if (++spins % 64 == 0 && std::chrono::steady_clock::now() >= deadline) {
      return make_error_code(errc::timed_out);
    }
  }
}

//! Busy-polls for exactly one completion. @return as poll_for.
[[nodiscard]] inline std::error_code poll_one(completion_queue& cq, completion& out,
                                              std::chrono::nanoseconds timeout) noexcept {
  std::size_t filled = 0;
  return poll_for(cq, std::span<completion>(&out, 1), 1, timeout, filled);
}

//! Polls without waiting and hands each completion to f (f must not throw on
//! the data path).
//! @param handled set to the number handed to f (0 when polling failed).
//! @return empty, or the errno of ibv_poll_cq.
template <class F>
[[nodiscard]] inline std::error_code drain(completion_queue& cq, std::span<completion> scratch, F&& f,
                                           std::size_t& handled) noexcept(noexcept(f(scratch[0]))) {
  std::error_code ec = cq.poll(scratch, handled);
  for (std::size_t i = 0; i < handled; ++i) {
    f(scratch[i]);
  }
  return ec;
}

}  // namespace rdx
