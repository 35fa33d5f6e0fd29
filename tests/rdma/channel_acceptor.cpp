// rdma tests: rdx::acceptor (rdx/channel/acceptor.hpp) accepts clients over
// TCP into a running worker without blocking its thread. One server thread
// serves clients that arrive together and later, each with a granted window
// and a message exchange checked byte by byte, while a silent client and one
// that sends foreign bytes fail only their own set-ups; a client refused by
// a full completion queue is reported with its numbers.
#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/worker.hpp>

#include <catch2/catch.hpp>

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

#include "acceptor_support.hpp"
#include "channel_support.hpp"
#include <netinet/in.h>
#include <sys/socket.h>

using namespace std::chrono_literals;

using namespace acceptor_test;

namespace {

// A client: connects over TCP with the plain blocking exchange, then does
// client_traffic(). Errors are collected, not thrown (Catch2 is not thread-safe).
void run_client(const rdx::protection_domain& pd, std::uint16_t port, std::uint32_t id, std::mutex& m,
                std::vector<std::string>& errors) {
  try {
    rdx::tcp::socket sock = rdx::tcp::connect("127.0.0.1", port, 30s);
    rdx::connection c(pd, small_attr());
    const rdx::peer_offer offer = rdx::exchange_and_connect(sock, c, {}, 30s);
    client_traffic(pd, c, offer, id);
  } catch (const std::exception& e) {
    const std::lock_guard l(m);
    errors.push_back("client " + std::to_string(id) + ": " + e.what());
  }
}

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
  const bool events = GENERATE(false, true);
  INFO("event mode: " << events);
  // The silent client's set-up fails at this deadline; every other client
  // must be served before it (long enough for 16 set-ups under ASan in a VM).
  constexpr auto setup_timeout = 10s;
  serving s(events);
  rdx::worker& w = s.w;
  server& srv = s.srv;
  rdx::acceptor acc(w, s.pd, rdx::tcp::listener::bind("", 0), small_attr(),
                    rdx::acceptor_options{.timeout = setup_timeout}, srv.prepare());
  if (events) w.watch(acc.fd());
  const std::uint16_t port = acc.port();

  // A silent client and one with foreign bytes arrive first: neither may hold the others.
  rdx::tcp::socket silent = stranger(port, false);
  rdx::tcp::socket junk = stranger(port, true);
  constexpr std::uint32_t first = 12, later = 4;
  std::mutex m;
  std::vector<std::string> errors;
  std::vector<std::jthread> clients;
  for (std::uint32_t i = 0; i < first; ++i)
    clients.emplace_back(run_client, std::cref(s.pd), port, i, std::ref(m), std::ref(errors));

  std::uint32_t failed_setups = 0;
  std::vector<std::string> failures;
  bool silent_failed = false, junk_failed = false;
  const auto start = std::chrono::steady_clock::now();
  auto served_all_at = std::chrono::steady_clock::time_point{};
  auto silent_failed_at = std::chrono::steady_clock::time_point{};
  while (srv.served < first + later || failed_setups < 2) {
    REQUIRE(std::chrono::steady_clock::now() - start < 60s);
    drive(w, events);
    srv.take(acc, [&](rdx::accepted a) {
      ++failed_setups;
      failures.push_back(a.message);
      if (a.error == rdx::errc::timed_out) {
        silent_failed = true;
        silent_failed_at = std::chrono::steady_clock::now();
      }
      if (a.error == rdx::errc::wire_format) junk_failed = true;
    });
    srv.serve([&] {
      if (srv.served == first) {
        // The second wave arrives while the worker serves: set up the same way.
        for (std::uint32_t i = first; i < first + later; ++i)
          clients.emplace_back(run_client, std::cref(s.pd), port, i, std::ref(m), std::ref(errors));
      }
      if (srv.served == first + later) served_all_at = std::chrono::steady_clock::now();
    });
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
  // Every client was served before the silent one's set-up deadline ran out:
  // a client that says nothing holds no one but itself.
  CHECK(served_all_at != std::chrono::steady_clock::time_point{});
  CHECK(served_all_at < silent_failed_at);
  CHECK(silent_failed_at - start >= setup_timeout);
  CHECK(acc.pending() == 0);
  CHECK(w.connections() == first + later);
  srv.sessions.clear();
  CHECK(w.connections() == 0);
}

TEST_CASE("an acceptor reports a client its worker cannot take, and goes on", "[worker][acceptor]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  one_client_worker room(pd);
  rdx::worker& w = room.w;
  rdx::acceptor acc(w, pd, rdx::tcp::listener::bind("", 0), small_attr(),
                    rdx::acceptor_options{.timeout = 10s});
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
    results = collect(w, acc, 2);
  }
  (void)refused_for_room(results);
  // The refused client learns at once that the server closed its set-up.
  CHECK((client_errors[0].empty() != client_errors[1].empty()));
  CHECK(w.connections() == 2);
}
