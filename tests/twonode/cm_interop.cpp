// twonode test: rdx's rdma_cm layer (rdx::cm) against rdma-core's own
// rdma_cm programs, each side on a raw rdx::queue_pair with its own CQs and
// registered buffers.
//   --role client  plays rdma_client's part against rdma-core's rdma_server:
//                  posts a receive, connects (cm::connect, retrying while
//                  nothing listens), sends 16 bytes, waits for the 16-byte
//                  reply, then for rdma_server's disconnect.
//   --role server  plays rdma_server's part for rdma-core's rdma_client:
//                  listens (cm::listener), posts a receive before accepting
//                  (request::accept), receives 16 bytes, sends 16 bytes back,
//                  then waits for rdma_client's disconnect.
// Both rdma-core programs send their static, never written, 16-byte buffer:
// 16 zero bytes. The receive buffer is larger and prefilled with 0xa5, so the
// check sees the length, the zeros and that nothing was written past them.
// Every wait has a deadline (--timeout). Exit 0 when every check holds, 1 with
// a line naming the failure, 2 for a usage error.
#include <rdx/cm/cm.hpp>
#include <rdx/rdx.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

constexpr std::size_t message_bytes = 16;  // rdma_server's and rdma_client's send_msg/recv_msg
constexpr std::size_t recv_bytes = 64;     // room to notice a longer message
constexpr std::uint8_t unwritten = 0xa5;

struct args {
  std::string role;
  std::string peer;
  std::uint16_t port = 7471;  // rdma_server's and rdma_client's default
  std::chrono::seconds timeout{60};
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: cm_interop --role client|server [--peer ADDR] [--port N] [--timeout S]\n"
               "  --role client   rdma_client's part against rdma-core's rdma_server at --peer\n"
               "  --role server   rdma_server's part for rdma-core's rdma_client; with --peer,\n"
               "                  only a request from that address is accepted\n"
               "  --peer ADDR     the server's address (client), the expected client (server)\n"
               "  --port N        rdma_cm port (default 7471, as rdma_server and rdma_client)\n"
               "  --timeout S     deadline of the whole exchange in seconds (default 60)\n"
               "Exit status: 0 when every check holds, 1 on a failure (named), 2 on a usage error.\n");
}

//! A bad command line: main prints it with the usage and exits 2.
class usage_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

std::uint32_t number(std::string_view opt, std::string_view v, std::uint32_t lo, std::uint32_t hi) {
  std::uint32_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc{} || end != v.data() + v.size() || n < lo || n > hi) {
    throw usage_error(std::string(opt) + " " + std::string(v) + ": expected a number from " +
                      std::to_string(lo) + " to " + std::to_string(hi));
  }
  return n;
}

//! @return nullopt for --help. @throws usage_error.
std::optional<args> parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view o = argv[i];
    if (o == "-h" || o == "--help") {
      return std::nullopt;
    }
    if (o != "--role" && o != "--peer" && o != "--port" && o != "--timeout") {
      throw usage_error("unknown option " + std::string(o));
    }
    if (i + 1 >= argc) {
      throw usage_error(std::string(o) + " needs a value");
    }
    const std::string_view v = argv[++i];
    if (o == "--role") {
      a.role = v;
    } else if (o == "--peer") {
      a.peer = v;
    } else if (o == "--port") {
      a.port = static_cast<std::uint16_t>(number(o, v, 1, 65535));
    } else {
      a.timeout = std::chrono::seconds(number(o, v, 1, 3600));
    }
  }
  if (a.role != "client" && a.role != "server") {
    throw usage_error("--role must be client or server");
  }
  if (a.role == "client" && a.peer.empty()) {
    throw usage_error("--role client needs --peer ADDR");
  }
  return a;
}

class failure : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

std::chrono::milliseconds left(clk::time_point deadline) {
  return std::max(1ms, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clk::now()));
}

std::string host_of(const std::string& peer) {
  return peer.substr(0, peer.rfind(':'));
}

