// Helpers for the acceptor tests (rdx::acceptor over TCP, rdx::cm::acceptor
// over rdma_cm): what a client does once connected, what the server keeps
// per client, the server's loop (both acceptors have the same poll()), and
// a worker with room for one client only.
#pragma once

#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/channel.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/channel/worker.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "channel_support.hpp"

namespace acceptor_test {

using namespace std::chrono_literals;

struct record {
  std::uint32_t client;
  std::uint32_t seq;
  std::uint64_t check;
};

inline std::uint64_t check_of(std::uint32_t id) {
  return (std::uint64_t{id} << 32 | 0x5a5a) * 0x9e3779b97f4a7c15ull;
}

constexpr std::size_t window_words = 64;
using window_buffer = decltype(rdx::make_window_buffer<std::uint64_t, rdx::rights::write>(
    std::declval<const rdx::protection_domain&>(), window_words));

inline rdx::connection_attr small_attr() {
  return rdx::connection_attr{.send_depth = 16, .signal_interval = 8, .recv_depth = 8, .message_size = 64};
}

//! A client once connected: writes its pattern into the server's window,
//! then sends one record and checks the answer. @throws std::runtime_error.
inline void client_traffic(const rdx::protection_domain& pd, rdx::connection& c, const rdx::peer_offer& offer,
                           std::uint32_t id) {
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
}

//! What the server keeps per client: the window it granted, then its traffic.
struct session {
  window_buffer mine;
  std::optional<rdx::grant<std::uint64_t, rdx::rights::write>> g{};
  std::unique_ptr<rdx::connection> conn{};
  std::optional<rdx::channel<record>> ch{};
  std::optional<rdx::receive_operation<record>> recv{};
  std::optional<rdx::operation> reply{};
  bool done = false;
};

//! The server's side, on one thread: a session per client made by
//! prepare(), the set-ups an acceptor hands out, the answers.
struct server {
  const rdx::protection_domain& pd;
  std::map<rdx::connection*, std::unique_ptr<session>> sessions{};
  std::uint32_t served = 0;

  //! The acceptors' prepare_fn: a session with one granted window.
  rdx::acceptor::prepare_fn prepare() {
    return [this](rdx::connection& c, const std::string&) {
      auto s = std::make_unique<session>(
          session{rdx::make_window_buffer<std::uint64_t, rdx::rights::write>(pd, window_words)});
      s->g.emplace(c, s->mine);
      std::vector<rdx::window_descriptor> d{s->g->descriptor()};
      sessions[&c] = std::move(s);
      return d;
    };
  }

  //! Takes every set-up acc has finished: a failed one goes to on_failure
  //! (its session dropped), a connected one waits for its client's record.
  template <class Acceptor, class F>
  void take(Acceptor& acc, F&& on_failure) {
    while (std::optional<rdx::accepted> a = acc.poll()) {
      session* s = a->conn ? sessions.at(a->conn.get()).get() : nullptr;
      if (!*a) {
        if (s != nullptr) {
          s->g.reset();
          sessions.erase(a->conn.get());
        }
        a->conn.reset();
        on_failure(std::move(*a));
        continue;
      }
      s->conn = std::move(a->conn);
      s->ch.emplace(*s->conn);
      s->recv.emplace(s->ch->receive());
    }
  }

  //! Checks each record that came (and the window its client wrote before
  //! it) and answers it; on_served() as each answer completes.
  template <class F>
  void serve(F&& on_served) {
    for (auto& [key, sp] : sessions) {
      session& s = *sp;
      if (!s.conn || s.done) continue;
      if (s.reply) {
        if (!s.reply->done()) continue;
        REQUIRE(s.reply->error() == std::error_code{});
        s.done = true;
        ++served;
        on_served();
        continue;
      }
      if (!s.recv->done()) continue;
      INFO(s.conn->failure_message());
      REQUIRE(s.recv->error() == std::error_code{});
      const record r = s.recv->value();
      REQUIRE(r.check == check_of(r.client));
      for (std::size_t j = 0; j < window_words; ++j)
        REQUIRE(s.mine[j] == std::uint64_t{r.client} * 1000003u + j);
      s.reply.emplace(s.ch->send(record{r.client, 2, r.check + 1}));
    }
  }
};

//! A device, its protection domain, a worker (in event mode or not) and the server's side.
struct serving {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
  rdx::worker w;
  server srv{pd};
  explicit serving(bool events) : w(pd, rdx::worker_attr{.events = events}) {}
};

//! One turn of the server's loop: progress, or in event mode a bounded wait.
inline void drive(rdx::worker& w, bool events) {
  if (events) {
    const std::error_code ec = w.wait(50ms);
    REQUIRE((!ec || ec == rdx::errc::timed_out));
  } else {
    w.progress();
  }
}

//! A worker whose completion queue has room for one client of small_attr()
//! (16 + 8 + 1 entries): the device may round the queue up, so a connection
//! of the worker's own fills the rest.
struct one_client_worker {
  rdx::worker w;
  rdx::connection filler;
  explicit one_client_worker(const rdx::protection_domain& pd)
      : w(pd, rdx::worker_attr{.cq_depth = 64}), filler(w, pd, filler_attr(w)) {
    REQUIRE(w.cq_capacity() - w.cq_reserved() == 25);
  }
  static rdx::connection_attr filler_attr(const rdx::worker& w) {
    rdx::connection_attr a = small_attr();
    a.recv_depth = static_cast<std::uint32_t>(w.cq_capacity() - 2 * 25 + 8);
    return a;
  }
};

//! Polls acc (and progresses w) until n set-ups have ended, within 30 s.
template <class Acceptor>
std::vector<rdx::accepted> collect(rdx::worker& w, Acceptor& acc, std::size_t n) {
  std::vector<rdx::accepted> results;
  const auto start = std::chrono::steady_clock::now();
  while (results.size() < n) {
    REQUIRE(std::chrono::steady_clock::now() - start < 30s);
    w.progress();
    while (std::optional<rdx::accepted> a = acc.poll()) results.push_back(std::move(*a));
    std::this_thread::sleep_for(1ms);
  }
  return results;
}

//! Of two set-ups, the one refused for the full queue: checked with the
//! other, which is connected. @return its index in results.
inline std::size_t refused_for_room(const std::vector<rdx::accepted>& results) {
  REQUIRE(results.size() == 2);
  const std::size_t bad = static_cast<bool>(results[0]) ? 1 : 0;
  const rdx::accepted& ok = results[1 - bad];
  const rdx::accepted& refused = results[bad];
  REQUIRE(static_cast<bool>(ok));
  REQUIRE_FALSE(ok.conn->failed());
  REQUIRE_FALSE(static_cast<bool>(refused));
  INFO(refused.message);
  CHECK(refused.error == rdx::errc::limit_exceeded);
  CHECK(refused.conn == nullptr);
  CHECK(refused.message.find("cq_depth") != std::string::npos);
  return bad;
}

}  // namespace acceptor_test
