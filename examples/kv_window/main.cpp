// rdx kv_window: one side serves a table of fixed-size records in a window;
// the other reads them, writes some, bumps each record's version atomically,
// reads everything back and checks it. The server checks its table too.
//
//   server:  kv_window [options]
//   client:  kv_window [options] SERVER
#include <rdx/channel/channel.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "../common.hpp"
#include <poll.h>
#include <sys/socket.h>

namespace {

//! One record: 64 bytes, the version word at index 1 of its 8 words.
struct record {
  std::uint64_t key;
  std::uint64_t version;
  char value[48];
};
static_assert(sizeof(record) == 64 && alignof(record) == 8);
constexpr std::size_t words_per_record = sizeof(record) / 8;
constexpr std::uint64_t final_version = 10;

constexpr auto table_rights = rdx::rights::read | rdx::rights::write | rdx::rights::atomic;

struct options {
  std::string server;
  std::string device;
  std::uint32_t records = 64;
  std::uint32_t queue_pairs = 1;
  std::uint16_t port = 18516;
  bool all = false;
  std::chrono::seconds timeout{30};
};

void usage(const char* argv0) {
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
      "  -p, --port PORT       TCP port of the exchange (default 18516)\n"
      "  -a, --all             touch every record, however many (slow under TCG)\n"
      "  -t, --timeout SEC     limit for connecting and each operation (default 30)\n"
      "  -h, --help            this text\n"
      "\n"
      "Exit status: 0 when every check passed, 1 on a failure, 2 for a usage error.\n",
      argv0, argv0, final_version);
}

struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect_ok(rdx::operation& op, const options& o, const std::string& what) {
  const std::error_code ec = op.wait(o.timeout);
  if (ec) throw failure(what + ": " + ec.message());
}

