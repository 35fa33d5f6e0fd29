// rdx: the interface through which connection set-up authenticates the peer
// over the TCP bootstrap. It needs no cryptography itself; rdx::auth
// (rdx/auth/psk.hpp) implements it with a pre-shared key. The protocol:
// rdx's design notes (share/doc/rdx/design.md), "Wire protocols", "Authenticated
// set-up".
#pragma once

#include <chrono>
#include <cstddef>
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
};

}  // namespace rdx
