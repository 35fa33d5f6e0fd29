// rdx: the rendezvous of a job's ranks: every rank hands in a few bytes (its
// connection info, its grants) and gets back every rank's, indexed by rank.
//
// Rank 0 serves it on its rendezvous port (torchrun's MASTER_PORT) from one
// thread: poll() over the listener and every rank's socket, no thread per
// rank. The others connect (retrying until rank 0 listens), send a hello
// {magic, version, rank, size, length} and their bytes, and wait for the
// table: a reply header {magic, version, status, count}, the table's length
// in bytes, then each rank's {length, bytes}, read by each rank in one go.
// Everything is bounded by rank 0's deadline: once a rank's bytes are in,
// rank 0 tells it how long it may still wait (ranks start unevenly, and a
// rank that called long before rank 0 listened waits for rank 0's verdict
// rather than time out first). Every failure is named:
//   - ranks that never arrived, listed;
//   - two processes claiming one rank, or a rank that says the job has
//     another size: the job is inconsistent, every rank is told why;
//   - a rank that leaves after its hello and before the table: named, and
//     every other rank is told;
//   - a stranger's bytes (not a hello) or a hello claiming more than the
//     byte limit: that connection is dropped and the others are served.
// A failure reaches the ranks that are connected as a failure reply; rank 0
// throws the same message.
//
// With a key (rendezvous_options::key, an rdx::auth::psk_key say), a hello
// says so and carries a fresh nonce; rank 0 answers with a nonce of its own,
// and the rank sends a MAC over both nonces, its hello and its bytes. Only
// then does rank 0 read the hello's rank and size: a process without the key
// (or with another) is refused alone, by name, and cannot claim a rank or
// fail the job. The table comes with a MAC over both nonces and the table's
// own MAC, so a rank takes only its job's table, and only this once.
//
// Its parts, under rdx/group/detail/: the wire (rendezvous_wire.hpp), rank
// 0's side (rendezvous_server.hpp, over its intake in rendezvous_intake.hpp)
// and the other ranks' (rendezvous_client.hpp).
#pragma once

#include <rdx/error.hpp>
#include <rdx/group/detail/rendezvous_client.hpp>
#include <rdx/group/detail/rendezvous_server.hpp>
#include <rdx/group/detail/rendezvous_wire.hpp>
#include <rdx/group/environment.hpp>
#include <rdx/group/rendezvous_options.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace rdx::group {

//! Hands in `mine` and returns every rank's bytes, indexed by rank. Rank 0
//! serves the rendezvous on me.rendezvous_port (all addresses) from the
//! calling thread; the others connect to me.rendezvous_host there.
//! @throws rdx::error naming the ranks that never arrived (errc::timed_out),
//!         two claims of one rank or a different job size
//!         (errc::invalid_argument), a rank that left during set-up
//!         (errc::peer_disconnected), and on ranks other than 0 rank 0's
//!         reason (errc::operation_failed); a stranger's bytes on the port
//!         are dropped and the others served.
[[nodiscard]] inline rendezvous_table rendezvous(const rank_info& me, std::span<const std::byte> mine,
                                                 const rendezvous_options& o = {}) {
  me.check();
  if (me.size > 1 && (me.rendezvous_port == 0 || (me.rank != 0 && me.rendezvous_host.empty()))) {
    rdx::detail::throw_rdx(errc::invalid_argument,
                           "rendezvous: no rendezvous address (MASTER_ADDR and MASTER_PORT, or "
                           "rdx::group::given(..., host, port))");
  }
  if (mine.size() > o.max_bytes) {
    rdx::detail::throw_rdx(errc::invalid_argument, "rendezvous: " + std::to_string(mine.size()) +
                                                       " bytes to hand in, above max_bytes " +
                                                       std::to_string(o.max_bytes));
  }
  if (me.size == 1) {
    return rendezvous_table{std::vector<std::byte>(mine.begin(), mine.end())};
  }
  if (me.rank == 0) {
    return detail::rendezvous_server(me, mine, o).run();
  }
  return detail::rendezvous_client(me, mine, o);
}

}  // namespace rdx::group
