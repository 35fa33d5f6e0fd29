// faults soak: traffic of every kind between two nodes, each payload checked
// on arrival, for a fixed byte count or a duration, on whatever the wire does
// (tests/faults/CMakeLists.txt puts netem, link flaps and forced errors on it).
//
// Node 0 (--role server) grants a window and takes messages; node 1 (--role
// client) drives rounds of:
//   - channel<std::byte> messages of varying length, each with a header
//     {seq, kind, length, xxh3 of the payload}; the server checks the hash and
//     the sequence (a gap counts as lost, a repeat as a duplicate);
//   - for each window size (4 KiB .. 1 MiB, striped over the queue pairs in
//     32 KiB chunks): a write of a fresh pattern, then a message carrying its
//     seq and xxh3, which the server checks against its window and answers
//     (itself a checked message); then a read of the same bytes, checked
//     against the same hash.
// At the end the client says how many messages it sent and the server
// answers with its counts. Both print one RESULT line and exit 1 on any
// mismatch, loss or duplicate.
//
// Integrity: XXH3_64bits from libxxhash (Debian libxxhash-dev). A 64-bit
// hash misses a corruption with probability 2^-64 and runs at memory speed
// (CRC32C would need SSE4.2 code or a library of its own; the kernel's is not
// reachable from user space), and xxHash is packaged by every distribution.
//
// Expected failure (--expect-failure, client): a fault the client itself
// causes (--down-after/--down-for: its link down longer than the retry
// budget; --qp-error-at N: its queue pair 0 to ERR at operation N) or the
// server's death (server --kill-at N, which first sends one byte on the TCP
// socket) must fail the connection. Then every operation pending at that
// moment must end with an error, exactly once (its result does not change
// later), within connection::detection_bound() of the fault; later
// operations fail at once; and a fresh connection (TCP port + 1) must carry a
// clean, checked session. The server reports over it how many of the first
// connection's messages arrived: at least every message whose send completed
// before the fault (a completion means the peer's NIC had it).
//
// A stalled receiver (server --stall-at N --stall-for MS, client
// --expect-stall MS): the server stops taking messages, as a busy process
// does. The client's credits run out (a round of 32 messages is twice the
// receive depth), its sends wait without reaching the NIC, a bounded wait on
// one times out and leaves it pending, no receiver-not-ready NAK is sent
// (--expect-none rcvd_rnr_err+send_rnr_err), and every message arrives,
// checked, once the server goes on.
#include <rdx/channel/channel.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <support/faults.hpp>
#include <sys/socket.h>
#include <xxhash.h>

using namespace std::chrono_literals;
using rdx::rights;
using clk = std::chrono::steady_clock;

