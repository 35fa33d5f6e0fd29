// rdx benchmarks: what every part shares: the operations measured, the queue
// settings both twins post with, and the one failure the benchmarks report
// (a failed post or completion, a peer out of step).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace rdx_bench {

using clk = std::chrono::steady_clock;

enum class op : std::uint32_t {
  write_bw,
  read_bw,
  send_bw,
  write_lat,
  read_lat,
  send_lat,
  // Typed channels (layer 5): remote_window writes and reads, striped over
  // 1 or 2 queue pairs, and channel<std::byte> messages: copying (send into
  // a staging buffer, receive out of the ring) and zero-copy (send_registered
  // from registered memory, receive_view in the ring).
  window_write_bw,
  window_read_bw,
  window_write_lat,
  window_read_lat,
  chan_send_bw,
  chan_send_lat,
  chan_zc_bw,
  chan_zc_lat,
  quit
};
enum class api_kind : std::uint32_t { raw, rdx };

[[nodiscard]] inline std::string_view to_string(op o) noexcept {
  switch (o) {
    case op::write_bw: return "write_bw";
    case op::read_bw: return "read_bw";
    case op::send_bw: return "send_bw";
    case op::write_lat: return "write_lat";
    case op::read_lat: return "read_lat";
    case op::send_lat: return "send_lat";
    case op::window_write_bw: return "window_write_bw";
    case op::window_read_bw: return "window_read_bw";
    case op::window_write_lat: return "window_write_lat";
    case op::window_read_lat: return "window_read_lat";
    case op::chan_send_bw: return "chan_send_bw";
    case op::chan_send_lat: return "chan_send_lat";
    case op::chan_zc_bw: return "chan_zc_bw";
    case op::chan_zc_lat: return "chan_zc_lat";
    case op::quit: return "quit";
  }
  return "?";
}
[[nodiscard]] inline bool is_latency(op o) noexcept {
  return o == op::write_lat || o == op::read_lat || o == op::send_lat || o == op::window_write_lat ||
         o == op::window_read_lat || o == op::chan_send_lat || o == op::chan_zc_lat;
}

// Queue settings shared by both twins (they post on the same queue pairs).
inline constexpr std::uint32_t sq_depth = 256;  // rdx's default send depth
inline constexpr std::uint32_t rq_depth = 256;
inline constexpr int cq_depth = 1024;
inline constexpr unsigned max_batch = 64;         // largest group posted with one doorbell
inline constexpr unsigned lat_signal_every = 16;  // latency loops: one signaled send in 16
inline constexpr unsigned max_qps = 2;

//! A benchmark failure (a failed post or completion, a peer out of step): the
//! benchmark reports it and stops; it is never thrown on success.
struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void fail(const std::string& what) {
  throw failure(what);
}

inline void check_post(int rc, const char* where) {
  if (rc != 0) [[unlikely]]
    fail(std::string(where) + ": post failed: " + std::strerror(rc));
}
inline void check_op(std::error_code ec, const char* where) {
  if (ec) [[unlikely]]
    fail(std::string(where) + ": " + ec.message());
}
template <class Api>
inline void check_completion(const typename Api::wc_type& c, const char* where) {
  if (!Api::ok(c)) [[unlikely]]
    fail(std::string(where) + ": completion with status " + Api::status(c));
}

}  // namespace rdx_bench
