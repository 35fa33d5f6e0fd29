// kv_window: the command line's options, the --help text, and the
// connection both sides set up from them.
#pragma once

#include <rdx/channel/connection_attr.hpp>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

#include "psk_setup.hpp"
#include "record.hpp"

namespace kv {

struct options {
  std::string server;
  std::string device;
  std::uint32_t records = 64;
  std::uint32_t queue_pairs = 1;
  std::uint16_t port = 18516;
  bool all = false;
  bool cm = false;            // rdma_cm set-up instead of the TCP exchange
  std::uint32_t clients = 1;  // server: clients served at once, each on its own slice
  bool pool = false;          // server: every client's messages in one receive pool
  bool events = false;        // -e: sleep on the connection's or worker's descriptor instead of polling
  std::string psk_file;       // --psk-file: the pre-shared key that authenticates the TCP exchange
  std::chrono::seconds timeout{30};
};

inline void usage(const char* argv0) {
  std::printf(
      "Usage:\n"
      "  %s [options]          serve a table of records and wait for one client\n"
      "  %s [options] SERVER   read, write and atomically bump the server's records\n"
      "\n"
      "The client reads every record, rewrites every second one, bumps each record's\n"
      "version with fetch_add (0 -> 1) and compare_swap (1 -> %" PRIu64
      "), reads the table\n"
      "back and checks it; the server then checks its own copy. Both sides must\n"
      "use the same -n and -k. Tables of more than 128 records are sampled: every\n"
      "(n/128)-th record is bumped and every second of those rewritten.\n"
      "\n"
      "Options:\n"
      "  -d, --ib-dev DEV      RDMA device (default: RDX_DEVICE, else the first ACTIVE one)\n"
      "  -n, --records N       records in the table (default 64)\n"
      "  -k, --queue-pairs K   queue pairs to stripe large transfers over (default 1)\n"
      "  -p, --port PORT       TCP port of the exchange, or with --cm the rdma_cm port\n"
      "                        (default 18516)\n"
      "      --cm              connect through rdma_cm (librdmacm) instead of the TCP\n"
      "                        exchange; the grants travel in its private data\n"
      "      --clients N       (server) serve N clients at once from one thread, each on\n"
      "                        its own connection (all on one rdx::worker) with a grant\n"
      "                        of its own slice of N x -n records; one line per client\n"
      "                        (default 1)\n"
      "      --pool            (server) every client's messages in one receive pool of\n"
      "                        the worker (a shared receive queue) instead of a ring\n"
      "                        of each client's own\n"
      "  -e, --events          sleep on a descriptor instead of busy polling while\n"
      "                        waiting: the client on its connection's for each\n"
      "                        completion, the server on its worker's (a --clients\n"
      "                        server of 2 or more always sleeps)\n"
      "      --psk-file FILE   the pre-shared key (hex, as `openssl rand -hex 32`\n"
      "                        writes it; mode 600) that authenticates set-up over\n"
      "                        TCP: both sides prove they hold it before any queue\n"
      "                        pair is connected, and a peer without it is refused;\n"
      "                        both sides need the same file. The server then sets\n"
      "                        clients up one at a time. Not with --cm: rdma_cm\n"
      "                        set-up has no authentication\n"
      "                        (this build: %s)\n"
      "  -a, --all             touch every record, however many (slow under TCG)\n"
      "  -t, --timeout SEC     limit for connecting and each operation (default 30)\n"
      "  -h, --help            this text\n"
      "\n"
      "Exit status: 0 when every check passed (with --clients: for every client),\n"
      "1 on a failure, 2 for a usage error.\n"
      "\n"
      "Examples (server 10.77.0.1):\n"
      "  %s                        and  %s 10.77.0.1\n"
      "  %s --cm --clients 3 -n 32 and  three of  %s --cm -n 32 10.77.0.1\n"
      "  %s -e --psk-file KEY      and  %s -e --psk-file KEY 10.77.0.1\n"
      "    (KEY made once with  (umask 077; openssl rand -hex 32 > KEY)  and copied)\n",
      argv0, argv0, final_version, app::psk_build_note(), argv0, argv0, argv0, argv0, argv0, argv0);
}

inline rdx::connection_attr attr_of(const options& o) {
  return rdx::connection_attr{.queue_pairs = o.queue_pairs, .recv_depth = 8, .message_size = 64};
}

}  // namespace kv