namespace {

constexpr std::uint32_t message_size = 4096;
constexpr std::size_t max_write = 1u << 20;
constexpr int messages_per_round = 32;
constexpr auto win_rights = rights::read | rights::write;
const char* const counter_names[] = {
    "completer_retry_err", "rcvd_seq_err", "out_of_seq_request", "duplicate_request", "retry_exceeded_err",
    "link_downed",         "rcvd_rnr_err", "send_rnr_err",       "sent_pkts",         "rcvd_pkts"};

enum kind : std::uint32_t { k_data = 1, k_write_done = 2, k_end = 3, k_ack = 4, k_final = 5 };

struct header {
  std::uint64_t seq = 0;
  std::uint32_t kind = 0;
  std::uint32_t length = 0;  // payload bytes after the header, or bytes written (k_write_done)
  std::uint64_t hash = 0;    // xxh3 of the payload, or of the window bytes written
  std::uint64_t aux = 0;     // k_ack: 1 when the server's check passed; k_end: messages sent
};
static_assert(sizeof(header) == 32);

// The server's counts, the payload of k_final.
struct report {
  std::uint64_t received;        // client messages taken, this connection
  std::uint64_t mismatches;      // payload or window hashes that did not match
  std::uint64_t lost;            // sequence gaps
  std::uint64_t duplicates;      // sequence repeats
  std::uint64_t first_received;  // messages taken on the failed connection before (expect-failure)
  std::uint64_t counters[std::size(counter_names)];  // the server's hw_counter rises, in counter_names' order
};

struct options {
  bool server = false;
  std::string peer;
  std::uint16_t port = 18700;
  std::uint64_t bytes = 0;
  double seconds = 0;
  std::vector<std::size_t> sizes{4096, 65536, 262144, max_write};
  std::uint32_t queue_pairs = 2;
  std::size_t chunk = 32 * 1024;     // connection_attr::chunk_size
  bool pacing = false;               // connection_attr::pacing (adaptive chunks, bytes in flight paced)
  std::uint64_t ack_timeout_us = 0;  // connect_options::set_ack_timeout; 0: rdx's default (67 ms)
  std::string label = "soak";
  std::string device;
  std::string ifname = "eth0";
  bool expect_failure = false;
  std::uint64_t down_after_ms = 0, down_for_ms = 0;
  std::uint64_t cut_after_ms = 0, cut_for_ms = 0;  // either role: a wire cut, timed from the connection
  std::uint64_t qp_error_at = 0;
  std::uint64_t kill_at = 0;
  bool after_kill = false;  // server: serve only the reconnection (port + 1)
  std::uint64_t reconnect_bytes = 2u << 20;
  std::uint64_t expect_min_us = 0;  // client: every operation took at least this long (a delay on the wire)
  std::vector<std::pair<std::string, std::uint64_t>> expect_counters;  // NAME[+NAME...]:N
  std::vector<std::string> expect_zero;                                // NAME[+NAME...]
  std::vector<std::pair<std::string, std::uint64_t>> expect_both;      // client: over both nodes
  std::uint64_t stall_at = 0, stall_for_ms = 0;  // server: stop taking messages at message N, for MS
  std::uint64_t expect_stall_ms = 0;             // client: a send must wait out the server's stall
  double progress_s = 60;                        // client: a progress line this often
  std::uint64_t stall_timeout_ms = 30000;        // connection_attr::stall_timeout
};

[[noreturn]] void usage(int rc) {
  std::FILE* f = rc == 0 ? stdout : stderr;
  std::fprintf(
      f,
      "usage: soak [options]\n"
      "  --role server|client    default: server on RDX_NODE=0, client otherwise\n"
      "  --peer ADDR             the server (client; default $RDX_PEER_ADDR)\n"
      "  --port P                TCP port of the exchange (default 18700; P+1 for a reconnection)\n"
      "  --bytes N[K|M]          client: stop after N bytes moved (messages + writes + reads)\n"
      "  --seconds S             client: stop after S seconds (with --bytes: the first reached)\n"
      "  --sizes A,B,...         window write sizes in bytes (default 4096,65536,262144,1048576)\n"
      "  --queue-pairs K         queue pairs (default 2); writes stripe over them in chunks\n"
      "  --chunk N[K|M]          the striping chunk (default 32K; a multiple of 4 KiB)\n"
      "  --pacing                adaptive chunks and bytes in flight paced by completion\n"
      "                          times (connection_attr::pacing; --chunk is then unused)\n"
      "  --ack-timeout-us US     the local ACK timeout, rounded up to the next code (default\n"
      "                          rdx's, code 14: 67 ms); the code is printed\n"
      "  --label NAME            first field of the RESULT line (default soak)\n"
      "  --device NAME           RDMA device whose hw_counters are reported (default $RDX_DEVICE)\n"
      "  --expect C[+C...]:N     fail unless those hw_counters rose by at least N together (repeatable)\n"
      "  --expect-both C[+C...]:N   client: the same over both nodes (this one's and the\n"
      "                          server's rises, from its report; repeatable)\n"
      "  --expect-none C[+C...]  fail if any of those hw_counters rose (repeatable)\n"
      "  --expect-min-us US      client: fail unless every operation took at least US (a delay)\n"
      "  --expect-failure        client: the connection must fail (see below), then reconnect\n"
      "  --down-after MS --down-for MS   client: take --if down MS after the start, for MS\n"
      "  --cut-after MS --cut-for MS     either role: MS after the connection is made, drop\n"
      "                          every packet --if sends (netem loss 100%%) for MS; a cut\n"
      "                          that met no traffic is made again 400 ms later (4 cuts at\n"
      "                          most); fails unless one dropped a packet\n"
      "  --if NAME               interface for --down-* (default eth0)\n"
      "  --qp-error-at N         client: force queue pair 0 to ERR at operation N\n"
      "  --kill-at N             server: SIGKILL itself at its N-th message\n"
      "  --after-kill            server: serve only the reconnection on port P+1\n"
      "  --stall-at N --stall-for MS   server: at its N-th message stop taking messages (and\n"
      "                          touching the connection) for MS, as a busy receiver does\n"
      "  --expect-stall MS       client: a send must wait for credits while the server\n"
      "                          stalls; a bounded wait on it must time out and leave it\n"
      "                          pending, and it must complete when the server goes on\n"
      "  --progress S            client: a progress line every S seconds (default 60)\n"
      "  --stall-timeout MS      connection_attr::stall_timeout (default 30000; the watchdog\n"
      "                          fires after max(MS, detection_bound()) without a completion)\n"
      "  --reconnect-bytes N     bytes of the session after the failure (default 2M)\n"
      "  -h, --help              this text\n"
      "Prints one line: RESULT label=... role=... seconds= MBps= bytes= ops= mismatches= lost= duplicates=\n"
      "msg_p50_us= msg_p99_us= write_p50_us= write_p99_us= read_p50_us= read_p99_us= and\n"
      "the device's hw_counter deltas. Exit 1 on any mismatch, loss, duplicate or failed check.\n");
  std::exit(rc);
}

std::uint64_t parse_size(const std::string& s) {
  std::size_t end = 0;
  std::uint64_t v = std::stoull(s, &end);
  const std::string unit = s.substr(end);
  if (unit == "K" || unit == "k") return v << 10;
  if (unit == "M" || unit == "m") return v << 20;
  if (unit == "G" || unit == "g") return v << 30;
  if (!unit.empty()) throw std::invalid_argument("bad size: " + s);
  return v;
}

options parse(int argc, char** argv) {
  options o;
  const char* node = std::getenv("RDX_NODE");
  o.server = node != nullptr && std::string(node) == "0";
  if (const char* p = std::getenv("RDX_PEER_ADDR")) o.peer = p;
  if (const char* d = std::getenv("RDX_DEVICE")) o.device = d;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "soak: %s needs a value\n", a.c_str());
        usage(2);
      }
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      usage(0);
    } else if (a == "--role") {
      const std::string r = val();
      if (r != "server" && r != "client") usage(2);
      o.server = r == "server";
    } else if (a == "--peer") {
      o.peer = val();
    } else if (a == "--port") {
      o.port = static_cast<std::uint16_t>(std::stoul(val()));
    } else if (a == "--bytes") {
      o.bytes = parse_size(val());
    } else if (a == "--seconds") {
      o.seconds = std::stod(val());
    } else if (a == "--sizes") {
      o.sizes.clear();
      std::string s = val();
      for (std::size_t p = 0; p <= s.size();) {
        const std::size_t c = std::min(s.find(',', p), s.size());
        o.sizes.push_back(parse_size(s.substr(p, c - p)));
        p = c + 1;
      }
    } else if (a == "--chunk") {
      o.chunk = parse_size(val());
    } else if (a == "--pacing") {
      o.pacing = true;
    } else if (a == "--ack-timeout-us") {
      o.ack_timeout_us = std::stoull(val());
    } else if (a == "--queue-pairs") {
      o.queue_pairs = static_cast<std::uint32_t>(std::stoul(val()));
    } else if (a == "--label") {
      o.label = val();
    } else if (a == "--device") {
      o.device = val();
    } else if (a == "--expect") {
      const std::string e = val();
      const std::size_t at = e.rfind(':');
      if (at == std::string::npos) usage(2);
      o.expect_counters.emplace_back(e.substr(0, at), std::stoull(e.substr(at + 1)));
    } else if (a == "--expect-both") {
      const std::string e = val();
      const std::size_t at = e.rfind(':');
      if (at == std::string::npos) usage(2);
      o.expect_both.emplace_back(e.substr(0, at), std::stoull(e.substr(at + 1)));
    } else if (a == "--expect-none") {
      o.expect_zero.push_back(val());
    } else if (a == "--stall-at") {
      o.stall_at = std::stoull(val());
    } else if (a == "--stall-for") {
      o.stall_for_ms = std::stoull(val());
    } else if (a == "--expect-stall") {
      o.expect_stall_ms = std::stoull(val());
    } else if (a == "--stall-timeout") {
      o.stall_timeout_ms = std::stoull(val());
    } else if (a == "--progress") {
      o.progress_s = std::stod(val());
    } else if (a == "--expect-min-us") {
      o.expect_min_us = std::stoull(val());
    } else if (a == "--expect-failure") {
      o.expect_failure = true;
    } else if (a == "--down-after") {
      o.down_after_ms = std::stoull(val());
    } else if (a == "--down-for") {
      o.down_for_ms = std::stoull(val());
    } else if (a == "--cut-after") {
      o.cut_after_ms = std::stoull(val());
    } else if (a == "--cut-for") {
      o.cut_for_ms = std::stoull(val());
    } else if (a == "--if") {
      o.ifname = val();
    } else if (a == "--qp-error-at") {
      o.qp_error_at = std::stoull(val());
    } else if (a == "--kill-at") {
      o.kill_at = std::stoull(val());
    } else if (a == "--after-kill") {
      o.after_kill = true;
    } else if (a == "--reconnect-bytes") {
      o.reconnect_bytes = parse_size(val());
    } else {
      std::fprintf(stderr, "soak: unknown argument %s\n", a.c_str());
      usage(2);
    }
  }
  for (std::size_t s : o.sizes) {
    if (s == 0 || s > max_write) throw std::invalid_argument("window sizes must be 1 .. 1 MiB");
  }
  if (!o.server && o.peer.empty()) throw std::invalid_argument("the client needs --peer or RDX_PEER_ADDR");
  if (!o.server && o.bytes == 0 && o.seconds == 0) o.bytes = 8u << 20;
  if (o.queue_pairs == 0) throw std::invalid_argument("--queue-pairs must be at least 1");
  return o;
}

