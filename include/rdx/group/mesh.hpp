// rdx: a job's ranks connected in a full mesh on one worker per process.
//
// mesh(me, pd, window) runs the whole set-up in one call:
//   1. rendezvous (group/rendezvous.hpp): every rank hands in the address
//      of its acceptor, a TCP listener whose set-ups run without blocking;
//   2. connections: a rank connects to every lower rank (a blocking client
//      exchange) and then accepts every higher one on its acceptor, all on
//      its one worker. No cycle can form: rank 0 only accepts, and a rank
//      waits only on lower ones, which finish their own connecting first;
//   3. grants: each rank grants every peer exactly that peer's block of the
//      window, and one 8-byte barrier slot, and sends the descriptors over
//      the bootstrap socket (a rank learns who a client is from its
//      preamble, after the acceptor's exchange, so grants follow connecting);
//   4. a barrier, so that every grant is known to work before mesh returns.
// With mesh_options::on_demand, steps 2 to 4 wait for each pair's first use
// (block_of, peer, barrier): the higher rank of a pair always connects to
// the lower one's acceptor, and a lower rank that needs a higher one first
// sends it a request (a preamble with the request flag, handed out by the
// acceptor before any connection is made), so every blocking wait is on a
// lower rank and none can close a cycle.
// A client's preamble carries the job's fingerprint (a hash of the whole
// rendezvous table, identical on every rank of one job and different for
// the next job on the same port) and both ranks: a process of another job,
// or one claiming a rank it is not, is dropped and the set-up goes on.
// Each rank's address carries 16 random bytes, so the fingerprint is new for
// every job. With a key (mesh_options::key), the rendezvous admits only the
// job's ranks, and every preamble carries a MAC over itself and the whole
// table: only a holder of the key, in this job, can connect as a rank.
// Every step has the one deadline of mesh_options::timeout, and every
// failure names the ranks: those that never connected, the one whose
// connection failed and why.
//
// Threading: the mesh, its worker and its connections are used by one
// thread at a time.
//
// Its parts, under rdx/group/detail/: the wire (mesh_wire.hpp), a pair's
// set-up, grants and the barrier (mesh_pairs.hpp), and pairs connected on
// first use (mesh_on_demand.hpp).
#pragma once

#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/connect/authenticator.hpp>
#include <rdx/connect/tcp_socket.hpp>
#include <rdx/error.hpp>
#include <rdx/group/detail/mesh_on_demand.hpp>
#include <rdx/group/detail/mesh_pairs.hpp>
#include <rdx/group/detail/mesh_wire.hpp>
#include <rdx/group/environment.hpp>
#include <rdx/group/mesh_options.hpp>
#include <rdx/group/rendezvous.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <poll.h>

namespace rdx::group {

//! Every rank of a job connected to every other, on one worker, with each
//! peer's block of every other rank's window granted and a barrier. Not
//! movable (its connections point into its worker and buffers).
class mesh : private detail::mesh_on_demand {
public:
  //! The rights each peer has on its block of a window.
  static constexpr rights window_rights = detail::mesh_pairs::window_rights;
  //! A peer's block of a rank's window, as this rank reaches it.
  using remote_block = detail::mesh_pairs::remote_block;

