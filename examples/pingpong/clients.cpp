// pingpong --clients N: every client on one worker, served from one thread.
//
// An acceptor sets clients up while the others are served: over TCP
// (rdx::acceptor) pingpong's settings go first (the acceptor's preamble),
// then the exchange of exchange_and_connect; over rdma_cm (rdx::cm::acceptor)
// they go as the first message each way, as with one client. Clients are the
// same program as for one client.
// With --psk-file the acceptor hands each client out after its settings, and
// the client's exchange is authenticated here, blocking (rdx::acceptor has no
// authentication): one client's set-up at a time, each within --timeout.
// Each session is a small state machine that the loop below moves on when
// its operation completes; a step that takes longer than --timeout fails
// that session alone.
#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/channel.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>
#if RDX_EXAMPLES_CM
#include <rdx/cm/cm.hpp>
#endif

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cli.hpp"
#include "modes.hpp"
#include "payload.hpp"
#include "peer_settings.hpp"
#include "psk_setup.hpp"

namespace pingpong {

namespace {

double seconds_since(steady::time_point t) {
  return std::chrono::duration<double>(steady::now() - t).count();
}

struct worker_session {
  std::string tag;
  std::size_t words = 0;
  rdx::registered_buffer<std::uint64_t> mine;
  std::optional<rdx::grant<std::uint64_t, rdx::rights::write>> g{};
  std::unique_ptr<rdx::connection> conn{};
  rdx::tcp::socket sock{};
  std::uint32_t seed = 0;
  std::optional<rdx::remote_window<std::uint64_t, rdx::rights::write>> peer_win{};
  std::optional<rdx::channel<std::byte>> ch{};
  std::vector<std::byte> echo{};
  std::optional<rdx::operation> op{};             // the receive, echo or write in flight
  std::optional<rdx::operation> settings_send{};  // rdma_cm: pingpong's settings as a message
  std::array<std::byte, settings_size> settings_in{};
  enum class step { settings, payload, echo, barrier, done } at = step::payload;
  bool barrier_sent = false;
  std::uint32_t k = 0;
  steady::time_point started{}, step_deadline{};
};

// Moves s on as far as it can go without waiting; throws failure naming the round trip.
void advance_session(worker_session& s, const options& o) {
  const bool window = o.m == mode::window;
  auto* mine_bytes = reinterpret_cast<std::byte*>(s.mine.data());
  for (;;) {
    if (steady::now() > s.step_deadline)
      throw failure("round trip " + std::to_string(s.k) + ": nothing happened for " +
                    std::to_string(o.timeout.count()) + " s (has the client stopped? see its output)");
    switch (s.at) {
      case worker_session::step::settings:
        if (!s.op->done() || !s.settings_send->done()) return;
        for (rdx::operation* x : {&*s.op, &*s.settings_send}) {
          if (const std::error_code ec = x->error())
            throw failure("exchanging settings over rdma_cm: " + ec.message());
        }
        s.seed = decode_settings(s.settings_in, settings{static_cast<std::uint32_t>(o.m), o.iters, o.size, 0},
                                 s.tag)
                     .seed;
        s.op.reset();
        s.settings_send.reset();
        s.at = worker_session::step::payload;
        break;
      case worker_session::step::payload:
        if (window) {
          std::atomic_ref<std::uint64_t> seq(s.mine[s.words - 1]);
          if (seq.load(std::memory_order_acquire) != std::uint64_t{s.k} + 1) return;
          check_payload(mine_bytes, o, s.k, s.seed, "the payload");
          s.op.emplace(s.peer_win->write(s.g->local(), 0));
        } else {
          if (!s.op) s.op.emplace(s.ch->receive(std::span<std::byte>(s.echo)));
          if (!s.op->done()) return;
          if (const std::error_code ec = s.op->error())
            throw failure("round trip " + std::to_string(s.k) + ": channel receive failed: " + ec.message());
          if (s.op->byte_count() != o.size)
            throw failure("round trip " + std::to_string(s.k) + ": " + std::to_string(s.op->byte_count()) +
                          " bytes arrived, expected " + std::to_string(o.size));
          check_payload(s.echo.data(), o, s.k, s.seed, "the payload");
          s.op.emplace(s.ch->send(std::span<const std::byte>(s.echo)));
        }
        s.at = worker_session::step::echo;
        break;
      case worker_session::step::echo:
        if (!s.op->done()) return;
        if (const std::error_code ec = s.op->error())
          throw failure("round trip " + std::to_string(s.k) + ": " +
                        (window ? "window write" : "channel send") + " failed: " + ec.message() + " (" +
                        s.conn->failure_message() + ")");
        s.op.reset();
        s.at = ++s.k == o.iters ? worker_session::step::barrier : worker_session::step::payload;
        s.step_deadline = steady::now() + o.timeout;
        break;
      case worker_session::step::barrier: {
        // The client is done too: no traffic in flight when the queue pairs go
        // (over rdma_cm its last echo's completion says so: nothing follows it).
        if (!s.sock.is_open()) {
          s.at = worker_session::step::done;
          return;
        }
        if (!rdx::tcp::try_barrier(s.sock, s.barrier_sent, s.step_deadline)) return;
        s.at = worker_session::step::done;
        return;
      }
      case worker_session::step::done: return;
    }
  }
}

}  // namespace

int serve_typed_clients(const options& o) {
  const app::setup_key key(o.psk_file);  // before any socket
  rdx::context ctx = app::open_device(o.device);
  rdx::protection_domain pd(ctx);
  const bool window = o.m == mode::window;
  // A round trip has one operation in flight: 16 send-queue entries are plenty,
  // and each client reserves 16 + 16 + 1 entries of the worker's queue.
  const rdx::connection_attr attr{
      .send_depth = 16,
      .signal_interval = 8,
      .recv_depth = 16,
      // Over rdma_cm the first message carries pingpong's settings (24 bytes).
      .message_size = static_cast<std::uint32_t>(window ? 64 : std::max<std::size_t>(o.size, o.cm ? 64 : 1)),
      .port = o.ib_port,
      .gid_index = o.gid_index};
  // --pool: every client's recv_depth credits from one receive pool, a
  // quarter more for busy clients to grow by, the rest kept for joiners.
  const std::uint32_t joining = o.clients * attr.recv_depth;
  const rdx::receive_pool_attr pool{
      .buffers = o.pool ? joining * 5 / 4 : 0, .buffer_size = attr.message_size, .reserve = joining};
  rdx::worker w(pd, rdx::worker_attr{.events = o.events, .pool = pool});
  settings mine_settings{static_cast<std::uint32_t>(o.m), o.iters, o.size, 0};
  rdx::acceptor_options ao{.timeout = o.timeout, .connect = connect_opts(o)};
  ao.preamble.resize(settings_size);
  encode_settings(ao.preamble.data(), mine_settings);
  ao.peer_preamble_size = settings_size;
  if (key) ao.check_preamble = [](std::span<const std::byte>) { return rdx::preamble_verdict::hand_out; };
  const std::size_t words = (o.size + 7) / 8 + 1;  // payload, then the sequence word
  std::map<rdx::connection*, std::unique_ptr<worker_session>> sessions;
  std::uint32_t arrived = 0;
  const rdx::acceptor::prepare_fn prepare = [&](rdx::connection& c, const std::string& peer) {
    auto s = std::make_unique<worker_session>(
        worker_session{"[client " + std::to_string(++arrived) + " " + peer + "]", words,
                       rdx::make_window_buffer<std::uint64_t, rdx::rights::write>(pd, words)});
    s->started = steady::now();
    std::vector<rdx::window_descriptor> grants;
    if (window) {
      s->g.emplace(c, s->mine);
      grants.push_back(s->g->descriptor());
    }
    std::printf("%s arrived, %zu in set-up\n", s->tag.c_str(), sessions.size() + 1);
    sessions[&c] = std::move(s);
    return grants;
  };
  std::optional<rdx::acceptor> tcp_acc;
#if RDX_EXAMPLES_CM
  std::optional<rdx::cm::acceptor> cm_acc;
  if (o.cm) {
    cm_acc.emplace(w, pd, rdx::cm::listener(o.tcp_port), attr,
                   rdx::cm::acceptor_options{.timeout = o.timeout, .connect = connect_opts(o)}, prepare);
  }
#endif
  if (!o.cm) tcp_acc.emplace(w, pd, rdx::tcp::listener::bind("", o.tcp_port), attr, std::move(ao), prepare);
  // The next finished or failed set-up, never waiting.
  auto next_setup = [&]() -> std::optional<rdx::accepted> {
#if RDX_EXAMPLES_CM
    if (cm_acc) return cm_acc->poll();
#endif
    return tcp_acc->poll();
  };
  const int acc_fd = tcp_acc ? tcp_acc->fd() :
#if RDX_EXAMPLES_CM
                             cm_acc->fd();
#else
                             -1;
#endif
  const std::uint16_t acc_port = tcp_acc ? tcp_acc->port() :
#if RDX_EXAMPLES_CM
                                         cm_acc->port();
#else
                                         0;
#endif
  if (o.events) w.watch(acc_fd);
  const int room = w.cq_capacity() / static_cast<int>(attr.send_depth + attr.recv_depth + 1);
  std::printf(
      "rdx pingpong server (%s): %s, %u clients on one worker, one thread (%s); its queue of %d "
      "entries has room for %d\n",
      mode_name(o.m), ctx.name().c_str(), o.clients, o.events ? "sleeping on its descriptor" : "polling",
      w.cq_capacity(), room);
  if (key) std::printf("  set-up authenticated with --psk-file: one client's set-up at a time\n");
  std::printf("  waiting for %u clients on %s port %u\n", o.clients, o.cm ? "rdma_cm" : "TCP", acc_port);
  std::fflush(stdout);
  std::uint32_t served = 0, setup_failed = 0, failed = 0, running = 0;
  steady::time_point last_event = steady::now();
  auto end_session = [&](std::map<rdx::connection*, std::unique_ptr<worker_session>>::iterator it,
                         const std::string& cause, bool in_setup) {
    worker_session& s = *it->second;
    if (cause.empty()) {
      ++served;
      std::printf("%s finished after %.2f s: %u payloads of %zu bytes (%s) received, checked and echoed\n",
                  s.tag.c_str(), seconds_since(s.started), o.iters, o.size, mode_name(o.m));
    } else {
      ++(in_setup ? setup_failed : failed);
      std::fprintf(stderr, "%s FAILED %s after %.2f s: %s\n", s.tag.c_str(),
                   in_setup ? "in set-up" : "after set-up", seconds_since(s.started), cause.c_str());
    }
    last_event = steady::now();
    s.g.reset();  // the grant before its connection and memory
    sessions.erase(it);
  };
  unsigned spins = 0;
  while (served + setup_failed + failed < o.clients) {
    if (o.events) {
      (void)w.wait(std::chrono::milliseconds{100});
    } else {
      w.progress();
    }
    // The acceptor costs a system call: asked every 64 polls, or after each wake-up.
    if (o.events || ++spins % 64 == 0) {
      while (std::optional<rdx::accepted> a = next_setup()) {
        if (a->handed_out)  // --psk-file: its settings are in; the authenticated exchange
          *a = app::set_up_client(std::move(*a), w, pd, attr, prepare, key,
                                  {.timeout = o.timeout, .connect = connect_opts(o)});
        auto it = a->conn ? sessions.find(a->conn.get()) : sessions.end();
        if (!*a) {
          if (it != sessions.end()) {
            end_session(it, a->message, true);
          } else {
            ++setup_failed;
            std::fprintf(stderr, "[client %s] FAILED in set-up: %s\n", a->peer.c_str(), a->message.c_str());
          }
          continue;
        }
        worker_session& s = *it->second;
        try {
          if (o.cm) {
            // Pingpong's settings as the first message each way; checked in advance_session.
            s.ch.emplace(*a->conn);
            std::array<std::byte, settings_size> out{};
            encode_settings(out.data(), mine_settings);
            s.settings_send.emplace(s.ch->send(std::span<const std::byte>(out)));
            s.op.emplace(s.ch->receive(std::span<std::byte>(s.settings_in)));
            s.at = worker_session::step::settings;
          } else {
            s.seed = decode_settings(a->preamble, mine_settings, a->peer).seed;
          }
          if (window) {
            if (a->offer.windows.size() != 1)
              throw failure("the client granted " + std::to_string(a->offer.windows.size()) +
                            " windows, --window needs 1");
            s.peer_win.emplace(*a->conn, a->offer.windows[0]);
            if (s.peer_win->size() < words)
              throw failure("the client's window of " + std::to_string(s.peer_win->size()) +
                            " words is smaller than " + std::to_string(words));
          } else {
            if (!s.ch) s.ch.emplace(*a->conn);
            s.echo.resize(o.size);
          }
        } catch (const std::exception& e) {
          end_session(it, e.what(), true);
          continue;
        }
        s.conn = std::move(a->conn);
        s.sock = std::move(a->socket);
        s.step_deadline = steady::now() + o.timeout;
        ++running;
        std::printf("%s connected (%s), %u in progress\n", s.tag.c_str(),
                    rdx::to_string(s.conn->local_info().endpoints[0]).c_str(), running);
      }
      std::fflush(stdout);
    }
    for (auto it = sessions.begin(); it != sessions.end();) {
      auto cur = it++;
      worker_session& s = *cur->second;
      if (!s.conn) continue;  // still in set-up
      std::string cause;
      try {
        advance_session(s, o);
      } catch (const std::exception& e) {
        cause = e.what();
      }
      if (s.at == worker_session::step::done || !cause.empty()) {
        --running;
        end_session(cur, cause, false);
      }
    }
    if (sessions.empty() && steady::now() - last_event > o.timeout) {
      std::fprintf(stderr, "  no client for %lld s: stopping after %u of %u clients\n",
                   static_cast<long long>(o.timeout.count()), served + setup_failed + failed, o.clients);
      break;
    }
  }
  std::printf("%u clients handled: %u served, %u failed in set-up, %u failed after set-up\n",
              served + setup_failed + failed, served, setup_failed, failed);
  return failed == 0 && served > 0 ? 0 : 1;
}

}  // namespace pingpong
