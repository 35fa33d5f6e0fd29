// rdx's examples: --psk-file, the pre-shared key that authenticates a TCP
// set-up (rdx::auth), read once before any socket, and the server's side of
// an authenticated set-up on a worker. rdx::acceptor sets clients up without
// blocking but without authentication, so a server with a key sets each
// client up in a blocking exchange_and_connect: one client at a time, each up
// to the set-up timeout. A program that links rdx::auth defines
// RDX_EXAMPLES_AUTH=1; without it, --psk-file is refused (psk_build_check).
#pragma once

#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/error.hpp>
#if RDX_EXAMPLES_AUTH
#include <rdx/auth/psk.hpp>
#endif

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "cli.hpp"
#include <poll.h>

namespace app {

#if RDX_EXAMPLES_AUTH
inline constexpr bool built_with_auth = true;
#else
inline constexpr bool built_with_auth = false;
#endif

//! What --help says of this build's --psk-file.
inline const char* psk_build_note() {
  return built_with_auth ? "with rdx::auth" : "without rdx::auth: libssl-dev was not found";
}

//! Refuses --psk-file where the program was built without rdx::auth, naming the fix.
//! @throws usage_error
inline void psk_build_check(const std::string& program) {
  if (!built_with_auth)
    throw usage_error("--psk-file: this " + program +
                      " was built without rdx::auth (install libssl-dev and reconfigure)");
}

//! The key of --psk-file, or none. One key serves every set-up of the process.
class setup_key {
public:
  setup_key() = default;
  //! Reads the key file (hex digits, mode 600) now; an empty path gives no key.
  //! @throws rdx::error naming the file and what is wrong with it.
  explicit setup_key(const std::string& path) {
#if RDX_EXAMPLES_AUTH
    if (!path.empty()) key_ = rdx::auth::psk_key::from_file(path);
#else
    if (!path.empty())
      throw rdx::error(rdx::errc::invalid_argument, "--psk-file " + path + ": built without rdx::auth");
#endif
  }
  //! True when set-up is to be authenticated.
  explicit operator bool() const noexcept {
    return key_ != nullptr;
  }

  //! rdx::exchange_and_connect over s, authenticated with this key when there
  //! is one (a fresh psk_authenticator per set-up).
  //! @throws rdx::error: errc::authentication_failed when either side refuses
  //!         the other, and whatever exchange_and_connect throws.
  rdx::peer_offer exchange_and_connect(const rdx::tcp::socket& s, rdx::connection& c,
                                       std::span<const rdx::window_descriptor> grants,
                                       rdx::exchange_options eo) const {
#if RDX_EXAMPLES_AUTH
    std::optional<rdx::auth::psk_authenticator> a;
    if (key_) eo.auth = &a.emplace(key_);
#endif
    return rdx::exchange_and_connect(s, c, grants, eo);
  }

private:
#if RDX_EXAMPLES_AUTH
  std::shared_ptr<const rdx::auth::psk_key> key_;
#else
  std::shared_ptr<const rdx::keyed_mac> key_;  // always empty
#endif
};

//! Ends the set-up of a client a server has accepted (a.socket open; from
//! rdx::acceptor's hand_out or a listener): its connection on w with attr,
//! prepare's grants, then the exchange authenticated with key, blocking up to
//! eo.timeout. Returns a as an acceptor would: connected, or with error and
//! message (a refusal of the key says "refused (--psk-file)"), its connection
//! kept for the caller to destroy after what prepare made for it.
inline rdx::accepted set_up_client(rdx::accepted a, rdx::worker& w, const rdx::protection_domain& pd,
                                   const rdx::connection_attr& attr, const rdx::acceptor::prepare_fn& prepare,
                                   const setup_key& key, const rdx::exchange_options& eo) {
  a.handed_out = false;
  if (a.peer.empty()) a.peer = a.socket.peer();
  try {
    a.conn = std::make_unique<rdx::connection>(w, pd, attr);
    std::vector<rdx::window_descriptor> grants;
    if (prepare) grants = prepare(*a.conn, a.peer);
    a.offer = key.exchange_and_connect(a.socket, *a.conn, grants, eo);
  } catch (const std::system_error& e) {
    a.error = e.code();
    a.message =
        std::string(e.code() == rdx::errc::authentication_failed ? "refused (--psk-file): " : "") + e.what();
    a.socket.close();
  } catch (const std::exception& e) {
    a.error = rdx::make_error_code(rdx::errc::wire_format);
    a.message = e.what();
    a.socket.close();
  }
  return a;
}

//! A client waiting on l, accepted without waiting; none when nobody waits.
//! @throws rdx::error for a failed accept.
inline std::optional<rdx::tcp::socket> try_accept(const rdx::tcp::listener& l) {
  pollfd p{l.native_handle(), POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0 || (p.revents & POLLIN) == 0) return std::nullopt;
  try {
    return l.accept(std::chrono::milliseconds(100));  // one waits: returns at once
  } catch (const rdx::error& e) {
    if (e.code() == rdx::errc::timed_out) return std::nullopt;  // it gave up meanwhile
    throw;
  }
}

}  // namespace app
