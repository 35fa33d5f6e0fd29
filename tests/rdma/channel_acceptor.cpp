// rdma tests: rdx::acceptor (rdx/channel/acceptor.hpp) accepts clients over
// TCP into a running worker without blocking its thread. One server thread
// serves clients that arrive together and later, each with a granted window
// and a message exchange checked byte by byte, while a silent client and one
// that sends foreign bytes fail only their own set-ups; a client refused by
// a full completion queue is reported with its numbers.
#include <catch2/catch.hpp>

#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/worker.hpp>

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "channel_support.hpp"

using namespace std::chrono_literals;

namespace {

struct record {
  std::uint32_t client;
  std::uint32_t seq;
  std::uint64_t check;
};

std::uint64_t check_of(std::uint32_t id) { return (std::uint64_t{id} << 32 | 0x5a5a) * 0x9e3779b97f4a7c15ull; }

constexpr std::size_t window_words = 64;
using window_buffer = decltype(rdx::make_window_buffer<std::uint64_t, rdx::rights::write>(
    std::declval<const rdx::protection_domain&>(), window_words));

rdx::connection_attr small_attr() {
  return rdx::connection_attr{.send_depth = 16, .signal_interval = 8, .recv_depth = 8, .message_size = 64};
}

// A client: connects over TCP with the plain blocking exchange, writes its
// pattern into the server's window, then sends one record and checks the
// answer. Errors are collected, not thrown (Catch2 is not thread-safe).
void run_client(const rdx::protection_domain& pd, std::uint16_t port, std::uint32_t id, std::mutex& m,
                std::vector<std::string>& errors) {
  try {
    rdx::tcp::socket sock = rdx::tcp::connect("127.0.0.1", port, 30s);
    rdx::connection c(pd, small_attr());
    const rdx::peer_offer offer = rdx::exchange_and_connect(sock, c, {}, 30s);
    if (offer.windows.size() != 1) throw std::runtime_error("the server granted no window");
    rdx::remote_window<std::uint64_t, rdx::rights::write> win(c, offer.windows[0]);
    rdx::registered_buffer<std::uint64_t> out(pd, window_words);
    for (std::size_t j = 0; j < window_words; ++j) out[j] = std::uint64_t{id} * 1000003u + j;
    auto w = win.write(out, 0);
    if (auto ec = w.wait(30s)) throw std::runtime_error("window write: " + ec.message());
    rdx::channel<record> ch(c);
    auto s = ch.send(record{id, 1, check_of(id)});
    auto r = ch.receive();
    if (auto ec = r.wait(30s)) throw std::runtime_error("receive: " + ec.message() + " " + c.failure_message());
    if (auto ec = s.wait(30s)) throw std::runtime_error("send: " + ec.message());
    const record got = r.value();
    if (got.client != id || got.check != check_of(id) + 1) throw std::runtime_error("a wrong answer");
  } catch (const std::exception& e) {
    const std::lock_guard l(m);
    errors.push_back("client " + std::to_string(id) + ": " + e.what());
  }
}

// What the server keeps per client: the window it granted, then its traffic.
struct session {
  window_buffer mine;
  std::optional<rdx::grant<std::uint64_t, rdx::rights::write>> g{};
  std::unique_ptr<rdx::connection> conn{};
  std::optional<rdx::channel<record>> ch{};
  std::optional<rdx::receive_operation<record>> recv{};
  std::optional<rdx::operation> reply{};
  bool done = false;
};

// A TCP client that says nothing, or says something no rdx peer would.
rdx::tcp::socket stranger(std::uint16_t port, bool foreign_bytes) {
  rdx::tcp::socket s = rdx::tcp::connect("127.0.0.1", port, 10s);
  if (foreign_bytes) {
    const std::vector<std::byte> junk(64, std::byte{0xab});
    s.send_all(junk, std::chrono::steady_clock::now() + 5s);
  }
  return s;
}

}  // namespace

