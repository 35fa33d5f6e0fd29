// rdx pingpong: a reliable-connection ping-pong between two hosts, with every
// payload checked and the latency distribution and bandwidth printed.
//
//   server:  pingpong [options]
//   client:  pingpong [options] SERVER
//
// Modes: send (send/recv), write_imm (RDMA write with immediate into the
// peer's registered ring), --channel (rdx::channel<std::byte> messages),
// --window (rdx::remote_window writes, completion seen by polling memory), and --rc-compat, which speaks
// rdma-core's ibv_rc_pingpong exchange and traffic so either side may be ibv_rc_pingpong.
// With --clients N a --channel or --window server serves N clients at once
// from one thread, every client's connection on one rdx::worker, set up by an
// rdx::acceptor while the others are served; one bad client holds only its
// own slot, over TCP (rdx::acceptor) and rdma_cm (rdx::cm::acceptor) alike.
#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/channel.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/connect/rc_pingpong_exchange.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>
#if RDX_EXAMPLES_CM
#include <rdx/cm/cm.hpp>
#endif

#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include <sys/socket.h>
#include <unistd.h>

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

enum class mode : std::uint32_t { send = 1, write_imm = 2, channel = 3, window = 4 };

const char* mode_name(mode m) {
  switch (m) {
    case mode::send: return "send";
    case mode::write_imm: return "write_imm";
    case mode::channel: return "channel";
    case mode::window: return "window";
  }
  return "?";
}

struct options {
  std::string server;  // empty: act as the server
  std::string device;
  std::uint8_t ib_port = 0;
  std::optional<std::uint8_t> gid_index;
  std::size_t size = 4096;
  std::uint32_t iters = 1000;
  std::uint16_t tcp_port = rdx::rc_pingpong::default_port;
  std::optional<ibv_mtu> mtu;
  mode m = mode::send;
  bool rc_compat = false;
  bool cm = false;      // connect through rdma_cm instead of the TCP exchange
  bool events = false;  // sleep on completion events instead of busy polling
  std::chrono::seconds timeout{30};
  std::optional<std::chrono::milliseconds> ack_timeout;  // --ack-timeout: the local ACK timeout
  std::uint32_t clients = 1;                             // server: how many clients to serve, all at once
  bool pool = false;                                     // --clients server: one receive pool for all
  std::optional<std::uint32_t> corrupt_round;            // testing: damage one payload on purpose
};

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
      "  %s --channel --clients 4    and  up to 4 of  %s --channel 10.77.0.1\n",
      argv0, argv0, argv0, argv0, argv0, argv0, argv0, argv0, argv0, argv0, argv0);
}

options parse_options(int argc, char** argv, bool& help) {
  options o;
  examples::arg_reader r(argc, argv);
  std::string v;
  std::optional<std::size_t> mtu_bytes;
  while (!r.done()) {
    if (r.match({"-h", "--help"})) {
      help = true;
      return o;
    } else if (r.match({"-d", "--ib-dev"}, &v)) {
      o.device = v;
    } else if (r.match({"-i", "--ib-port"}, &v)) {
      o.ib_port = static_cast<std::uint8_t>(examples::parse_number("--ib-port", v, 1, 255));
    } else if (r.match({"-x", "-g", "--gid-index"}, &v)) {
      o.gid_index = static_cast<std::uint8_t>(examples::parse_number("--gid-index", v, 0, 255));
    } else if (r.match({"-s", "--size"}, &v)) {
      o.size = examples::parse_number("--size", v, 1, std::uint64_t{1} << 30, true);
    } else if (r.match({"-n", "--iters"}, &v)) {
      o.iters = static_cast<std::uint32_t>(examples::parse_number("--iters", v, 1, 100000000));
    } else if (r.match({"-p", "--port"}, &v)) {
      o.tcp_port = static_cast<std::uint16_t>(examples::parse_number("--port", v, 1, 65535));
    } else if (r.match({"-m", "--mtu"}, &v)) {
      mtu_bytes = examples::parse_number("--mtu", v, 256, 4096);
      ibv_mtu m{};
      if (!rdx::mtu_from_bytes(static_cast<int>(*mtu_bytes), m))
        throw examples::usage_error("--mtu " + v + ": expected 256, 512, 1024, 2048 or 4096");
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
        throw examples::usage_error("--mode " + v + ": expected send, write_imm, channel or window");
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
      o.corrupt_round =
          static_cast<std::uint32_t>(examples::parse_number("--corrupt-round", v, 0, 100000000));
    } else if (r.match({"--pool"})) {
      o.pool = true;
    } else if (r.match({"--clients"}, &v)) {
      o.clients = static_cast<std::uint32_t>(examples::parse_number("--clients", v, 1, 65536));
    } else if (r.match({"-t", "--timeout"}, &v)) {
      o.timeout = std::chrono::seconds(examples::parse_number("--timeout", v, 1, 86400));
    } else if (r.match({"--ack-timeout"}, &v)) {
      o.ack_timeout = std::chrono::milliseconds(examples::parse_number("--ack-timeout", v, 1, 3600000));
    } else if (r.peek().starts_with("-") && r.peek().size() > 1) {
      throw examples::usage_error("unknown option " + std::string(r.peek()));
    } else {
      if (!o.server.empty())
        throw examples::usage_error("more than one server address: " + o.server + " and " + r.take());
      o.server = r.take();
    }
  }
  if (o.rc_compat && o.m != mode::send)
    throw examples::usage_error(
        "--rc-compat speaks ibv_rc_pingpong's traffic, which is send/recv: drop --mode");
  if (o.rc_compat && o.cm)
    throw examples::usage_error("--rc-compat speaks ibv_rc_pingpong's TCP exchange: drop --cm");
#if !RDX_EXAMPLES_CM
  if (o.cm) throw examples::usage_error("--cm: this pingpong was built without librdmacm (rdx::cm)");
#endif
  if (o.pool && o.clients < 2)
    throw examples::usage_error(
        "--pool is for a --clients N server (N of 2 or more): add --clients, or drop --pool");
  if (o.clients > 1 && !o.server.empty())
    throw examples::usage_error("--clients is for the server: drop it, or drop " + o.server);
  if (o.clients > 1 && o.m != mode::channel && o.m != mode::window)
    throw examples::usage_error(
        "--clients serves each client on its own rdx::connection: add --channel or --window");
  if (o.m == mode::channel && o.size > 64 * 1024)
    throw examples::usage_error("--channel carries messages of up to 64K: use a smaller --size");
  return o;
}

