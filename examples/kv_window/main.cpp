// rdx kv_window: one side serves a table of fixed-size records in a window;
// the other reads them, writes some, bumps each record's version atomically,
// reads everything back and checks it. The server checks its table too.
// With --clients N the server serves N clients at once from one thread, every
// client's connection on one rdx::worker with a grant of its own slice of the table.
//
//   server:  kv_window [options]
//   client:  kv_window [options] SERVER
#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/channel.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>
#if RDX_EXAMPLES_CM
#include <rdx/cm/cm.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
using steady = std::chrono::steady_clock;

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
      "  -a, --all             touch every record, however many (slow under TCG)\n"
      "  -t, --timeout SEC     limit for connecting and each operation (default 30)\n"
      "  -h, --help            this text\n"
      "\n"
      "Exit status: 0 when every check passed (with --clients: for every client),\n"
      "1 on a failure, 2 for a usage error.\n"
      "\n"
      "Examples (server 10.77.0.1):\n"
      "  %s                        and  %s 10.77.0.1\n"
      "  %s --cm --clients 3 -n 32 and  three of  %s --cm -n 32 10.77.0.1\n",
      argv0, argv0, final_version, argv0, argv0, argv0, argv0);
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

rdx::connection_attr attr_of(const options& o) {
  return rdx::connection_attr{.queue_pairs = o.queue_pairs, .recv_depth = 8, .message_size = 64};
}

// --- The server: every client on one worker, served from one thread ----------
//
// An acceptor (rdx::acceptor over TCP, rdx::cm::acceptor over rdma_cm) sets
// clients up while the others are served. Each client's session waits for
// its report, checks its slice, sends the verdict and (over TCP) meets the
// client at a last barrier; the loop below moves every session on when the
// worker wakes. A client that fails, at set-up or after, ends its own
// session only.

struct session {
  std::string tag;
  std::uint64_t first = 0;                  // the slice's first record in the table
  std::unique_ptr<rdx::connection> conn{};  // handed over by the acceptor once set up
  rdx::tcp::socket sock{};                  // TCP: for the last barrier and to see the client leave
  std::optional<rdx::channel<std::uint64_t>> ctl{};
  std::optional<rdx::grant<std::uint64_t, table_rights>> words{};
  std::optional<rdx::grant<record, table_rights>> as_records{};
  std::optional<rdx::receive_operation<std::uint64_t>> report{};
  std::optional<rdx::operation> verdict{};
  std::uint64_t bad = 0;
  bool barrier_sent = false;
  steady::time_point next_look{}, deadline{};
};

// Moves s on without waiting. @return true once it is over; throws failure naming why it failed.
bool advance(session& s, const options& o, record* table) {
  const auto now = steady::now();
  if (!s.verdict) {
    if (!s.report->done()) {
      // The client takes as long as its table needs: wait while it is connected.
      // (Ending early would deregister the table under its feet.)
      if (s.sock && now >= s.next_look) {
        if (!peer_connected(s.sock)) throw failure("the client went away before reporting");
        s.next_look = now + std::chrono::seconds(1);
      }
      return false;
    }
    if (s.report->error()) throw failure("waiting for the client's report: " + s.conn->failure_message());
    if (s.report->value() != o.records)
      throw failure("the client checked " + std::to_string(s.report->value()) + " records");
    const std::uint64_t stride = o.all ? 1 : stride_for(o.records);
    for (std::uint64_t i = 0; i < o.records; ++i) {
      const std::string p = final_problem(table[s.first + i], i, stride);
      if (!p.empty() && s.bad++ < 5)
        std::fprintf(stderr, "  record %" PRIu64 ": %s\n", s.first + i, p.c_str());
    }
    s.verdict.emplace(s.ctl->send(s.bad));
    s.deadline = now + o.timeout;
  }
  if (!s.verdict->done()) {
    if (now > s.deadline) throw failure("sending the verdict: no completion within the timeout");
    return false;
  }
  if (s.verdict->error()) throw failure("sending the verdict: " + s.verdict->error().message());
  if (s.sock) {
    // The client's last step: one byte each way, so no traffic is in flight when the queue pairs go.
    if (!rdx::tcp::try_barrier(s.sock, s.barrier_sent, s.deadline)) return false;
  }
  if (s.bad != 0) throw failure(std::to_string(s.bad) + " records are wrong in the server's table");
  return true;
}

