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
#include <rdx/rdx.hpp>

#include <cstdio>
#include <exception>

#include "cli.hpp"
#include "modes.hpp"
#include "options.hpp"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep stdout and stderr in order in logs
  pingpong::options o;
  try {
    bool help = false;
    o = pingpong::parse_options(argc, argv, help);
    if (help) {
      pingpong::usage(argv[0]);
      return 0;
    }
  } catch (const app::usage_error& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", argv[0], e.what());
    return 2;
  }
  try {
    if (o.ack_timeout) {
      std::printf("retransmission: %s\n", rdx::retransmission_summary(pingpong::connect_opts(o)).c_str());
    }
    if (o.m == pingpong::mode::channel || o.m == pingpong::mode::window)
      return o.clients > 1 ? pingpong::serve_typed_clients(o) : pingpong::run_typed(o);
    return o.rc_compat ? pingpong::run_rc_compat(o) : pingpong::run_native(o);
  } catch (const rdx::error& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
  } catch (const pingpong::failure& e) {
    std::fprintf(stderr, "%s: FAILED: %s\n", argv[0], e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
  }
  return 1;
}