//! A failure that ends the run: printed, exit status 1.
struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --- payloads ---------------------------------------------------------------

// Every byte differs from the same byte of the previous two round trips, so a
// payload that did not arrive (stale data) or arrived shifted is caught.
inline std::uint8_t pattern_byte(std::size_t i, std::uint32_t iter, std::uint32_t seed) noexcept {
  return static_cast<std::uint8_t>(((i * 131u) ^ (i >> 8)) + iter * 13u + seed);
}
void fill_pattern(std::byte* p, std::size_t n, std::uint32_t iter, std::uint32_t seed) noexcept {
  for (std::size_t i = 0; i < n; ++i) p[i] = std::byte{pattern_byte(i, iter, seed)};
}
// Index of the first wrong byte, or n.
std::size_t check_pattern(const std::byte* p, std::size_t n, std::uint32_t iter,
                          std::uint32_t seed) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != std::byte{pattern_byte(i, iter, seed)}) return i;
  return n;
}

// ibv_rc_pingpong fills its buffer with 0x7b and, with -c, writes 0 into the
// first byte of every page; its server echoes what it receives.
std::size_t page_size() {
  return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}
void fill_rc(std::byte* p, std::size_t n, bool page_marks) {
  std::memset(p, 0x7b, n);
  if (page_marks)
    for (std::size_t i = 0; i < n; i += page_size()) p[i] = std::byte{0};
}
std::size_t check_rc(const std::byte* p, std::size_t n, bool page_marks) {
  const std::size_t ps = page_size();
  for (std::size_t i = 0; i < n; ++i) {
    const std::byte want = (page_marks && i % ps == 0) ? std::byte{0} : std::byte{0x7b};
    if (p[i] != want) return i;
  }
  return n;
}

std::string byte_text(std::byte b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", std::to_integer<unsigned>(b));
  return buf;
}

// --- settings both sides must share (native modes) ---------------------------

struct settings {
  std::uint32_t mode = 0;
  std::uint32_t iters = 0;
  std::uint64_t size = 0;
  std::uint32_t seed = 0;
};

constexpr std::size_t settings_size = 24;

