// rdx: what an acceptor (rdx/channel/acceptor.hpp) is told and what it hands
// back: its options, the verdict on a client's preamble, and one client's
// finished or failed set-up.
#pragma once

#include <rdx/channel/connection.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace rdx {

//! What an acceptor does with a client once its preamble is in
//! (acceptor_options::check_preamble).
enum class preamble_verdict {
  proceed,   //!< set the client up
  refuse,    //!< fail its set-up (errc::rejected) and close its socket
  hand_out,  //!< end its set-up here: handed out with its socket and no connection
};

//! How an acceptor sets up its clients.
struct acceptor_options {
  //! Each client's whole set-up, from its TCP accept to the barrier.
  std::chrono::milliseconds timeout = tcp::default_timeout;
  connect_options connect{};  //!< the RTR and RTS settings of every queue pair
  //! Set-ups in progress at once; later clients wait in the listen backlog.
  std::size_t max_pending = 256;
  //! The application's bytes, sent to every client before rdx's messages
  //! (its own settings, say).
  std::vector<std::byte> preamble{};
  //! How many bytes each client sends before rdx's messages (its preamble).
  std::size_t peer_preamble_size = 0;
  //! Called with each client's preamble (peer_preamble_size > 0) once it is
  //! in; until then nothing but `preamble` is sent to the client and no
  //! connection is made for it, so a stranger costs no queue pair. Empty:
  //! every client proceeds, its connection made as it arrives.
  std::function<preamble_verdict(std::span<const std::byte>)> check_preamble{};
};

//! One client's set-up, finished or failed.
struct accepted {
  std::string peer;  //!< the client's TCP address, "host:port"
  //! Connected, on the worker. When set-up failed: the connection that was
  //! being set up (unconnected; destroy it with what prepare made for it),
  //! or null when it could not be made.
  std::unique_ptr<connection> conn;
  peer_offer offer;                 //!< the client's connection info and grants
  std::vector<std::byte> preamble;  //!< the client's first peer_preamble_size bytes
  tcp::socket socket;               //!< the bootstrap socket, still open (closed on failure)
  std::error_code error;            //!< why set-up failed (timed_out, wire_format, limit_exceeded, ...)
  std::string message;              //!< that in words, naming the client and the step
  //! check_preamble said preamble_verdict::hand_out: no connection and no
  //! error; `preamble` and `socket` are the client's, for the application.
  bool handed_out = false;
  //! True when the client is connected.
  explicit operator bool() const noexcept { return !error && conn != nullptr; }
};

}  // namespace rdx