//! False once the TCP peer has closed its end (it never sends before the end).
bool peer_connected(const rdx::tcp::socket& s) {
  pollfd p{s.native_handle(), POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return true;
  char c = 0;
  return ::recv(s.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

std::string initial_value(std::uint64_t i) {
  return "record " + std::to_string(i);
}
std::string updated_value(std::uint64_t i) {
  return "updated " + std::to_string(i * 7);
}
void set_value(record& r, const std::string& v) {
  std::memset(r.value, 0, sizeof r.value);
  std::memcpy(r.value, v.data(), std::min(v.size(), sizeof r.value - 1));
}
//! The first problem with a record in its final state, or "".
//! Large tables are sampled: every stride-th record is bumped, every second
//! of those rewritten (at most 128 of each kind of operation per run).
std::uint64_t stride_for(std::uint64_t records) {
  return std::max<std::uint64_t>(1, records / 128);
}
bool bumped(std::uint64_t i, std::uint64_t stride) {
  return i % stride == 0;
}
bool rewritten(std::uint64_t i, std::uint64_t stride) {
  return bumped(i, stride) && (i / stride) % 2 == 0;
}

std::string final_problem(const record& r, std::uint64_t i, std::uint64_t stride) {
  if (r.key != i) return "key " + std::to_string(r.key);
  const std::uint64_t version = bumped(i, stride) ? final_version : 0;
  if (r.version != version)
    return "version " + std::to_string(r.version) + ", expected " + std::to_string(version);
  const std::string want = rewritten(i, stride) ? updated_value(i) : initial_value(i);
  if (std::string(r.value) != want) return "value '" + std::string(r.value) + "', expected '" + want + "'";
  return "";
}

int run(const options& o) {
  rdx::context ctx = examples::open_device(o.device);
  rdx::protection_domain pd(ctx);
  rdx::connection conn(
      pd, rdx::connection_attr{.queue_pairs = o.queue_pairs, .recv_depth = 8, .message_size = 64});
  rdx::channel<std::uint64_t> ctl(conn);
  const bool client = !o.server.empty();
  const std::uint64_t stride = o.all ? 1 : stride_for(o.records);

  if (!client) {
    std::printf("kv_window server: %u records of %zu bytes on %s\n", o.records, sizeof(record),
                ctx.name().c_str());
  }
  rdx::tcp::socket sock = examples::bootstrap_socket(o.server, o.port, o.timeout);

  if (!client) {
    // The table: one registered region with exactly read, write and atomic
    // rights, granted twice: as records, and as 8-byte words for atomics.
    auto table =
        rdx::make_window_buffer<std::uint64_t, table_rights>(pd, std::size_t{o.records} * words_per_record);
    auto* recs = reinterpret_cast<record*>(table.data());
    for (std::uint64_t i = 0; i < o.records; ++i) {
      recs[i].key = i;
      recs[i].version = 0;
      set_value(recs[i], initial_value(i));
    }
    const rdx::grant<std::uint64_t, table_rights> words(conn, table);
    const rdx::grant<record, table_rights> as_records(conn, table.region(),
                                                      std::span<record>(recs, o.records));
    const rdx::window_descriptor grants[] = {as_records.descriptor(), words.descriptor()};
    (void)rdx::exchange_and_connect(sock, conn, grants, o.timeout);
    std::printf("  connected to %s; waiting for the client\n", sock.peer().c_str());
    std::fflush(stdout);
    // The client takes as long as its table needs: wait while it is connected.
    // (Leaving early would deregister the table under the client's feet.)
    auto done = ctl.receive();
    std::error_code ec;
    while ((ec = done.wait(std::chrono::seconds(1))) == rdx::errc::timed_out) {
      if (!peer_connected(sock)) throw failure("the client went away before reporting");
    }
    if (ec) throw failure("waiting for the client's report: " + ec.message());
    if (done.value() != o.records)
      throw failure("the client checked " + std::to_string(done.value()) + " records");
    std::uint64_t bad = 0;
    for (std::uint64_t i = 0; i < o.records; ++i) {
      const std::string p = final_problem(recs[i], i, stride);
      if (!p.empty() && bad++ < 5) std::fprintf(stderr, "  record %" PRIu64 ": %s\n", i, p.c_str());
    }
    auto reply = ctl.send(bad);
    expect_ok(reply, o, "sending the verdict");
    rdx::tcp::barrier(sock, o.timeout);
    if (bad != 0) throw failure(std::to_string(bad) + " records are wrong in the server's table");
    std::printf("server: all %u records in their final state (version %" PRIu64 ")\n", o.records,
                final_version);
    return 0;
  }

  const rdx::peer_offer offer = rdx::exchange_and_connect(sock, conn, {}, o.timeout);
  if (offer.windows.size() != 2)
    throw failure("the server granted " + std::to_string(offer.windows.size()) + " windows, expected 2");
  rdx::remote_window<record, rdx::rights::read | rdx::rights::write> table(conn, offer.windows[0]);
  rdx::remote_window<std::uint64_t, rdx::rights::atomic> words(conn, offer.windows[1]);
  if (table.size() != o.records)
    throw failure("the server's table has " + std::to_string(table.size()) + " records");
  std::printf("kv_window client: %zu records at %s over %u queue pair(s)\n", table.size(),
              sock.peer().c_str(), conn.queue_pair_count());

  rdx::registered_buffer<record> local(pd, o.records);
  // 1. Read the whole table in one operation (striped when large).
  auto r1 = table.read(local, 0);
  expect_ok(r1, o, "reading the table");
  for (std::uint64_t i = 0; i < o.records; ++i) {
    if (local[i].key != i || local[i].version != 0 || std::string(local[i].value) != initial_value(i))
      throw failure("record " + std::to_string(i) + " read back wrong before any change");
  }
  // 2. Rewrite the even records, one write each.
  std::uint64_t n_written = 0, n_bumped = 0;
  for (std::uint64_t i = 0; i < o.records; i += stride) {
    if (!rewritten(i, stride)) continue;
    ++n_written;
    set_value(local[i], updated_value(i));
    auto w = table.write(rdx::local_span<const record>(local).subspan(i, 1), i);
    expect_ok(w, o, "writing record " + std::to_string(i));
  }
  // 3. Bump every version: fetch_add 0 -> 1, then compare_swap 1 -> final.
  for (std::uint64_t i = 0; i < o.records; i += stride) {
    ++n_bumped;
    const std::size_t v = i * words_per_record + 1;
    auto fa = words.fetch_add(v, 1);
    expect_ok(fa, o, "fetch_add on record " + std::to_string(i));
    if (fa.old_value() != 0)
      throw failure("fetch_add on record " + std::to_string(i) + " saw " + std::to_string(fa.old_value()));
    auto cs = words.compare_swap(v, 1, final_version);
    expect_ok(cs, o, "compare_swap on record " + std::to_string(i));
    if (cs.old_value() != 1)
      throw failure("compare_swap on record " + std::to_string(i) + " saw " + std::to_string(cs.old_value()));
  }
  // A compare_swap that must not swap.
  auto miss = words.compare_swap(1, 0, 99);
  expect_ok(miss, o, "compare_swap expected to miss");
  if (miss.old_value() != final_version)
    throw failure("the missing compare_swap saw " + std::to_string(miss.old_value()));
  // A range outside the table is refused here, before the NIC sees it.
  auto outside = table.read(local, 1);
  if (outside.error() != rdx::errc::out_of_range) throw failure("a read past the table was not refused");
  // 4. Read everything back and check it.
  std::memset(static_cast<void*>(local.data()), 0, local.size_bytes());
  auto r2 = table.read(local, 0);
  expect_ok(r2, o, "reading the table back");
  for (std::uint64_t i = 0; i < o.records; ++i) {
    const std::string p = final_problem(local[i], i, stride);
    if (!p.empty()) throw failure("record " + std::to_string(i) + " read back: " + p);
  }
  // 5. Tell the server, which checks its own memory.
  auto report = ctl.send(std::uint64_t{o.records});
  expect_ok(report, o, "sending the report");
  auto verdict = ctl.receive();
  expect_ok(verdict, o, "waiting for the server's verdict");
  rdx::tcp::barrier(sock, o.timeout);
  if (verdict.value() != 0)
    throw failure("the server found " + std::to_string(verdict.value()) + " wrong records");
  std::printf("client: %u records read, %llu written, %llu bumped twice, all checked on both sides\n",
              o.records, static_cast<unsigned long long>(n_written),
              static_cast<unsigned long long>(n_bumped));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    examples::arg_reader r(argc, argv);
    std::string v;
    while (!r.done()) {
      if (r.match({"-h", "--help"})) {
        usage(argv[0]);
        return 0;
      } else if (r.match({"-d", "--ib-dev"}, &v)) {
        o.device = v;
      } else if (r.match({"-n", "--records"}, &v)) {
        o.records = static_cast<std::uint32_t>(examples::parse_number("--records", v, 1, 1u << 24));
      } else if (r.match({"-k", "--queue-pairs"}, &v)) {
        o.queue_pairs = static_cast<std::uint32_t>(examples::parse_number("--queue-pairs", v, 1, 16));
      } else if (r.match({"-a", "--all"})) {
        o.all = true;
      } else if (r.match({"-p", "--port"}, &v)) {
        o.port = static_cast<std::uint16_t>(examples::parse_number("--port", v, 1, 65535));
      } else if (r.match({"-t", "--timeout"}, &v)) {
        o.timeout = std::chrono::seconds(examples::parse_number("--timeout", v, 1, 86400));
      } else if (r.peek().starts_with("-") && r.peek().size() > 1) {
        throw examples::usage_error("unknown option " + std::string(r.peek()));
      } else {
        if (!o.server.empty()) throw examples::usage_error("more than one server address");
        o.server = r.take();
      }
    }
  } catch (const examples::usage_error& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", argv[0], e.what());
    return 2;
  }
  try {
    return run(o);
  } catch (const failure& e) {
    std::fprintf(stderr, "%s: FAILED: %s\n", argv[0], e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
  }
  return 1;
}
