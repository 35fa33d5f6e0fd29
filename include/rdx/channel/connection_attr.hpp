// rdx: the settings of a connection (connection_attr) and what one side
// tells the other to connect to it (connection_info), whichever bootstrap
// carries it: the TCP exchange (channel/exchange.hpp) or rdma_cm (cm/connect.hpp).
#pragma once

#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rdx {

//! Settings of a connection; each side of a connection must use the same
//! queue_pairs, recv_depth and message_size (connect() checks).
struct connection_attr {
  std::uint32_t queue_pairs = 1;                     //!< K: large writes and reads are striped over them
  std::uint32_t send_depth = 256;                    //!< send-queue entries per queue pair
  std::uint32_t signal_interval = 64;                //!< at most this many work requests per signaled one
  std::uint32_t recv_depth = 64;                     //!< pre-posted message buffers: the peer's credits
  std::uint32_t message_size = 4096;                 //!< bytes per message buffer: the largest message
  std::size_t chunk_size = std::size_t{512} * 1024;  //!< striping chunk, a multiple of 4 KiB
  bool events = false;                               //!< create a completion channel (event mode)
  std::uint8_t port = 0;                             //!< 0: the first ACTIVE port
  std::optional<std::uint8_t> gid_index{};           //!< unset: select_gid() (RDX_GID_INDEX, RoCE v2, ...)
  //! How sends are posted: the extended post API where the provider offers
  //! it (automatic), or ibv_post_send (classic). queue_pair_attr::post.
  post_api post = post_api::automatic;
  //! Receives that waited this long on an idle connection send a liveness
  //! probe, so a dead peer is noticed without traffic; 0 turns it off.
  std::chrono::milliseconds keepalive{1000};
  //! Longest time destruction waits for the flushed work of its queue pairs.
  std::chrono::milliseconds drain_timeout{2000};
  //! Work posted and awaiting a completion that gets neither a completion nor
  //! an error for this long (and at least detection_bound()) fails the
  //! connection with errc::no_progress. A working NIC completes or fails
  //! every request within detection_bound(); this catches a NIC, driver or
  //! peer that does neither. Between two completions a queue pair moves at
  //! most signal_interval x chunk_size bytes (32 MiB by default): raise it
  //! for links slower than about 10 Mb/s. 0 turns it off.
  std::chrono::milliseconds stall_timeout{30000};
  //! Adaptive chunking and pacing of writes and reads: the bytes in flight
  //! (all queue pairs together) are limited by a window that grows while
  //! chunks complete near the path's base time and shrinks when they are
  //! late, and chunks are cut at 64 KiB to 1 MiB as the window allows
  //! (chunk_size is then not used). Every paced chunk is signaled.
  bool pacing = false;
  //! Seal every message with AES-256-GCM under session keys from the
  //! authenticated set-up (exchange_options::auth), one key per direction:
  //! a message changed on the wire, replayed, reordered or sealed with
  //! another key is never delivered and fails the connection with
  //! errc::integrity_failed. Both sides must set the same. Each message then
  //! carries message_size - sealed_message_overhead bytes of payload
  //! (connection::message_size()). Window operations and sends from
  //! registered memory bypass the seal, so they are refused on such a
  //! connection (errc::unsupported).
  bool encrypt = false;
};

//! Where a connection's pacing stands (connection::pacing()).
struct pacing_state {
  std::uint64_t window = 0;     //!< bytes allowed in flight; 0 when pacing is off
  std::uint64_t chunk = 0;      //!< the chunk writes and reads are cut at now
  std::uint64_t decreases = 0;  //!< times the window shrank for a late chunk
  std::uint64_t in_flight = 0;  //!< bytes of paced chunks posted and not yet completed
  std::uint64_t probes = 0;     //!< zero-length writes sent behind a late tail (tail-loss probes)
  std::uint64_t losses = 0;     //!< paced chunks that waited out a retransmission (half the ACK timeout)
};

//! What one side tells the other to connect: its queue pairs, its
//! flow-control word and its buffer settings.
struct connection_info {
  std::vector<endpoint> endpoints;  //!< one per queue pair, in order
  //! 8 bytes the peer writes its consumed count into, through queue pair 0
  //! (a memory window over exactly those bytes, or an exact registration).
  remote_descriptor credit_word{};
  std::uint32_t recv_depth = 0;    //!< the sender's message buffers: the credits it gives
  std::uint32_t message_size = 0;  //!< bytes per message buffer: the largest message it takes
  bool encrypt = false;            //!< its messages are sealed (connection_attr::encrypt)
};

namespace detail {

//! Why two sides' connection_attr::encrypt disagree, in words; "" when they agree.
[[nodiscard]] inline std::string encrypt_disagreement(bool here, bool there) {
  if (here == there) {
    return {};
  }
  return std::string("connection_attr::encrypt is ") + (here ? "true" : "false") + " here but " +
         (there ? "true" : "false") + " at the peer; both sides need the same";
}

}  // namespace detail

}  // namespace rdx
