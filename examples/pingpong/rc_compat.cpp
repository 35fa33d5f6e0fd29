// pingpong --rc-compat: rdma-core's ibv_rc_pingpong exchange and traffic, so
// that either side may be ibv_rc_pingpong.
#include <rdx/connect/rc_pingpong_exchange.hpp>
#include <rdx/rdx.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.hpp"
#include "modes.hpp"
#include "payload.hpp"
#include "report.hpp"
#include "resources.hpp"

namespace pingpong {

// ibv_rc_pingpong's protocol: its exchange, then send/recv of SIZE bytes from
// one buffer per side; the server echoes what it receives.
int run_rc_compat(const options& o) {
  resources r(o, app::open_device(o.device));
  const bool client = !o.server.empty();
  print_local(r, client ? "client (ibv_rc_pingpong protocol)" : "server (ibv_rc_pingpong protocol)", o);
  r.qp.to_init();
  for (std::uint32_t s = 0; s < recv_slots; ++s) post_recv_slot(r, o, s);
  const auto copts = connect_opts(o);
  const ibv_mtu agreed = copts.max_mtu;
  auto connect = [&](const rdx::endpoint& remote) {
    std::printf("  remote address: %s\n", rdx::to_string(remote).c_str());
    if (rdx::gid_is_zero(remote.gid) && r.ctx.query_port(r.qp.port()).is_ethernet())
      throw failure(
          "the peer sent a zero GID, which a RoCE port cannot reach: run ibv_rc_pingpong with -g GID_INDEX");
    r.qp.connect(remote, copts);
  };

  if (client) {
    auto sock = app::bootstrap_socket(o.server, o.tcp_port, o.timeout);
    connect(rdx::rc_pingpong::client_exchange(sock, r.qp.local_endpoint(), agreed, o.timeout));
  } else {
    auto sock = app::bootstrap_socket("", o.tcp_port, o.timeout);
    (void)rdx::rc_pingpong::server_exchange(sock, r.qp.local_endpoint(), connect, agreed, o.timeout);
  }
  std::printf("  connected: path MTU %d, %zu bytes x %u round trips\n", rdx::mtu_bytes(agreed), o.size,
              o.iters);
  std::fflush(stdout);

  run_stats st;
  st.rtt_us.reserve(o.iters);
  bool page_marks = true;  // what the client's payload looks like (ibv_rc_pingpong -c marks pages)
  const auto loop_start = steady::now();
  for (std::uint32_t k = 0; k < o.iters; ++k) {
    const std::uint32_t slot = k % recv_slots;
    std::byte* slot_mem = r.ring.data() + slot * o.size;
    if (client) {
      fill_rc(r.send_buf.data(), o.size, true);
      if (o.corrupt_round == k) r.send_buf[o.size / 2] ^= std::byte{0x5a};
      const auto t0 = steady::now();
      post_echo_or_ping(r, o, {}, r.send_buf.sge(), k);
      const rdx::completion rc = wait_completion(r.recv_cq, "receive", k, o);
      const auto t1 = steady::now();
      (void)wait_completion(r.send_cq, "send", k, o);
      st.rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      check_recv(rc, o, k);
      if (const std::size_t bad = check_rc(slot_mem, o.size, true); bad != o.size)
        throw failure("the echo of round trip " + std::to_string(k) + " is wrong at byte " +
                      std::to_string(bad) + ": " + byte_text(slot_mem[bad]) + " (expected what was sent)");
    } else {
      const rdx::completion rc = wait_completion(r.recv_cq, "receive", k, o);
      check_recv(rc, o, k);
      post_echo_or_ping(r, o, {}, r.ring.sge(slot * o.size, o.size), k);
      (void)wait_completion(r.send_cq, "send", k, o);
      if (k == 0 && check_rc(slot_mem, o.size, true) != o.size &&
          check_rc(slot_mem, o.size, false) == o.size) {
        page_marks = false;
        std::printf(
            "  note: the client does not mark pages (ibv_rc_pingpong without -c); checking for 0x7b only\n");
      }
      if (const std::size_t bad = check_rc(slot_mem, o.size, page_marks); bad != o.size)
        throw failure("the payload of round trip " + std::to_string(k) + " is wrong at byte " +
                      std::to_string(bad) + ": " + byte_text(slot_mem[bad]) + ", expected " +
                      byte_text((page_marks && bad % page_size() == 0) ? std::byte{0} : std::byte{0x7b}) +
                      " (ibv_rc_pingpong's fill)");
    }
    // Clear the slot so a receive that never lands cannot pass the next check.
    std::memset(slot_mem, 0, o.size);
    post_recv_slot(r, o, slot);
  }
  st.wall_s = std::chrono::duration<double>(steady::now() - loop_start).count();
  report(o, st, client, "rc-compat");
  return 0;
}

}  // namespace pingpong
