// rdx-doctor: everything on this host that decides whether RDMA and
// GPUDirect RDMA will work, each line ok / note / warning / error with the
// fix; with --peer (the peer running --serve), both sides compared and a real
// checked transfer each way. Exit status 0 without errors, 1 with, 2 for a
// command-line mistake.
#include <rdx/rdx.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "checks.hpp"
#include "cli.hpp"
#include "counters.hpp"
#include "peer.hpp"
#include "report.hpp"
#include <sys/utsname.h>

namespace {

#ifndef RDX_DOCTOR_VERSION
#define RDX_DOCTOR_VERSION "0.1.0"
#endif

struct check_entry {
  const char* name;
  const char* what;
  void (*run)(doctor::report&, const doctor::scope&);
};

constexpr check_entry all_checks[] = {
    {"devices", "RDMA devices present and opening", doctor::check_devices},
    {"ports", "port state, link layer, network interface", doctor::check_ports},
    {"gid", "GID table with RoCE versions, the entry rdx uses and why", doctor::check_gid},
    {"mtu", "active and maximum MTU against the interface's", doctor::check_mtu},
    {"retrans", "retransmission settings in time; the port's loss and recovery counters",
     doctor::check_retransmission},
    {"memlock", "locked-memory limit against a typical registration", doctor::check_memlock},
    {"hugepages", "huge pages and transparent huge pages", doctor::check_hugepages},
    {"fork", "fork safety of registered memory", doctor::check_fork},
    {"gpu", "per GPU: dma-buf, peermem, the NIC it would use and its distance", doctor::check_gpu},
};

void usage(const char* argv0) {
  std::printf(
      "Usage: %s [options]\n"
      "       %s --serve [options]          (on one host)\n"
      "       %s --peer HOST [options]      (on the other)\n"
      "\n"
      "Checks everything on this host that decides whether RDMA and GPUDirect RDMA\n"
      "will work, and prints each finding as ok, note, warning or error with its fix.\n"
      "With --peer, the host running --serve is compared with this one (MTU, GID type\n"
      "and subnet, retry settings) and a queue pair is connected to it for a checked\n"
      "RDMA write in each direction and a few message round trips; a failed step is\n"
      "named with what it tried and the likely cause.\n"
      "\n"
      "Options:\n"
      "  --json               one JSON document on stdout instead of lines\n"
      "  --check LIST         only these checks, comma-separated (default: all):\n",
      argv0, argv0, argv0);
  for (const auto& c : all_checks) std::printf("                         %-10s %s\n", c.name, c.what);
  std::printf(
      "  -d, --ib-dev DEV     only this RDMA device (default: all; the peer check uses\n"
      "                       RDX_DEVICE, else the first with an ACTIVE port)\n"
      "  -i, --ib-port N      only this port (default: all; the peer check: the first ACTIVE)\n"
      "  -g, --gid-index N    use this GID index, as RDX_GID_INDEX does\n"
      "  --memlock-need SIZE  the registration size the memlock check expects (default 64M)\n"
      "  --peer HOST          compare with and connect to rdx-doctor --serve on HOST\n"
      "  --serve              wait for one rdx-doctor --peer, then check with it\n"
      "  -p, --port N         TCP port of --serve and --peer (default 18520)\n"
      "  -t, --timeout SEC    bound of each peer step and of --serve's wait (default 10;\n"
      "                       --serve: 60)\n"
      "  --bytes SIZE         bytes written each way by the peer check (default 64K)\n"
      "  -h, --help           this text\n"
      "\n"
      "Exit status: 0 when nothing is an error, 1 when something is, 2 for a usage error.\n"
      "Environment: RDX_DEVICE, RDX_GID_INDEX (as in every rdx program).\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bool json = false, serve = false;
  std::string checks, peer;
  doctor::scope sc;
  doctor::peer_scope ps;
  bool timeout_set = false;
  try {
    app::arg_reader a(argc, argv);
    while (!a.done()) {
      std::string v;
      if (a.match({"-h", "--help"})) {
        usage(argv[0]);
        return 0;
      } else if (a.match({"--json"})) {
        json = true;
      } else if (a.match({"--serve"})) {
        serve = true;
      } else if (a.match({"--check"}, &v)) {
        checks = v;
      } else if (a.match({"-d", "--ib-dev"}, &v)) {
        sc.device = v;
      } else if (a.match({"-i", "--ib-port"}, &v)) {
        sc.port = static_cast<int>(app::parse_number("--ib-port", v, 1, 255));
      } else if (a.match({"-g", "--gid-index"}, &v)) {
        (void)app::parse_number("--gid-index", v, 0, 255);
        ::setenv("RDX_GID_INDEX", v.c_str(), 1);
      } else if (a.match({"--memlock-need"}, &v)) {
        sc.memlock_need = app::parse_number("--memlock-need", v, 1, 1ull << 50, true);
      } else if (a.match({"--peer"}, &v)) {
        peer = v;
      } else if (a.match({"-p", "--port"}, &v)) {
        ps.tcp_port = static_cast<std::uint16_t>(app::parse_number("--port", v, 1, 65535));
      } else if (a.match({"-t", "--timeout"}, &v)) {
        ps.timeout = std::chrono::seconds(app::parse_number("--timeout", v, 1, 3600));
        timeout_set = true;
      } else if (a.match({"--bytes"}, &v)) {
        ps.bytes = app::parse_number("--bytes", v, 1, 1ull << 30, true);
      } else {
        throw app::usage_error("unknown argument " + std::string(a.peek()));
      }
    }
    if (serve && !peer.empty()) throw app::usage_error("--serve and --peer exclude each other");
    if (serve && !timeout_set) ps.timeout = std::chrono::seconds(60);
    ps.host = peer;
  } catch (const app::usage_error& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", argv[0], e.what());
    return 2;
  }

  std::vector<const check_entry*> run;
  if (checks.empty()) {
    for (const auto& c : all_checks) run.push_back(&c);
  } else {
    std::size_t at = 0;
    while (at <= checks.size()) {
      std::size_t comma = checks.find(',', at);
      if (comma == std::string::npos) comma = checks.size();
      const std::string name = checks.substr(at, comma - at);
      const check_entry* found = nullptr;
      for (const auto& c : all_checks)
        if (name == c.name) found = &c;
      if (found == nullptr) {
        std::fprintf(stderr, "%s: --check %s: no such check (see --help for the list)\n", argv[0],
                     name.c_str());
        return 2;
      }
      run.push_back(found);
      at = comma + 1;
    }
  }

  utsname u{};
  ::uname(&u);
  doctor::report r(json);
  if (!json) std::printf("rdx-doctor %s on %s (Linux %s)\n\n", RDX_DOCTOR_VERSION, u.nodename, u.release);
  for (const check_entry* c : run) c->run(r, sc);

  if (serve || !peer.empty()) {
    // The device and port rdx itself would use.
    try {
      rdx::context ctx = sc.device.empty() ? rdx::context::open_default() : rdx::context::open(sc.device);
      const std::uint8_t port = sc.port != 0 ? static_cast<std::uint8_t>(sc.port) : ctx.default_port();
      doctor::report local = r;  // what the peer is told about this host
      if (serve)
        doctor::serve_peer(r, ps, ctx, port, local);
      else
        doctor::check_peer(r, ps, ctx, port, local);
    } catch (const rdx::error& e) {
      r.add("peer.device", "host", doctor::level::error,
            std::string("no device to check the peer with: ") + e.what(),
            "fix the devices and ports checks first");
    }
  }
  r.finish(
      {{"tool", "rdx-doctor"}, {"version", RDX_DOCTOR_VERSION}, {"host", u.nodename}, {"kernel", u.release}});
  return r.count(doctor::level::error) > 0 ? 1 : 0;
}
