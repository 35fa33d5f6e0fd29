// kv_window's server: every client on one worker, served from one thread.
//
// An acceptor (rdx::acceptor over TCP, rdx::cm::acceptor over rdma_cm) sets
// clients up while the others are served. Each client's session waits for
// its report, checks its slice, sends the verdict and (over TCP) meets the
// client at a last barrier; the loop below moves every session on when the
// worker wakes (or, polling, on every pass). A client that fails, at set-up or
// after, ends its own session only. With --psk-file clients are accepted here
// and each exchange is authenticated, blocking (rdx::acceptor has no
// authentication): one client's set-up at a time, each within --timeout.
#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/channel.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>
#if RDX_EXAMPLES_CM
#include <rdx/cm/cm.hpp>
#endif

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cli.hpp"
#include "kv_window.hpp"
#include "options.hpp"
#include "psk_setup.hpp"
#include "record.hpp"
#include <poll.h>
#include <sys/socket.h>

namespace kv {
namespace {

using steady = std::chrono::steady_clock;

//! False once the TCP peer has closed its end (it never sends before the end).
bool peer_connected(const rdx::tcp::socket& s) {
  pollfd p{s.native_handle(), POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return true;
  char c = 0;
  return ::recv(s.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

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

}  // namespace

// The server: a table of clients x records; client i (in arrival order) gets
// slice i. The record keys in each slice count from 0, as the client expects.
int serve(const options& o) {
  const app::setup_key key(o.psk_file);  // before any socket
  rdx::context ctx = app::open_device(o.device);
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
  // One client's server sleeps with -e only; more clients are always slept on.
  const bool sleep = o.events || o.clients > 1;
  rdx::worker w(pd, rdx::worker_attr{.events = sleep, .pool = pool});
  std::printf("kv_window server: %u records of %zu bytes for each of %u client(s) on %s%s, one thread (%s)\n",
              o.records, sizeof(record), o.clients, ctx.name().c_str(), o.cm ? " (rdma_cm)" : "",
              sleep ? "sleeping on its worker's descriptor" : "polling");

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
  std::optional<rdx::tcp::listener> auth_l;  // --psk-file: set-ups here, authenticated
  if (!o.cm && key) {
    auth_l.emplace(rdx::tcp::listener::bind("", o.port));
    w.watch(auth_l->native_handle());
    std::printf("  waiting for %u client(s) on TCP port %u, set-up authenticated with --psk-file\n",
                o.clients, auth_l->port());
  } else if (!o.cm) {
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
    if (auth_l) {
      std::optional<rdx::tcp::socket> s = app::try_accept(*auth_l);
      if (!s) return std::nullopt;
      rdx::accepted a;
      a.socket = std::move(*s);
      return app::set_up_client(std::move(a), w, pd, attr_of(o), prepare, key,
                                rdx::exchange_options{.timeout = o.timeout});
    }
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
  unsigned spins = 0;
  while (passed + failed < o.clients || !sessions.empty()) {
    if (sleep) {
      (void)w.wait(std::chrono::milliseconds{100});
    } else {
      w.progress();
    }
    // Polling, set-ups (a system call) are looked at every 64 passes.
    const bool look = sleep || ++spins % 64 == 0;
    while (std::optional<rdx::accepted> a = look ? next_setup() : std::nullopt) {
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

}  // namespace kv
