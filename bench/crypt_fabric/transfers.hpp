// rdx_crypt_fabric: a transfer point, B bytes from the client's buffer into
// the server's. Plain: one window write into a window the server granted,
// then a message saying it is done (one queue pair delivers it after the
// write's bytes). Sealed: a sealed window write (rdx/channel/sealed_window.hpp)
// in chunks of --chunk bytes, sealed on the client while the one before is on
// the wire and opened on the server into its buffer as each arrives. Either way the server answers with the
// bytes it has as soon as they are all in (the clock stops there), then
// checks every byte and sends where the first wrong one is (B: none). A
// fetch point goes the other way, read by the client (fetch_client).
#pragma once

#include <rdx/channel/channel.hpp>
#include <rdx/channel/sealed_fetch.hpp>
#include <rdx/channel/sealed_window.hpp>
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

//! The one window the server granted for point p, of the bytes it needs.
//! @throws failure for none, several, or one too small.
inline const rdx::window_descriptor& the_window(link& l, const point& p, std::uint64_t chunk) {
  const auto& w = l.offer().windows;
  const std::size_t need =
      p.how == mode::plain ? p.size : rdx::sealed_window_bytes(p.size, static_cast<std::uint32_t>(chunk));
  if (w.size() != 1 || w[0].memory.length < need) {
    throw failure(describe(p) + ": the server granted " + std::to_string(w.size()) + " windows (" +
                  (w.empty() ? std::string("none") : std::to_string(w[0].memory.length) + " bytes") +
                  "), this side needs 1 of " + std::to_string(need) + " bytes");
  }
  return w[0];
}

//! The client's side of a transfer point.
inline point_result transfer_client(bench_env& e, const point& p) {
  const std::size_t b = p.size;
  const std::uint64_t chunk = e.pl.chunk;
  const std::span<std::byte> src = e.bulk->span().first(b);
  fill(src, point_seed(e.pl, p));
  checker check(e, p);
  link l(e, p, {});
  rdx::channel<std::byte> ch(l.conn());
  rdx::remote_window<std::byte, rdx::rights::write> win(l.conn(), the_window(l, p, chunk));
  std::optional<rdx::sealed_writer> writer;
  if (p.how == mode::sealed) {
    writer.emplace(l.conn(), e.pd, l.window_seal(), static_cast<std::uint32_t>(chunk), 4);
  }
  std::uint64_t have = 0;
  auto got_have = ch.receive(std::as_writable_bytes(std::span(&have, 1)));
  const std::uint64_t done = b;

  const auto t0 = clock::now();
  if (p.how == mode::plain) {
    auto wr = win.write(rdx::local_span<const std::byte>(*e.bulk).subspan(0, b), 0);
    rdx::operation sent = ch.send(std::as_bytes(std::span(&done, 1)));
    l.wait(wr, "window write", 0);
    l.wait(sent, "done message", 0);
  } else {
    // Chunk k + 1 is sealed while chunk k is on the wire; the server opens
    // each as its notification arrives.
    l.check(writer->write(win, src, clock::now() + e.o.timeout), "sealed window write", 0);
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
    // Each chunk is opened into dst once its tag has checked.
    rdx::sealed_reader& reader = l.reader();
    l.check(reader.read(dst, clock::now() + e.o.timeout), "sealed window chunk", reader.chunks_opened());
    have = b;
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

//! The client's side of a fetch point: it asks for the server's B bytes.
//! Plain: the server says they are ready and the client reads them with one
//! window read. Sealed: the server seals them chunk by chunk into its
//! window (sealed_source), announcing each, and the client reads each
//! announced chunk and opens it (sealed_fetcher) while the next are sealed
//! and read. The clock runs from the ask until every byte is here. Then the client checks every
//! byte and tells the server where the first wrong one is (B: none).
inline point_result fetch_client(bench_env& e, const point& p) {
  const std::size_t b = p.size;
  const std::uint64_t chunk = e.pl.chunk;
  const std::span<std::byte> dst = e.bulk->span().first(b);
  std::memset(dst.data(), 0, b);  // nothing an earlier point left passes (its seed differs too)
  checker check(e, p);
  link l(e, p, {});
  rdx::channel<std::byte> ch(l.conn());
  rdx::remote_window<std::byte, rdx::rights::read> win(l.conn(), the_window(l, p, chunk));
  std::optional<rdx::sealed_fetcher> fetcher;
  if (p.how == mode::sealed) {
    fetcher.emplace(l.conn(), e.pd, l.window_seal(), static_cast<std::uint32_t>(chunk), 4);
  }
  std::uint64_t ready = b;
  rdx::operation got_ready;
  if (p.how == mode::plain) {
    got_ready = ch.receive(std::as_writable_bytes(std::span(&ready, 1)));
  }
  const std::uint64_t ask = b;

  const auto t0 = clock::now();
  rdx::operation asked = ch.send(std::as_bytes(std::span(&ask, 1)));
  if (p.how == mode::plain) {
    l.take(got_ready, "the server's ready message", 0);
    auto rd = win.read(rdx::local_span<std::byte>(*e.bulk).subspan(0, b), 0);
    l.wait(rd, "window read", 0);
  } else {
    // Each chunk is read once the server announces it sealed, and opened
    // while the next are read and sealed.
    l.check(fetcher->fetch(win, dst, clock::now() + e.o.timeout), "sealed window read",
            fetcher->chunks_opened());
  }
  const double secs = std::chrono::duration<double>(clock::now() - t0).count();
  l.wait(asked, "ask message", 0);

  const mismatch m = first_mismatch(dst, point_seed(e.pl, p));
  (void)check.ok("fetch", 0, m, b, b);
  if (ready != b) {
    check.say("the server made " + std::to_string(ready) + " of " + std::to_string(b) + " bytes ready");
  }
  const std::uint64_t first_wrong = m.offset;
  auto verdict = ch.send(std::as_bytes(std::span(&first_wrong, 1)));
  l.wait(verdict, "verdict", 0);
  l.finish();
  return {.mbps = static_cast<double>(b) / secs / 1e6};
}

//! The server's side of a fetch point.
inline void fetch_server(bench_env& e, const point& p) {
  const std::size_t b = p.size;
  const std::span<std::byte> src = e.bulk->span().first(b);
  fill(src, point_seed(e.pl, p));
  checker check(e, p);
  link l(e, p, p.how == mode::plain ? src : std::span<std::byte>());
  rdx::channel<std::byte> ch(l.conn());

  std::uint64_t ask = 0;
  auto asked = ch.receive(std::as_writable_bytes(std::span(&ask, 1)));
  l.take(asked, "ask message", 0);
  if (p.how == mode::plain) {
    const std::uint64_t ready = b;
    auto said = ch.send(std::as_bytes(std::span(&ready, 1)));
    l.wait(said, "ready message", 0);
  } else {
    // Chunk k + 1 is sealed while the client reads chunk k.
    l.check(l.source().publish(src, clock::now() + e.o.timeout), "publishing the sealed buffer", 0);
  }

  std::uint64_t first_wrong = 0;
  auto verdict = ch.receive(std::as_writable_bytes(std::span(&first_wrong, 1)));
  l.take(verdict, "the client's verdict", 0);
  if (ask != b || first_wrong != b) {
    check.say(
        "the client asked for " + std::to_string(ask) + " of " + std::to_string(b) + " bytes" +
        (first_wrong != b ? " and found byte " + std::to_string(first_wrong) + " wrong" : std::string()) +
        ": see the client's output");
  }
  l.finish();
}

}  // namespace crypt_fabric