void put_be(std::byte* p, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = std::byte(v >> (8 * (bytes - 1 - i)));
}
std::uint64_t get_be(const std::byte* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

void encode_settings(std::byte* out, const settings& mine) {
  std::memcpy(out, "RDXP", 4);
  put_be(out + 4, mine.mode, 4);
  put_be(out + 8, mine.size, 8);
  put_be(out + 16, mine.iters, 4);
  put_be(out + 20, mine.seed, 4);
}

// The peer's settings from its 24 bytes; a mismatch with ours throws, naming
// what differs (each side reports it before any RDMA traffic).
settings decode_settings(std::span<const std::byte> in, const settings& mine, const std::string& who) {
  if (in.size() < settings_size || std::memcmp(in.data(), "RDXP", 4) != 0)
    throw failure("the peer at " + who + " is not an rdx pingpong");
  settings peer;
  peer.mode = static_cast<std::uint32_t>(get_be(in.data() + 4, 4));
  peer.size = get_be(in.data() + 8, 8);
  peer.iters = static_cast<std::uint32_t>(get_be(in.data() + 16, 4));
  peer.seed = static_cast<std::uint32_t>(get_be(in.data() + 20, 4));
  std::string diff;
  auto mode_text = [](std::uint32_t m) {
    return m >= 1 && m <= 4 ? std::string(mode_name(static_cast<mode>(m))) : "mode " + std::to_string(m);
  };
  if (peer.mode != mine.mode)
    diff += " --mode " + mode_text(mine.mode) + " here, " + mode_text(peer.mode) + " there;";
  if (peer.size != mine.size)
    diff += " -s " + std::to_string(mine.size) + " here, " + std::to_string(peer.size) + " there;";
  if (peer.iters != mine.iters)
    diff += " -n " + std::to_string(mine.iters) + " here, " + std::to_string(peer.iters) + " there;";
  if (!diff.empty()) {
    diff.pop_back();
    throw failure("settings differ from the peer's at " + who + ":" + diff +
                  " (run both sides with the same -s, -n and --mode)");
  }
  return peer;
}

// Both sides send their settings; the server takes the client's seed. A
// mismatch is reported on both sides before any RDMA traffic. `deadline` is
// the whole set-up's: the endpoint exchange that follows gets what is left.
settings exchange_settings(const rdx::tcp::socket& s, const settings& mine, steady::time_point deadline) {
  std::byte out[settings_size] = {};
  encode_settings(out, mine);
  s.send_all(out, deadline, "send settings");
  std::byte in[settings_size] = {};
  s.recv_exact(in, deadline, "receive settings");
  return decode_settings(in, mine, s.peer());
}

// What is left of a set-up deadline (zero once it has passed: the next step then times out).
std::chrono::milliseconds time_left(steady::time_point deadline) {
  return std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now()),
                  std::chrono::milliseconds{0});
}

// --- RDMA resources -----------------------------------------------------------

constexpr std::uint32_t recv_slots = 2;

std::optional<rdx::completion_channel> make_channel(const rdx::context& ctx, bool events) {
  if (!events) return std::nullopt;
  return rdx::completion_channel(ctx);
}

struct resources {
  rdx::context ctx;
  rdx::protection_domain pd;
  std::optional<rdx::completion_channel> send_ch;  // event mode (-e) only
  std::optional<rdx::completion_channel> recv_ch;
  rdx::completion_queue send_cq;
  rdx::completion_queue recv_cq;
  rdx::queue_pair qp;
  rdx::registered_buffer<std::byte> send_buf;
  rdx::registered_buffer<std::byte> ring;  // recv_slots slots of `size` bytes

  resources(const options& o, rdx::context c)
      : ctx(std::move(c)),
        pd(ctx),
        send_ch(make_channel(ctx, o.events)),
        recv_ch(make_channel(ctx, o.events)),
        send_cq(ctx, rdx::completion_queue_attr{.depth = 16, .channel = send_ch ? &*send_ch : nullptr}),
        recv_cq(ctx, rdx::completion_queue_attr{.depth = 16, .channel = recv_ch ? &*recv_ch : nullptr}),
        qp(pd, send_cq, recv_cq,
           rdx::queue_pair_attr{
               .max_send_wr = 4,
               .max_recv_wr = recv_slots + 2,
               .port = o.ib_port,
               .gid_index = o.gid_index,
               .remote_access = o.m == mode::write_imm ? rdx::access::remote_write : rdx::access::none}),
        send_buf(pd, o.size),
        ring(pd, o.size * recv_slots,
             o.m == mode::write_imm ? rdx::access::local_write | rdx::access::remote_write
                                    : rdx::access::local_write) {}
};

// Posts the receive for slot `slot`: into the ring (send mode) or empty (write
// with immediate: the data lands by RDMA write, the receive only carries imm).
void post_recv_slot(resources& r, const options& o, std::uint32_t slot) {
  std::error_code ec;
  if (o.m == mode::write_imm) {
    ec = r.qp.post_recv(rdx::wr::recv(std::span<const ibv_sge>{}).id(slot));
  } else {
    ec = r.qp.post_recv(rdx::wr::recv(r.ring.sge(slot * o.size, o.size)).id(slot));
  }
  if (ec) throw failure("post a receive: " + ec.message());
}

// Busy-polls cq for one completion, or with `events` sleeps on its channel
// between polls (arm, poll once more to close the race, then wait).
std::error_code next_completion(rdx::completion_queue& cq, rdx::completion& c, bool events,
                                std::chrono::seconds timeout) {
  if (!events) return rdx::poll_one(cq, c, timeout);
  const auto deadline = steady::now() + timeout;
  for (;;) {
    int n = cq.poll(std::span<rdx::completion>(&c, 1));
    if (n < 0) return {-n, std::generic_category()};
    if (n == 1) return {};
    if (std::error_code ec = cq.arm()) return ec;
    n = cq.poll(std::span<rdx::completion>(&c, 1));
    if (n < 0) return {-n, std::generic_category()};
    if (n == 1) return {};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
    if (left.count() <= 0) return rdx::make_error_code(rdx::errc::timed_out);
    if (std::error_code ec = cq.wait_event(left)) return ec;
  }
}