void require(bool c, const std::string& what) {
  if (!c) throw std::runtime_error(what);
}

// A wire cut from this side (--cut-after/--cut-for): its tc is started
// before the connection, the cut timed from the connection (start_cut), so
// that it meets traffic. Empty without the options.
void prepare_cut(const options& o, std::optional<rdx_test::wire_cut>& c) {
  if (o.cut_for_ms != 0) c.emplace(o.ifname);
}
void start_cut(const options& o, std::optional<rdx_test::wire_cut>& c) {
  // Up to four cuts, 400 ms apart: one that met no traffic (a VM stalled
  // by its host's load: one CI run) is made again rather than failing.
  if (c) c->start(std::chrono::milliseconds(o.cut_after_ms), std::chrono::milliseconds(o.cut_for_ms), 4);
}

// Waits for the cut to end and checks it dropped packets: a cut that met
// no traffic proves nothing about surviving one.
void check_cut(std::optional<rdx_test::wire_cut>& c, const char* role) {
  if (!c) return;
  c->join();
  require(c->tc_status() == 0, "the wire cut's tc failed (status " + std::to_string(c->tc_status()) +
                                   "; is sch_netem loaded and is this root?)");
  std::printf("soak %s: the wire was cut for %lld ms and %lld packets were dropped (cut %d of at most 4)\n",
              role, static_cast<long long>(c->lasted().count()), c->dropped(), c->cuts());
  if (c->dropped() < 1) std::fprintf(stderr, "soak %s: tc printed:\n%s", role, c->output().c_str());
  require(c->dropped() >= 1,
          std::string("the wire cut dropped no packet: no traffic crossed the wire while it "
                      "was cut (") +
              role + ", 4 cuts 400 ms apart), so the run proves nothing; cut later or for longer");
}

std::uint64_t xxh(const void* p, std::size_t n) {
  return XXH3_64bits(p, n);
}

// A pattern no earlier write left: seeded by the sequence number.
void fill(std::byte* p, std::size_t n, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(x >> (8 * (i % 8)));
}

// Latencies in microseconds; percentiles at the end.
struct samples {
  std::vector<std::uint32_t> us;
  std::uint64_t bytes = 0;  // moved by these operations
  clk::duration busy{};     // their time, summed: bytes / busy is their goodput
  //! MB/s while one of these operations was under way.
  [[nodiscard]] double goodput() const {
    const double s = std::chrono::duration<double>(busy).count();
    return s > 0 ? static_cast<double>(bytes) / 1e6 / s : 0.0;
  }
  void add(clk::duration d) {
    us.push_back(
        static_cast<std::uint32_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count()));
  }
  [[nodiscard]] std::uint64_t pct(double p) {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    return us[std::min(us.size() - 1, static_cast<std::size_t>(p * static_cast<double>(us.size())))];
  }
};

