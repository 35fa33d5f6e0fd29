// rdx_crypt_fabric: encrypted (connection_attr::encrypt) against plain rdx
// connections on one fabric, paired in one run, between two processes.
//
//   server:  rdx_crypt_fabric --psk-file KEY
//   client:  rdx_crypt_fabric --psk-file KEY SERVER
//
// Per round, per message size: message throughput and round-trip latency on
// a plain connection pair and on a sealed one; per transfer size: a window
// write (plain) against a sealed window write (sealed_writer, sealed_reader),
// and a window read against a sealed window read (sealed_source,
// sealed_fetcher). Each point gets a fresh connection pair over its own
// authenticated TCP set-up; the receiving side checks every byte. The parts: crypt_fabric/ (options, plan,
// pattern, link, messages, transfers, report).
#include <rdx/auth/psk.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/error.hpp>
#include <rdx/rdx.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.hpp"
#include "crypt_fabric/link.hpp"
#include "crypt_fabric/messages.hpp"
#include "crypt_fabric/options.hpp"
#include "crypt_fabric/plan.hpp"
#include "crypt_fabric/report.hpp"
#include "crypt_fabric/transfers.hpp"

namespace crypt_fabric {
namespace {

// The key, read before any device or socket; a file that cannot serve says how to make one.
std::shared_ptr<const rdx::auth::psk_key> read_key(const std::string& path) {
  try {
    return rdx::auth::psk_key::from_file(path);
  } catch (const rdx::error& e) {
    throw std::runtime_error(
        std::string("--psk-file: ") + e.what() +
        " (make a key with  openssl rand -hex 32 > key; chmod 600 key  and give both sides "
        "the same file)");
  }
}

std::string list_text(const std::vector<std::uint64_t>& v) {
  std::string s;
  for (std::uint64_t x : v) {
    if (!s.empty()) {
      s += ',';
    }
    s += size_name(x);
  }
  return s.empty() ? "none" : s;
}

int run(const options& o) {
  const bool client = !o.server.empty();
  const auto key = read_key(o.psk_file);
  rdx::context ctx = app::open_device(o.device);
  rdx::protection_domain pd(ctx);
  std::optional<rdx::tcp::listener> listener;
  rdx::tcp::socket control;
  if (client) {
    control = rdx::tcp::connect(o.server, o.port, o.timeout);
  } else {
    listener.emplace(rdx::tcp::listener::bind("", o.port));
    std::printf("rdx_crypt_fabric server on %s: waiting for a client on TCP port %u\n", ctx.name().c_str(),
                listener->port());
    control = listener->accept(o.timeout);
  }
  plan mine{.seed = (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}(),
            .rounds = o.rounds,
            .quick = o.quick,
            .iters = o.iters,
            .latency_iters = o.latency_iters,
            .chunk = o.chunk,
            .sizes = o.sizes,
            .bulk = o.bulk};
  const plan pl = agree_plan(control, client ? &mine : nullptr, clock::now() + o.timeout);
  std::printf(
      "rdx_crypt_fabric %s: device %s, peer %s\n  messages %s, transfers %s (sealed in %s chunks), %u "
      "round%s%s\n",
      client ? "client" : "server", ctx.name().c_str(), control.peer().c_str(), list_text(pl.sizes).c_str(),
      list_text(pl.bulk).c_str(), size_name(pl.chunk).c_str(), pl.rounds, pl.rounds == 1 ? "" : "s",
      pl.quick ? ", quick" : "");

  // Everything the measured loops touch is made here, before any clock starts.
  bench_env e{o, pl, pd, key, listener ? &*listener : nullptr, std::nullopt, {}, {}, {}};
  if (!pl.bulk.empty()) {
    e.bulk.emplace(rdx::make_window_buffer<std::byte>(pd, *std::max_element(pl.bulk.begin(), pl.bulk.end())));
  }
  std::uint64_t largest = 16;
  std::uint64_t most_trips = 0;
  for (std::uint64_t s : pl.sizes) {
    largest = std::max(largest, s);
    most_trips = std::max(most_trips, latency_count(pl, s));
  }
  e.buf.resize(largest);
  e.rtt.reserve(most_trips);

  results res(pl);
  const std::vector<point> points = schedule(pl);
  for (std::size_t i = 0; i < points.size(); ++i) {
    const point& p = points[i];
    const bool message = p.what == kind::message;
    std::printf("  [%zu/%zu] %-8s %-8s %-6s round %u: ", i + 1, points.size(), kind_name(p.what),
                size_name(p.size).c_str(), mode_name(p.how), p.round + 1);
    std::fflush(stdout);
    if (client) {
      const point_result r = message                    ? message_client(e, p)
                             : p.what == kind::transfer ? transfer_client(e, p)
                                                        : fetch_client(e, p);
      res.add(p, r);
      if (message) {
        std::printf("%.1f MB/s, round trip p50 %.1f us, p99 %.1f us\n", r.mbps, r.p50_us, r.p99_us);
      } else {
        std::printf("%.1f MB/s\n", r.mbps);
      }
    } else {
      const std::size_t before = e.problems.size();
      if (message) {
        message_server(e, p);
      } else if (p.what == kind::transfer) {
        transfer_server(e, p);
      } else {
        fetch_server(e, p);
      }
      std::printf("%s\n", e.problems.size() == before ? "every byte checked" : "WRONG BYTES (above)");
    }
  }
  rdx::tcp::barrier(control, o.timeout);
  if (client) {
    res.print(ctx.name(), control.peer(), pl.rounds, pl.chunk);
  }
  if (!e.problems.empty()) {
    std::fprintf(stderr, "rdx_crypt_fabric: FAILED: %zu wrong:\n", e.problems.size());
    for (const std::string& s : e.problems) {
      std::fprintf(stderr, "  %s\n", s.c_str());
    }
    return 1;
  }
  std::printf("rdx_crypt_fabric: every byte checked out, plain and sealed (%zu points)\n", points.size());
  return 0;
}

// What to do about an rdx error whose own message may not say it.
const char* fix_for(const std::error_code& ec) {
  if (ec == rdx::errc::authentication_failed) {
    return " (the two sides hold different keys: give both the same --psk-file)";
  }
  if (ec == rdx::errc::integrity_failed) {
    return " (a sealed message failed its check: the data were changed in transit, or a bug)";
  }
  if (ec == rdx::errc::no_device) {
    return " (Soft-RoCE:  rdma link add rxe0 type rxe netdev IFACE ; or name a device with -d)";
  }
  return "";
}

}  // namespace
}  // namespace crypt_fabric

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress in order with stderr in logs
  crypt_fabric::options o;
  try {
    bool help = false;
    o = crypt_fabric::parse_options(argc, argv, help);
    if (help) {
      crypt_fabric::usage(argv[0]);
      return 0;
    }
  } catch (const app::usage_error& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", argv[0], e.what());
    return 2;
  }
  try {
    return crypt_fabric::run(o);
  } catch (const rdx::error& e) {
    std::fprintf(stderr, "\n%s: %s%s\n", argv[0], e.what(), crypt_fabric::fix_for(e.code()));
  } catch (const crypt_fabric::failure& e) {
    std::fprintf(stderr, "\n%s: FAILED: %s\n", argv[0], e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\n%s: %s\n", argv[0], e.what());
  }
  return 1;
}
