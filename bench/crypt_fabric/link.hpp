// rdx_crypt_fabric: what every point of one side shares, and one point's
// connection pair: made fresh, met over a fresh TCP socket, authenticated
// with the pre-shared key in both modes (only the seal differs).
#pragma once

#include <rdx/auth/psk.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/sealed_fetch.hpp>
#include <rdx/channel/sealed_window.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "options.hpp"
#include "pattern.hpp"
#include "plan.hpp"

namespace crypt_fabric {

using clock = std::chrono::steady_clock;

//! What the points of one side use, made once before the first.
struct bench_env {
  const options& o;
  const plan& pl;
  const rdx::protection_domain& pd;
  std::shared_ptr<const rdx::auth::psk_key> key;
  const rdx::tcp::listener* listener = nullptr;           //!< the server's; nullptr on the client
  std::optional<rdx::registered_buffer<std::byte>> bulk;  //!< a transfer's source or a fetch's destination
                                                          //!< (client); their window or source (server)
  std::vector<std::byte> buf;                             //!< a message received or echoed
  std::vector<double> rtt;                                //!< a latency point's round trips, us
  std::vector<std::string> problems;                      //!< every wrong byte found, and where

  [[nodiscard]] bool client() const noexcept { return listener == nullptr; }
};

//! What a point measured (on the client).
struct point_result {
  double mbps = 0;  //!< payload bytes / s, 10^6
  double p50_us = 0;
  double p99_us = 0;
};

//! Records wrong bytes of one point: the first few in full, on stderr too.
class checker {
public:
  checker(bench_env& e, const point& p) : e_(e), p_(p) {}

