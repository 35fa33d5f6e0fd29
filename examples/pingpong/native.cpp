// pingpong's native modes, send and write_imm, over raw verbs: settings and
// endpoints through the TCP exchange or rdma_cm's private data, then ITERS
// round trips, every payload checked.
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>
#if RDX_EXAMPLES_CM
#include <rdx/cm/cm.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cli.hpp"
#include "modes.hpp"
#include "payload.hpp"
#include "peer_settings.hpp"
#include "report.hpp"
#include "resources.hpp"
#if RDX_EXAMPLES_CM
#include "settings.hpp"
#endif

namespace pingpong {

namespace {

// ITERS round trips on a connected queue pair (both sides' receives posted).
run_stats native_round_trips(resources& r, const options& o, const rdx::remote_descriptor& peer_ring,
                             std::uint32_t seed) {
  const bool client = !o.server.empty();
  run_stats st;
  st.rtt_us.reserve(o.iters);
  const auto loop_start = steady::now();
  for (std::uint32_t k = 0; k < o.iters; ++k) {
    const std::uint32_t slot = k % recv_slots;
    std::byte* slot_mem = r.ring.data() + slot * o.size;
    if (client) {
      fill_pattern(r.send_buf.data(), o.size, k, seed);
      if (o.corrupt_round == k) r.send_buf[o.size / 2] ^= std::byte{0x5a};
      const auto t0 = steady::now();
      post_echo_or_ping(r, o, peer_ring, r.send_buf.sge(), k);
      const rdx::completion rc = wait_completion(r.recv_cq, "receive", k, o);
      const auto t1 = steady::now();
      (void)wait_completion(r.send_cq, "send", k, o);
      st.rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      check_recv(rc, o, k);
      check_payload(slot_mem, o, k, seed, "the echo");
    } else {
      const rdx::completion rc = wait_completion(r.recv_cq, "receive", k, o);
      check_recv(rc, o, k);
      // Echo first, check while it is on the wire: the client's latency stays the network's.
      post_echo_or_ping(r, o, peer_ring, r.ring.sge(slot * o.size, o.size), k);
      (void)wait_completion(r.send_cq, "send", k, o);
      check_payload(slot_mem, o, k, seed, "the payload");
    }
    post_recv_slot(r, o, slot);
  }
  st.wall_s = std::chrono::duration<double>(steady::now() - loop_start).count();
  return st;
}

// The peer's write_imm ring, checked to hold recv_slots payloads.
rdx::remote_descriptor peer_ring_of(const options& o, std::span<const rdx::remote_descriptor> got) {
  if (o.m != mode::write_imm) return {};
  if (got.size() != 1)
    throw failure("the peer sent " + std::to_string(got.size()) +
                  " memory descriptors, write_imm needs exactly 1");
  if (!rdx::contains(got[0], 0, o.size * recv_slots))
    throw failure("the peer's buffer of " + std::to_string(got[0].length) + " bytes is smaller than " +
                  std::to_string(o.size * recv_slots));
  return got[0];
}

#if RDX_EXAMPLES_CM
// Native modes over rdma_cm: the settings (24 bytes) and, in write_imm, the
// ring's address, key and length (20 bytes) travel in the request's and the
// reply's private data; ESTABLISHED is the barrier. A server whose settings
// differ rejects the request, and the client prints the server's reason.
constexpr std::size_t cm_native_size = settings_size + 20;

std::vector<std::byte> cm_native_data(const options& o, const resources& r, const settings& mine) {
  std::vector<std::byte> d(cm_native_size);
  encode_settings(d.data(), mine);
  if (o.m == mode::write_imm) {
    const rdx::remote_descriptor ring = r.ring.remote();
    app::settings_writer(std::span<std::byte>(d).subspan(settings_size))
        .u64(ring.addr)
        .u32(ring.rkey)
        .u64(ring.length);
  }
  return d;
}

std::vector<rdx::remote_descriptor> cm_native_ring(const options& o, std::span<const std::byte> d) {
  if (o.m != mode::write_imm) return {};
  if (d.size() < cm_native_size) throw failure("the peer's private data holds no ring descriptor");
  app::settings_reader p(d.subspan(settings_size));
  const std::uint64_t addr = p.u64();
  const std::uint32_t rkey = p.u32();
  return {rdx::remote_descriptor{addr, rkey, p.u64()}};
}

int run_native_cm(const options& o, resources& r) {
  const bool client = !o.server.empty();
  const auto copts = connect_opts(o);
  const rdx::cm::options cmo{.timeout = o.timeout, .qp = copts, .wait_for_listener = true};
  settings mine{static_cast<std::uint32_t>(o.m), o.iters, o.size, 0};
  std::optional<rdx::cm::link> link;
  std::uint32_t seed = 0;
  rdx::remote_descriptor peer_ring{};
  if (client) {
    rdx::detail::os_random(&mine.seed, sizeof mine.seed);
    seed = mine.seed;
    link.emplace(rdx::cm::connect(r.qp, o.server, o.tcp_port, cm_native_data(o, r, mine), cmo));
    (void)decode_settings(link->peer_private_data(), mine, link->peer());
    peer_ring = peer_ring_of(o, cm_native_ring(o, link->peer_private_data()));
  } else {
    rdx::cm::listener l(o.tcp_port);
    std::printf("  waiting for a client on rdma_cm port %u\n", l.port());
    std::fflush(stdout);
    std::optional<rdx::cm::request> req = l.next(o.timeout);
    if (!req)
      throw failure("no client within " + std::to_string(o.timeout.count()) + " s on rdma_cm port " +
                    std::to_string(l.port()));
    settings peer;
    try {
      peer = decode_settings(req->private_data(), mine, req->peer());
      peer_ring = peer_ring_of(o, cm_native_ring(o, req->private_data()));
    } catch (const failure& e) {
      req->reject(rdx::cm::reject_reason::settings, e.what());
      throw;
    }
    seed = mine.seed = peer.seed;
    link.emplace(req->accept(r.qp, cm_native_data(o, r, mine), cmo));
  }
  std::printf("  remote address: %s over rdma_cm, queue pair %s\n", link->peer(),
              rdx::to_string(r.qp.local_endpoint()).c_str());
  std::printf("  connected: mode %s, %zu bytes x %u round trips\n", mode_name(o.m), o.size, o.iters);
  std::fflush(stdout);
  const run_stats st = native_round_trips(r, o, peer_ring, seed);
  // The client's last receive is the server's last send: nothing is in
  // flight. The server waits for the client to disconnect first.
  if (!client && !link->wait_disconnected(steady::now() + o.timeout))
    std::fprintf(stderr, "  note: the client did not disconnect within %lld s\n",
                 static_cast<long long>(o.timeout.count()));
  report(o, st, client, mode_name(o.m));
  return 0;
}
#endif

}  // namespace

// Native modes: settings, endpoints (and in write_imm the ring's descriptor),
// connect, barrier, ITERS round trips, barrier.
int run_native(const options& o) {
  resources r(o, app::open_device(o.device));
  const bool client = !o.server.empty();
  print_local(r, client ? "client" : "server", o);
  r.qp.to_init();
  for (std::uint32_t s = 0; s < recv_slots; ++s) post_recv_slot(r, o, s);
#if RDX_EXAMPLES_CM
  if (o.cm) return run_native_cm(o, r);
#endif

  rdx::tcp::socket sock = app::bootstrap_socket(o.server, o.tcp_port, o.timeout);
  // One deadline for the whole set-up: a slow peer cannot stretch it step by step.
  const auto setup_deadline = steady::now() + o.timeout;
  settings mine{static_cast<std::uint32_t>(o.m), o.iters, o.size, 0};
  if (client) rdx::detail::os_random(&mine.seed, sizeof mine.seed);
  const settings peer = exchange_settings(sock, mine, setup_deadline);
  const std::uint32_t seed = client ? mine.seed : peer.seed;

  std::vector<rdx::remote_descriptor> mine_desc;
  if (o.m == mode::write_imm) mine_desc.push_back(r.ring.remote());
  const rdx::wire::message remote =
      rdx::tcp::exchange(sock, r.qp.local_endpoint(), mine_desc, setup_deadline);
  std::printf("  remote address: %s (%s)\n", rdx::to_string(remote.ep).c_str(), sock.peer().c_str());
  const rdx::remote_descriptor peer_ring = peer_ring_of(o, remote.descriptors);
  const auto copts = connect_opts(o);
  r.qp.connect(remote.ep, copts);
  std::printf("  connected: path MTU %d, mode %s, %zu bytes x %u round trips\n",
              rdx::mtu_bytes(std::min({r.qp.local_endpoint().mtu, remote.ep.mtu, copts.max_mtu})),
              mode_name(o.m), o.size, o.iters);
  std::fflush(stdout);
  rdx::tcp::barrier(sock, setup_deadline);  // both queue pairs ready, receives posted
  const run_stats st = native_round_trips(r, o, peer_ring, seed);
  rdx::tcp::barrier(sock, o.timeout);  // the peer is done too: no traffic in flight when the QP goes
  report(o, st, client, mode_name(o.m));
  return 0;
}

}  // namespace pingpong
