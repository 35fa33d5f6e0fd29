// rdx_crypt_fabric: a message point. Throughput: the client streams N
// messages of S bytes, up to recv_depth sends outstanding; the server checks
// every byte of each and answers with its count of intact messages and a
// checksum (8 bytes); the clock runs from the first send to that answer.
// Latency: ping-pongs of S bytes, the server echoing what it received; the
// client times each round trip and checks the echo after its clock stopped.
#pragma once

#include <rdx/channel/channel.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cli.hpp"
#include "link.hpp"
#include "pattern.hpp"
#include "plan.hpp"

namespace crypt_fabric {

//! The counts of a message point: throughput messages, then unmeasured and measured round trips.
struct message_counts {
  std::uint64_t n;
  std::uint64_t warm;
  std::uint64_t lat;
};

inline message_counts counts_for(const plan& pl, const point& p) {
  const std::uint64_t lat = latency_count(pl, p.size);
  return {message_count(pl, p.size), lat / 10, lat};
}

//! The client's side of a message point.
inline point_result message_client(bench_env& e, const point& p) {
  const auto [n, warm, lat] = counts_for(e.pl, p);
  const std::size_t size = p.size;
  message_pool pool(size, n + warm + lat, point_seed(e.pl, p));
  checker check(e, p);
  link l(e, p, {});
  rdx::channel<std::byte> ch(l.conn());
  const std::uint32_t depth = l.conn().attributes().recv_depth;
  std::vector<rdx::operation> sends(depth);
  std::array<std::uint32_t, 2> answer{};  // intact messages, checksum
  auto got_answer = ch.receive(std::as_writable_bytes(std::span(answer)));
  std::uint64_t sum = 0;

  const auto t0 = clock::now();
  for (std::uint64_t k = 0; k < n; ++k) {
    rdx::operation& s = sends[k % depth];
    if (k >= depth) {
      l.wait(s, "send", k - depth);
    }
    const std::span<const std::byte> m = pool.message(k);
    sum = fold(sum, m);
    s = ch.send(m);  // copied before it returns: the pool entry may change
  }
  for (std::uint64_t k = n > depth ? n - depth : 0; k < n; ++k) {
    l.wait(sends[k % depth], "send", k);
  }
  l.take(got_answer, "the server's count after message", n);
  const double secs = std::chrono::duration<double>(clock::now() - t0).count();

  point_result r;
  r.mbps = static_cast<double>(n * size) / secs / 1e6;
  if (answer[0] != n || answer[1] != static_cast<std::uint32_t>(sum)) {
    check.say("the server found " + std::to_string(answer[0]) + " of " + std::to_string(n) +
              " messages intact, checksum " + std::to_string(answer[1]) + " (sent " +
              std::to_string(static_cast<std::uint32_t>(sum)) + "): see the server's output");
  }

  e.rtt.clear();
  const std::span<std::byte> echo(e.buf.data(), size);
  for (std::uint64_t k = 0; k < warm + lat; ++k) {
    const std::span<const std::byte> m = pool.message(n + k);
    const auto a = clock::now();
    auto s = ch.send(m);
    auto back = ch.receive(echo);
    l.take(back, "echo", k);
    const auto b = clock::now();
    l.wait(s, "ping", k);
    if (k >= warm) {
      e.rtt.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    }
    const std::span<const std::byte> got = echo.first(back.byte_count());
    (void)check.ok("echo", k, pool.check(n + k, got), got.size(), size);
  }
  std::sort(e.rtt.begin(), e.rtt.end());
  r.p50_us = app::percentile(e.rtt, 50);
  r.p99_us = app::percentile(e.rtt, 99);
  l.finish();
  return r;
}

//! The server's side of a message point: every byte checked.
inline void message_server(bench_env& e, const point& p) {
  const auto [n, warm, lat] = counts_for(e.pl, p);
  const std::size_t size = p.size;
  message_pool pool(size, n + warm + lat, point_seed(e.pl, p));
  checker check(e, p);
  link l(e, p, {});
  rdx::channel<std::byte> ch(l.conn());
  const std::span<std::byte> buf(e.buf.data(), size);
  std::uint64_t intact = 0;
  std::uint64_t sum = 0;
  for (std::uint64_t k = 0; k < n; ++k) {
    auto r = ch.receive(buf);
    l.take(r, "receive", k);
    const std::span<const std::byte> got = buf.first(r.byte_count());
    sum = fold(sum, got);
    if (check.ok("message", k, pool.check(k, got), got.size(), size)) {
      ++intact;
    }
  }
  const std::array<std::uint32_t, 2> answer{static_cast<std::uint32_t>(intact),
                                            static_cast<std::uint32_t>(sum)};
  auto s = ch.send(std::as_bytes(std::span(answer)));
  l.wait(s, "count after message", n);

  for (std::uint64_t k = 0; k < warm + lat; ++k) {
    auto r = ch.receive(buf);
    l.take(r, "ping", k);
    const std::span<const std::byte> got = buf.first(r.byte_count());
    auto echo = ch.send(got);  // copied before it returns: checked while it travels
    (void)check.ok("ping", k, pool.check(n + k, got), got.size(), size);
    l.wait(echo, "echo", k);
  }
  l.finish();
}

}  // namespace crypt_fabric