  //! Sets up the whole mesh (see the file comment) within o.timeout.
  //! @throws rdx::error naming the ranks: errc::timed_out for ranks that
  //! never connected or never reached the first barrier, the rendezvous's
  //! errors, a connection's failure with the peer named, errc::invalid_argument
  //! for a window smaller than size() x block or without a region.
  mesh(const rank_info& me, const protection_domain& pd, mesh_window window = {}, mesh_options o = {})
      : detail::mesh_on_demand(me, pd, window, std::move(o)) {
    const auto t0 = tcp::clock::now();
    deadline_ = t0 + o_.timeout;
    me_.check();
    if (window_.block != 0 &&
        (window_.region == nullptr || window_.bytes.size() / window_.block < me_.size)) {
      rdx::detail::throw_rdx(errc::invalid_argument,
                             "mesh: the window has " + std::to_string(window_.bytes.size()) +
                                 " bytes, a block of " + std::to_string(window_.block) + " for each of " +
                                 std::to_string(me_.size) + " ranks needs " +
                                 std::to_string(window_.block * me_.size) +
                                 (window_.region == nullptr ? ", and no region was given" : ""));
    }
    const std::uint32_t n = me_.size;
    conns_.resize(n);
    socks_.resize(n);
    window_grants_.resize(n);
    slot_grants_.resize(n);
    blocks_.resize(n);
    slot_windows_.resize(n);
    ops_.resize(n);
    std::fill(slots_.data(), slots_.data() + n, 0);

    // 1. Everyone's acceptor address.
    tcp::listener l = tcp::listener::bind({}, o_.port);
    const std::uint16_t port = l.port();
    const std::string host = o_.host.empty() ? detail::route_address(me_.rendezvous_host) : o_.host;
    const auto entry = detail::address_entry(host, port);
    rendezvous_options ro;
    ro.timeout = o_.timeout;
    ro.key = o_.key;
    table_ = o_.exchange ? o_.exchange(entry) : rendezvous(me_, entry, ro);
    const rendezvous_table& table = table_;
    if (table.size() != me_.size) {
      rdx::detail::throw_rdx(errc::protocol_error, "mesh: the exchange returned " +
                                                       std::to_string(table.size()) +
                                                       " entries for a job of " + std::to_string(me_.size));
    }
    fp_ = detail::fingerprint(table);
    if (o_.key) {
      // The job's MAC: every entry with its length, under the key.
      std::vector<std::byte> all;
      for (const auto& e : table) {
        std::byte len[4];
        detail::put32(len, static_cast<std::uint32_t>(e.size()));
        all.insert(all.end(), len, len + 4);
        all.insert(all.end(), e.begin(), e.end());
      }
      const auto m = o_.key->mac({detail::rv_label(detail::mesh_job_label), all});
      job_mac_.assign(m.begin(), m.end());
    }
    const auto t1 = tcp::clock::now();
    timings_.rendezvous = us(t1 - t0);

    // 2. Connections: to every lower rank, then from every higher one.
    acceptor_options ao;
    ao.timeout = o_.timeout;
    ao.connect = o_.connect;
    ao.preamble = detail::keyed_preamble(o_.key.get(), job_mac_, detail::preamble(fp_, me_.rank, ~0u));
    ao.peer_preamble_size = detail::preamble_size + (o_.key ? keyed_mac::mac_size : 0);
    ao.check_preamble = [this](std::span<const std::byte> p) { return check_preamble(p); };
    acc_.emplace(w_, pd, std::move(l), o_.attr, ao);
    if (o_.on_demand) {
      requests_.resize(n);
      timings_.total = us(t1 - t0);
      return;
    }
    for (std::uint32_t q = 0; q < me_.rank; ++q) {
      connect_to(q, table[q]);
    }
    accept_from_higher(*acc_);
    const auto t2 = tcp::clock::now();
    timings_.connect = us(t2 - t1);

    // 3. Grants, sent on every bootstrap socket before any is read.
    exchange_grants();
    const auto t3 = tcp::clock::now();
    timings_.grants = us(t3 - t2);

    // 4. Everyone can reach everyone.
    barrier_until(deadline_, "the first barrier");
    for (auto& s : socks_) {
      s = tcp::socket{};
    }
    acc_.reset();  // every pair is connected: nobody else may join
    const auto t4 = tcp::clock::now();
    timings_.barrier = us(t4 - t3);
    timings_.total = us(t4 - t0);
  }
  mesh(const mesh&) = delete;
  mesh& operator=(const mesh&) = delete;
  mesh(mesh&&) = delete;
  mesh& operator=(mesh&&) = delete;
  //! Revokes the grants and tears every connection down (bounded).
  ~mesh() = default;