rdx::completion wait_completion(rdx::completion_queue& cq, const char* what, std::uint32_t iter,
                                const options& o) {
  const std::chrono::seconds timeout = o.timeout;
  rdx::completion c{};
  const std::error_code ec = next_completion(cq, c, o.events, timeout);
  if (ec == rdx::errc::timed_out)
    throw failure("round trip " + std::to_string(iter) + ": no " + what + " completion within " +
                  std::to_string(timeout.count()) + " s (has the peer stopped? see its output)");
  if (ec) throw failure(std::string("polling the ") + what + " completion queue: " + ec.message());
  if (!c.ok()) {
    char vendor[32];
    std::snprintf(vendor, sizeof vendor, "vendor error 0x%x", c.vendor_err());
    throw failure("round trip " + std::to_string(iter) + ": " + what + " failed: " + c.error().message() +
                  " (" + vendor + ")");
  }
  return c;
}

void check_recv(const rdx::completion& c, const options& o, std::uint32_t iter) {
  const std::uint32_t slot = iter % recv_slots;
  const auto it = std::to_string(iter);
  if (c.wr_id() != slot)
    throw failure("round trip " + it + ": receive completed for slot " + std::to_string(c.wr_id()) +
                  ", expected " + std::to_string(slot));
  if (o.m == mode::write_imm) {
    if (c.opcode() != IBV_WC_RECV_RDMA_WITH_IMM || !c.has_imm())
      throw failure("round trip " + it + ": expected an RDMA write with immediate, got opcode " +
                    std::to_string(c.opcode()));
    if (c.imm() != iter)
      throw failure("round trip " + it + ": immediate data " + std::to_string(c.imm()) + ", expected " + it);
  } else if (c.opcode() != IBV_WC_RECV) {
    throw failure("round trip " + it + ": expected a receive, got opcode " + std::to_string(c.opcode()));
  }
  if (c.byte_len() != o.size)
    throw failure("round trip " + it + ": " + std::to_string(c.byte_len()) + " bytes arrived, expected " +
                  std::to_string(o.size));
}

void post_echo_or_ping(resources& r, const options& o, const rdx::remote_descriptor& peer_ring,
                       const ibv_sge& src, std::uint32_t iter) {
  const std::uint32_t slot = iter % recv_slots;
  std::error_code ec;
  if (o.m == mode::write_imm) {
    ec = r.qp.post_send(rdx::wr::write_imm(src, rdx::at(peer_ring, slot * o.size), iter));
  } else {
    ec = r.qp.post_send(rdx::wr::send(src));
  }
  if (ec) throw failure("round trip " + std::to_string(iter) + ": post a send: " + ec.message());
}

// Whether this side's payload for `iter` is right; throws naming the first wrong byte.
void check_payload(const std::byte* p, const options& o, std::uint32_t iter, std::uint32_t seed,
                   const char* who) {
  const std::size_t bad = check_pattern(p, o.size, iter, seed);
  if (bad != o.size)
    throw failure(std::string(who) + " of round trip " + std::to_string(iter) + " is wrong at byte " +
                  std::to_string(bad) + ": " + byte_text(p[bad]) + ", expected " +
                  byte_text(std::byte{pattern_byte(bad, iter, seed)}));
}

struct run_stats {
  std::vector<double> rtt_us;
  double wall_s = 0;
};

void print_stats(const options& o, const run_stats& st, const char* label) {
  std::vector<double> s = st.rtt_us;
  std::sort(s.begin(), s.end());
  double sum = 0;
  for (double v : s) sum += v;
  const double min = s.front(), med = examples::percentile(s, 50), p99 = examples::percentile(s, 99);
  const double bytes = 2.0 * static_cast<double>(o.size) * o.iters;
  const double mbps = bytes / (sum / 1e6) / 1e6;
  std::printf("%u round trips of %zu bytes (%s), every payload checked\n", o.iters, o.size, label);
  std::printf("  round-trip latency: min %.2f us, median %.2f us, p99 %.2f us, mean %.2f us\n", min, med, p99,
              sum / static_cast<double>(s.size()));
  std::printf("  one-way (half round trip): min %.2f us, median %.2f us, p99 %.2f us\n", min / 2, med / 2,
              p99 / 2);
  std::printf(
      "  bandwidth: %.2f MB/s = %.2f Mbit/s (2 x %zu x %u bytes in %.3f s of round trips; loop %.3f s)\n",
      mbps, mbps * 8, o.size, o.iters, sum / 1e6, st.wall_s);
  std::printf("RESULT mode=%s size=%zu iters=%u min_us=%.2f median_us=%.2f p99_us=%.2f mbit_s=%.2f\n", label,
              o.size, o.iters, min, med, p99, mbps * 8);
}