// The server: a table of clients x records; client i (in arrival order) gets
// slice i. The record keys in each slice count from 0, as the client expects.
int serve(const options& o) {
  rdx::context ctx = examples::open_device(o.device);
  rdx::protection_domain pd(ctx);
  const std::uint64_t total = std::uint64_t{o.records} * o.clients;
  auto table = rdx::make_window_buffer<std::uint64_t, table_rights>(pd, total * words_per_record);
  auto* recs = reinterpret_cast<record*>(table.data());
  for (std::uint64_t i = 0; i < total; ++i) {
    recs[i].key = i % o.records;
    recs[i].version = 0;
    set_value(recs[i], initial_value(i % o.records));
  }
  // --pool: every client's recv_depth credits from one receive pool, a
  // quarter more for busy clients to grow by, the rest kept for joiners.
  const rdx::connection_attr attr = attr_of(o);
  const std::uint32_t joining = o.clients * attr.recv_depth;
  const rdx::receive_pool_attr pool{
      .buffers = o.pool ? joining * 5 / 4 : 0, .buffer_size = attr.message_size, .reserve = joining};
  rdx::worker w(pd, rdx::worker_attr{.events = true, .pool = pool});
  std::printf("kv_window server: %u records of %zu bytes for each of %u client(s) on %s%s, one thread\n",
              o.records, sizeof(record), o.clients, ctx.name().c_str(), o.cm ? " (rdma_cm)" : "");

  std::map<rdx::connection*, std::unique_ptr<session>> sessions;
  std::uint32_t arrived = 0, passed = 0, failed = 0;
  // A client's slice, granted twice with exactly read, write and atomic
  // rights: as records, and as 8-byte words for atomics. Nothing else of the table.
  const rdx::acceptor::prepare_fn prepare = [&](rdx::connection& c, const std::string& peer) {
    if (arrived == o.clients) throw failure("every slice of the table is taken");
    auto s = std::make_unique<session>();
    s->first = std::uint64_t{arrived} * o.records;
    s->tag = "[client " + std::to_string(++arrived) + " " + peer + (o.cm ? " over rdma_cm" : "") + "]";
    s->ctl.emplace(c);
    s->words.emplace(c, table.region(),
                     std::span<std::uint64_t>(table.data() + s->first * words_per_record,
                                              std::size_t{o.records} * words_per_record));
    s->as_records.emplace(c, table.region(), std::span<record>(recs + s->first, o.records));
    std::vector<rdx::window_descriptor> grants{s->as_records->descriptor(), s->words->descriptor()};
    sessions[&c] = std::move(s);
    return grants;
  };
  std::optional<rdx::acceptor> tcp_acc;
#if RDX_EXAMPLES_CM
  std::optional<rdx::cm::acceptor> cm_acc;
  if (o.cm) {
    cm_acc.emplace(w, pd, rdx::cm::listener(o.port), attr_of(o),
                   rdx::cm::acceptor_options{.timeout = o.timeout}, prepare);
    w.watch(cm_acc->fd());
    std::printf("  waiting for %u client(s) on rdma_cm port %u\n", o.clients, cm_acc->port());
  }
#endif
  if (!o.cm) {
    tcp_acc.emplace(w, pd, rdx::tcp::listener::bind("", o.port), attr_of(o),
                    rdx::acceptor_options{.timeout = o.timeout}, prepare);
    w.watch(tcp_acc->fd());
    std::printf("  waiting for %u client(s) on TCP port %u\n", o.clients, tcp_acc->port());
  }
  std::fflush(stdout);
  auto next_setup = [&]() -> std::optional<rdx::accepted> {
#if RDX_EXAMPLES_CM
    if (cm_acc) return cm_acc->poll();
#endif
    return tcp_acc->poll();
  };
  auto end = [&](std::map<rdx::connection*, std::unique_ptr<session>>::iterator it, const std::string& why) {
    session& s = *it->second;
    if (why.empty()) {
      ++passed;
      std::printf("%s all %u records of its slice in their final state (version %" PRIu64 ")\n",
                  s.tag.c_str(), o.records, final_version);
    } else {
      ++failed;
      std::fprintf(stderr, "%s FAILED: %s\n", s.tag.c_str(), why.c_str());
    }
    std::fflush(stdout);
    sessions.erase(it);  // operations, grants and channel first, then the connection (member order)
  };
  auto last_event = steady::now();
  while (passed + failed < o.clients || !sessions.empty()) {
    (void)w.wait(std::chrono::milliseconds{100});
    while (std::optional<rdx::accepted> a = next_setup()) {
      last_event = steady::now();
      auto it = a->conn ? sessions.find(a->conn.get()) : sessions.end();
      if (!*a) {
        if (it != sessions.end()) {
          it->second->conn = std::move(a->conn);  // destroyed after what prepare made on it
          end(it, "set-up: " + a->message);
        } else {
          ++failed;
          std::fprintf(stderr, "[client %s] FAILED in set-up: %s\n", a->peer.c_str(), a->message.c_str());
        }
        continue;
      }
      session& s = *it->second;
      s.conn = std::move(a->conn);
      s.sock = std::move(a->socket);
      s.report.emplace(s.ctl->receive());
      std::printf("%s connected (records %" PRIu64 " to %" PRIu64 "); %zu in progress\n", s.tag.c_str(),
                  s.first, s.first + o.records - 1, sessions.size());
      std::fflush(stdout);
    }
    for (auto it = sessions.begin(); it != sessions.end();) {
      auto cur = it++;
      if (!cur->second->conn) continue;  // still in set-up
      std::string why;
      bool over = false;
      try {
        over = advance(*cur->second, o, recs);
      } catch (const std::exception& e) {
        why = e.what();
        over = true;
      }
      if (over) {
        last_event = steady::now();
        end(cur, why);
      }
    }
    if (sessions.empty() && arrived < o.clients && steady::now() - last_event > o.timeout) {
      std::fprintf(stderr, "  no client within %lld s: stopping after %u of %u\n",
                   static_cast<long long>(o.timeout.count()), passed + failed, o.clients);
      failed += o.clients - (passed + failed);
      break;
    }
  }
  if (o.clients > 1) std::printf("server: %u of %u clients passed\n", passed, o.clients);
  if (failed != 0)
    throw failure(std::to_string(failed) + " of " + std::to_string(o.clients) + " clients failed");
  if (o.clients == 1)
    std::printf("server: all %u records in their final state (version %" PRIu64 ")\n", o.records,
                final_version);
  return 0;
}

