// rdx kv_window: one side serves a table of fixed-size records in a window;
// the other reads them, writes some, bumps each record's version atomically,
// reads everything back and checks it. The server checks its table too.
// With --clients N the server serves N clients at once from one thread, every
// client's connection on one rdx::worker with a grant of its own slice of the table.
//
//   server:  kv_window [options]
//   client:  kv_window [options] SERVER
//
// options.hpp holds the command line, record.hpp the table's layout,
// server.cpp and client.cpp the two sides.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "cli.hpp"
#include "kv_window.hpp"
#include "options.hpp"

int main(int argc, char** argv) {
  kv::options o;
  try {
    app::arg_reader r(argc, argv);
    std::string v;
    while (!r.done()) {
      if (r.match({"-h", "--help"})) {
        kv::usage(argv[0]);
        return 0;
      } else if (r.match({"-d", "--ib-dev"}, &v)) {
        o.device = v;
      } else if (r.match({"-n", "--records"}, &v)) {
        o.records = static_cast<std::uint32_t>(app::parse_number("--records", v, 1, 1u << 24));
      } else if (r.match({"-k", "--queue-pairs"}, &v)) {
        o.queue_pairs = static_cast<std::uint32_t>(app::parse_number("--queue-pairs", v, 1, 16));
      } else if (r.match({"-a", "--all"})) {
        o.all = true;
      } else if (r.match({"-p", "--port"}, &v)) {
        o.port = static_cast<std::uint16_t>(app::parse_number("--port", v, 1, 65535));
      } else if (r.match({"--cm"})) {
        o.cm = true;
      } else if (r.match({"-e", "--events"})) {
        o.events = true;
      } else if (r.match({"--psk-file"}, &v)) {
        app::psk_build_check("kv_window");
        o.psk_file = v;
      } else if (r.match({"--pool"})) {
        o.pool = true;
      } else if (r.match({"--clients"}, &v)) {
        o.clients = static_cast<std::uint32_t>(app::parse_number("--clients", v, 1, 65536));
      } else if (r.match({"-t", "--timeout"}, &v)) {
        o.timeout = std::chrono::seconds(app::parse_number("--timeout", v, 1, 86400));
      } else if (r.peek().starts_with("-") && r.peek().size() > 1) {
        throw app::usage_error("unknown option " + std::string(r.peek()));
      } else {
        if (!o.server.empty()) throw app::usage_error("more than one server address");
        o.server = r.take();
      }
    }
    if (o.clients > 1 && !o.server.empty())
      throw app::usage_error("--clients is for the server: drop it, or drop " + o.server);
    if (o.pool && !o.server.empty())
      throw app::usage_error("--pool is for the server: drop it, or drop " + o.server);
    if (!o.psk_file.empty() && o.cm)
      throw app::usage_error(
          "--psk-file: rdx::auth authenticates the TCP exchange; rdma_cm set-up (--cm) has no "
          "authentication: drop --cm or --psk-file");
#if !RDX_EXAMPLES_CM
    if (o.cm) throw app::usage_error("--cm: this kv_window was built without librdmacm (rdx::cm)");
#endif
  } catch (const app::usage_error& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", argv[0], e.what());
    return 2;
  }
  try {
    return o.server.empty() ? kv::serve(o) : kv::run_client(o);
  } catch (const kv::failure& e) {
    std::fprintf(stderr, "%s: FAILED: %s\n", argv[0], e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
  }
  return 1;
}