TEST_CASE("an acceptor sets up clients on a running worker from one thread", "[worker][acceptor]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  const bool events = GENERATE(false, true);
  INFO("event mode: " << events);
  rdx::worker w(pd, rdx::worker_attr{.events = events});
  std::map<rdx::connection*, std::unique_ptr<session>> sessions;
  rdx::acceptor acc(w, pd, rdx::tcp::listener::bind("", 0), small_attr(),
                    rdx::acceptor_options{.timeout = 3s},
                    [&](rdx::connection& c, const std::string&) {
                      auto s = std::make_unique<session>(session{
                          rdx::make_window_buffer<std::uint64_t, rdx::rights::write>(pd, window_words)});
                      s->g.emplace(c, s->mine);
                      std::vector<rdx::window_descriptor> d{s->g->descriptor()};
                      sessions[&c] = std::move(s);
                      return d;
                    });
  if (events) w.watch(acc.fd());
  const std::uint16_t port = acc.port();

  // A silent client and one with foreign bytes arrive first: neither may hold the others.
  rdx::tcp::socket silent = stranger(port, false);
  rdx::tcp::socket junk = stranger(port, true);
  constexpr std::uint32_t first = 12, later = 4;
  std::mutex m;
  std::vector<std::string> errors;
  std::vector<std::jthread> clients;
  for (std::uint32_t i = 0; i < first; ++i) clients.emplace_back(run_client, std::cref(pd), port, i, std::ref(m), std::ref(errors));

  std::uint32_t served = 0, failed_setups = 0;
  std::vector<std::string> failures;
  bool silent_failed = false, junk_failed = false;
  const auto start = std::chrono::steady_clock::now();
  auto served_all_at = std::chrono::steady_clock::time_point{};
  while (served < first + later || failed_setups < 2) {
    REQUIRE(std::chrono::steady_clock::now() - start < 60s);
    if (events) {
      const std::error_code ec = w.wait(50ms);
      REQUIRE((!ec || ec == rdx::errc::timed_out));
    } else {
      w.progress();
    }
    while (std::optional<rdx::accepted> a = acc.poll()) {
      session* s = a->conn ? sessions.at(a->conn.get()).get() : nullptr;
      if (!*a) {
        ++failed_setups;
        failures.push_back(a->message);
        if (a->error == rdx::errc::timed_out) silent_failed = true;
        if (a->error == rdx::errc::wire_format) junk_failed = true;
        if (s != nullptr) {
          s->g.reset();
          sessions.erase(a->conn.get());
        }
        continue;
      }
      s->conn = std::move(a->conn);
      s->ch.emplace(*s->conn);
      s->recv.emplace(s->ch->receive());
    }
    for (auto& [key, sp] : sessions) {
      session& s = *sp;
      if (!s.conn || s.done) continue;
      if (s.reply) {
        if (!s.reply->done()) continue;
        REQUIRE(s.reply->error() == std::error_code{});
        s.done = true;
        if (++served == first) {
          // The second wave arrives while the worker serves: set up the same way.
          for (std::uint32_t i = first; i < first + later; ++i)
            clients.emplace_back(run_client, std::cref(pd), port, i, std::ref(m), std::ref(errors));
        }
        if (served == first + later) served_all_at = std::chrono::steady_clock::now();
        continue;
      }
      if (!s.recv->done()) continue;
      INFO(s.conn->failure_message());
      REQUIRE(s.recv->error() == std::error_code{});
      const record r = s.recv->value();
      REQUIRE(r.check == check_of(r.client));
      // The client's write landed before its message: every word is its own.
      for (std::size_t j = 0; j < window_words; ++j) REQUIRE(s.mine[j] == std::uint64_t{r.client} * 1000003u + j);
      s.reply.emplace(s.ch->send(record{r.client, 2, r.check + 1}));
    }
  }
  clients.clear();  // joins
  {
    const std::lock_guard l(m);
    INFO((errors.empty() ? std::string() : errors.front()));
    REQUIRE(errors.empty());
  }
  INFO((failures.empty() ? std::string() : failures.front()));
  CHECK(junk_failed);
  CHECK(silent_failed);
  // Every client was served before the silent one's set-up deadline ran out.
  CHECK(served_all_at != std::chrono::steady_clock::time_point{});
  CHECK(served_all_at - start < 3s);
  CHECK(acc.pending() == 0);
  CHECK(w.connections() == first + later);
  sessions.clear();
  CHECK(w.connections() == 0);
}

TEST_CASE("an acceptor reports a client its worker cannot take, and goes on", "[worker][acceptor]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  // The device may round the queue up: a connection of the worker's own
  // fills it so that one client of small_attr() (16 + 8 + 1 entries) fits.
  rdx::worker w(pd, rdx::worker_attr{.cq_depth = 64});
  rdx::connection_attr filler_attr = small_attr();
  filler_attr.recv_depth = static_cast<std::uint32_t>(w.cq_capacity() - 2 * 25 + 8);
  rdx::connection filler(w, pd, filler_attr);
  REQUIRE(w.cq_capacity() - w.cq_reserved() == 25);
  rdx::acceptor acc(w, pd, rdx::tcp::listener::bind("", 0), small_attr(), rdx::acceptor_options{.timeout = 10s});
  std::vector<std::string> client_errors(2);
  auto set_up_only = [&pd, port = acc.port()](std::string& why) {
    try {
      rdx::tcp::socket sock = rdx::tcp::connect("127.0.0.1", port, 30s);
      rdx::connection c(pd, small_attr());
      (void)rdx::exchange_and_connect(sock, c, {}, 30s);
    } catch (const std::exception& e) {
      why = e.what();
    }
  };
  std::vector<rdx::accepted> results;
  {
    std::jthread c1(set_up_only, std::ref(client_errors[0]));
    std::jthread c2(set_up_only, std::ref(client_errors[1]));
    const auto start = std::chrono::steady_clock::now();
    while (results.size() < 2) {
      REQUIRE(std::chrono::steady_clock::now() - start < 30s);
      w.progress();
      while (std::optional<rdx::accepted> a = acc.poll()) results.push_back(std::move(*a));
      std::this_thread::sleep_for(1ms);
    }
  }
  const bool first_ok = static_cast<bool>(results[0]);
  const rdx::accepted& ok = first_ok ? results[0] : results[1];
  const rdx::accepted& refused = first_ok ? results[1] : results[0];
  REQUIRE(static_cast<bool>(ok));
  REQUIRE_FALSE(ok.conn->failed());
  REQUIRE_FALSE(static_cast<bool>(refused));
  INFO(refused.message);
  CHECK(refused.error == rdx::errc::limit_exceeded);
  CHECK(refused.conn == nullptr);
  CHECK(refused.message.find("cq_depth") != std::string::npos);
  // The refused client learns at once that the server closed its set-up.
  CHECK((client_errors[0].empty() != client_errors[1].empty()));
  CHECK(w.connections() == 2);
}