struct totals {
  std::uint64_t bytes = 0, ops = 0, mismatches = 0, lost = 0, duplicates = 0;
  samples msg, write, read;
  clk::time_point started = clk::now();
  std::map<std::string, std::uint64_t> peer_rises;  // client: the server's hw_counter rises
};

// The connection of one session, and what both roles keep on it.
struct session {
  rdx::protection_domain& pd;
  rdx::connection conn;
  rdx::channel<std::byte> ch;
  rdx::registered_buffer<std::byte> win;
  rdx::grant<std::byte, win_rights> g;
  rdx::tcp::socket sock;
  rdx::peer_offer offer;
  std::vector<std::byte> rx = std::vector<std::byte>(message_size);
  std::vector<std::byte> tx = std::vector<std::byte>(message_size);
  std::uint64_t tx_seq = 0, rx_seq = 0;  // next to send, next expected

  session(rdx::protection_domain& p, const options& o, bool server, std::uint16_t port)
      : pd(p),
        conn(pd, rdx::connection_attr{.queue_pairs = o.queue_pairs,
                                      .recv_depth = 16,
                                      .message_size = message_size,
                                      .chunk_size = o.chunk,
                                      .keepalive = 500ms,
                                      .stall_timeout = std::chrono::milliseconds(o.stall_timeout_ms),
                                      .pacing = o.pacing}),
        ch(conn),
        win(rdx::make_window_buffer<std::byte, win_rights>(pd, max_write)),
        g(conn, win) {
    const rdx::window_descriptor grants[] = {g.descriptor()};
    if (server) {
      auto l = rdx::tcp::listener::bind("", port);
      sock = l.accept(120s);
    } else {
      sock = rdx::tcp::connect(o.peer, port, 120s);
    }
    rdx::connect_options co;
    if (o.ack_timeout_us != 0) {
      (void)co.set_ack_timeout(std::chrono::microseconds(o.ack_timeout_us));
      std::printf("soak: %s\n", rdx::retransmission_summary(co).c_str());
    }
    offer =
        rdx::exchange_and_connect(sock, conn, grants, rdx::exchange_options{.timeout = 60s, .connect = co});
    require(offer.windows.size() == 1, "one window expected from the peer");
  }

  // Starts a send of header h and payload (copied before return).
  rdx::operation send(header h, const void* payload = nullptr) {
    h.seq = tx_seq++;
    std::memcpy(tx.data(), &h, sizeof h);
    const bool has_payload = h.kind == k_data || h.kind == k_final;
    if (has_payload && payload != nullptr && h.length != 0)
      std::memcpy(tx.data() + sizeof h, payload, h.length);
    const std::size_t n = sizeof h + (has_payload ? h.length : 0);
    return ch.send(std::span<const std::byte>(tx.data(), n));
  }

  // Checks a message that arrived in rx (byte_count n) against its header;
  // counts what is wrong. Returns its header.
  header check(std::uint32_t n, totals& t) {
    header h{};
    if (n < sizeof h) {
      ++t.mismatches;
      return h;
    }
    std::memcpy(&h, rx.data(), sizeof h);
    if (h.seq > rx_seq) t.lost += h.seq - rx_seq;
    if (h.seq < rx_seq) {
      ++t.duplicates;
    } else {
      rx_seq = h.seq + 1;
    }
    const bool has_payload = h.kind == k_data || h.kind == k_final;
    if (has_payload && (sizeof h + h.length != n || xxh(rx.data() + sizeof h, h.length) != h.hash)) {
      ++t.mismatches;
    }
    return h;
  }
};

std::map<std::string, std::uint64_t> counters_now(const options& o) {
  return o.device.empty() ? std::map<std::string, std::uint64_t>{} : rdx_test::rxe_counters(o.device);
}

int result(const options& o, const char* role, totals& t, const std::map<std::string, std::uint64_t>& before,
           const std::string& extra = "") {
  const auto after = counters_now(o);
  std::string deltas;
  bool counters_ok = true;
  for (const char* n : counter_names) {
    const auto a = after.find(n);
    const auto b = before.find(n);
    if (a == after.end() || b == before.end()) continue;
    deltas += std::string(" ") + n + "=" + std::to_string(a->second - b->second);
  }
  auto rose = [&](const std::string& name) {
    std::uint64_t d = 0;  // the sum of the named counters' deltas (NAME+NAME...)
    for (std::size_t p = 0; p <= name.size();) {
      const std::size_t e = std::min(name.find('+', p), name.size());
      const auto a = after.find(name.substr(p, e - p));
      const auto b = before.find(name.substr(p, e - p));
      if (a != after.end() && b != before.end()) d += a->second - b->second;
      p = e + 1;
    }
    return d;
  };
  auto peer_rose = [&](const std::string& name) {
    std::uint64_t d = 0;
    for (std::size_t p = 0; p <= name.size();) {
      const std::size_t e = std::min(name.find('+', p), name.size());
      if (const auto r = t.peer_rises.find(name.substr(p, e - p)); r != t.peer_rises.end()) d += r->second;
      p = e + 1;
    }
    return d;
  };
  for (const auto& [name, least] : o.expect_both) {
    const std::uint64_t mine = rose(name);
    const std::uint64_t theirs = peer_rose(name);
    if (mine + theirs < least) {
      std::fprintf(stderr,
                   "soak: expected %s to rise by at least %" PRIu64 " over both nodes, it rose by %" PRIu64
                   " here and %" PRIu64 " on the server\n",
                   name.c_str(), least, mine, theirs);
      counters_ok = false;
    }
  }
  for (const auto& name : o.expect_zero) {
    if (const std::uint64_t d = rose(name); d != 0) {
      std::fprintf(stderr, "soak: expected %s not to rise, it rose by %" PRIu64 "\n", name.c_str(), d);
      counters_ok = false;
    }
  }
  for (const auto& [name, least] : o.expect_counters) {
    const std::uint64_t d = rose(name);
    if (d < least) {
      std::fprintf(stderr, "soak: expected %s to rise by at least %" PRIu64 ", it rose by %" PRIu64 "\n",
                   name.c_str(), least, d);
      counters_ok = false;
    }
  }
  if (o.expect_min_us != 0 && !o.server) {
    for (samples* k : {&t.msg, &t.write, &t.read}) {
      if (!k->us.empty() && k->pct(0) < o.expect_min_us) {
        std::fprintf(stderr,
                     "soak: an operation took %" PRIu64 " us, less than --expect-min-us %" PRIu64 "\n",
                     k->pct(0), o.expect_min_us);
        counters_ok = false;
      }
    }
  }
  const double secs = std::chrono::duration<double>(clk::now() - t.started).count();
  std::printf("RESULT label=%s role=%s seconds=%.1f MBps=%.2f bytes=%" PRIu64 " ops=%" PRIu64
              " mismatches=%" PRIu64 " lost=%" PRIu64 " duplicates=%" PRIu64 " msg_p50_us=%" PRIu64
              " msg_p99_us=%" PRIu64 " write_p50_us=%" PRIu64 " write_p99_us=%" PRIu64 " read_p50_us=%" PRIu64
              " read_p99_us=%" PRIu64 " write_MBps=%.2f read_MBps=%.2f%s%s\n",
              o.label.c_str(), role, secs, static_cast<double>(t.bytes) / 1e6 / secs, t.bytes, t.ops,
              t.mismatches, t.lost, t.duplicates, t.msg.pct(0.5), t.msg.pct(0.99), t.write.pct(0.5),
              t.write.pct(0.99), t.read.pct(0.5), t.read.pct(0.99), t.write.goodput(), t.read.goodput(),
              deltas.c_str(), extra.c_str());
  std::fflush(stdout);
  return t.mismatches == 0 && t.lost == 0 && t.duplicates == 0 && counters_ok ? 0 : 1;
}

