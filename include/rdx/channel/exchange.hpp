// rdx: connecting a connection over the TCP bootstrap, together with the
// window grants each side offers.
//
// Optionally authenticated (exchange_options::auth): both sides prove they
// hold a pre-shared key first, and check a MAC over every byte that follows
// before any queue pair is connected. Then one endpoint message per queue
// pair: the first carries the credit word and the windows' memory with their
// keys for queue pair 0, message i the same memory with the keys for queue
// pair i. Then each side's settings block (connect/settings.hpp: queue pairs,
// recv_depth, message_size, per window its rights and element size). One
// deadline covers all of it. Anything malformed or inconsistent throws
// rdx::error (errc::wire_format) naming what arrived. The messages:
// rdx's design notes (share/doc/rdx/design.md), "Wire protocols".
#pragma once

#include <rdx/channel/connection.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/authenticator.hpp>
#include <rdx/connect/settings.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/wire.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace rdx {

//! How exchange_and_connect runs.
struct exchange_options {
  //! The whole exchange, not each step: a slow or silent peer holds it no longer.
  std::chrono::milliseconds timeout = tcp::default_timeout;
  connect_options connect{};  //!< the RTR and RTS settings of every queue pair
  //! When set (rdx::auth::psk_authenticator, say), the peer must prove it
  //! holds the key before anything else is exchanged, and a MAC over every
  //! byte of the exchange is checked before any queue pair is connected.
  authenticator* auth = nullptr;
};

namespace detail {

//! What one side sends in the exchange: per queue pair the descriptors of
//! its endpoint message (the credit word first, then every grant with that
//! queue pair's key), and the settings block.
struct offer_messages {
  std::vector<std::vector<remote_descriptor>> descriptors;  //!< one list per queue pair
  std::vector<std::byte> settings;                          //!< wire::encode_settings
};

//! This side's messages for connection info `mine` and `grants`.
//! @throws rdx::error (errc::invalid_argument) for too many grants or a grant of another connection.
[[nodiscard]] inline offer_messages make_offer_messages(const connection_info& mine,
                                                        std::span<const window_descriptor> grants,
                                                        const char* who) {
  if (grants.size() + 1 > wire::max_descriptors) {
    detail::throw_rdx(errc::invalid_argument, std::string(who) + ": too many windows");
  }
  const std::size_t nqp = mine.endpoints.size();
  for (const auto& g : grants) {
    if (!g.keys.empty() && g.keys.size() != nqp) {
      detail::throw_rdx(errc::invalid_argument, std::string(who) + ": a grant has keys for " +
                                                    std::to_string(g.keys.size()) +
                                                    " queue pairs, the connection " + std::to_string(nqp) +
                                                    " (was it made on another connection?)");
    }
  }
  offer_messages out;
  for (std::size_t i = 0; i < nqp; ++i) {
    std::vector<remote_descriptor>& desc = out.descriptors.emplace_back();
    if (i == 0) {
      desc.push_back(mine.credit_word);
    }
    for (const auto& g : grants) {
      remote_descriptor d = g.memory;
      if (!g.keys.empty()) {
        d.rkey = g.keys[i];
      }
      desc.push_back(d);
    }
  }
  wire::settings s{static_cast<std::uint32_t>(nqp), mine.recv_depth, mine.message_size, {}, mine.encrypt};
  for (const auto& g : grants) {
    s.windows.push_back({static_cast<std::uint32_t>(g.granted), g.element_size});
  }
  out.settings = wire::encode_settings(s);
  return out;
}

//! Checks the peer's endpoint messages (one per queue pair of this side)
//! against each other, as soon as they are in, before its settings are read:
//! a credit word in the first, and every window naming the same memory in
//! each; fail(what) throws. Returns the number of windows they name.
template <class Fail>
std::size_t check_endpoint_messages(const std::vector<wire::message>& got, Fail&& fail) {
  const std::size_t nqp = got.size();
  if (got[0].descriptors.empty()) {
    fail("the peer sent no credit word");
  }
  const std::size_t peer_windows = got[0].descriptors.size() - 1;
  for (std::size_t i = 1; i < nqp; ++i) {
    if (got[i].descriptors.size() != peer_windows) {
      fail("endpoint message " + std::to_string(i) + " has " + std::to_string(got[i].descriptors.size()) +
           " window keys, the first has " + std::to_string(peer_windows));
    }
    for (std::size_t j = 0; j < peer_windows; ++j) {
      const remote_descriptor& a = got[0].descriptors[j + 1];
      const remote_descriptor& b = got[i].descriptors[j];
      if (a.addr != b.addr || a.length != b.length) {
        fail("window " + std::to_string(j) + " names other memory for queue pair " + std::to_string(i));
      }
    }
  }
  return peer_windows;
}

//! The peer's offer from its endpoint messages (one per queue pair of this
//! side) and its settings block, checked for consistency; fail(what) throws.
template <class Fail>
[[nodiscard]] peer_offer read_peer_offer(const std::vector<wire::message>& got, const wire::settings& theirs,
                                         Fail&& fail) {
  const std::size_t nqp = got.size();
  const std::size_t peer_windows = check_endpoint_messages(got, fail);
  peer_offer peer;
  for (const auto& m : got) {
    peer.info.endpoints.push_back(m.ep);
  }
  const std::size_t nwin = theirs.windows.size();
  if (theirs.queue_pairs != nqp || nwin != peer_windows) {
    fail("the peer's settings disagree with its endpoint messages (" + std::to_string(theirs.queue_pairs) +
         " queue pairs, " + std::to_string(nwin) + " windows; its endpoint messages name " +
         std::to_string(nqp) + " and " + std::to_string(peer_windows) + ")");
  }
  peer.info.recv_depth = theirs.recv_depth;
  peer.info.message_size = theirs.message_size;
  peer.info.encrypt = theirs.encrypt;
  peer.info.credit_word = got[0].descriptors[0];
  for (std::size_t j = 0; j < nwin; ++j) {
    window_descriptor w{got[0].descriptors[j + 1],
                        static_cast<rights>(theirs.windows[j].rights),
                        theirs.windows[j].element_size,
                        {}};
    for (std::size_t i = 0; i < nqp; ++i) {
      w.keys.push_back(got[i].descriptors[i == 0 ? j + 1 : j].rkey);
    }
    peer.windows.push_back(std::move(w));
  }
  return peer;
}

}  // namespace detail

