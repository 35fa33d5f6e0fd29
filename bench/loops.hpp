// rdx benchmarks: the measured loops, written once and instantiated for each
// interface of twins.hpp so that both twins run the same algorithm on the
// same queue pair, and the typed-channel runs (remote_window, channel<T>)
// next to the plain-verbs loops they are compared with.
#pragma once

#include <rdx/channel/channel.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/operation.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/verbs/memory_region.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "common.hpp"
#include "fabric.hpp"
#include "twins.hpp"

namespace rdx_bench {

struct result {
  double seconds = 0;  // whole run, first post to last completion
  std::uint64_t bytes = 0;
  std::vector<double> lat_us;  // per operation (latency runs), sorted
  double wr_per_op = 0;        // connection runs: work requests posted per operation (probes included)
  double signaled_per_op = 0;  // connection runs: signaled work requests per operation
};

//! Bandwidth: keeps `depth` requests in flight on queue pair 0, posted in
//! groups of depth/4 (one doorbell, last one signaled), until `count` completed.
template <class Api>
inline result run_bw(fabric& f, op o, std::size_t size, unsigned depth, std::uint64_t count) {
  side& s = f.client();
  wr_desc d;
  switch (o) {
    case op::write_bw: d = {IBV_WR_RDMA_WRITE, s.tx_sge(0, size), s.peer_rx()}; break;
    case op::read_bw: d = {IBV_WR_RDMA_READ, s.rx_sge(0, size), s.peer_tx()}; break;
    default: d = {IBV_WR_SEND, s.tx_sge(0, size), {}}; break;
  }
  const unsigned group = std::max(1u, std::min(depth / 4, max_batch));
  const command c{o, std::is_same_v<Api, rdx_api> ? api_kind::rdx : api_kind::raw, size, count, depth, 1};
  f.begin<Api>(c);
  std::uint64_t posted = 0;
  std::uint64_t done = 0;
  typename Api::wc_type wcs[16];
  const auto t0 = clk::now();
  while (done < count) {
    while (posted < count) {
      const auto g = static_cast<unsigned>(std::min<std::uint64_t>(group, count - posted));
      if (posted - done + g > depth) break;
      check_post(Api::post(s.qp(0), d, g, true, g), "post");
      posted += g;
    }
    int n = Api::poll(s.scq(0), wcs, 16);
    if (n < 0) [[unlikely]]
      fail("poll send CQ failed");
    for (int i = 0; i < n; ++i) {
      check_completion<Api>(wcs[i], "send CQ");
      done += Api::id(wcs[i]);
    }
    if (o == op::send_bw) f.progress<Api>();
  }
  const auto t1 = clk::now();
  f.end<Api>();
  return {std::chrono::duration<double>(t1 - t0).count(), count * size, {}};
}

//! Latency: `count` operations one at a time. Write and send are ping-pongs
//! (the peer answers in kind; half the round trip is reported), read is one
//! round trip.
template <class Api>
inline result run_lat(fabric& f, op o, std::size_t size, std::uint64_t count) {
  side& s = f.client();
  const command c{o, std::is_same_v<Api, rdx_api> ? api_kind::rdx : api_kind::raw, size, count, 1, 1};
  result r;
  r.lat_us.resize(count);
  sq_credit credit;
  typename Api::wc_type wcs[1];
  f.begin<Api>(c);
  const auto start = clk::now();
  for (std::uint64_t i = 1; i <= count; ++i) {
    const bool last = i == count;
    const auto t0 = clk::now();
    double scale = 0.5;
    if (o == op::write_lat) {
      s.set_tx_tail(size, i);
      post_lat<Api>(s, 0, {IBV_WR_RDMA_WRITE, s.tx_sge(0, size), s.peer_rx()}, credit, last);
      while (s.rx_tail(size) != i) {
        f.progress<Api>();
        reap<Api>(s, 0, credit);
      }
    } else if (o == op::send_lat) {
      post_lat<Api>(s, 0, {IBV_WR_SEND, s.tx_sge(0, size), {}}, credit, last);
      for (;;) {
        int n = Api::poll(s.rcq(0), wcs, 1);
        if (n < 0) [[unlikely]]
          fail("poll receive CQ failed");
        if (n == 1) break;
        f.progress<Api>();
        reap<Api>(s, 0, credit);
      }
      check_completion<Api>(wcs[0], "receive CQ");
      check_post(Api::post_recv(s.qp(0), s.rx_sge(0, s.region())), "post_recv");
    } else {
      scale = 1.0;
      check_post(Api::post(s.qp(0), {IBV_WR_RDMA_READ, s.rx_sge(0, size), s.peer_tx()}, 1, true, 1), "post");
      int n = 0;
      while ((n = Api::poll(s.scq(0), wcs, 1)) == 0) {}
      if (n < 0) [[unlikely]]
        fail("poll send CQ failed");
      check_completion<Api>(wcs[0], "send CQ");
    }
    r.lat_us[i - 1] = std::chrono::duration<double, std::micro>(clk::now() - t0).count() * scale;
  }
  const auto stop = clk::now();
  while (credit.outstanding != 0) reap<Api>(s, 0, credit);
  f.end<Api>();
  r.seconds = std::chrono::duration<double>(stop - start).count();
  r.bytes = count * size;
  std::sort(r.lat_us.begin(), r.lat_us.end());
  return r;
}

// --- channel runs -----------------------------------------------------------

//! remote_window bandwidth: `depth` operations in flight on a connection of
//! `qps` queue pairs (large transfers striped in 512 KiB chunks).
inline result run_window_bw(fabric& f, op o, std::size_t size, unsigned depth, std::uint64_t count,
                            unsigned qps) {
  chan_side& cs = f.client_chan();
  rdx::remote_window<std::byte, win_rights> w(cs.conn(qps), cs.peer_window(qps));
  const rdx::local_span<std::byte> local = cs.local(size);
  auto ring = std::make_unique<std::optional<rdx::operation>[]>(depth);
  rdx::connection& conn = cs.conn(qps);
  const std::uint64_t posted0 = conn.posted_count(), signaled0 = conn.signaled_count();
  f.begin<rdx_api>(command{o, api_kind::rdx, size, count, depth, qps});
  const auto t0 = clk::now();
  for (std::uint64_t i = 0; i < count; ++i) {
    auto& slot = ring[i % depth];
    if (slot) {
      check_op(slot->wait(), "window");
      slot.reset();
    }
    if (o == op::window_write_bw)
      slot = w.write(local, 0);
    else
      slot = w.read(local, 0);
  }
  for (unsigned j = 0; j < depth; ++j) {
    if (ring[j]) check_op(ring[j]->wait(), "window");
  }
  const auto t1 = clk::now();
  f.end<rdx_api>();
  result r{std::chrono::duration<double>(t1 - t0).count(), count * size, {}};
  r.wr_per_op = static_cast<double>(conn.posted_count() - posted0) / static_cast<double>(count);
  r.signaled_per_op = static_cast<double>(conn.signaled_count() - signaled0) / static_cast<double>(count);
  return r;
}

//! The plain-verbs twin of run_window_bw: the same chunks (512 KiB, aligned in
//! the remote address space), round-robin over `qps` queue pairs of the same
//! depth, one request per post, signaled every depth/4 per queue pair.
template <class Api>
inline result run_stripe_bw(fabric& f, op o, std::size_t size, unsigned depth, std::uint64_t count,
                            unsigned qps) {
  side& s = f.client();
  const bool write = o == op::window_write_bw;
  const rdx::remote_ptr base = write ? s.peer_rx() : s.peer_tx();
  constexpr std::uint64_t chunk = 512 * 1024;
  struct piece {
    std::uint64_t off, len;
  };
  std::vector<piece> pieces;
  for (std::uint64_t pos = 0; pos < size;) {
    const std::uint64_t len = std::min<std::uint64_t>(size - pos, chunk - (base.addr + pos) % chunk);
    pieces.push_back({pos, len});
    pos += len;
  }
  const std::uint64_t total = count * pieces.size();
  const std::uint64_t window = std::uint64_t{depth} * pieces.size();
  const unsigned group = std::max(1u, depth / 4);
  std::uint64_t last_on[max_qps] = {};
  for (unsigned q = 0; q < qps; ++q) last_on[q] = total - 1 - ((total - 1 + qps - q) % qps);
  unsigned since[max_qps] = {};
  typename Api::wc_type wcs[16];
  f.begin<Api>(
      command{o, std::is_same_v<Api, rdx_api> ? api_kind::rdx : api_kind::raw, size, count, depth, qps});
  std::uint64_t posted = 0, done = 0;
  const auto t0 = clk::now();
  while (done < total) {
    while (posted < total && posted - done < window) {
      const piece& p = pieces[posted % pieces.size()];
      const auto q = static_cast<unsigned>(posted % qps);
      const wr_desc d = write ? wr_desc{IBV_WR_RDMA_WRITE, s.tx_sge(p.off, p.len), base + p.off}
                              : wr_desc{IBV_WR_RDMA_READ, s.rx_sge(p.off, p.len), base + p.off};
      const bool sig = ++since[q] >= group || posted == last_on[q];
      check_post(Api::post(s.qp(q), d, 1, sig, since[q]), "post");
      if (sig) since[q] = 0;
      ++posted;
    }
    for (unsigned q = 0; q < qps; ++q) {
      int n = Api::poll(s.scq(q), wcs, 16);
      if (n < 0) [[unlikely]]
        fail("poll send CQ failed");
      for (int i = 0; i < n; ++i) {
        check_completion<Api>(wcs[i], "send CQ");
        done += Api::id(wcs[i]);
      }
    }
  }
  const auto t1 = clk::now();
  f.end<Api>();
  return {std::chrono::duration<double>(t1 - t0).count(), count * size, {}};
}

//! One operation at a time: remote_window write or read completion (rdx), or
//! a signaled write or read polled to completion (the plain-verbs twin).
template <class Api>
inline result run_window_lat(fabric& f, op o, std::size_t size, std::uint64_t count) {
  const bool write = o == op::window_write_lat;
  result r;
  r.lat_us.resize(count);
  f.begin<Api>(command{o, std::is_same_v<Api, rdx_api> ? api_kind::rdx : api_kind::raw, size, count, 1, 1});
  const auto start = clk::now();
  if constexpr (std::is_same_v<Api, rdx_api>) {
    chan_side& cs = f.client_chan();
    rdx::remote_window<std::byte, win_rights> w(cs.conn(1), cs.peer_window(1));
    const rdx::local_span<std::byte> local = cs.local(size);
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto t0 = clk::now();
      if (write)
        check_op(w.write(local, 0).wait(), "window write");
      else
        check_op(w.read(local, 0).wait(), "window read");
      r.lat_us[i] = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
    }
  } else {
    side& s = f.client();
    const wr_desc d = write ? wr_desc{IBV_WR_RDMA_WRITE, s.tx_sge(0, size), s.peer_rx()}
                            : wr_desc{IBV_WR_RDMA_READ, s.rx_sge(0, size), s.peer_tx()};
    typename Api::wc_type wc[1];
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto t0 = clk::now();
      check_post(Api::post(s.qp(0), d, 1, true, 1), "post");
      int n = 0;
      while ((n = Api::poll(s.scq(0), wc, 1)) == 0) {}
      if (n < 0) [[unlikely]]
        fail("poll send CQ failed");
      check_completion<Api>(wc[0], "send CQ");
      r.lat_us[i] = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
    }
  }
  const auto stop = clk::now();
  f.end<Api>();
  r.seconds = std::chrono::duration<double>(stop - start).count();
  r.bytes = count * size;
  std::sort(r.lat_us.begin(), r.lat_us.end());
  return r;
}

