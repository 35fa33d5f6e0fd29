// rdx::detail: what a connection manager leaves with a connection it
// connected (rdma_cm's ids and their event channel, cm/link.hpp), so the
// engine hears a peer's disconnect beside its completions: it takes what the
// peer sent before, then fails the connection with errc::peer_disconnected.
// Set-up and housekeeping only: never called per operation.
#pragma once

#include <system_error>

namespace rdx::detail {

class peer_link {
public:
  peer_link() = default;
  peer_link(const peer_link&) = delete;
  peer_link& operator=(const peer_link&) = delete;
  //! Destroying the link disconnects (the peer hears DISCONNECTED).
  virtual ~peer_link() = default;
  //! Readable when an event waits; the engine sleeps on it in event mode.
  [[nodiscard]] virtual int fd() const noexcept = 0;
  //! Takes the events that wait, without blocking. @return
  //! errc::peer_disconnected once the peer has gone, else empty.
  [[nodiscard]] virtual std::error_code poll() noexcept = 0;
  //! The peer in words ("10.77.0.2:7471"), for failure_message().
  [[nodiscard]] virtual const char* peer() const noexcept = 0;
  //! Tells the peer this side is going (idempotent, never throws).
  virtual void disconnect() noexcept = 0;

protected:
  peer_link(peer_link&&) = default;
  peer_link& operator=(peer_link&&) = default;
};

}  // namespace rdx::detail
