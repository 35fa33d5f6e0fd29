// rdx: the interface through which connection set-up authenticates the peer
// over the TCP bootstrap. It needs no cryptography itself; rdx::auth
// (rdx/auth/psk.hpp) implements it with a pre-shared key. The protocol:
// rdx's design notes (share/doc/rdx/design.md), "Wire protocols", "Authenticated
// set-up".
#pragma once

#include <rdx/connect/message_seal.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>

namespace rdx {

namespace tcp {
class socket;
}  // namespace tcp

//! Authenticates one set-up over one TCP socket. Both sides run the same
//! steps, so the protocol has no client or server role:
//!   1. begin(s, deadline) before any other byte on s;
//!   2. every byte of the exchange goes through s with this object hooked in
//!      (tcp::socket::record_with, or the tcp::socket::recording guard);
//!   3. finish(s, deadline) once the exchange is done and before any queue
//!      pair leaves RESET.
//! One object serves one set-up. Not thread-safe.
class authenticator {
public:
  authenticator() = default;
  authenticator(const authenticator&) = delete;
  authenticator& operator=(const authenticator&) = delete;
  authenticator(authenticator&&) = delete;
  authenticator& operator=(authenticator&&) = delete;
  virtual ~authenticator() = default;

  //! Proves to the peer that this side holds the key and checks the peer's
  //! proof, with fresh challenges from both sides.
  //! @throws rdx::error: errc::authentication_failed naming the check that
  //!         failed, errc::wire_format for a malformed message, errc::timed_out
  //!         naming the step.
  virtual void begin(const tcp::socket& s, std::chrono::steady_clock::time_point deadline) = 0;

  //! Sees every byte this side sends (`sent`) or receives on the socket after
  //! begin(), in order; bytes seen before begin() returns or after finish()
  //! starts are not part of the transcript.
  virtual void record(std::span<const std::byte> bytes, bool sent) noexcept = 0;

  //! Sends this side's MAC over the whole transcript and checks the peer's.
  //! @throws rdx::error as begin() does; errc::authentication_failed when the
  //!         transcripts differ.
  virtual void finish(const tcp::socket& s, std::chrono::steady_clock::time_point deadline) = 0;

  //! After a successful finish(): a message_seal keyed for this set-up alone
  //! (one key per direction, derived from the key and the whole
  //! transcript), for a connection with connection_attr::encrypt. The default
  //! gives none (nullptr): an authenticator that derives no keys cannot key
  //! encryption. @throws rdx::error when finish() has not succeeded.
  [[nodiscard]] virtual std::unique_ptr<message_seal> make_seal() { return nullptr; }
};

//! A MAC keyed by a secret that every party holds: 32 bytes over the
//! concatenation of `parts`. rdx::auth::psk_key is one (HMAC-SHA256 with the
//! pre-shared key). rdx::group's rendezvous and mesh use it to admit only the
//! job's ranks; each use puts its own label first, so a MAC made for one
//! step is never accepted for another. Thread-safe.
class keyed_mac {
public:
  //! Bytes of a MAC.
  static constexpr std::size_t mac_size = 32;
  keyed_mac() = default;
  keyed_mac(const keyed_mac&) = delete;
  keyed_mac& operator=(const keyed_mac&) = delete;
  keyed_mac(keyed_mac&&) = delete;
  keyed_mac& operator=(keyed_mac&&) = delete;
  virtual ~keyed_mac() = default;

  //! The MAC of the concatenation of `parts`.
  //! @throws rdx::error when the implementation fails (errc::operation_failed).
  [[nodiscard]] virtual std::array<std::byte, mac_size> mac(
      std::initializer_list<std::span<const std::byte>> parts) const = 0;
};

}  // namespace rdx