//! channel<std::byte> messages: a stream with `depth` sends in flight, or a
//! ping-pong (half the round trip reported). Twin: send_bw / send_lat.
//! Copying: send() copies into a staging buffer, receive() out of the ring.
//! Zero-copy: send_registered() posts from the registered local buffer,
//! receive_view() reads in the ring and gives the buffer back when dropped.
template <bool ZeroCopy>
inline result run_chan_as(fabric& f, op o, std::size_t size, unsigned depth, std::uint64_t count) {
  chan_side& cs = f.client_chan();
  auto& ch = cs.channel();
  const std::span<const std::byte> msg(cs.buffer(size));
  const std::span<std::byte> dst(cs.buffer(size));
  const rdx::local_span<const std::byte> src = cs.local(size);
  auto send = [&] {
    if constexpr (ZeroCopy)
      return ch.send_registered(src);
    else
      return ch.send(msg);
  };
  result r;
  f.begin<rdx_api>(command{o, api_kind::rdx, size, count, depth, 1});
  const auto start = clk::now();
  if (o == op::chan_send_lat || o == op::chan_zc_lat) {
    r.lat_us.resize(count);
    std::optional<rdx::operation> tx;  // the previous ping, retired lazily as the raw twin does
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto t0 = clk::now();
      if (tx) {
        check_op(tx->wait(), "channel send");
        tx.reset();
      }
      tx = send();
      if constexpr (ZeroCopy) {
        rdx::message_view<std::byte> rx = ch.receive_view();
        while (!rx.test()) f.progress<rdx_api>();
        check_op(rx.error(), "channel receive_view");
        if (rx.view().size() != size)
          fail("channel receive_view: " + std::to_string(rx.view().size()) + " bytes, expected " +
               std::to_string(size));
      } else {
        rdx::operation rx = ch.receive(dst);
        while (!rx.test()) f.progress<rdx_api>();
        check_op(rx.error(), "channel receive");
      }
      r.lat_us[i] = std::chrono::duration<double, std::micro>(clk::now() - t0).count() * 0.5;
    }
    if (tx) check_op(tx->wait(), "channel send");
  } else {
    auto ring = std::make_unique<std::optional<rdx::operation>[]>(depth);
    for (std::uint64_t i = 0; i < count; ++i) {
      auto& slot = ring[i % depth];
      if (slot) {
        check_op(slot->wait(), "channel send");
        slot.reset();
      }
      // Loopback: the receiver is this thread, so let it take messages and
      // return credits before the next send (which would otherwise be
      // deferred until the slot's wait drives both sides).
      while (ch.credits() == 0) {
        f.progress<rdx_api>();
        ch.conn().progress();
      }
      slot = send();
      if (f.is_loopback()) f.progress<rdx_api>();
    }
    for (unsigned j = 0; j < depth; ++j) {
      if (ring[j]) check_op(ring[j]->wait(), "channel send");
    }
  }
  const auto stop = clk::now();
  f.end<rdx_api>();
  r.seconds = std::chrono::duration<double>(stop - start).count();
  r.bytes = count * size;
  std::sort(r.lat_us.begin(), r.lat_us.end());
  return r;
}

//! A channel run: chan_send_* copying, chan_zc_* zero-copy (see run_chan_as).
inline result run_chan(fabric& f, op o, std::size_t size, unsigned depth, std::uint64_t count) {
  if (is_zero_copy_op(o)) return run_chan_as<true>(f, o, size, depth, count);
  return run_chan_as<false>(f, o, size, depth, count);
}

}  // namespace rdx_bench
