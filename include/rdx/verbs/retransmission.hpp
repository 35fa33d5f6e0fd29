// rdx: the retransmission settings of a reliable queue pair in units of time.
//
// The verbs take two timers as codes, not times: the local ACK timeout
// (ibv_qp_attr::timeout, 4.096 us x 2^code, 0 meaning "wait forever") and the
// RNR NAK timer (ibv_qp_attr::min_rnr_timer, a table in which 0 is the
// LONGEST wait, 655.36 ms). These functions turn a duration into the code the
// hardware takes (the smallest code whose wait is at least the duration) and
// a code back into its duration, so that a program can say what it asked for
// and print what it got. The tables are those of ibv_modify_qp(3).
#pragma once

#include <rdx/error.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace rdx {

//! The longest local ACK timeout code (4.096 us x 2^31, about 2.4 hours).
inline constexpr std::uint8_t max_ack_timeout_code = 31;

//! The wait one local ACK timeout code stands for: 4.096 us x 2^code; code 0
//! means "no timeout" (never retransmit) and reads as zero here.
[[nodiscard]] constexpr std::chrono::nanoseconds ack_timeout_of(std::uint8_t code) noexcept {
  if (code == 0 || code > max_ack_timeout_code) {
    return std::chrono::nanoseconds{0};
  }
  return std::chrono::nanoseconds{std::int64_t{4096} << code};
}

//! The smallest ACK timeout code whose wait is at least `at_least`.
//! Refused (invalid_argument, naming the range): zero or less (0 would turn
//! retransmission off, and a peer that vanished would hang every operation),
//! or more than code 31's 2.4 hours.
[[nodiscard]] inline std::uint8_t ack_timeout_code(std::chrono::nanoseconds at_least) {
  if (at_least.count() <= 0) {
    detail::throw_rdx(errc::invalid_argument,
                      "ACK timeout of " + std::to_string(at_least.count()) +
                          " ns: give a positive time (a zero code would turn retransmission off)");
  }
  for (std::uint8_t c = 1; c <= max_ack_timeout_code; ++c) {
    if (ack_timeout_of(c) >= at_least) {
      return c;
    }
  }
  detail::throw_rdx(
      errc::invalid_argument,
      "ACK timeout of " + std::to_string(at_least.count()) +
          " ns is beyond the longest the verbs can express (code 31, 4.096 us x 2^31, about 2.4 h)");
}

namespace detail {
// ibv_modify_qp(3)'s min_rnr_timer table in units of 10 us; code 0 is 655.36 ms.
inline constexpr std::array<std::uint32_t, 32> rnr_timer_10us{
    65536, 1,   2,   3,   4,    6,    8,    12,   16,   24,   32,   48,    64,    96,    128,   192,
    256,   384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
}  // namespace detail

//! The RNR NAK delay a `min_rnr_timer` code asks of a sender: 0.01 ms (code 1)
//! up to 491.52 ms (code 31); code 0 is the longest, 655.36 ms.
[[nodiscard]] constexpr std::chrono::nanoseconds rnr_timer_of(std::uint8_t code) noexcept {
  if (code >= detail::rnr_timer_10us.size()) {
    return std::chrono::nanoseconds{0};
  }
  return std::chrono::nanoseconds{std::int64_t{detail::rnr_timer_10us[code]} * 10000};
}

//! The `min_rnr_timer` code with the smallest delay at least `at_least`
//! (codes 1 to 31; code 0's 655.36 ms is given for a wait above 491.52 ms
//! and up to 655.36 ms). Refused: zero or less, or above 655.36 ms.
[[nodiscard]] inline std::uint8_t rnr_timer_code(std::chrono::nanoseconds at_least) {
  if (at_least.count() <= 0) {
    detail::throw_rdx(errc::invalid_argument, "RNR timer of " + std::to_string(at_least.count()) +
                                                  " ns: give a positive time (0.01 ms to 655.36 ms)");
  }
  for (std::size_t c = 1; c < detail::rnr_timer_10us.size(); ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    if (rnr_timer_of(code) >= at_least) {
      return code;
    }
  }
  if (rnr_timer_of(0) >= at_least) {
    return 0;
  }
  detail::throw_rdx(errc::invalid_argument,
                    "RNR timer of " + std::to_string(at_least.count()) +
                        " ns is beyond the longest the verbs can express (655.36 ms, code 0)");
}

//! How long a requester keeps retrying before its work request fails with
//! "transport retry counter exceeded": (retry_cnt + 1) ACK timeouts. The
//! specification lets the hardware wait up to four times the code's time
//! before it declares one lost, so the longest is `4 x` this.
[[nodiscard]] constexpr std::chrono::nanoseconds retry_window(std::uint8_t ack_timeout_code,
                                                              std::uint8_t retry_cnt) noexcept {
  return ack_timeout_of(ack_timeout_code) * (retry_cnt + 1);
}

}  // namespace rdx
