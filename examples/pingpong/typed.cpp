// pingpong's typed modes over rdx::connection, --channel and --window, for a
// client or the server of one client; met over TCP or rdma_cm.
//
// --channel: rdx::channel<std::byte> messages of SIZE bytes, echoed.
// --window: each side grants a window of SIZE bytes plus a sequence word; a
// round trip is one rdx::remote_window write of payload and sequence, seen by
// the other side polling its own memory (the sequence word is written last:
// one RDMA write places its bytes in order on rxe and on the NICs rdx targets).
#include <rdx/channel/channel.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>
#if RDX_EXAMPLES_CM
#include <rdx/cm/cm.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "modes.hpp"
#include "payload.hpp"
#include "peer_settings.hpp"
#include "psk_setup.hpp"
#include "report.hpp"

namespace pingpong {

namespace {

// What is left of a set-up deadline (zero once it has passed: the next step then times out).
std::chrono::milliseconds time_left(steady::time_point deadline) {
  return std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now()),
                  std::chrono::milliseconds{0});
}

// How a typed session met its peer: what the peer offered and said, its
// name, and what to do after the last round trip.
struct meeting {
  rdx::peer_offer offer;
  settings peer;
  std::string peer_name;
  std::function<void()> finish;
};

// Over TCP: settings, then exchange_and_connect on the socket get_socket()
// returns (the one-client server says where it waits only once its
// connection exists), authenticated with --psk-file's key when given (the
// settings go first, outside it); a barrier at the end.
template <class GetSocket>
auto tcp_meeting(const options& o, const app::setup_key& key, GetSocket&& get_socket) {
  return [&o, &key, get_socket = std::forward<GetSocket>(get_socket)](
             rdx::connection& conn, std::span<const rdx::window_descriptor> grants, const settings& mine,
             steady::time_point deadline) mutable {
    auto sock = std::make_shared<rdx::tcp::socket>(get_socket());
    meeting m;
    m.peer = exchange_settings(*sock, mine, deadline);
    m.offer = key.exchange_and_connect(
        *sock, conn, grants,
        rdx::exchange_options{.timeout = time_left(deadline), .connect = connect_opts(o)});
    m.peer_name = rdx::to_string(m.offer.info.endpoints[0]) + " (" + sock->peer() +
                  (key ? (o.encrypt ? ", authenticated with --psk-file, messages sealed)"
                                    : ", authenticated with --psk-file)")
                       : ")");
    // The peer is done too: no traffic in flight when the queue pairs go.
    m.finish = [sock, &o] { rdx::tcp::barrier(*sock, o.timeout); };
    return m;
  };
}

#if RDX_EXAMPLES_CM
// Over rdma_cm the library's private data carries the connection settings and
// the grants; pingpong's own settings go as the first message each way.
settings cm_settings(rdx::connection& conn, const settings& mine, const std::string& who,
                     steady::time_point deadline) {
  rdx::channel<std::byte> ch(conn);
  std::byte out[settings_size] = {};
  encode_settings(out, mine);
  auto s = ch.send(std::span<const std::byte>(out));
  std::byte in[settings_size] = {};
  auto r = ch.receive(std::span<std::byte>(in));
  for (rdx::operation* op : {static_cast<rdx::operation*>(&s), &r}) {
    if (const std::error_code ec = op->wait_until(deadline))
      throw failure("exchanging settings with " + who + " over rdma_cm: " + ec.message());
  }
  return decode_settings(in, mine, who);
}

// The client's side: cm::connect to SERVER on the rdma_cm port.
auto cm_client_meeting(const options& o) {
  return [&o](rdx::connection& conn, std::span<const rdx::window_descriptor> grants, const settings& mine,
              steady::time_point deadline) {
    meeting m;
    m.offer = rdx::cm::connect(
        conn, o.server, o.tcp_port, grants,
        rdx::cm::options{.timeout = time_left(deadline), .qp = connect_opts(o), .wait_for_listener = true});
    m.peer_name = rdx::detail::host_port(o.server, o.tcp_port) + " over rdma_cm";
    m.peer = cm_settings(conn, mine, m.peer_name, deadline);
    return m;
  };
}

// The server's side: cm::accept of a request the listener handed out
// (get_request() is called once the connection exists, as get_socket()).
template <class GetRequest>
auto cm_server_meeting(GetRequest&& get_request) {
  return [get_request = std::forward<GetRequest>(get_request)](
             rdx::connection& conn, std::span<const rdx::window_descriptor> grants, const settings& mine,
             steady::time_point deadline) mutable {
    rdx::cm::request req = get_request();
    meeting m;
    m.peer_name = req.peer() + " over rdma_cm";
    m.offer = rdx::cm::accept(std::move(req), conn, grants, rdx::cm::options{.timeout = time_left(deadline)});
    m.peer = cm_settings(conn, mine, m.peer_name, deadline);
    return m;
  };
}
#endif