// --- server -------------------------------------------------------------------

// Serves one session until the client's k_end; returns false when the
// connection failed first (then t.received counts what arrived before) and
// says in why what ended it.
bool serve(session& s, const options& o, totals& t, std::uint64_t& received, std::uint64_t first_received,
           const std::map<std::string, std::uint64_t>& before, std::string& why) {
  rdx_test::kill_at killer(o.kill_at);
  auto ended = [&](const char* step, std::error_code ec) {
    why = std::string(step) + " after " + std::to_string(received) + " messages: " + ec.message();
    if (s.conn.failed()) why += "; the connection failed: " + s.conn.failure_message();
    return false;
  };
  for (;;) {
    auto r = s.ch.receive(std::span<std::byte>(s.rx));
    if (std::error_code ec = r.wait(120s)) {
      if (ec == rdx::errc::timed_out && !s.conn.failed()) throw std::runtime_error("no message for 120 s");
      return ended("a receive", ec);
    }
    if (o.kill_at != 0 && killer.count() + 1 == o.kill_at) {
      const char b = 'k';  // "now": the client times its detection from this
      (void)::send(s.sock.native_handle(), &b, 1, MSG_NOSIGNAL);
    }
    killer.tick();
    ++received;
    if (o.stall_at != 0 && received == o.stall_at) {
      std::printf("soak server: not taking messages for %" PRIu64 " ms from message %" PRIu64 "\n",
                  o.stall_for_ms, received);
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(o.stall_for_ms));
    }
    ++t.ops;
    const header h = s.check(r.byte_count(), t);
    if (h.kind == k_data) {
      t.bytes += h.length;
    } else if (h.kind == k_write_done) {
      const bool good = h.length <= max_write && xxh(s.win.data(), h.length) == h.hash;
      if (!good) ++t.mismatches;
      t.bytes += h.length;
      auto a = s.send(header{.kind = k_ack, .length = 0, .hash = h.hash, .aux = good ? 1u : 0u});
      if (std::error_code ec = a.wait(120s)) return ended("an acknowledgement's send", ec);
    } else if (h.kind == k_end) {
      if (h.aux > s.rx_seq) t.lost += h.aux - s.rx_seq;  // messages that never came after the last one seen
      report rep{received, t.mismatches, t.lost, t.duplicates, first_received, {}};
      const auto now = counters_now(o);
      for (std::size_t i = 0; i < std::size(counter_names); ++i) {
        const auto a = now.find(counter_names[i]);
        const auto b = before.find(counter_names[i]);
        if (a != now.end() && b != before.end()) rep.counters[i] = a->second - b->second;
      }
      auto f = s.send(header{.kind = k_final, .length = sizeof rep, .hash = xxh(&rep, sizeof rep)}, &rep);
      if (std::error_code ec = f.wait(120s)) return ended("the final report's send", ec);
      rdx::tcp::barrier(s.sock, 60s);
      return true;
    } else {
      ++t.mismatches;
    }
  }
}

int run_server(const options& o) {
  rdx::context ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  const auto before = counters_now(o);
  totals t;
  std::uint64_t first_received = 0;
  if (!o.after_kill) {
    std::optional<rdx_test::wire_cut> cut;
    prepare_cut(o, cut);
    session s(pd, o, true, o.port);
    std::uint64_t received = 0;
    start_cut(o, cut);
    std::string why;
    if (serve(s, o, t, received, 0, before, why)) {
      check_cut(cut, "server");
      return result(o, "server", t, before);
    }
    // The connection failed: take what had arrived before (a receive started
    // after the failure still takes a message that had arrived), then serve
    // the reconnection.
    for (;;) {
      auto r = s.ch.receive(std::span<std::byte>(s.rx));
      if (r.wait(5s)) break;
      ++received;
      (void)s.check(r.byte_count(), t);
    }
    first_received = received;
    std::printf("soak server: the session ended (%s); %" PRIu64 " messages in all; serving port %u\n",
                why.c_str(), received, o.port + 1);
    if (!o.expect_failure) {
      std::fprintf(stderr, "soak server: the session ended: %s\n", why.c_str());
      result(o, "server", t, before);
      return 1;
    }
  }
  session s2(pd, o, true, static_cast<std::uint16_t>(o.port + 1));
  totals t2;
  std::uint64_t received = 0;
  std::string why;
  require(serve(s2, o, t2, received, first_received, before, why), "the reconnected session failed: " + why);
  t2.mismatches += t.mismatches;
  t2.duplicates += t.duplicates;
  return result(o, "server", t2, before, " reconnected=1");
}

