// rdx: what a rendezvous takes (rendezvous_options) and gives back
// (rendezvous_table), apart from the protocol, so a mesh's options can name
// them.
#pragma once

#include <rdx/connect/authenticator.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace rdx::group {

//! How a rendezvous runs.
struct rendezvous_options {
  //! The whole rendezvous, connecting included: ranks that are not there by
  //! then are named, and every rank fails.
  std::chrono::milliseconds timeout{30000};
  //! The most bytes one rank may hand in (a larger hello is a stranger's).
  std::uint32_t max_bytes = 64 * 1024;
  //! A key every rank of the job holds (an rdx::auth::psk_key, say): each rank
  //! proves it holds the key before rank 0 takes its bytes, and rank 0 proves
  //! the table is the job's. A process without it, or with another, is refused
  //! by name and the others are served. Every rank must be given one, or none.
  std::shared_ptr<const keyed_mac> key{};
};

//! Every rank's bytes, indexed by rank (this rank's own included).
using rendezvous_table = std::vector<std::vector<std::byte>>;

}  // namespace rdx::group
