// rdx: what a mesh is made with (mesh_window, mesh_options) and what it
// reports of its set-up (mesh_timings).
#pragma once

#include <rdx/channel/connection_attr.hpp>
#include <rdx/connect/authenticator.hpp>
#include <rdx/group/rendezvous_options.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace rdx::group {

//! The memory every peer may reach, one block each: peer p reads and writes
//! bytes [p x block, (p + 1) x block) of `bytes`, and nothing else. The
//! region must be registered without remote rights (make_window_buffer).
struct mesh_window {
  const memory_region* region = nullptr;  //!< the registration holding bytes
  std::span<std::byte> bytes{};           //!< at least size() x block bytes
  std::size_t block = 0;                  //!< bytes per peer (0: no window)
};

//! How a mesh is set up.
struct mesh_options {
  //! Each peer's connection. The defaults keep a peer small (8 receive
  //! buffers of 4 KiB, 128 send entries), so a worker's queue holds many.
  //! With events, the worker has a descriptor and barrier() sleeps on it
  //! (for at most 1 ms at a time) instead of polling: for ranks that
  //! outnumber the cores.
  connection_attr attr{.send_depth = 128, .signal_interval = 32, .recv_depth = 8};
  //! The whole set-up: rendezvous, connections, grants and the first barrier.
  std::chrono::milliseconds timeout{60000};
  connect_options connect{};  //!< every queue pair's RTR and RTS settings
  //! The address other ranks connect to. Empty: this host's address on the
  //! route to the rendezvous host (no packet is sent to find it).
  std::string host{};
  //! The acceptor's port (0: the OS picks one).
  std::uint16_t port = 0;
  //! How the ranks' addresses are exchanged: hands in this rank's bytes and
  //! returns every rank's, indexed by rank (a PMIx fence, say). Empty: rdx's
  //! own rendezvous at the rank_info's rendezvous address.
  std::function<rendezvous_table(std::span<const std::byte>)> exchange{};
  //! A key every rank of the job holds (an rdx::auth::psk_key, say): rdx's
  //! rendezvous then admits only holders of it (rendezvous_options::key), and
  //! each connection's preamble carries a MAC over itself and the job's whole
  //! table, so only a holder of the key, in this job, connects as a rank. The
  //! endpoint exchange after the preamble is not covered. Every rank must be
  //! given one, or none.
  std::shared_ptr<const keyed_mac> key{};
  //! Connect each pair on its first use (block_of(), peer(), barrier())
  //! instead of all at set-up, as UCX and Mooncake do: the constructor is the
  //! rendezvous alone, and a rank holds connections only to the peers it
  //! reached or that reached it. A rank serves the others' set-ups while it
  //! is inside the mesh's calls (block_of, peer, barrier, progress): call
  //! progress() in long stretches without them, or the others wait (up to
  //! `timeout`, then fail naming this rank). barrier() connects every pair.
  bool on_demand = false;
};

//! How long each step of the set-up took.
struct mesh_timings {
  std::chrono::microseconds rendezvous{};  //!< until every rank's address was known
  std::chrono::microseconds connect{};     //!< until every peer was connected
  std::chrono::microseconds grants{};      //!< until every peer's grants were known
  std::chrono::microseconds barrier{};     //!< the first barrier
  std::chrono::microseconds total{};       //!< the whole constructor
};

}  // namespace rdx::group