//! Sends this side's connection info and grants over s, receives the peer's,
//! and connects c to the peer; both sides call it, then meet at a barrier so
//! no message meets a queue pair that is not ready. Endpoint message i
//! carries the grants' keys for queue pair i (the first also carries the
//! credit word). @throws rdx::error: errc::wire_format for anything malformed
//! or inconsistent, errc::timed_out at the deadline, errc::authentication_failed
//! when o.auth refuses the peer; c is then still unconnected.
inline peer_offer exchange_and_connect(const tcp::socket& s, connection& c,
                                       std::span<const window_descriptor> grants, const exchange_options& o) {
  const auto deadline = tcp::clock::now() + o.timeout;
  const bool encrypt = c.attributes().encrypt;
  if (encrypt && o.auth == nullptr) {
    throw error(errc::invalid_argument,
                "exchange_and_connect: connection_attr::encrypt needs session keys from an authenticated "
                "set-up: set exchange_options::auth (rdx::auth::psk_authenticator with the pre-shared key)");
  }
  std::optional<tcp::socket::recording> rec;
  if (o.auth != nullptr) {
    o.auth->begin(s, deadline);
    rec.emplace(s, o.auth);
  }
  const connection_info info = c.local_info();
  const detail::offer_messages mine = detail::make_offer_messages(info, grants, "exchange_and_connect");
  const std::size_t nqp = mine.descriptors.size();
  auto fail = [&](const std::string& what) {
    throw error(errc::wire_format, "exchange_and_connect with " + s.peer() + ": " + what);
  };
  std::vector<wire::message> got;
  for (std::size_t i = 0; i < nqp; ++i) {
    got.push_back(tcp::exchange(s, info.endpoints[i], mine.descriptors[i], deadline));
  }
  (void)detail::check_endpoint_messages(got, fail);
  s.send_all(mine.settings, deadline, "send connection settings");
  std::vector<std::byte> block(wire::settings_header_size);
  s.recv_exact(block, deadline, "receive connection settings");
  block.resize(wire::settings_size(wire::settings_window_count(block)));
  s.recv_exact(std::span(block).subspan(wire::settings_header_size), deadline, "receive window grants");
  peer_offer peer = detail::read_peer_offer(got, wire::decode_settings(block), fail);
  if (o.auth != nullptr) {
    // Every byte above is in the transcript; a peer without the key, a
    // changed byte or a replay fails here, before any queue pair is connected.
    rec.reset();
    o.auth->finish(s, deadline);
  }
  // Checked once authenticated: a changed flag has failed the transcript MAC.
  if (const std::string why = detail::encrypt_disagreement(encrypt, peer.info.encrypt); !why.empty()) {
    throw error(errc::invalid_argument, "exchange_and_connect with " + s.peer() + ": " + why);
  }
  if (encrypt) {
    std::unique_ptr<message_seal> seal = o.auth->make_seal();
    if (!seal) {
      throw error(errc::invalid_argument,
                  "exchange_and_connect: connection_attr::encrypt needs session keys, and "
                  "exchange_options::auth derives none (use rdx::auth::psk_authenticator)");
    }
    c.seal_with(std::move(seal));
  }
  c.connect(peer.info, o.connect);
  tcp::barrier(s, deadline);
  return peer;
}

//! The same without throwing rdx::error: the same work as the throwing form; its rdx::error
//! becomes ec (cleared on success), with the code only, not the message's text. On failure the
//! value returned is empty and c is left as the throwing form leaves it. std::bad_alloc passes
//! through.
inline peer_offer exchange_and_connect(const tcp::socket& s, connection& c,
                                       std::span<const window_descriptor> grants, const exchange_options& o,
                                       std::error_code& ec) {
  return detail::value_or_code(ec, [&] { return exchange_and_connect(s, c, grants, o); });
}

//! The same, with a timeout for the whole exchange and connect options.
inline peer_offer exchange_and_connect(const tcp::socket& s, connection& c,
                                       std::span<const window_descriptor> grants,
                                       std::chrono::milliseconds timeout = tcp::default_timeout,
                                       const connect_options& opt = {}) {
  return exchange_and_connect(s, c, grants, exchange_options{.timeout = timeout, .connect = opt});
}

//! Connects two connections of this process to each other (loopback tests).
inline void connect_pair(connection& a, connection& b, const connect_options& opt = {}) {
  const connection_info ia = a.local_info();
  const connection_info ib = b.local_info();
  a.connect(ib, opt);
  b.connect(ia, opt);
}

}  // namespace rdx