// --- client -------------------------------------------------------------------

// One operation the client waits on, with when it started.
struct tracked {
  rdx::operation op;
  clk::time_point start;
  samples* lat;
  std::uint64_t bytes;
  bool data_message;
  clk::time_point end{};  // when it was first seen done
};

class client {
public:
  client(session& s, const options& o, totals& t) : s_(s), o_(o), t_(t), w_(s.conn, s.offer.windows[0]) {
    src_.emplace(s.pd, max_write);
    dst_.emplace(s.pd, max_write);
  }

  // Runs rounds until the byte count or the duration; false when the
  // connection failed (pending_ then holds what was pending).
  bool run(std::uint64_t bytes, double seconds, const std::atomic<bool>* stop_early = nullptr) {
    const auto start = clk::now();
    auto more = [&] {
      if (bytes != 0 && t_.bytes >= bytes) return false;
      if (seconds > 0 && std::chrono::duration<double>(clk::now() - start).count() >= seconds) return false;
      return stop_early == nullptr || !stop_early->load();
    };
    auto said = start;
    while (more()) {
      if (o_.progress_s > 0 && clk::now() - said >= std::chrono::duration<double>(o_.progress_s)) {
        said = clk::now();
        std::printf("soak client: %s, %.0f s: %.1f MB in %" PRIu64 " operations, %" PRIu64
                    " mismatches so far\n",
                    o_.label.c_str(), std::chrono::duration<double>(said - start).count(),
                    static_cast<double>(t_.bytes) / 1e6, t_.ops, t_.mismatches);
        std::fflush(stdout);
      }
      for (int i = 0; i < messages_per_round; ++i) {
        const std::uint32_t len = static_cast<std::uint32_t>((s_.tx_seq * 2654435761u) % (message_size - 31));
        std::vector<std::byte>& p = payload_;
        p.resize(len);
        fill(p.data(), len, s_.tx_seq ^ 0xabcdefull);
        start_op(s_.send(header{.kind = k_data, .length = len, .hash = xxh(p.data(), len)}, p.data()),
                 &t_.msg, len, true);
      }
      if (!settle()) return false;
      for (std::size_t size : o_.sizes) {
        const std::uint64_t seed = s_.tx_seq;
        fill(src_->data(), size, seed);
        const std::uint64_t h = xxh(src_->data(), size);
        start_op(w_.write(rdx::local_span<const std::byte>(*src_).subspan(0, size), 0), &t_.write, size,
                 false);
        if (!settle()) return false;
        start_op(s_.send(header{.kind = k_write_done, .length = static_cast<std::uint32_t>(size), .hash = h}),
                 &t_.msg, 0, true);
        if (!settle()) return false;
        start_op(s_.ch.receive(std::span<std::byte>(s_.rx)), nullptr, 0, false);
        if (!settle()) return false;
        const header a = s_.check(last_bytes_, t_);
        if (a.kind != k_ack || a.hash != h || a.aux != 1) ++t_.mismatches;
        std::memset(dst_->data(), 0, size);
        start_op(w_.read(rdx::local_span<std::byte>(*dst_).subspan(0, size), 0), &t_.read, size, false);
        if (!settle()) return false;
        if (xxh(dst_->data(), size) != h) ++t_.mismatches;
      }
    }
    return true;
  }

  // Ends the session: k_end, the server's report, checked.
  report finish() {
    start_op(s_.send(header{.kind = k_end, .length = 0, .hash = 0, .aux = s_.tx_seq + 1}), nullptr, 0, false);
    require(settle(), "k_end: " + s_.conn.failure_message());
    start_op(s_.ch.receive(std::span<std::byte>(s_.rx)), nullptr, 0, false);
    require(settle(), "the server's report: " + s_.conn.failure_message());
    const header h = s_.check(last_bytes_, t_);
    report rep{};
    require(h.kind == k_final && h.length == sizeof rep, "the server's report is malformed");
    std::memcpy(&rep, s_.rx.data() + sizeof h, sizeof rep);
    rdx::tcp::barrier(s_.sock, 60s);
    return rep;
  }