  //! This rank.
  [[nodiscard]] std::uint32_t rank() const noexcept { return me_.rank; }
  //! Ranks in the job.
  [[nodiscard]] std::uint32_t size() const noexcept { return me_.size; }
  //! The rank information the mesh was made with.
  [[nodiscard]] const rank_info& info() const noexcept { return me_; }
  //! The worker every connection is on: progress() it, or sleep on its fd().
  [[nodiscard]] rdx::worker& worker() noexcept { return w_; }
  //! The connection to rank p (p != rank()).
  //! @throws rdx::error (errc::out_of_range) for p == rank() or p >= size().
  //! With on_demand, connects the pair first (see mesh_options::on_demand).
  [[nodiscard]] connection& peer(std::uint32_t p) {
    check_peer(p, "peer");
    ensure(p);
    return *conns_[p];
  }
  //! This rank's block of rank p's window: what it may read and write there.
  //! @throws rdx::error (errc::out_of_range) for p == rank() or p >= size(),
  //! (errc::not_ready) when the mesh has no window.
  //! With on_demand, connects the pair first (see mesh_options::on_demand).
  [[nodiscard]] remote_block& block_of(std::uint32_t p) {
    check_peer(p, "block_of");
    ensure(p);
    if (!blocks_[p]) {
      rdx::detail::throw_rdx(errc::not_ready, "mesh::block_of: the mesh was made without a window");
    }
    return *blocks_[p];
  }
  //! Peer p's block of this rank's own window (what p writes and reads).
  [[nodiscard]] std::span<std::byte> local_block(std::uint32_t p) const noexcept {
    return detail::mesh_pairs::local_block(p);
  }
  //! How long each step of the set-up took.
  [[nodiscard]] const mesh_timings& timings() const noexcept { return timings_; }
  //! Barriers passed, the first (in the constructor, unless on_demand) included.
  [[nodiscard]] std::uint64_t barriers() const noexcept { return epoch_; }
  //! Peers this rank holds a connection to (size() - 1 unless on_demand).
  [[nodiscard]] std::uint32_t connected() const noexcept {
    return static_cast<std::uint32_t>(std::count_if(slot_windows_.begin(), slot_windows_.end(),
                                                    [](const auto& w) { return w.has_value(); }));
  }
  //! Drives the worker and, with on_demand, serves the other ranks' set-ups
  //! with this one (never waits for one to begin; one that began is carried
  //! through). Returns the worker's completions.
  //! @throws rdx::error as peer() does, for a set-up that fails.
  std::size_t progress() {
    serve();
    return w_.progress();
  }

  //! Returns once every rank has called barrier() as often as this one:
  //! writes its count into a slot every peer granted it, and waits for every
  //! peer's write into its own slots (no collective, no rank in the middle).
  //! Before it, let every write of this rank complete: a barrier says the
  //! ranks arrived, and completed writes are in place.
  //! @throws rdx::error (errc::timed_out) naming the ranks that did not
  //! arrive; a peer's connection failure, naming it.
  void barrier(std::chrono::milliseconds timeout = std::chrono::milliseconds{30000}) {
    if (o_.on_demand) {
      ensure_all();
    }
    barrier_until(tcp::clock::now() + timeout, "barrier " + std::to_string(epoch_ + 1));
  }

private:
  void accept_from_higher(acceptor& acc) {
    std::uint32_t missing = me_.size - me_.rank - 1;
    while (missing > 0) {
      while (auto a = acc.poll()) {
        if (a->handed_out) {
          continue;  // a request: none in a full mesh
        }
        if (!*a) {
          dropped_ = refusal(*a);
          continue;
        }
        // check_preamble let only this job's higher ranks through; a second
        // set-up of one pair closes here.
        const std::uint32_t from = detail::get32(a->preamble.data() + 16);
        if (conns_[from]) {
          dropped_ = a->peer + ": a second set-up from rank " + std::to_string(from);
          continue;
        }
        conns_[from] = std::move(a->conn);
        socks_[from] = std::move(a->socket);
        --missing;
      }
      if (missing == 0) {
        break;
      }
      if (tcp::clock::now() >= deadline_) {
        std::vector<std::uint32_t> ranks;
        for (std::uint32_t r = me_.rank + 1; r < me_.size; ++r) {
          if (!conns_[r]) {
            ranks.push_back(r);
          }
        }
        rdx::detail::throw_rdx(errc::timed_out,
                               "mesh: rank " + std::to_string(me_.rank) + " waited " +
                                   std::to_string(o_.timeout.count()) + " ms for " + ranks_named(ranks) +
                                   " to connect" +
                                   (dropped_.empty() ? "" : " (last refused: " + dropped_ + ")"));
      }
      (void)w_.progress();
      pollfd pf{acc.fd(), POLLIN, 0};
      (void)::poll(&pf, 1, 5);
    }
  }

  void exchange_grants() {
    const std::uint32_t n = me_.size;
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me_.rank) {
        continue;
      }
      try {
        send_grants(p);
      } catch (const std::exception& e) {
        rdx::detail::throw_rdx(errc::peer_disconnected, "mesh: " + who(p) + ": " + e.what());
      }
    }
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me_.rank) {
        continue;
      }
      try {
        read_grants(p);
      } catch (const std::exception& e) {
        rdx::detail::throw_rdx(errc::peer_disconnected, "mesh: " + who(p) + ": grants: " + e.what());
      }
    }
  }
};

}  // namespace rdx::group