  //! True when m says got bytes matched (and want arrived); else records
  //! where `what` k differs. Builds no string unless something is wrong.
  bool ok(const char* what, std::uint64_t k, const mismatch& m, std::size_t got, std::size_t want) {
    if (got == want && m.offset == got) {
      return true;
    }
    if (++wrong_ <= 3) {
      char text[160];
      if (got != want) {
        std::snprintf(text, sizeof text, "%s %llu: %zu bytes arrived, expected %zu", what,
                      static_cast<unsigned long long>(k), got, want);
      } else {
        std::snprintf(text, sizeof text, "%s %llu, byte %zu: expected 0x%02x, found 0x%02x", what,
                      static_cast<unsigned long long>(k), m.offset, m.expected, m.found);
      }
      say(text);
    } else if (wrong_ == 4) {
      say("more wrong messages follow; only the first 3 are shown");
    }
    return false;
  }
  //! Records a problem the peer reported, or one that is not about one message.
  void say(const std::string& what) {
    e_.problems.push_back(describe(p_) + ": " + what);
    std::fprintf(stderr, "  WRONG: %s\n", e_.problems.back().c_str());
  }

private:
  bench_env& e_;
  const point& p_;
  std::uint64_t wrong_ = 0;
};

//! The attributes of a point's connection: a message buffer of its payload
//! (a message size, or 16 bytes for a transfer's or fetch's short messages) plus the seal's overhead in both
//! modes, so plain and sealed connections have the same buffers.
inline rdx::connection_attr attr_for(const bench_env& e, const point& p) {
  std::uint64_t payload = p.what == kind::message ? p.size : 16;
  payload = std::max<std::uint64_t>(payload, 16);  // the 8-byte replies fit
  const auto size = static_cast<std::uint32_t>(payload + rdx::sealed_message_overhead);
  return rdx::connection_attr{.queue_pairs = 1,
                              .recv_depth = ring_depth(payload),
                              .message_size = size,
                              .gid_index = e.o.gid_index,
                              .encrypt = p.how == mode::sealed};
}

//! One point's connection, connected to the peer's.
class link {
public:
  //! Makes the connection (granting window to the peer when not empty: to
  //! write for a transfer, to read for a fetch), meets the peer on a fresh
  //! socket, agrees on p, and connects with the key.
  //! @throws rdx::error for a failed step, failure for a peer out of step.
  link(const bench_env& e, const point& p, std::span<std::byte> window)
      : conn_(e.pd, attr_for(e, p)), timeout_(e.o.timeout), what_(describe(p)) {
    if (!window.empty() && p.what == kind::fetch) {
      read_grant_.emplace(conn_, e.bulk->region(), window);
    } else if (!window.empty()) {
      grant_.emplace(conn_, e.bulk->region(), window);
    }
    const auto deadline = clock::now() + timeout_;
    sock_ = e.client() ? rdx::tcp::connect(e.o.server, e.o.port, timeout_) : e.listener->accept(timeout_);
    agree_point(sock_, p, deadline);
    rdx::auth::psk_authenticator auth(e.key);
    std::vector<rdx::window_descriptor> grants;
    if (grant_) {
      grants.push_back(grant_->descriptor());
    }
    if (read_grant_) {
      grants.push_back(read_grant_->descriptor());
    }
    const bool sealed_bulk = p.what != kind::message && p.how == mode::sealed;
    const auto chunk = static_cast<std::uint32_t>(e.pl.chunk);
    // The server's sealed windows are granted in the set-up; their seal comes from it.
    if (sealed_bulk && !e.client() && p.what == kind::transfer) {
      reader_.emplace(conn_, e.pd, chunk, p.size);
      landing_.emplace(conn_, reader_->landing());
      grants.push_back(landing_->descriptor());
    } else if (sealed_bulk && !e.client()) {
      source_.emplace(conn_, e.pd, chunk, p.size);
      source_grant_.emplace(conn_, source_->window());
      grants.push_back(source_grant_->descriptor());
    }
    const auto left = std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now()),
                               std::chrono::milliseconds{1});
    offer_ = rdx::exchange_and_connect(sock_, conn_, grants,
                                       rdx::exchange_options{.timeout = left, .auth = &auth});
    if (sealed_bulk) {
      window_seal_ = auth.make_window_seal();
      if (reader_) {
        (void)reader_->seal_with(*window_seal_);
      }
      if (source_) {
        (void)source_->seal_with(*window_seal_);
      }
    }
  }
  link(const link&) = delete;
  link& operator=(const link&) = delete;
  link(link&&) = delete;
  link& operator=(link&&) = delete;
  ~link() = default;

  [[nodiscard]] rdx::connection& conn() noexcept { return conn_; }
  [[nodiscard]] const rdx::peer_offer& offer() const noexcept { return offer_; }
  //! A sealed transfer's window seal (the set-up's window keys).
  [[nodiscard]] rdx::message_seal& window_seal() noexcept { return *window_seal_; }
  //! A sealed transfer's reader (the server's), its landing window granted.
  [[nodiscard]] rdx::sealed_reader& reader() noexcept { return *reader_; }
  //! A sealed fetch's source (the server's), its window granted to read.
  [[nodiscard]] rdx::sealed_source& source() noexcept { return *source_; }
  //! @throws failure as wait() when ec is an error.
  void check(const std::error_code& ec, const char* what, std::uint64_t k) const {
    if (ec) {
      fail(ec, what, k);
    }
  }

  //! Waits for op, the k-th `what` of the point (a send or a write).
  //! @throws failure naming the point, the operation, the error and why the connection failed.
  void wait(rdx::operation& op, const char* what, std::uint64_t k) {
    if (const std::error_code ec = op.wait(timeout_)) {
      fail(ec, what, k);
    }
  }
  //! Waits for a receive by polling, as rdx_bench's loops do (wait() would
  //! first make this side's own last request signaled). @throws as wait().
  void take(rdx::operation& op, const char* what, std::uint64_t k) {
    const auto deadline = clock::now() + timeout_;
    for (unsigned spins = 1; !op.test(); ++spins) {
      if (spins % 1024 == 0 && clock::now() > deadline) {
        fail(rdx::make_error_code(rdx::errc::timed_out), what, k);
      }
    }
    if (op.error()) {
      fail(op.error(), what, k);
    }
  }

  //! The peer is done too: nothing is in flight when the queue pairs go.
  void finish() { rdx::tcp::barrier(sock_, timeout_); }

private:
  [[noreturn]] void fail(const std::error_code& ec, const char* what, std::uint64_t k) const {
    std::string why = ec.message();
    if (ec == rdx::errc::timed_out) {
      why = "no completion within " + std::to_string(timeout_.count()) +
            " s (has the peer stopped? see its output; --timeout raises the limit)";
    } else if (conn_.failed()) {
      why += ": " + conn_.failure_message();
    }
    throw failure(what_ + ": " + what + " " + std::to_string(k) + ": " + why);
  }

  rdx::connection conn_;
  std::optional<rdx::grant<std::byte, rdx::rights::write>> grant_;  // revoked before conn_ goes
  std::optional<rdx::grant<std::byte, rdx::rights::read>> read_grant_;
  std::unique_ptr<rdx::auth::aes_gcm_seal> window_seal_;  // outlives the reader and the source
  std::optional<rdx::sealed_reader> reader_;              // its landing outlives the grant
  std::optional<rdx::grant<std::byte, rdx::rights::write>> landing_;
  std::optional<rdx::sealed_source> source_;  // its window outlives the grant
  std::optional<rdx::grant<std::byte, rdx::rights::read>> source_grant_;
  rdx::tcp::socket sock_;
  rdx::peer_offer offer_;
  std::chrono::seconds timeout_;
  std::string what_;
};

}  // namespace crypt_fabric