// One session, on a connection of its own over pd: settings, exchange and
// round trips; meet() connects it (over TCP or rdma_cm). Lines start with
// `tag`: empty for a client and the one-client server, which also print the
// header line. `setup_done` is set once set-up has completed, so a throw
// before it is a set-up failure.
template <class Meet>
run_stats run_typed_session(const options& o, const rdx::context& ctx, const rdx::protection_domain& pd,
                            Meet&& meet, const std::string& tag, bool& setup_done) {
  const bool client = !o.server.empty();
  const bool window = o.m == mode::window;
  // Over rdma_cm the first message carries pingpong's settings (24 bytes).
  const std::size_t min_message = o.cm ? 64 : 1;
  rdx::connection conn(pd, rdx::connection_attr{.recv_depth = 16,
                                                .message_size = static_cast<std::uint32_t>(
                                                    (window ? 64 : std::max(o.size, min_message)) +
                                                    (o.encrypt ? rdx::sealed_message_overhead : 0)),
                                                .events = o.events,
                                                .port = o.ib_port,
                                                .gid_index = o.gid_index,
                                                .encrypt = o.encrypt});
  const std::size_t words = (o.size + 7) / 8 + 1;  // payload, then the sequence word
  auto mine = rdx::make_window_buffer<std::uint64_t, rdx::rights::write>(pd, words);
  const rdx::grant<std::uint64_t, rdx::rights::write> g(conn, mine);
  rdx::registered_buffer<std::uint64_t> out(pd, words);
  if (tag.empty())
    std::printf("rdx pingpong %s (%s%s): %s port %u\n", client ? "client" : "server", mode_name(o.m),
                o.cm ? ", rdma_cm" : "", ctx.name().c_str(), conn.qp(0).port());
  std::printf("%s  local address:  %s\n", tag.c_str(), rdx::to_string(conn.qp(0).local_endpoint()).c_str());

  // One deadline for the whole set-up, settings and exchange together: a
  // silent or slow peer holds this session no longer than --timeout.
  const auto setup_deadline = steady::now() + o.timeout;
  settings mine_settings{static_cast<std::uint32_t>(o.m), o.iters, o.size, 0};
  if (client) rdx::detail::os_random(&mine_settings.seed, sizeof mine_settings.seed);
  const rdx::window_descriptor grants[] = {g.descriptor()};
  meeting met = meet(
      conn,
      window ? std::span<const rdx::window_descriptor>(grants) : std::span<const rdx::window_descriptor>(),
      mine_settings, setup_deadline);
  const rdx::peer_offer& offer = met.offer;
  const std::uint32_t seed = client ? mine_settings.seed : met.peer.seed;
  std::printf("%s  remote address: %s, %u queue pair(s)\n", tag.c_str(), met.peer_name.c_str(),
              conn.queue_pair_count());
  std::optional<rdx::remote_window<std::uint64_t, rdx::rights::write>> peer_win;
  if (window) {
    if (offer.windows.size() != 1)
      throw failure("the peer granted " + std::to_string(offer.windows.size()) +
                    " windows, --window needs 1");
    peer_win.emplace(conn, offer.windows[0]);
    if (peer_win->size() < words)
      throw failure("the peer's window of " + std::to_string(peer_win->size()) + " words is smaller than " +
                    std::to_string(words));
  }
  setup_done = true;
  rdx::channel<std::byte> ch(conn);
  std::vector<std::byte> msg(o.size), echo(o.size);
  std::fflush(stdout);

  auto check_op = [&](rdx::operation& op, const char* what, std::uint32_t k) {
    const std::error_code ec = op.wait(o.timeout, o.events ? rdx::wait_mode::events : rdx::wait_mode::poll);
    if (ec == rdx::errc::timed_out)
      throw failure("round trip " + std::to_string(k) + ": no " + what + " completion within " +
                    std::to_string(o.timeout.count()) + " s (has the peer stopped? see its output)");
    if (ec) throw failure("round trip " + std::to_string(k) + ": " + what + " failed: " + ec.message());
  };
  // Polls the sequence word of this side's window until the peer's write of round k lands.
  auto await_seq = [&](std::uint32_t k) {
    const auto deadline = steady::now() + o.timeout;
    std::atomic_ref<std::uint64_t> seq(mine[words - 1]);
    unsigned spins = 0;
    auto nap = std::chrono::microseconds{50};
    while (seq.load(std::memory_order_acquire) != std::uint64_t{k} + 1) {
      // A write raises no event here: with -e, sleep between looks, longer
      // each time up to 2 ms, so that many clients on one core leave it to
      // the server and the kernel (which acknowledges the peer's writes:
      // starved, the peer's writes end in transport retry exceeded).
      if (o.events || ++spins % 256 == 0) {
        conn.progress();
        if (o.events) {
          std::this_thread::sleep_for(nap);
          nap = std::min(nap * 2, std::chrono::microseconds{2000});
        }
        if (steady::now() > deadline)
          throw failure("round trip " + std::to_string(k) + ": the peer's write did not arrive within " +
                        std::to_string(o.timeout.count()) + " s");
      }
    }
  };
  auto* mine_bytes = reinterpret_cast<std::byte*>(mine.data());
  auto* out_bytes = reinterpret_cast<std::byte*>(out.data());

  run_stats st;
  st.rtt_us.reserve(o.iters);
  const auto loop_start = steady::now();
  for (std::uint32_t k = 0; k < o.iters; ++k) {
    if (window && client) {
      fill_pattern(out_bytes, o.size, k, seed);
      out[words - 1] = std::uint64_t{k} + 1;
      const auto t0 = steady::now();
      auto w = peer_win->write(out, 0);
      await_seq(k);
      const auto t1 = steady::now();
      check_op(w, "window write", k);
      st.rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      check_payload(mine_bytes, o, k, seed, "the echo");
    } else if (window) {
      await_seq(k);
      // Checked before the echo: once echoed, the client writes the next round here.
      check_payload(mine_bytes, o, k, seed, "the payload");
      // Echo straight from the window: its memory is registered, so it is a source too.
      auto w = peer_win->write(g.local(), 0);
      check_op(w, "window write", k);
    } else if (client) {
      fill_pattern(msg.data(), o.size, k, seed);
      const auto t0 = steady::now();
      auto s = ch.send(std::span<const std::byte>(msg));
      auto r = ch.receive(std::span<std::byte>(echo));
      check_op(r, "channel receive", k);
      const auto t1 = steady::now();
      check_op(s, "channel send", k);
      st.rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      if (r.byte_count() != o.size)
        throw failure("round trip " + std::to_string(k) + ": " + std::to_string(r.byte_count()) +
                      " bytes arrived, expected " + std::to_string(o.size));
      check_payload(echo.data(), o, k, seed, "the echo");
    } else {
      auto r = ch.receive(std::span<std::byte>(echo));
      check_op(r, "channel receive", k);
      auto s = ch.send(std::span<const std::byte>(echo.data(), r.byte_count()));
      check_op(s, "channel send", k);
      if (r.byte_count() != o.size)
        throw failure("round trip " + std::to_string(k) + ": " + std::to_string(r.byte_count()) +
                      " bytes arrived, expected " + std::to_string(o.size));
      check_payload(echo.data(), o, k, seed, "the payload");
    }
  }
  st.wall_s = std::chrono::duration<double>(steady::now() - loop_start).count();
  if (met.finish) met.finish();
  return st;
}

}  // namespace