//! The end of a run: the client's statistics, or the server's one line.
void report(const options& o, const run_stats& st, bool client, const char* label) {
  if (client) {
    print_stats(o, st, label);
  } else {
    std::printf("%u payloads of %zu bytes (%s) received, checked and echoed\n", o.iters, o.size, label);
  }
}

// --- the two roles --------------------------------------------------------------

void print_local(const resources& r, const char* role, const options& o) {
  const rdx::gid_choice g = o.gid_index ? rdx::use_gid_index(r.ctx, r.qp.port(), *o.gid_index)
                                        : rdx::select_gid(r.ctx, r.qp.port());
  std::printf("rdx pingpong %s: %s port %u, %s\n", role, r.ctx.name().c_str(), r.qp.port(), g.reason.c_str());
  std::printf("  local address:  %s\n", rdx::to_string(r.qp.local_endpoint()).c_str());
}

rdx::connect_options connect_opts(const options& o) {
  rdx::connect_options c;
  c.max_mtu = o.mtu.value_or(o.rc_compat ? rdx::rc_pingpong::default_mtu : IBV_MTU_4096);
  if (o.ack_timeout) (void)c.set_ack_timeout(*o.ack_timeout);
  return c;
}

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
    put_be(d.data() + settings_size, ring.addr, 8);
    put_be(d.data() + settings_size + 8, ring.rkey, 4);
    put_be(d.data() + settings_size + 12, ring.length, 8);
  }
  return d;
}

std::vector<rdx::remote_descriptor> cm_native_ring(const options& o, std::span<const std::byte> d) {
  if (o.m != mode::write_imm) return {};
  if (d.size() < cm_native_size) throw failure("the peer's private data holds no ring descriptor");
  const std::byte* p = d.data() + settings_size;
  return {
      rdx::remote_descriptor{get_be(p, 8), static_cast<std::uint32_t>(get_be(p + 8, 4)), get_be(p + 12, 8)}};
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

// Native modes: settings, endpoints (and in write_imm the ring's descriptor),
// connect, barrier, ITERS round trips, barrier.
int run_native(const options& o) {
  resources r(o, examples::open_device(o.device));
  const bool client = !o.server.empty();
  print_local(r, client ? "client" : "server", o);
  r.qp.to_init();
  for (std::uint32_t s = 0; s < recv_slots; ++s) post_recv_slot(r, o, s);
#if RDX_EXAMPLES_CM
  if (o.cm) return run_native_cm(o, r);
#endif

  rdx::tcp::socket sock = examples::bootstrap_socket(o.server, o.tcp_port, o.timeout);
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

// ibv_rc_pingpong's protocol: its exchange, then send/recv of SIZE bytes from
// one buffer per side; the server echoes what it receives.
int run_rc_compat(const options& o) {
  resources r(o, examples::open_device(o.device));
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
    auto sock = examples::bootstrap_socket(o.server, o.tcp_port, o.timeout);
    connect(rdx::rc_pingpong::client_exchange(sock, r.qp.local_endpoint(), agreed, o.timeout));
  } else {
    auto sock = examples::bootstrap_socket("", o.tcp_port, o.timeout);
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

// --- typed modes over rdx::connection: --channel and --window -------------------

// --channel: rdx::channel<std::byte> messages of SIZE bytes, echoed.
// --window: each side grants a window of SIZE bytes plus a sequence word; a
// round trip is one rdx::remote_window write of payload and sequence, seen by
// the other side polling its own memory (the sequence word is written last:
// one RDMA write places its bytes in order on rxe and on the NICs rdx targets).
//
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
// connection exists); a barrier at the end.
template <class GetSocket>
auto tcp_meeting(const options& o, GetSocket&& get_socket) {
  return [&o, get_socket = std::forward<GetSocket>(get_socket)](
             rdx::connection& conn, std::span<const rdx::window_descriptor> grants, const settings& mine,
             steady::time_point deadline) mutable {
    auto sock = std::make_shared<rdx::tcp::socket>(get_socket());
    meeting m;
    m.peer = exchange_settings(*sock, mine, deadline);
    m.offer = rdx::exchange_and_connect(
        *sock, conn, grants,
        rdx::exchange_options{.timeout = time_left(deadline), .connect = connect_opts(o)});
    m.peer_name = rdx::to_string(m.offer.info.endpoints[0]) + " (" + sock->peer() + ")";
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
                                                    window ? 64 : std::max(o.size, min_message)),
                                                .events = o.events,
                                                .port = o.ib_port,
                                                .gid_index = o.gid_index});
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

// A client, or the server of one client.
int run_typed(const options& o) {
  rdx::context ctx = examples::open_device(o.device);
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
        tcp_meeting(o, [&] { return examples::bootstrap_socket(o.server, o.tcp_port, o.timeout); }),
        std::string(), setup_done);
  }
  report(o, st, client, mode_name(o.m));
  return 0;
}