int run_client(const options& o) {
  rdx::context ctx = examples::open_device(o.device);
  rdx::protection_domain pd(ctx);
  rdx::connection conn(pd, attr_of(o));
  rdx::channel<std::uint64_t> ctl(conn);
  const std::uint64_t stride = o.all ? 1 : stride_for(o.records);
  rdx::peer_offer offer;
  std::string peer;
  std::function<void()> finish = [] {};
#if RDX_EXAMPLES_CM
  if (o.cm) {
    // The server may start a moment after its clients: wait for it, up to --timeout.
    offer = rdx::cm::connect(conn, o.server, o.port, {},
                             rdx::cm::options{.timeout = o.timeout, .wait_for_listener = true});
    peer = rdx::detail::host_port(o.server, o.port) + " over rdma_cm";
  }
#endif
  if (!o.cm) {
    auto sock = std::make_shared<rdx::tcp::socket>(examples::bootstrap_socket(o.server, o.port, o.timeout));
    offer = rdx::exchange_and_connect(*sock, conn, {}, o.timeout);
    peer = sock->peer();
    finish = [sock, &o] { rdx::tcp::barrier(*sock, o.timeout); };
  }
  if (offer.windows.size() != 2)
    throw failure("the server granted " + std::to_string(offer.windows.size()) + " windows, expected 2");
  rdx::remote_window<record, rdx::rights::read | rdx::rights::write> table(conn, offer.windows[0]);
  rdx::remote_window<std::uint64_t, rdx::rights::atomic> words(conn, offer.windows[1]);
  if (table.size() != o.records)
    throw failure("the server's table has " + std::to_string(table.size()) + " records");
  std::printf("kv_window client: %zu records at %s over %u queue pair(s)\n", table.size(), peer.c_str(),
              conn.queue_pair_count());

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
  finish();
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
      } else if (r.match({"--cm"})) {
        o.cm = true;
      } else if (r.match({"--pool"})) {
        o.pool = true;
      } else if (r.match({"--clients"}, &v)) {
        o.clients = static_cast<std::uint32_t>(examples::parse_number("--clients", v, 1, 65536));
      } else if (r.match({"-t", "--timeout"}, &v)) {
        o.timeout = std::chrono::seconds(examples::parse_number("--timeout", v, 1, 86400));
      } else if (r.peek().starts_with("-") && r.peek().size() > 1) {
        throw examples::usage_error("unknown option " + std::string(r.peek()));
      } else {
        if (!o.server.empty()) throw examples::usage_error("more than one server address");
        o.server = r.take();
      }
    }
    if (o.clients > 1 && !o.server.empty())
      throw examples::usage_error("--clients is for the server: drop it, or drop " + o.server);
    if (o.pool && !o.server.empty())
      throw examples::usage_error("--pool is for the server: drop it, or drop " + o.server);
#if !RDX_EXAMPLES_CM
    if (o.cm) throw examples::usage_error("--cm: this kv_window was built without librdmacm (rdx::cm)");
#endif
  } catch (const examples::usage_error& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", argv[0], e.what());
    return 2;
  }
  try {
    return o.server.empty() ? serve(o) : run_client(o);
  } catch (const failure& e) {
    std::fprintf(stderr, "%s: FAILED: %s\n", argv[0], e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
  }
  return 1;
}
