// twonode test: a peer that dies in the middle of traffic. Node 0 is the
// victim, node 1 the survivor (RDX_NODE, RDX_PEER_ADDR as for every twonode
// test). Modes:
//   --kill   the victim's process is killed (SIGKILL) while the survivor has
//            writes, reads, sends (some deferred), a receive and a
//            notification wait pending;
//   --link   the victim takes its link down while the survivor has only a
//            receive, a notification wait and deferred sends pending (the
//            keepalive probe must notice);
//   --link-traffic  the victim takes its link down in the middle of writes,
//            reads and sends, as with --kill.
//   --cm     (with --kill) the connection is set up through rdma_cm: the
//            victim's kernel disconnects its ids when the process dies, and
//            the survivor's pending operations must end with
//            errc::peer_disconnected, well before the retry timeouts would.
// The survivor checks that every pending operation ends with an error exactly
// once, within connection::detection_bound() of the death (printed next to
// the measured time), that later operations fail at once, and that no queue
// pair is left behind. Exit 0 when all of that holds.
#include <rdx/channel/channel.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>
#if RDX_TEST_CM
#include <rdx/cm/cm.hpp>
#endif

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace std::chrono_literals;
using rdx::rights;
using clk = std::chrono::steady_clock;

namespace {

constexpr std::size_t words = 1u << 17;  // 1 MiB of uint64
constexpr std::uint16_t port = 18640;

void require(bool c, const std::string& what) {
  if (!c) throw std::runtime_error(what);
}

std::size_t qp_count() {
  FILE* f = ::popen("rdma resource show qp 2>/dev/null", "r");
  if (f == nullptr) return 0;
  std::size_t n = 0;
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) n += std::strstr(line, "pid") != nullptr;
  ::pclose(f);
  return n;
}

struct setup {
  rdx::context ctx = rdx::context::open_default();
  rdx::protection_domain pd{ctx};
  rdx::connection conn;
  rdx::registered_buffer<std::uint64_t> win;
  rdx::grant<std::uint64_t, rights::read | rights::write> g;
  rdx::tcp::socket sock;
  rdx::peer_offer offer;
  setup(bool server, const std::string& peer, bool cm)
      : conn(pd,
             rdx::connection_attr{.queue_pairs = 2, .recv_depth = 8, .message_size = 64, .keepalive = 500ms}),
        win(rdx::make_window_buffer<std::uint64_t, rights::read | rights::write>(pd, words)),
        g(conn, win) {
    const rdx::window_descriptor grants[] = {g.descriptor()};
#if RDX_TEST_CM
    // Over rdma_cm the TCP socket only carries the victim's "now" signal.
    if (cm && server) {
      rdx::cm::listener l(port);
      auto t = rdx::tcp::listener::bind("", port + 1);
      std::optional<rdx::cm::request> r = l.next(60s);
      require(r.has_value(), "no rdma_cm request within 60 s");
      offer = rdx::cm::accept(std::move(*r), conn, grants);
      sock = t.accept(60s);
      return;
    }
    if (cm) {
      offer = rdx::cm::connect(conn, peer, port, {}, {.timeout = 60s, .wait_for_listener = true});
      sock = rdx::tcp::connect(peer, port + 1, 60s);
      return;
    }
#else
    require(!cm, "built without rdx::cm");
#endif
    if (server) {
      auto l = rdx::tcp::listener::bind("", port);
      sock = l.accept(60s);
    } else {
      sock = rdx::tcp::connect(peer, port, 60s);
    }
    offer = rdx::exchange_and_connect(sock, conn, grants, 60s);
  }
};

