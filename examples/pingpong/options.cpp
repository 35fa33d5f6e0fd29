// pingpong's command line: --help's text and the parser.
#include "options.hpp"

#include <cstdio>
#include <string>

#include "cli.hpp"
#include "psk_setup.hpp"

namespace pingpong {

const char* mode_name(mode m) {
  switch (m) {
    case mode::send: return "send";
    case mode::write_imm: return "write_imm";
    case mode::channel: return "channel";
    case mode::window: return "window";
  }
  return "?";
}

void usage(const char* argv0) {
  std::printf(
      "Usage:\n"
      "  %s [options]            start a server and wait for one client (or N: --clients)\n"
      "  %s [options] SERVER     connect to the server at SERVER (host name or address)\n"
      "\n"
      "A reliable-connection ping-pong: the client sends SIZE bytes, the server\n"
      "checks them and sends them back, ITERS times. Every payload is checked on\n"
      "both sides; the client prints min, median and p99 round-trip latency and\n"
      "the bandwidth. Both sides must use the same -s, -n and --mode.\n"
      "\n"
      "Options:\n"
      "  -d, --ib-dev DEV       RDMA device (default: RDX_DEVICE, else the first device\n"
      "                         with an ACTIVE port)\n"
      "  -i, --ib-port N        device port (default: the first ACTIVE port)\n"
      "  -x, -g, --gid-index N  GID index (default: RDX_GID_INDEX, else automatic:\n"
      "                         RoCE v2 IPv4-mapped first; see devinfo)\n"
      "  -s, --size BYTES       message size, K/M suffixes allowed (default 4096)\n"
      "  -n, --iters N          round trips (default 1000)\n"
      "  -p, --port PORT        TCP port of the endpoint exchange, or with --cm the\n"
      "                         rdma_cm port (default 18515)\n"
      "  -m, --mtu BYTES        largest path MTU: 256 to 4096 (default 4096; with\n"
      "                         --rc-compat 1024, as ibv_rc_pingpong)\n"
      "      --mode MODE        send (send/recv, default), write_imm (RDMA write\n"
      "                         with immediate into the peer's registered buffer),\n"
      "                         channel or window (below)\n"
      "      --channel          the same as --mode channel: rdx::channel<std::byte>\n"
      "                         messages (flow-controlled send/recv, SIZE <= 64K)\n"
      "      --window           the same as --mode window: rdx::remote_window writes\n"
      "                         of SIZE bytes plus a sequence word; each side polls\n"
      "                         its own memory for the peer's write\n"
      "      --rc-compat        interoperate with rdma-core's ibv_rc_pingpong: its TCP\n"
      "                         exchange and its traffic (send mode). Run it with the\n"
      "                         same -s and -n, with -g GID_INDEX on RoCE, and with -c\n"
      "                         so that it fills and checks its payload\n"
      "      --cm               connect through rdma_cm (librdmacm) instead of the TCP\n"
      "                         exchange: SERVER is the server's address on its RDMA\n"
      "                         device; settings travel in the connect request's\n"
      "                         private data (send, write_imm) or as the first message\n"
      "                         (channel, window). Every mode, --clients too\n"
      "  -e, --events           sleep on completion events instead of busy polling\n"
      "                         (as ibv_rc_pingpong -e); with --channel or --window the\n"
      "                         connection, or the --clients server's worker, sleeps on\n"
      "                         its descriptor (a --window side still polls its memory)\n"
      "      --clients N        (server, --channel or --window) listen once and serve N\n"
      "                         clients as they come, all at once, from one thread: every\n"
      "                         client's connection on one rdx::worker, set up while the\n"
      "                         others are served (TCP or --cm alike). A\n"
      "                         client that fails set-up (silent, slow, other settings,\n"
      "                         foreign bytes) costs only its own slot. One worker holds\n"
      "                         max_cqe / 33 clients (992 on Soft-RoCE); one line per\n"
      "                         client accepted and finished (default 1)\n"
      "      --pool             (--clients server) every client's messages in one\n"
      "                         receive pool of the worker (a shared receive queue:\n"
      "                         recv_depth x N buffers and a quarter more to grow by)\n"
      "                         instead of a ring of each client's own\n"
      "      --psk-file FILE    the pre-shared key (hex, as `openssl rand -hex 32`\n"
      "                         writes it; mode 600) that authenticates set-up with\n"
      "                         --channel or --window over TCP: both sides prove they\n"
      "                         hold it before any queue pair is connected, and a peer\n"
      "                         without it is refused; both sides need the same file.\n"
      "                         A --clients server then sets clients up one at a time.\n"
      "                         Not with send, write_imm, --rc-compat or --cm: their\n"
      "                         set-up has no authentication\n"
      "                         (this build: %s)\n"
      "      --encrypt          (--channel, with --psk-file) seal every message with\n"
      "                         AES-256-GCM under keys from the authenticated set-up\n"
      "                         (rdx::connection_attr::encrypt): a changed, replayed or\n"
      "                         reordered message is refused; both sides need it. Each\n"
      "                         message carries 24 bytes more on the wire\n"
      "  -t, --timeout SEC      limit for connecting, for a client's whole set-up and for\n"
      "                         each completion (default 30)\n"
      "      --ack-timeout MS   how long the NIC waits for an ACK before it resends,\n"
      "                         rounded up to what the verbs can express (4.096 us x\n"
      "                         2^code; the line printed says what it became); a request\n"
      "                         still unanswered after 7 of them fails (default 67 ms)\n"
      "  -h, --help             this text\n"
      "\n"
      "Testing:\n"
      "      --corrupt-round K  (client) flip one byte of the payload sent in round\n"
      "                         trip K, to see both sides catch it and fail\n"
      "\n"
      "Exit status: 0 when every round trip completed with the right payload, 1 on\n"
      "any failure, 2 for a usage error. With --clients N: 0 when every client that\n"
      "completed set-up passed its checks and at least one did, else 1.\n"
      "\n"
      "Examples (two hosts, server 10.77.0.1):\n"
      "  %s                          and  %s 10.77.0.1\n"
      "  %s --mode write_imm -s 64K  and  %s --mode write_imm -s 64K 10.77.0.1\n"
      "  ibv_rc_pingpong -g 1 -c     and  %s --rc-compat 10.77.0.1\n"
      "  %s --cm --window            and  %s --cm --window 10.77.0.1\n"
      "  %s --channel --clients 4    and  up to 4 of  %s --channel 10.77.0.1\n"
      "  %s --channel --psk-file KEY and  %s --channel --psk-file KEY 10.77.0.1\n"
      "  add --encrypt to both of those to seal every message\n"
      "    (KEY made once with  (umask 077; openssl rand -hex 32 > KEY)  and copied)\n",
      argv0, argv0, app::psk_build_note(), argv0, argv0, argv0, argv0, argv0, argv0, argv0, argv0, argv0,
      argv0, argv0);
}

options parse_options(int argc, char** argv, bool& help) {
  options o;
  app::arg_reader r(argc, argv);
  std::string v;
  std::optional<std::size_t> mtu_bytes;
  while (!r.done()) {
    if (r.match({"-h", "--help"})) {
      help = true;
      return o;
    } else if (r.match({"-d", "--ib-dev"}, &v)) {
      o.device = v;
    } else if (r.match({"-i", "--ib-port"}, &v)) {
      o.ib_port = static_cast<std::uint8_t>(app::parse_number("--ib-port", v, 1, 255));
    } else if (r.match({"-x", "-g", "--gid-index"}, &v)) {
      o.gid_index = static_cast<std::uint8_t>(app::parse_number("--gid-index", v, 0, 255));
    } else if (r.match({"-s", "--size"}, &v)) {
      o.size = app::parse_number("--size", v, 1, std::uint64_t{1} << 30, true);
    } else if (r.match({"-n", "--iters"}, &v)) {
      o.iters = static_cast<std::uint32_t>(app::parse_number("--iters", v, 1, 100000000));
    } else if (r.match({"-p", "--port"}, &v)) {
      o.tcp_port = static_cast<std::uint16_t>(app::parse_number("--port", v, 1, 65535));
    } else if (r.match({"-m", "--mtu"}, &v)) {
      mtu_bytes = app::parse_number("--mtu", v, 256, 4096);
      ibv_mtu m{};
      if (!rdx::mtu_from_bytes(static_cast<int>(*mtu_bytes), m))
        throw app::usage_error("--mtu " + v + ": expected 256, 512, 1024, 2048 or 4096");
      o.mtu = m;
    } else if (r.match({"--mode"}, &v)) {
      if (v == "send")
        o.m = mode::send;
      else if (v == "write_imm")
        o.m = mode::write_imm;
      else if (v == "channel")
        o.m = mode::channel;
      else if (v == "window")
        o.m = mode::window;
      else
        throw app::usage_error("--mode " + v + ": expected send, write_imm, channel or window");
    } else if (r.match({"--channel"})) {
      o.m = mode::channel;
    } else if (r.match({"--window"})) {
      o.m = mode::window;
    } else if (r.match({"-e", "--events"})) {
      o.events = true;
    } else if (r.match({"--cm"})) {
      o.cm = true;
    } else if (r.match({"--rc-compat"})) {
      o.rc_compat = true;
    } else if (r.match({"--corrupt-round"}, &v)) {
      o.corrupt_round = static_cast<std::uint32_t>(app::parse_number("--corrupt-round", v, 0, 100000000));
    } else if (r.match({"--pool"})) {
      o.pool = true;
    } else if (r.match({"--clients"}, &v)) {
      o.clients = static_cast<std::uint32_t>(app::parse_number("--clients", v, 1, 65536));
    } else if (r.match({"--encrypt"})) {
      app::psk_build_check("pingpong");
      o.encrypt = true;
    } else if (r.match({"--psk-file"}, &v)) {
      app::psk_build_check("pingpong");
      o.psk_file = v;
    } else if (r.match({"-t", "--timeout"}, &v)) {
      o.timeout = std::chrono::seconds(app::parse_number("--timeout", v, 1, 86400));
    } else if (r.match({"--ack-timeout"}, &v)) {
      o.ack_timeout = std::chrono::milliseconds(app::parse_number("--ack-timeout", v, 1, 3600000));
    } else if (r.peek().starts_with("-") && r.peek().size() > 1) {
      throw app::usage_error("unknown option " + std::string(r.peek()));
    } else {
      if (!o.server.empty())
        throw app::usage_error("more than one server address: " + o.server + " and " + r.take());
      o.server = r.take();
    }
  }
  if (o.rc_compat && o.m != mode::send)
    throw app::usage_error("--rc-compat speaks ibv_rc_pingpong's traffic, which is send/recv: drop --mode");
  if (o.rc_compat && o.cm)
    throw app::usage_error("--rc-compat speaks ibv_rc_pingpong's TCP exchange: drop --cm");
#if !RDX_EXAMPLES_CM
  if (o.cm) throw app::usage_error("--cm: this pingpong was built without librdmacm (rdx::cm)");
#endif
  if (o.pool && o.clients < 2)
    throw app::usage_error(
        "--pool is for a --clients N server (N of 2 or more): add --clients, or drop --pool");
  if (o.clients > 1 && !o.server.empty())
    throw app::usage_error("--clients is for the server: drop it, or drop " + o.server);
  if (o.clients > 1 && o.m != mode::channel && o.m != mode::window)
    throw app::usage_error(
        "--clients serves each client on its own rdx::connection: add --channel or --window");
  if (!o.psk_file.empty() && o.rc_compat)
    throw app::usage_error(
        "--psk-file: --rc-compat speaks ibv_rc_pingpong's exchange, which has no authentication: drop "
        "--psk-file");
  if (!o.psk_file.empty() && o.m != mode::channel && o.m != mode::window)
    throw app::usage_error(
        std::string("--psk-file authenticates the exchange of an rdx::connection, which ") +
        "only --channel and --window set up; --mode " + mode_name(o.m) +
        " sets up raw queue pairs without it: add --channel or --window, or drop --psk-file");
  if (!o.psk_file.empty() && o.cm)
    throw app::usage_error(
        "--psk-file: rdx::auth authenticates the TCP exchange; rdma_cm set-up (--cm) has no "
        "authentication: drop --cm or --psk-file");
  if (o.encrypt && o.psk_file.empty())
    throw app::usage_error(
        "--encrypt seals messages with keys from the authenticated set-up: add --psk-file FILE (both "
        "sides)");
  if (o.encrypt && o.m != mode::channel)
    throw app::usage_error(
        "--encrypt seals messages; --window writes one-sided, which an encrypted connection refuses: use "
        "--channel");
  if (o.encrypt && o.clients > 1)
    throw app::usage_error("--encrypt: the --clients server does not seal yet: drop --clients or --encrypt");
  if (o.m == mode::channel && o.size > 64 * 1024)
    throw app::usage_error("--channel carries messages of up to 64K: use a smaller --size");
  return o;
}

rdx::connect_options connect_opts(const options& o) {
  rdx::connect_options c;
  c.max_mtu = o.mtu.value_or(o.rc_compat ? rdx::rc_pingpong::default_mtu : IBV_MTU_4096);
  if (o.ack_timeout) (void)c.set_ack_timeout(*o.ack_timeout);
  return c;
}

}  // namespace pingpong