//! One side's verbs objects: its own CQs, an RC queue pair, a registered
//! 16-byte message to send (zeros, as the rdma-core programs send) and a
//! larger receive buffer prefilled with a byte nobody sends.
struct side {
  rdx::context ctx;
  rdx::protection_domain pd{ctx};
  rdx::completion_queue send_cq{ctx, 4};
  rdx::completion_queue recv_cq{ctx, 4};
  rdx::queue_pair qp{pd, send_cq, recv_cq, {.max_send_wr = 2, .max_recv_wr = 2}};
  rdx::registered_buffer<std::uint8_t> out{pd, message_bytes};
  rdx::registered_buffer<std::uint8_t> in{pd, recv_bytes};

  explicit side(rdx::context c) : ctx(std::move(c)) {
    std::fill(out.begin(), out.end(), std::uint8_t{0});
    std::fill(in.begin(), in.end(), unwritten);
  }

  //! INIT, then the receive: posted before the connection exists, as rdma_server and rdma_client do.
  void post_receive() {
    qp.to_init();
    if (std::error_code ec = qp.post_recv(rdx::wr::recv(in.sge()).id(1))) {
      throw failure("post_recv: " + ec.message());
    }
  }

  void send(clk::time_point deadline, const std::string& to) {
    if (std::error_code ec = qp.post_send(rdx::wr::send(out.sge()).id(2))) {
      throw failure("post_send of " + std::to_string(message_bytes) + " bytes to " + to + ": " +
                    ec.message());
    }
    const rdx::completion c = wait(send_cq, "send", deadline, to);
    if (c.opcode() != IBV_WC_SEND) {
      throw failure("the send completion has opcode " + std::to_string(c.opcode()) +
                    ", expected IBV_WC_SEND");
    }
    std::printf("cm_interop: sent %zu bytes to %s: send completion ok\n", message_bytes, to.c_str());
  }

  //! Waits for the peer's message and checks it is rdma-core's: 16 zero bytes.
  void receive(clk::time_point deadline, const std::string& from) {
    const rdx::completion c = wait(recv_cq, "receive", deadline, from);
    if (c.opcode() != IBV_WC_RECV) {
      throw failure("the receive completion has opcode " + std::to_string(c.opcode()) +
                    ", expected IBV_WC_RECV");
    }
    if (c.byte_len() != message_bytes) {
      throw failure("received " + std::to_string(c.byte_len()) + " bytes from " + from + ", expected " +
                    std::to_string(message_bytes));
    }
    for (std::size_t i = 0; i < recv_bytes; ++i) {
      const std::uint8_t want = i < message_bytes ? 0 : unwritten;
      if (in[i] != want) {
        char b[160];
        std::snprintf(b, sizeof b, "byte %zu of the receive buffer is 0x%02x, expected 0x%02x (%s)", i, in[i],
                      want,
                      i < message_bytes ? "the peer sends zeros" : "nothing is written past the message");
        throw failure(b);
      }
    }
    std::printf("cm_interop: received %u bytes from %s: status ok, 16 zero bytes as rdma-core sends\n",
                c.byte_len(), from.c_str());
  }

private:
  static rdx::completion wait(rdx::completion_queue& cq, const char* what, clk::time_point deadline,
                              const std::string& peer) {
    rdx::completion c{};
    if (std::error_code ec = rdx::poll_one(cq, c, left(deadline))) {
      throw failure(std::string("no ") + what + " completion with " + peer + " before the deadline (" +
                    ec.message() + ")");
    }
    if (!c.ok()) {
      throw failure(std::string(what) + " with " + peer + " completed with " +
                    ::ibv_wc_status_str(c.status()) + ": " + c.error().message());
    }
    return c;
  }
};

void wait_disconnect(rdx::cm::link& l, clk::time_point deadline, const char* who) {
  if (!l.wait_disconnected(deadline)) {
    throw failure(std::string(who) + " at " + l.peer() + " did not disconnect before the deadline");
  }
  std::printf("cm_interop: %s at %s disconnected (RDMA_CM_EVENT_DISCONNECTED)\n", who, l.peer());
}