  // After a failure: every pending operation ends with an error exactly
  // once, within bound of the fault; later operations fail at once.
  void check_failure(clk::time_point fault, std::chrono::milliseconds bound) {
    std::size_t pending = 0;
    clk::time_point last_end = fault;
    for (auto& p : pending_) {
      if (p.op.done() && p.op.ok()) continue;
      ++pending;
      const std::error_code ec = p.op.wait(bound + 5s);
      require(p.op.done(), "an operation pending at the failure did not end");
      require(static_cast<bool>(ec), "an operation pending at the failure ended without an error");
      last_end = std::max(last_end, clk::now());
      for (int i = 0; i < 100; ++i) s_.conn.progress();
      require(p.op.done() && p.op.error() == ec, "an operation's result changed after it ended");
    }
    auto late_send = s_.ch.send(std::span<const std::byte>(s_.tx.data(), 8));
    require(late_send.done() && late_send.error() == rdx::errc::operation_failed,
            "a later send did not fail at once");
    auto late_write = w_.write(rdx::local_span<const std::byte>(*src_).subspan(0, 64), 0);
    require(late_write.done() && late_write.error() == rdx::errc::operation_failed,
            "a later write did not fail at once");
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(last_end - fault);
    std::printf(
        "soak client: the connection failed (%s); %zu pending operations ended with an error, the last "
        "%lld ms after the fault (bound %lld ms)\n",
        s_.conn.failure_message().c_str(), pending, static_cast<long long>(took.count()),
        static_cast<long long>(bound.count()));
    require(pending > 0, "no operation was pending at the failure");
    if (s_.conn.failure_reason() == rdx::errc::no_progress) {
      // This side's NIC neither completed nor failed the work (Soft-RoCE
      // does so at times after its link came back): the stall watchdog
      // ended it, max(stall_timeout, detection_bound()) after the last
      // completion. Completions the kernel held when the fault struck can
      // come just after it; 250 ms covers them and the watchdog's clock
      // (every 1024 empty polls) under TCG.
      const auto stall = std::max(bound, std::chrono::milliseconds(o_.stall_timeout_ms));
      const auto from = std::max(fault, last_ok_);
      const auto watchdog = std::chrono::duration_cast<std::chrono::milliseconds>(last_end - from);
      std::printf(
          "soak client: the NIC reported nothing; the stall watchdog ended the work %lld ms after the "
          "last completion, %lld ms after the fault (its bound %lld ms)\n",
          static_cast<long long>(watchdog.count()),
          static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(from - fault).count()),
          static_cast<long long>(stall.count()));
      require(watchdog <= stall + 250ms, "the stall watchdog ended the work later than its bound");
    } else {
      require(took <= bound, "an operation ended later than detection_bound() after the fault");
    }
    pending_.clear();
  }

  [[nodiscard]] std::uint64_t data_ok() const noexcept { return data_ok_; }
  [[nodiscard]] bool stalled() const noexcept { return stalled_; }
  [[nodiscard]] std::uint64_t sent() const noexcept { return s_.tx_seq; }
  std::uint64_t qp_error_at = 0;
  std::optional<clk::time_point> forced;
  int watch_fd = -1;                             // the TCP socket, on which a dying server says "now"
  std::optional<clk::time_point> peer_said_now;  // when that byte was seen

private:
  void start_op(rdx::operation op, samples* lat, std::uint64_t bytes, bool data_message) {
    pending_.push_back(tracked{std::move(op), clk::now(), lat, bytes, data_message, {}});
    if (qp_error_at != 0 && ++ops_started_ == qp_error_at && !forced) {
      rdx_test::force_error(s_.conn, 0);
      forced = clk::now();
    }
  }

  // The server stopped taking messages (--expect-stall): a data send has
  // waited over a second with no credit left. A bounded wait on it must end
  // with timed_out, leave it pending and the connection healthy.
  void check_stall(clk::time_point now) {
    if (s_.conn.credits() != 0) return;
    for (auto& p : pending_) {
      if (!p.data_message || p.op.done() || !p.op.deferred() || now - p.start < 1s) continue;
      const auto t0 = clk::now();
      const std::error_code ec = p.op.wait(200ms);
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0);
      require(ec == rdx::errc::timed_out, "a wait of 200 ms on a send waiting for credits gave " +
                                              (ec ? ec.message() : std::string("success")));
      require(!p.op.done() && p.op.deferred(), "a timed-out wait ended the send it waited on");
      require(!s_.conn.failed(),
              "the connection failed while the peer stalled: " + s_.conn.failure_message());
      require(took >= 200ms && took < 1s, "a wait of 200 ms took " + std::to_string(took.count()) + " ms");
      std::printf(
          "soak client: no credits: a send waited %lld ms for the stalled server; a wait of 200 ms "
          "on it timed out after %lld ms and left it pending\n",
          static_cast<long long>(
              std::chrono::duration_cast<std::chrono::milliseconds>(now - p.start).count()),
          static_cast<long long>(took.count()));
      std::fflush(stdout);
      stalled_ = true;
      return;
    }
  }

  // Waits for every pending operation; false when one failed.
  bool settle() {
    const auto deadline = clk::now() + 120s;
    for (;;) {
      bool all = true;
      const auto now = clk::now();
      bool failed = false;
      for (auto& p : pending_) {
        if (!p.op.done()) {
          all = false;
        } else if (!p.op.ok()) {
          failed = true;
        } else if (p.end == clk::time_point{}) {
          p.end = now;
          last_ok_ = now;
        }
      }
      if (failed) return false;
      if (all) break;
      if (o_.expect_stall_ms != 0 && !stalled_) check_stall(now);
      if (clk::now() > deadline) {
        std::size_t waiting = 0, deferred = 0;
        for (auto& p : pending_) {
          waiting += p.op.done() ? 0 : 1;
          deferred += p.op.deferred() ? 1 : 0;
        }
        throw std::runtime_error("operations did not end within 120 s: " + std::to_string(waiting) + " of " +
                                 std::to_string(pending_.size()) + " pending, " + std::to_string(deferred) +
                                 " deferred; credits " + std::to_string(s_.conn.credits()) +
                                 ", outstanding on queue pair 0 " + std::to_string(s_.conn.outstanding(0)) +
                                 ", sent " + std::to_string(s_.tx_seq));
      }
      // Unsignaled requests complete only with a signaled one after them.
      s_.conn.cover();
      s_.conn.progress();
      if (watch_fd >= 0 && !peer_said_now && ++polls_ % 256 == 0) {
        pollfd p{watch_fd, POLLIN, 0};
        if (::poll(&p, 1, 0) > 0) peer_said_now = clk::now();
      }
    }
    for (auto& p : pending_) {
      if (p.lat != nullptr) {
        p.lat->add(p.end - p.start);
        p.lat->bytes += p.bytes;
        p.lat->busy += p.end - p.start;
      }
      t_.bytes += p.bytes;
      ++t_.ops;
      if (p.data_message) ++data_ok_;
      last_bytes_ = p.op.byte_count();
    }
    pending_.clear();
    return true;
  }

  session& s_;
  const options& o_;
  totals& t_;
  rdx::remote_window<std::byte, win_rights> w_;
  std::optional<rdx::registered_buffer<std::byte>> src_, dst_;
  std::vector<std::byte> payload_;
  std::vector<tracked> pending_;
  std::uint64_t data_ok_ = 0;  // messages whose send completed: the server's NIC has them
  std::uint64_t ops_started_ = 0;
  std::uint32_t last_bytes_ = 0;
  std::uint32_t polls_ = 0;
  clk::time_point last_ok_{};  // when this side last saw an operation complete
  bool stalled_ = false;
};