int victim(bool link, bool cm) {
  if (link) {
    setup s(true, "", cm);
    std::this_thread::sleep_for(1s);  // the survivor starts its operations
    const char b = 'x';
    (void)::send(s.sock.native_handle(), &b, 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(100ms);
    require(std::system("ip link set eth0 down") == 0, "ip link set eth0 down");
    std::this_thread::sleep_for(12s);
    (void)std::system("ip link set eth0 up");
    std::puts("victim: link was down for 12 s");
    return 0;
  }
  const pid_t child = ::fork();
  if (child == 0) {
    setup s(true, "", cm);
    rdx::channel<std::uint64_t> ch(s.conn);
    std::this_thread::sleep_for(1s);  // traffic flows; this side takes no message
    const char b = 'x';
    (void)::send(s.sock.native_handle(), &b, 1, MSG_NOSIGNAL);
    ::raise(SIGKILL);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  std::printf("victim: %s\n", killed ? "killed by SIGKILL as planned" : "did not die by SIGKILL");
  return killed ? 0 : 1;
}

int survivor(bool link, bool traffic, bool cm, const std::string& peer) {
  const std::size_t qps_before = qp_count();
  {
    setup s(false, peer, cm);
    rdx::channel<std::uint64_t> ch(s.conn);
    rdx::remote_window<std::uint64_t, rights::read | rights::write> w(s.conn, s.offer.windows.at(0));
    rdx::registered_buffer<std::uint64_t> local(s.pd, words);
    std::vector<rdx::operation> ops;
    ops.push_back(ch.receive());
    ops.push_back(ch.next_notification());
    for (std::uint64_t i = 0; i < 12; ++i) ops.push_back(ch.send(i));  // 8 credits: 4 deferred
    std::size_t ended_ok = 0;
    auto t_death = clk::time_point{};
    const auto start = clk::now();
    // Writes and reads keep flowing: eight slots, each restarted as it ends.
    const std::size_t first_slot = ops.size();
    const rdx::local_span<std::uint64_t> l(local);
    auto transfer = [&](std::size_t i) {
      return i % 2 == 0 ? w.write(rdx::local_span<const std::uint64_t>(l.subspan(0, 8192)), 0)
                        : w.read(l.subspan(8192 * (i % 8 + 1), 8192), 8192 * (i % 8 + 1));
    };
    for (std::size_t i = 0; traffic && i < 8; ++i) ops.push_back(transfer(first_slot + i));
    while (!s.conn.failed() && clk::now() - start < 60s) {
      for (std::size_t i = first_slot; traffic && i < ops.size(); ++i) {
        if (!ops[i].done()) continue;
        require(ops[i].ok() || s.conn.failed(),
                "a transfer failed before the death: " + ops[i].error().message());
        if (s.conn.failed()) break;
        ++ended_ok;
        ops[i] = transfer(i);
      }
      s.conn.progress();
      if (t_death == clk::time_point{}) {
        pollfd p{s.sock.native_handle(), POLLIN, 0};
        if (::poll(&p, 1, 0) > 0) t_death = clk::now();
      }
    }
    const auto t_failed = clk::now();
    require(s.conn.failed(), "the connection did not notice the dead peer in 60 s");
    require(t_death != clk::time_point{}, "the victim's signal never came");
    // Every pending operation ends, with an error, exactly once.
    for (auto& op : ops) {
      if (op.done() && op.ok()) {
        ++ended_ok;  // ended before the failure
        continue;
      }
      const std::error_code ec = op.wait(s.conn.detection_bound());
      require(op.done(), "an operation did not end after the failure");
      require(static_cast<bool>(ec), "an operation pending at the failure ended without an error");
      s.conn.progress();
      require(op.error() == ec, "an operation's result changed after it ended");
    }
    auto late = ch.send(99);
    require(late.done() && late.error() == rdx::errc::operation_failed, "a later send did not fail at once");
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(t_failed - t_death);
    const auto bound = s.conn.detection_bound();
    std::printf("dead_peer twonode (%s): %zu operations, %zu ended before the death, the rest failed: %s\n",
                !link     ? "process killed mid-transfer"
                : traffic ? "link down mid-transfer"
                          : "link down, receives only",
                ops.size(), ended_ok, s.conn.failure_reason().message().c_str());
    std::printf("dead_peer twonode (%s): detected in %lld ms, bound %lld ms\n",
                !link     ? "kill"
                : traffic ? "link, traffic"
                          : "link, receives only",
                static_cast<long long>(took.count()), static_cast<long long>(bound.count()));
    require(took <= bound, "detection took longer than detection_bound()");
    if (cm) {
      std::printf(
          "dead_peer twonode (kill, rdma_cm): DISCONNECTED ended it in %lld ms; the retry timeouts "
          "allow %lld ms (dead_peer_kill_twonode measures that path)\n",
          static_cast<long long>(took.count()), static_cast<long long>(bound.count()));
      require(s.conn.failure_reason() == rdx::errc::peer_disconnected,
              "the connection failed with " + s.conn.failure_message() + ", not the peer's DISCONNECTED");
    }
  }
  require(qp_count() == qps_before, "queue pairs left behind after the connection was destroyed");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool cm = argc > 2 && std::string(argv[2]) == "--cm";
  if (mode == "--help" || (mode != "--kill" && mode != "--link" && mode != "--link-traffic") ||
      (cm && mode != "--kill")) {
    std::printf(
        "usage: dead_peer --kill [--cm] | --link | --link-traffic   (RDX_NODE=0: victim, 1: survivor of "
        "RDX_PEER_ADDR)\n");
    return mode == "--help" ? 0 : 2;
  }
  const char* node = std::getenv("RDX_NODE");
  const char* peer = std::getenv("RDX_PEER_ADDR");
  try {
    const bool link = mode != "--kill";
    if (node != nullptr && std::string(node) == "0") return victim(link, cm);
    return survivor(link, mode != "--link", cm, peer != nullptr ? peer : "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dead_peer: %s\n", e.what());
    return 1;
  }
}