//! rdma_client's part: connects, retrying while nothing listens yet.
void run_client(const args& a, clk::time_point deadline) {
  side s(rdx::context::open_default());
  s.post_receive();
  std::optional<rdx::cm::link> l;
  int attempts = 0;
  while (!l) {
    ++attempts;
    try {
      l.emplace(rdx::cm::connect(s.qp, a.peer, a.port, {}, {.timeout = std::min(left(deadline), 10000ms)}));
    } catch (const rdx::error& e) {
      // Nothing listens yet: connection_refused (or, from an rdx::cm that
      // reports it as a rejection, the invalid service ID it names).
      const bool not_yet =
          e.code() == std::errc::connection_refused || e.code() == rdx::errc::unreachable ||
          (e.code() == rdx::errc::rejected && std::strstr(e.what(), "nothing listens") != nullptr);
      if (!not_yet || clk::now() + 250ms >= deadline) {
        throw failure(std::string("connect (attempt ") + std::to_string(attempts) + "): " + e.what());
      }
      if (attempts == 1) {
        std::printf("cm_interop: %s; retrying until it listens\n", e.what());
      }
      std::this_thread::sleep_for(250ms);
    }
  }
  const std::string peer = l->peer();
  std::printf("cm_interop: connected to %s on %s after %d attempt(s) (%zu bytes of reply private data)\n",
              peer.c_str(), s.ctx.name().c_str(), attempts, l->peer_private_data().size());
  s.send(deadline, peer);
  s.receive(deadline, peer);
  wait_disconnect(*l, deadline, "rdma_server");
  std::printf("cm_interop: client: ok (rdx::cm::connect interoperates with rdma-core's rdma_server)\n");
}

//! rdma_server's part: the receive is posted before the accept.
void run_server(const args& a, clk::time_point deadline) {
  rdx::cm::listener lis(a.port);
  std::printf("cm_interop: listening on port %u\n", static_cast<unsigned>(lis.port()));
  std::optional<rdx::cm::request> r = lis.next(left(deadline));
  if (!r) {
    throw failure("no connection request on port " + std::to_string(a.port) + " before the deadline");
  }
  const std::string peer = r->peer();
  if (!a.peer.empty() && host_of(peer) != a.peer) {
    throw failure("a request from " + peer + ", expected one from " + a.peer);
  }
  if (r->rdx()) {
    throw failure("the request from " + peer + " carries rdx private data: not rdma_client");
  }
  if (r->queue_pairs() != 1) {
    throw failure("the request from " + peer + " groups " + std::to_string(r->queue_pairs()) +
                  " queue pairs");
  }
  std::printf(
      "cm_interop: request from %s on %s: a foreign peer (no rdx header in its %zu bytes of private data)\n",
      peer.c_str(), r->device_name().c_str(), r->private_data().size());
  side s(rdx::context::open(r->device_name()));
  s.post_receive();
  rdx::cm::link l = r->accept(s.qp, {}, {.timeout = left(deadline)});
  std::printf("cm_interop: accepted %s (RDMA_CM_EVENT_ESTABLISHED)\n", peer.c_str());
  s.receive(deadline, peer);
  s.send(deadline, peer);
  wait_disconnect(l, deadline, "rdma_client");
  if (lis.rejected() != 0) {
    throw failure("the listener rejected " + std::to_string(lis.rejected()) +
                  " request(s): " + lis.last_rejection());
  }
  std::printf(
      "cm_interop: server: ok (rdx::cm::listener and request::accept interoperate with rdma_client)\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::optional<args> parsed;
  try {
    parsed = parse(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "cm_interop: %s\n", e.what());
    usage(stderr);
    return 2;
  }
  if (!parsed) {
    usage(stdout);
    return 0;
  }
  const args& a = *parsed;
  const auto deadline = clk::now() + a.timeout;
  try {
    if (a.role == "client") {
      run_client(a, deadline);
    } else {
      run_server(a, deadline);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cm_interop: %s: FAILED: %s\n", a.role.c_str(), e.what());
    return 1;
  }
  return 0;
}