// Merges the server's counts into the client's.
void take_report(totals& t, const report& rep) {
  t.mismatches += rep.mismatches;
  t.lost += rep.lost;
  t.duplicates += rep.duplicates;
  for (std::size_t i = 0; i < std::size(counter_names); ++i)
    t.peer_rises[counter_names[i]] += rep.counters[i];
}

int run_client(const options& o) {
  rdx::context ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  const auto before = counters_now(o);
  totals t;
  std::optional<rdx_test::wire_cut> cut;
  prepare_cut(o, cut);
  std::optional<session> s;
  s.emplace(pd, o, false, o.port);
  client c(*s, o, t);
  c.qp_error_at = o.qp_error_at;
  c.watch_fd = s->sock.native_handle();
  start_cut(o, cut);

  // A link down from this side, timed here: exact, no program started.
  std::atomic<bool> link_was_down{false};
  std::atomic<bool> link_back{false};
  std::atomic<std::int64_t> down_at_ns{0};
  std::jthread flapper;  // joined on every way out
  if (o.down_for_ms != 0) {
    flapper = std::jthread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(o.down_after_ms));
      // Said before the ioctl: on one CPU the main thread can see the
      // failure it causes before this thread runs again.
      down_at_ns = clk::now().time_since_epoch().count();
      link_was_down = true;
      rdx_test::set_link(o.ifname, false);
      std::this_thread::sleep_for(std::chrono::milliseconds(o.down_for_ms));
      rdx_test::set_link(o.ifname, true);
      link_back = true;
    });
  }
  auto join = [&] {
    if (flapper.joinable()) flapper.join();
  };

  const bool ran = c.run(o.bytes, o.seconds);
  if (ran) {
    require(!o.expect_failure, "the connection was expected to fail and did not");
    const report rep = c.finish();
    join();
    take_report(t, rep);
    check_cut(cut, "client");
    if (o.down_for_ms != 0) require(link_was_down.load(), "the run ended before the link went down");
    if (o.expect_stall_ms != 0) {
      require(c.stalled(),
              "no send waited for credits: the server did not stall, or recv_depth is larger "
              "than a round of messages");
      require(t.msg.pct(1.0) * 10 >= o.expect_stall_ms * 1000 * 9,
              "the longest message took " + std::to_string(t.msg.pct(1.0)) + " us, less than the stall");
    }
    const rdx::pacing_state ps = s->conn.pacing();
    char pacing[192];
    std::snprintf(pacing, sizeof pacing,
                  " pacing=%d pacing_window=%" PRIu64 " pacing_chunk=%" PRIu64 " pacing_decreases=%" PRIu64
                  " pacing_probes=%" PRIu64 " pacing_losses=%" PRIu64,
                  o.pacing ? 1 : 0, ps.window, ps.chunk, ps.decreases, ps.probes, ps.losses);
    return result(o, "client", t, before, pacing);
  }
  if (!o.expect_failure) {
    join();
    std::fprintf(stderr, "soak client: the connection failed: %s\n", s->conn.failure_message().c_str());
    result(o, "client", t, before);
    return 1;
  }
  // When did the fault happen? Ours (link down, forced error), else the server's byte.
  clk::time_point fault{};
  if (c.forced) {
    fault = *c.forced;
  } else if (link_was_down) {
    fault = clk::time_point(clk::duration(down_at_ns.load()));
  } else {
    require(c.peer_said_now.has_value(), "the connection failed with no fault to explain it");
    fault = *c.peer_said_now;
  }
  c.check_failure(fault, s->conn.detection_bound());
  const std::uint64_t data_ok = c.data_ok();
  const std::uint64_t sent_first = c.sent();
  join();
  if (o.down_for_ms != 0) require(link_back.load(), "the link did not come back");
  // A fresh connection on port + 1, a clean session over it.
  totals t2;
  session s2(pd, o, false, static_cast<std::uint16_t>(o.port + 1));
  client c2(s2, o, t2);
  require(c2.run(o.reconnect_bytes, 0), "the reconnected session failed: " + s2.conn.failure_message());
  const report rep = c2.finish();
  take_report(t2, rep);
  t2.mismatches += t.mismatches;
  t2.duplicates += t.duplicates;
  std::printf("soak client: before the fault %" PRIu64 " data messages completed, %" PRIu64
              " messages sent; the server took %" PRIu64 "\n",
              data_ok, sent_first, rep.first_received);
  if (!c.peer_said_now) {  // a killed server cannot say what it took
    require(rep.first_received >= data_ok, "a message whose send completed before the fault never arrived");
    require(rep.first_received <= sent_first, "the server took more messages than were sent");
  }
  return result(o, "client", t2, before, " reconnected=1");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    return o.server ? run_server(o) : run_client(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "soak: FAILED: %s\n", e.what());
    return 1;
  }
}