// A client, or the server of one client.
int run_typed(const options& o) {
  const app::setup_key key(o.psk_file);  // before any socket
  rdx::context ctx = app::open_device(o.device);
  rdx::protection_domain pd(ctx);
  bool setup_done = false;
  const bool client = !o.server.empty();
  run_stats st;
#if RDX_EXAMPLES_CM
  if (o.cm && client) {
    st = run_typed_session(o, ctx, pd, cm_client_meeting(o), std::string(), setup_done);
  } else if (o.cm) {
    rdx::cm::listener l(o.tcp_port);
    auto get_request = [&] {
      std::printf("  waiting for a client on rdma_cm port %u\n", l.port());
      std::fflush(stdout);
      std::optional<rdx::cm::request> r = l.next(o.timeout);
      if (!r)
        throw failure("no client within " + std::to_string(o.timeout.count()) + " s on rdma_cm port " +
                      std::to_string(l.port()));
      return std::move(*r);
    };
    st = run_typed_session(o, ctx, pd, cm_server_meeting(get_request), std::string(), setup_done);
  } else
#endif
  {
    st = run_typed_session(
        o, ctx, pd,
        tcp_meeting(o, key, [&] { return app::bootstrap_socket(o.server, o.tcp_port, o.timeout); }),
        std::string(), setup_done);
  }
  report(o, st, client, mode_name(o.m));
  return 0;
}

}  // namespace pingpong