double seconds_since(steady::time_point t) {
  return std::chrono::duration<double>(steady::now() - t).count();
}

// --- --clients N: every client on one worker, served from one thread ------------
//
// An acceptor sets clients up while the others are served: over TCP
// (rdx::acceptor) pingpong's settings go first (the acceptor's preamble),
// then the exchange of exchange_and_connect; over rdma_cm (rdx::cm::acceptor)
// they go as the first message each way, as with one client. Clients are the
// same program as for one client.
// Each session is a small state machine that the loop below moves on when
// its operation completes; a step that takes longer than --timeout fails
// that session alone.

struct worker_session {
  std::string tag;
  std::size_t words = 0;
  rdx::registered_buffer<std::uint64_t> mine;
  std::optional<rdx::grant<std::uint64_t, rdx::rights::write>> g{};
  std::unique_ptr<rdx::connection> conn{};
  rdx::tcp::socket sock{};
  std::uint32_t seed = 0;
  std::optional<rdx::remote_window<std::uint64_t, rdx::rights::write>> peer_win{};
  std::optional<rdx::channel<std::byte>> ch{};
  std::vector<std::byte> echo{};
  std::optional<rdx::operation> op{};             // the receive, echo or write in flight
  std::optional<rdx::operation> settings_send{};  // rdma_cm: pingpong's settings as a message
  std::array<std::byte, settings_size> settings_in{};
  enum class step { settings, payload, echo, barrier, done } at = step::payload;
  bool barrier_sent = false;
  std::uint32_t k = 0;
  steady::time_point started{}, step_deadline{};
};

// Moves s on as far as it can go without waiting; throws failure naming the round trip.
void advance_session(worker_session& s, const options& o) {
  const bool window = o.m == mode::window;
  auto* mine_bytes = reinterpret_cast<std::byte*>(s.mine.data());
  for (;;) {
    if (steady::now() > s.step_deadline)
      throw failure("round trip " + std::to_string(s.k) + ": nothing happened for " +
                    std::to_string(o.timeout.count()) + " s (has the client stopped? see its output)");
    switch (s.at) {
      case worker_session::step::settings:
        if (!s.op->done() || !s.settings_send->done()) return;
        for (rdx::operation* x : {&*s.op, &*s.settings_send}) {
          if (const std::error_code ec = x->error())
            throw failure("exchanging settings over rdma_cm: " + ec.message());
        }
        s.seed = decode_settings(s.settings_in, settings{static_cast<std::uint32_t>(o.m), o.iters, o.size, 0},
                                 s.tag)
                     .seed;
        s.op.reset();
        s.settings_send.reset();
        s.at = worker_session::step::payload;
        break;
      case worker_session::step::payload:
        if (window) {
          std::atomic_ref<std::uint64_t> seq(s.mine[s.words - 1]);
          if (seq.load(std::memory_order_acquire) != std::uint64_t{s.k} + 1) return;
          check_payload(mine_bytes, o, s.k, s.seed, "the payload");
          s.op.emplace(s.peer_win->write(s.g->local(), 0));
        } else {
          if (!s.op) s.op.emplace(s.ch->receive(std::span<std::byte>(s.echo)));
          if (!s.op->done()) return;
          if (const std::error_code ec = s.op->error())
            throw failure("round trip " + std::to_string(s.k) + ": channel receive failed: " + ec.message());
          if (s.op->byte_count() != o.size)
            throw failure("round trip " + std::to_string(s.k) + ": " + std::to_string(s.op->byte_count()) +
                          " bytes arrived, expected " + std::to_string(o.size));
          check_payload(s.echo.data(), o, s.k, s.seed, "the payload");
          s.op.emplace(s.ch->send(std::span<const std::byte>(s.echo)));
        }
        s.at = worker_session::step::echo;
        break;
      case worker_session::step::echo:
        if (!s.op->done()) return;
        if (const std::error_code ec = s.op->error())
          throw failure("round trip " + std::to_string(s.k) + ": " +
                        (window ? "window write" : "channel send") + " failed: " + ec.message() + " (" +
                        s.conn->failure_message() + ")");
        s.op.reset();
        s.at = ++s.k == o.iters ? worker_session::step::barrier : worker_session::step::payload;
        s.step_deadline = steady::now() + o.timeout;
        break;
      case worker_session::step::barrier: {
        // The client is done too: no traffic in flight when the queue pairs go
        // (over rdma_cm its last echo's completion says so: nothing follows it).
        if (!s.sock.is_open()) {
          s.at = worker_session::step::done;
          return;
        }
        if (!rdx::tcp::try_barrier(s.sock, s.barrier_sent, s.step_deadline)) return;
        s.at = worker_session::step::done;
        return;
      }
      case worker_session::step::done: return;
    }
  }
}

