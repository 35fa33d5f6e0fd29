// rdx_crypt_fabric: its command line. The client's plan (sizes, counts,
// rounds) is the one both sides run; the server takes it from the client.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"

namespace crypt_fabric {

inline constexpr std::uint64_t kib = 1024;
inline constexpr std::uint64_t mib = 1024 * kib;

//! A check or a step of the benchmark that failed: printed as FAILED, exit status 1.
struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! What the command line asks for.
struct options {
  std::string server;  //!< empty: this is the server
  std::uint16_t port = 18533;
  std::string device;                     //!< empty: RDX_DEVICE, else the first with an ACTIVE port
  std::optional<std::uint8_t> gid_index;  //!< unset: rdx's choice (RDX_GID_INDEX, RoCE v2, ...)
  std::string psk_file;
  std::vector<std::uint64_t> sizes{64, 4 * kib, mib};
  std::vector<std::uint64_t> bulk{mib, 4 * mib, 16 * mib, 64 * mib};
  std::uint64_t chunk = 256 * kib;
  std::uint64_t iters = 0;          //!< 0: per message size (plan.hpp, message_count)
  std::uint64_t latency_iters = 0;  //!< 0: per message size (plan.hpp, latency_count)
  std::uint32_t rounds = 3;
  bool quick = false;
  std::chrono::seconds timeout{30};
};

//! The plan's lists hold at most this many sizes each (they travel in a fixed block).
inline constexpr std::size_t max_list = 16;
//! Largest message size and chunk: a connection's ring holds at least 4 of them each side.
inline constexpr std::uint64_t max_message = 16 * mib;
//! Largest transfer: both sides register a buffer of the largest.
inline constexpr std::uint64_t max_transfer = 1024 * mib;

inline void usage(const char* argv0) {
  std::printf(
      "usage: %s [options]          (server)\n"
      "       %s [options] SERVER   (client)\n"
      "Encrypted (connection_attr::encrypt, AES-256-GCM) against plain rdx connections on one\n"
      "fabric, paired in one run: message throughput and round-trip latency per message size,\n"
      "bulk transfers (a window write, plain, against a sealed window write) and bulk\n"
      "fetches (a window read against a sealed window read) of the --bulk sizes. Every\n"
      "byte is checked where it lands; exit status 0 only when all of them were right.\n"
      "Each point gets a fresh connection pair, set up over TCP with --psk-file's key.\n"
      "The client's plan (sizes, counts, rounds) is the one both sides run.\n"
      "\n"
      "  -p, --port PORT        TCP port of the set-up (default 18533)\n"
      "  -d, --device DEV       RDMA device (default: RDX_DEVICE, else the first ACTIVE one)\n"
      "  -g, --gid-index N      GID index (default: RDX_GID_INDEX, else RoCE v2 where there is one)\n"
      "      --psk-file FILE    the pre-shared key, hex (required; the same file on both sides):\n"
      "                         openssl rand -hex 32 > key; chmod 600 key\n"
      "      --sizes LIST       message sizes, K/M suffixes (default 64,4K,1M)\n"
      "      --bulk LIST        transfer and fetch sizes, K/M suffixes, or none (default 1M,4M,16M,64M)\n"
      "      --chunk SIZE       payload of each sealed chunk of a transfer or fetch (default 256K)\n"
      "      --iters N          messages per throughput point (default: 128 MiB / size,\n"
      "                         at least 200 and at most 50000)\n"
      "      --latency-iters N  round trips per latency point (default 500; for sizes of\n"
      "                         256 KiB and more 128 MiB / size, at least 50), after N/10 unmeasured\n"
      "      --rounds R         rounds of every point; the table shows median [min..max] (default 3)\n"
      "      --quick            a smoke run: 1 round, 32 messages, 20 round trips, --bulk 1M\n"
      "                         (flags given explicitly win)\n"
      "      --timeout SEC      limit of every set-up step and every wait (default 30)\n"
      "  -h, --help             this text\n"
      "\n"
      "example:\n"
      "  openssl rand -hex 32 > key; chmod 600 key      (then copy key to the other host)\n"
      "  server:  %s --psk-file key\n"
      "  client:  %s --psk-file key 10.77.0.1\n",
      argv0, argv0, argv0, argv0);
}

//! A comma-separated list of sizes (K/M/G suffixes) in [lo, hi]; "none" when allow_none.
inline std::vector<std::uint64_t> parse_list(std::string_view opt, std::string_view text, std::uint64_t lo,
                                             std::uint64_t hi, bool allow_none) {
  std::vector<std::uint64_t> out;
  if (allow_none && text == "none") {
    return out;
  }
  while (true) {
    const std::size_t comma = text.find(',');
    out.push_back(app::parse_number(opt, text.substr(0, comma), lo, hi, true));
    if (comma == std::string_view::npos) {
      break;
    }
    text.remove_prefix(comma + 1);
  }
  if (out.size() > max_list) {
    throw app::usage_error(std::string(opt) + ": at most " + std::to_string(max_list) + " sizes");
  }
  return out;
}

//! Reads argv. @throws app::usage_error naming the mistake.
inline options parse_options(int argc, char** argv, bool& help) {
  options o;
  app::arg_reader r(argc, argv);
  std::string v;
  bool rounds_given = false;
  bool bulk_given = false;
  while (!r.done()) {
    if (r.match({"-h", "--help"})) {
      help = true;
      return o;
    }
    if (r.match({"-p", "--port"}, &v)) {
      o.port = static_cast<std::uint16_t>(app::parse_number("--port", v, 1, 65535));
    } else if (r.match({"-d", "--device"}, &v)) {
      o.device = v;
    } else if (r.match({"-g", "--gid-index"}, &v)) {
      o.gid_index = static_cast<std::uint8_t>(app::parse_number("--gid-index", v, 0, 255));
    } else if (r.match({"--psk-file"}, &v)) {
      o.psk_file = v;
    } else if (r.match({"--sizes"}, &v)) {
      o.sizes = parse_list("--sizes", v, 1, max_message, false);
    } else if (r.match({"--bulk"}, &v)) {
      o.bulk = parse_list("--bulk", v, 1, max_transfer, true);
      bulk_given = true;
    } else if (r.match({"--chunk"}, &v)) {
      o.chunk = app::parse_number("--chunk", v, 16, max_message, true);
    } else if (r.match({"--iters"}, &v)) {
      o.iters = app::parse_number("--iters", v, 1, 100'000'000);
    } else if (r.match({"--latency-iters"}, &v)) {
      o.latency_iters = app::parse_number("--latency-iters", v, 1, 10'000'000);
    } else if (r.match({"--rounds"}, &v)) {
      o.rounds = static_cast<std::uint32_t>(app::parse_number("--rounds", v, 1, 1000));
      rounds_given = true;
    } else if (r.match({"--quick"})) {
      o.quick = true;
    } else if (r.match({"--timeout"}, &v)) {
      o.timeout = std::chrono::seconds(app::parse_number("--timeout", v, 1, 3600));
    } else if (r.peek().starts_with("-")) {
      throw app::usage_error("unknown option " + std::string(r.peek()));
    } else if (o.server.empty()) {
      o.server = r.take();
    } else {
      throw app::usage_error("one SERVER only, got " + o.server + " and " + std::string(r.peek()));
    }
  }
  if (o.quick && !rounds_given) {
    o.rounds = 1;
  }
  if (o.quick && !bulk_given) {
    o.bulk = {mib};
  }
  if (o.psk_file.empty()) {
    throw app::usage_error(
        "--psk-file FILE is required: every connection is set up with a pre-shared key; make one with "
        " openssl rand -hex 32 > key; chmod 600 key  and give both sides the same file");
  }
  return o;
}

}  // namespace crypt_fabric
