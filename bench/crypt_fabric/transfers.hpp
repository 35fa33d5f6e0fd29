// rdx_crypt_fabric: a transfer point, B bytes from the client's buffer into
// the server's. Plain: one window write into a window the server granted,
// then a message saying it is done (one queue pair delivers it after the
// write's bytes). Sealed: window operations are refused on an encrypted
// connection, so the bytes go as a stream of sealed messages of --chunk
// bytes, each received at its offset. Either way the server answers with the
// bytes it has as soon as they are all in (the clock stops there), then
// checks every byte and sends where the first wrong one is (B: none).
#pragma once

#include <rdx/channel/channel.hpp>
#include <rdx/channel/window.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "link.hpp"
#include "pattern.hpp"
#include "plan.hpp"

namespace crypt_fabric {

//! The client's side of a transfer point.
inline point_result transfer_client(bench_env& e, const point& p) {
  const std::size_t b = p.size;
  const std::uint64_t chunk = e.pl.chunk;
  const std::uint64_t chunks = (b + chunk - 1) / chunk;
  const std::span<std::byte> src = e.bulk->span().first(b);
  fill(src, point_seed(e.pl, p));
  checker check(e, p);
  link l(e, p, {});
  rdx::channel<std::byte> ch(l.conn());
  std::optional<rdx::remote_window<std::byte, rdx::rights::write>> win;
  if (p.how == mode::plain) {
    const auto& w = l.offer().windows;
    if (w.size() != 1 || w[0].memory.length < b) {
      throw failure(describe(p) + ": the server granted " + std::to_string(w.size()) + " windows (" +
                    (w.empty() ? std::string("none") : std::to_string(w[0].memory.length) + " bytes") +
                    "), this side needs 1 of " + std::to_string(b) + " bytes");
    }
    win.emplace(l.conn(), w[0]);
  }
  const std::uint32_t depth = l.conn().attributes().recv_depth;
  std::vector<rdx::operation> sends(p.how == mode::sealed ? depth : 1);
  std::uint64_t have = 0;
  auto got_have = ch.receive(std::as_writable_bytes(std::span(&have, 1)));
  const std::uint64_t done = b;

  const auto t0 = clock::now();
  if (p.how == mode::plain) {
    auto w = win->write(rdx::local_span<const std::byte>(*e.bulk).subspan(0, b), 0);
    sends[0] = ch.send(std::as_bytes(std::span(&done, 1)));
    l.wait(w, "window write", 0);
    l.wait(sends[0], "done message", 0);
  } else {
    for (std::uint64_t i = 0; i < chunks; ++i) {
      rdx::operation& s = sends[i % depth];
      if (i >= depth) {
        l.wait(s, "chunk", i - depth);
      }
      s = ch.send(
          std::span<const std::byte>(src.subspan(i * chunk, std::min<std::uint64_t>(chunk, b - i * chunk))));
    }
    for (std::uint64_t i = chunks > depth ? chunks - depth : 0; i < chunks; ++i) {
      l.wait(sends[i % depth], "chunk", i);
    }
  }
  l.take(got_have, "the server's receipt", 0);
  const double secs = std::chrono::duration<double>(clock::now() - t0).count();

  std::uint64_t first_wrong = 0;
  auto verdict = ch.receive(std::as_writable_bytes(std::span(&first_wrong, 1)));
  l.take(verdict, "the server's verdict", 0);
  if (have != b || first_wrong != b) {
    check.say(
        "the server has " + std::to_string(have) + " of " + std::to_string(b) + " bytes" +
        (first_wrong != b ? ", the first wrong at byte " + std::to_string(first_wrong) : std::string()) +
        ": see the server's output");
  }
  l.finish();
  return {.mbps = static_cast<double>(b) / secs / 1e6};
}

//! The server's side of a transfer point: every byte checked.
inline void transfer_server(bench_env& e, const point& p) {
  const std::size_t b = p.size;
  const std::uint64_t chunk = e.pl.chunk;
  const std::uint64_t chunks = (b + chunk - 1) / chunk;
  const std::span<std::byte> dst = e.bulk->span().first(b);
  std::memset(dst.data(), 0, b);  // nothing an earlier point left passes (its seed differs too)
  checker check(e, p);
  link l(e, p, p.how == mode::plain ? dst : std::span<std::byte>());
  rdx::channel<std::byte> ch(l.conn());

  std::uint64_t have = 0;
  if (p.how == mode::plain) {
    std::uint64_t done = 0;
    auto r = ch.receive(std::as_writable_bytes(std::span(&done, 1)));
    l.take(r, "done message", 0);
    have = done;  // the write's bytes are in: they came first on the one queue pair
  } else {
    for (std::uint64_t i = 0; i < chunks; ++i) {
      const std::size_t want = std::min<std::uint64_t>(chunk, b - i * chunk);
      auto r = ch.receive(dst.subspan(i * chunk, want));
      l.take(r, "chunk", i);
      have += r.byte_count();
      (void)check.ok("chunk", i, mismatch{r.byte_count(), 0, 0}, r.byte_count(), want);
    }
  }
  auto receipt = ch.send(std::as_bytes(std::span(&have, 1)));
  l.wait(receipt, "receipt", 0);

  const mismatch m = first_mismatch(dst, point_seed(e.pl, p));
  (void)check.ok("transfer", 0, m, b, b);
  const std::uint64_t first_wrong = m.offset;
  auto verdict = ch.send(std::as_bytes(std::span(&first_wrong, 1)));
  l.wait(verdict, "verdict", 0);
  l.finish();
}

}  // namespace crypt_fabric