int serve_typed_clients(const options& o) {
  rdx::context ctx = examples::open_device(o.device);
  rdx::protection_domain pd(ctx);
  const bool window = o.m == mode::window;
  // A round trip has one operation in flight: 16 send-queue entries are plenty,
  // and each client reserves 16 + 16 + 1 entries of the worker's queue.
  const rdx::connection_attr attr{
      .send_depth = 16,
      .signal_interval = 8,
      .recv_depth = 16,
      // Over rdma_cm the first message carries pingpong's settings (24 bytes).
      .message_size = static_cast<std::uint32_t>(window ? 64 : std::max<std::size_t>(o.size, o.cm ? 64 : 1)),
      .port = o.ib_port,
      .gid_index = o.gid_index};
  // --pool: every client's recv_depth credits from one receive pool, a
  // quarter more for busy clients to grow by, the rest kept for joiners.
  const std::uint32_t joining = o.clients * attr.recv_depth;
  const rdx::receive_pool_attr pool{
      .buffers = o.pool ? joining * 5 / 4 : 0, .buffer_size = attr.message_size, .reserve = joining};
  rdx::worker w(pd, rdx::worker_attr{.events = o.events, .pool = pool});
  settings mine_settings{static_cast<std::uint32_t>(o.m), o.iters, o.size, 0};
  rdx::acceptor_options ao{.timeout = o.timeout, .connect = connect_opts(o)};
  ao.preamble.resize(settings_size);
  encode_settings(ao.preamble.data(), mine_settings);
  ao.peer_preamble_size = settings_size;
  const std::size_t words = (o.size + 7) / 8 + 1;  // payload, then the sequence word
  std::map<rdx::connection*, std::unique_ptr<worker_session>> sessions;
  std::uint32_t arrived = 0;
  const rdx::acceptor::prepare_fn prepare = [&](rdx::connection& c, const std::string& peer) {
    auto s = std::make_unique<worker_session>(
        worker_session{"[client " + std::to_string(++arrived) + " " + peer + "]", words,
                       rdx::make_window_buffer<std::uint64_t, rdx::rights::write>(pd, words)});
    s->started = steady::now();
    std::vector<rdx::window_descriptor> grants;
    if (window) {
      s->g.emplace(c, s->mine);
      grants.push_back(s->g->descriptor());
    }
    std::printf("%s arrived, %zu in set-up\n", s->tag.c_str(), sessions.size() + 1);
    sessions[&c] = std::move(s);
    return grants;
  };
  std::optional<rdx::acceptor> tcp_acc;
#if RDX_EXAMPLES_CM
  std::optional<rdx::cm::acceptor> cm_acc;
  if (o.cm) {
    cm_acc.emplace(w, pd, rdx::cm::listener(o.tcp_port), attr,
                   rdx::cm::acceptor_options{.timeout = o.timeout, .connect = connect_opts(o)}, prepare);
  }
#endif
  if (!o.cm) tcp_acc.emplace(w, pd, rdx::tcp::listener::bind("", o.tcp_port), attr, std::move(ao), prepare);
  // The next finished or failed set-up, never waiting.
  auto next_setup = [&]() -> std::optional<rdx::accepted> {
#if RDX_EXAMPLES_CM
    if (cm_acc) return cm_acc->poll();
#endif
    return tcp_acc->poll();
  };
  const int acc_fd = tcp_acc ? tcp_acc->fd() :
#if RDX_EXAMPLES_CM
                             cm_acc->fd();
#else
                             -1;
#endif
  const std::uint16_t acc_port = tcp_acc ? tcp_acc->port() :
#if RDX_EXAMPLES_CM
                                         cm_acc->port();
#else
                                         0;
#endif
  if (o.events) w.watch(acc_fd);
  const int room = w.cq_capacity() / static_cast<int>(attr.send_depth + attr.recv_depth + 1);
  std::printf(
      "rdx pingpong server (%s): %s, %u clients on one worker, one thread (%s); its queue of %d "
      "entries has room for %d\n",
      mode_name(o.m), ctx.name().c_str(), o.clients, o.events ? "sleeping on its descriptor" : "polling",
      w.cq_capacity(), room);
  std::printf("  waiting for %u clients on %s port %u\n", o.clients, o.cm ? "rdma_cm" : "TCP", acc_port);
  std::fflush(stdout);
  std::uint32_t served = 0, setup_failed = 0, failed = 0, running = 0;
  steady::time_point last_event = steady::now();
  auto end_session = [&](std::map<rdx::connection*, std::unique_ptr<worker_session>>::iterator it,
                         const std::string& cause, bool in_setup) {
    worker_session& s = *it->second;
    if (cause.empty()) {
      ++served;
      std::printf("%s finished after %.2f s: %u payloads of %zu bytes (%s) received, checked and echoed\n",
                  s.tag.c_str(), seconds_since(s.started), o.iters, o.size, mode_name(o.m));
    } else {
      ++(in_setup ? setup_failed : failed);
      std::fprintf(stderr, "%s FAILED %s after %.2f s: %s\n", s.tag.c_str(),
                   in_setup ? "in set-up" : "after set-up", seconds_since(s.started), cause.c_str());
    }
    last_event = steady::now();
    s.g.reset();  // the grant before its connection and memory
    sessions.erase(it);
  };
  unsigned spins = 0;
  while (served + setup_failed + failed < o.clients) {
    if (o.events) {
      (void)w.wait(std::chrono::milliseconds{100});
    } else {
      w.progress();
    }
    // The acceptor costs a system call: asked every 64 polls, or after each wake-up.
    if (o.events || ++spins % 64 == 0) {
      while (std::optional<rdx::accepted> a = next_setup()) {
        auto it = a->conn ? sessions.find(a->conn.get()) : sessions.end();
        if (!*a) {
          if (it != sessions.end()) {
            end_session(it, a->message, true);
          } else {
            ++setup_failed;
            std::fprintf(stderr, "[client %s] FAILED in set-up: %s\n", a->peer.c_str(), a->message.c_str());
          }
          continue;
        }
        worker_session& s = *it->second;
        try {
          if (o.cm) {
            // Pingpong's settings as the first message each way; checked in advance_session.
            s.ch.emplace(*a->conn);
            std::array<std::byte, settings_size> out{};
            encode_settings(out.data(), mine_settings);
            s.settings_send.emplace(s.ch->send(std::span<const std::byte>(out)));
            s.op.emplace(s.ch->receive(std::span<std::byte>(s.settings_in)));
            s.at = worker_session::step::settings;
          } else {
            s.seed = decode_settings(a->preamble, mine_settings, a->peer).seed;
          }
          if (window) {
            if (a->offer.windows.size() != 1)
              throw failure("the client granted " + std::to_string(a->offer.windows.size()) +
                            " windows, --window needs 1");
            s.peer_win.emplace(*a->conn, a->offer.windows[0]);
            if (s.peer_win->size() < words)
              throw failure("the client's window of " + std::to_string(s.peer_win->size()) +
                            " words is smaller than " + std::to_string(words));
          } else {
            if (!s.ch) s.ch.emplace(*a->conn);
            s.echo.resize(o.size);
          }
        } catch (const std::exception& e) {
          end_session(it, e.what(), true);
          continue;
        }
        s.conn = std::move(a->conn);
        s.sock = std::move(a->socket);
        s.step_deadline = steady::now() + o.timeout;
        ++running;
        std::printf("%s connected (%s), %u in progress\n", s.tag.c_str(),
                    rdx::to_string(s.conn->local_info().endpoints[0]).c_str(), running);
      }
      std::fflush(stdout);
    }
    for (auto it = sessions.begin(); it != sessions.end();) {
      auto cur = it++;
      worker_session& s = *cur->second;
      if (!s.conn) continue;  // still in set-up
      std::string cause;
      try {
        advance_session(s, o);
      } catch (const std::exception& e) {
        cause = e.what();
      }
      if (s.at == worker_session::step::done || !cause.empty()) {
        --running;
        end_session(cur, cause, false);
      }
    }
    if (sessions.empty() && steady::now() - last_event > o.timeout) {
      std::fprintf(stderr, "  no client for %lld s: stopping after %u of %u clients\n",
                   static_cast<long long>(o.timeout.count()), served + setup_failed + failed, o.clients);
      break;
    }
  }
  std::printf("%u clients handled: %u served, %u failed in set-up, %u failed after set-up\n",
              served + setup_failed + failed, served, setup_failed, failed);
  return failed == 0 && served > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep stdout and stderr in order in logs
  options o;
  try {
    bool help = false;
    o = parse_options(argc, argv, help);
    if (help) {
      usage(argv[0]);
      return 0;
    }
  } catch (const examples::usage_error& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", argv[0], e.what());
    return 2;
  }
  try {
    if (o.ack_timeout) {
      std::printf("retransmission: %s\n", rdx::retransmission_summary(connect_opts(o)).c_str());
    }
    if (o.m == mode::channel || o.m == mode::window)
      return o.clients > 1 ? serve_typed_clients(o) : run_typed(o);
    return o.rc_compat ? run_rc_compat(o) : run_native(o);
  } catch (const rdx::error& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
  } catch (const failure& e) {
    std::fprintf(stderr, "%s: FAILED: %s\n", argv[0], e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
  }
  return 1;
}
