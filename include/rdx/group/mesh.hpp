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
#pragma once

#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/connect/authenticator.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/tcp_socket.hpp>
#include <rdx/connect/wire.hpp>
#include <rdx/detail/random.hpp>
#include <rdx/error.hpp>
#include <rdx/group/environment.hpp>
#include <rdx/group/rendezvous.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

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

namespace detail {

inline constexpr std::uint32_t mesh_magic = 0x5244584d;  // "RDXM"
inline constexpr std::uint16_t mesh_version = 2;
inline constexpr std::size_t mesh_nonce_size = 16;  // in each address: new every job
inline constexpr std::string_view mesh_job_label = "rdx.group.mesh.v2 job";
inline constexpr std::string_view mesh_preamble_label = "rdx.group.mesh.v2 preamble";
inline constexpr std::size_t mesh_max_keys = 64;

// FNV-1a over every rank's entry, its length first: the same on every rank
// of one job, another for the next job (its ports differ).
inline std::uint64_t fingerprint(const rendezvous_table& t) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](std::uint8_t b) {
    h ^= b;
    h *= 0x100000001b3ull;
  };
  for (const auto& e : t) {
    const auto n = static_cast<std::uint32_t>(e.size());
    for (int i = 0; i < 4; ++i) mix(static_cast<std::uint8_t>(n >> (8 * i)));
    for (std::byte b : e) mix(std::to_integer<std::uint8_t>(b));
  }
  return h;
}

// A preamble: magic, version, flags, fingerprint, from rank, to rank (the
// server's names itself as `from` and leaves `to` as ~0). The request flag:
// `from` (a lower rank) asks `to` to connect to it; nothing else follows.
inline constexpr std::uint16_t preamble_request = 1;
inline std::vector<std::byte> preamble(std::uint64_t fp, std::uint32_t from, std::uint32_t to,
                                       std::uint16_t flags = 0) {
  std::vector<std::byte> p(24);
  put32(p.data(), mesh_magic);
  put16(p.data() + 4, mesh_version);
  put16(p.data() + 6, flags);
  put64(p.data() + 8, fp);
  put32(p.data() + 16, from);
  put32(p.data() + 20, to);
  return p;
}
inline constexpr std::size_t preamble_size = 24;

// Keyed: a preamble followed by its MAC over the job's MAC and itself.
inline std::vector<std::byte> keyed_preamble(const keyed_mac* key, std::span<const std::byte> job,
                                             std::vector<std::byte> p) {
  if (key == nullptr) return p;
  const auto m = key->mac({rv_label(mesh_preamble_label), job, p});
  p.insert(p.end(), m.begin(), m.end());
  return p;
}
// Whether a received preamble's MAC is the one its first 24 bytes should have.
inline bool preamble_mac_right(const keyed_mac* key, std::span<const std::byte> job,
                               std::span<const std::byte> p) {
  if (key == nullptr) return p.size() == preamble_size;
  if (p.size() != preamble_size + keyed_mac::mac_size) return false;
  const auto m = key->mac({rv_label(mesh_preamble_label), job, p.first(preamble_size)});
  return rv_same(m, p.subspan(preamble_size));
}

// The address on this host that packets to `host` leave from: a UDP socket
// connected there (connect sends nothing) says it.
inline std::string route_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* ai = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), "9", &hints, &ai) != 0 || ai == nullptr) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      char buf[INET6_ADDRSTRLEN] = {};
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0 &&
          ::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) ==
              0) {
        out = buf;
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(ai);
  return out;
}

// A rank's rendezvous entry: magic, version, port, host length, 16 random
// bytes (new every job), host.
inline constexpr std::size_t address_fixed = 10 + mesh_nonce_size;
inline std::vector<std::byte> address_entry(const std::string& host, std::uint16_t port) {
  std::vector<std::byte> e(address_fixed + host.size());
  put32(e.data(), mesh_magic);
  put16(e.data() + 4, mesh_version);
  put16(e.data() + 6, port);
  put16(e.data() + 8, static_cast<std::uint16_t>(host.size()));
  rdx::detail::os_random(e.data() + 10, mesh_nonce_size);
  std::memcpy(e.data() + address_fixed, host.data(), host.size());
  return e;
}
inline std::pair<std::string, std::uint16_t> read_address(std::span<const std::byte> e, std::uint32_t rank) {
  if (e.size() < address_fixed || get32(e.data()) != mesh_magic || get16(e.data() + 4) != mesh_version ||
      e.size() != address_fixed + std::size_t{get16(e.data() + 8)}) {
    rdx::detail::throw_rdx(errc::wire_format, "mesh: rank " + std::to_string(rank) +
                                                  "'s rendezvous entry is not a mesh address (a rank "
                                                  "of another program, or another rdx version)");
  }
  return {std::string(reinterpret_cast<const char*>(e.data()) + address_fixed, e.size() - address_fixed),
          get16(e.data() + 6)};
}

// Grants as bytes: count, then per grant addr, rkey, length, rights,
// element size, key count and keys.
inline std::vector<std::byte> encode_grants(std::span<const window_descriptor> ds) {
  std::vector<std::byte> out(4);
  put32(out.data(), static_cast<std::uint32_t>(ds.size()));
  for (const auto& d : ds) {
    const std::size_t at = out.size();
    out.resize(at + 32 + 4 * d.keys.size());
    std::byte* p = out.data() + at;
    put64(p, d.memory.addr);
    put32(p + 8, d.memory.rkey);
    put64(p + 12, d.memory.length);
    put32(p + 20, static_cast<std::uint32_t>(d.granted));
    put32(p + 24, d.element_size);
    put32(p + 28, static_cast<std::uint32_t>(d.keys.size()));
    for (std::size_t i = 0; i < d.keys.size(); ++i) put32(p + 32 + 4 * i, d.keys[i]);
  }
  return out;
}

}  // namespace detail

//! Every rank of a job connected to every other, on one worker, with each
//! peer's block of every other rank's window granted and a barrier. Not
//! movable (its connections point into its worker and buffers).
class mesh {
public:
  //! The rights each peer has on its block of a window.
  static constexpr rights window_rights = rights::read | rights::write;
  //! A peer's block of a rank's window, as this rank reaches it.
  using remote_block = remote_window<std::byte, window_rights>;

  //! Sets up the whole mesh (see the file comment) within o.timeout.
  //! @throws rdx::error naming the ranks: errc::timed_out for ranks that
  //! never connected or never reached the first barrier, the rendezvous's
  //! errors, a connection's failure with the peer named, errc::invalid_argument
  //! for a window smaller than size() x block or without a region.
  mesh(const rank_info& me, const protection_domain& pd, mesh_window window = {}, mesh_options o = {})
      : me_(me),
        pd_(&pd),
        o_(std::move(o)),
        window_(window),
        w_(pd, worker_attr{.events = o_.attr.events}),
        slots_(make_window_buffer<std::uint64_t>(pd, std::max<std::uint32_t>(me.size, 1))),
        src_(pd, 1) {
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
    for (std::uint32_t q = 0; q < me_.rank; ++q) connect_to(q, table[q]);
    accept_from_higher(*acc_);
    const auto t2 = tcp::clock::now();
    timings_.connect = us(t2 - t1);

    // 3. Grants, sent on every bootstrap socket before any is read.
    exchange_grants();
    const auto t3 = tcp::clock::now();
    timings_.grants = us(t3 - t2);

    // 4. Everyone can reach everyone.
    barrier_until(deadline_, "the first barrier");
    for (auto& s : socks_) s = tcp::socket{};
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
    if (!blocks_[p])
      rdx::detail::throw_rdx(errc::not_ready, "mesh::block_of: the mesh was made without a window");
    return *blocks_[p];
  }
  //! Peer p's block of this rank's own window (what p writes and reads).
  [[nodiscard]] std::span<std::byte> local_block(std::uint32_t p) const noexcept {
    if (window_.block == 0 || p >= me_.size) return {};
    return window_.bytes.subspan(std::size_t{p} * window_.block, window_.block);
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
    if (o_.on_demand) ensure_all();
    barrier_until(tcp::clock::now() + timeout, "barrier " + std::to_string(epoch_ + 1));
  }

private:
  static std::chrono::microseconds us(tcp::clock::duration d) {
    return std::chrono::duration_cast<std::chrono::microseconds>(d);
  }
  [[nodiscard]] std::string who(std::uint32_t p) const {
    return "rank " + std::to_string(me_.rank) + " with rank " + std::to_string(p);
  }
  void check_peer(std::uint32_t p, const char* what) const {
    if (p >= me_.size || p == me_.rank) {
      rdx::detail::throw_rdx(errc::out_of_range, std::string("mesh::") + what + "(" + std::to_string(p) +
                                                     "): rank " + std::to_string(me_.rank) + " of " +
                                                     std::to_string(me_.size) + " has no such peer");
    }
  }
  // "rank 2", "ranks 2, 5 and 7".
  static std::string ranks_named(const std::vector<std::uint32_t>& r) {
    return (r.size() == 1 ? "rank " : "ranks ") + detail::rank_list(r);
  }
  [[nodiscard]] std::chrono::milliseconds left() const {
    const auto l = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - tcp::clock::now());
    return std::max(l, std::chrono::milliseconds{1});
  }

  void connect_to(std::uint32_t q, std::span<const std::byte> entry) {
    const auto [host, port] = detail::read_address(entry, q);
    try {
      tcp::socket s = tcp::connect(host, port, left());
      s.send_all(detail::keyed_preamble(o_.key.get(), job_mac_, detail::preamble(fp_, me_.rank, q)),
                 deadline_, "mesh preamble");
      std::vector<std::byte> theirs(detail::preamble_size + (o_.key ? keyed_mac::mac_size : 0));
      s.recv_exact(theirs, deadline_, "mesh preamble");
      if (detail::get32(theirs.data()) != detail::mesh_magic || detail::get64(theirs.data() + 8) != fp_ ||
          detail::get32(theirs.data() + 16) != q ||
          !detail::preamble_mac_right(o_.key.get(), job_mac_, theirs)) {
        throw error(errc::wire_format, "the listener at " + host + ":" + std::to_string(port) +
                                           " is not rank " + std::to_string(q) + " of this job" +
                                           (o_.key ? " (or holds another key)" : ""));
      }
      auto c = std::make_unique<connection>(w_, *pd_, o_.attr);
      (void)exchange_and_connect(s, *c, {}, exchange_options{.timeout = left(), .connect = o_.connect});
      conns_[q] = std::move(c);
      socks_[q] = std::move(s);
    } catch (const std::exception& e) {
      rdx::detail::throw_rdx(errc::peer_disconnected, "mesh: " + who(q) + " (at " + host + ":" +
                                                          std::to_string(port) + "): " + e.what());
    }
  }

  // Whether a client's preamble is this job's, for this rank, with the
  // job's MAC: a request from a lower rank is handed out (on_demand), a
  // higher rank not yet connected proceeds, anything else is refused before
  // a connection is made for it.
  preamble_verdict check_preamble(std::span<const std::byte> p) const {
    if (p.size() < detail::preamble_size || detail::get32(p.data()) != detail::mesh_magic ||
        detail::get16(p.data() + 4) != detail::mesh_version || detail::get64(p.data() + 8) != fp_ ||
        detail::get32(p.data() + 20) != me_.rank) {
      return preamble_verdict::refuse;
    }
    const std::uint32_t from = detail::get32(p.data() + 16);
    if (from >= me_.size || from == me_.rank || !detail::preamble_mac_right(o_.key.get(), job_mac_, p)) {
      return preamble_verdict::refuse;
    }
    if ((detail::get16(p.data() + 6) & detail::preamble_request) != 0) {
      return o_.on_demand && from < me_.rank ? preamble_verdict::hand_out : preamble_verdict::refuse;
    }
    return from > me_.rank && !conns_[from] ? preamble_verdict::proceed : preamble_verdict::refuse;
  }

  // The pair with p is connected and both sides' grants are known.
  [[nodiscard]] bool ready(std::uint32_t p) const noexcept { return slot_windows_[p].has_value(); }

  // on_demand: connects the pair with p if it is not yet.
  void ensure(std::uint32_t p) {
    if (!o_.on_demand || ready(p)) return;
    if (p < me_.rank) {
      connect_pair(p);
      return;
    }
    const auto until = tcp::clock::now() + o_.timeout;
    send_request(p);
    wait_for({p}, until);
  }

  // on_demand: every pair of this rank, lower ranks first (this rank
  // connects to them), then every higher rank asked at once.
  void ensure_all() {
    for (std::uint32_t q = 0; q < me_.rank; ++q) {
      if (!ready(q)) connect_pair(q);
    }
    const auto until = tcp::clock::now() + o_.timeout;
    std::vector<std::uint32_t> higher;
    for (std::uint32_t p = me_.rank + 1; p < me_.size; ++p) {
      if (ready(p)) continue;
      send_request(p);
      higher.push_back(p);
    }
    wait_for(higher, until);
  }

  // Serves set-ups until every rank of `ps` has connected here.
  void wait_for(const std::vector<std::uint32_t>& ps, tcp::clock::time_point until) {
    for (;;) {
      serve();
      std::vector<std::uint32_t> missing;
      for (std::uint32_t p : ps) {
        if (!ready(p)) missing.push_back(p);
      }
      if (missing.empty()) break;
      if (tcp::clock::now() >= until) {
        rdx::detail::throw_rdx(errc::timed_out, "mesh: rank " + std::to_string(me_.rank) + " asked " +
                                                    ranks_named(missing) + " to connect (on first use) and " +
                                                    (missing.size() == 1 ? "it" : "they") +
                                                    " did not within " + std::to_string(o_.timeout.count()) +
                                                    " ms (a rank serves set-ups only inside the mesh's "
                                                    "calls: block_of, peer, barrier, progress)" +
                                                    (dropped_.empty() ? "" : "; last refused: " + dropped_));
      }
      (void)w_.progress();
      pollfd pf{acc_->fd(), POLLIN, 0};
      (void)::poll(&pf, 1, 1);
    }
    for (std::uint32_t p : ps) requests_[p] = tcp::socket{};
  }

  // on_demand: asks the higher rank p to connect here (a request preamble
  // on a socket of its own, kept open until p has connected).
  void send_request(std::uint32_t p) {
    if (requests_[p].native_handle() >= 0) return;
    const auto [host, port] = detail::read_address(table_[p], p);
    try {
      tcp::socket s = tcp::connect(host, port, o_.timeout);
      s.send_all(detail::keyed_preamble(o_.key.get(), job_mac_,
                                        detail::preamble(fp_, me_.rank, p, detail::preamble_request)),
                 tcp::clock::now() + o_.timeout, "mesh request");
      requests_[p] = std::move(s);
    } catch (const std::exception& e) {
      rdx::detail::throw_rdx(errc::peer_disconnected, "mesh: " + who(p) + " (at " + host + ":" +
                                                          std::to_string(port) +
                                                          "): asking it to connect: " + e.what());
    }
  }

  // on_demand: takes what the acceptor finished: a higher rank's connection
  // (grants exchanged on its socket), or a lower rank's request (this rank
  // connects to it, a blocking wait on a lower rank only).
  void serve() {
    if (!o_.on_demand || !acc_) return;
    while (auto a = acc_->poll()) {
      if (a->handed_out) {
        const std::uint32_t from = detail::get32(a->preamble.data() + 16);
        if (!ready(from)) connect_pair(from);
        continue;
      }
      if (!*a) {
        dropped_ = refusal(*a);
        continue;
      }
      const std::uint32_t from = detail::get32(a->preamble.data() + 16);
      if (conns_[from]) continue;  // a second set-up of the pair: closed here
      conns_[from] = std::move(a->conn);
      socks_[from] = std::move(a->socket);
      finish_pair(from);
    }
  }

  // on_demand: this rank connects to the lower rank q, then the grants.
  void connect_pair(std::uint32_t q) {
    deadline_ = tcp::clock::now() + o_.timeout;
    try {
      connect_to(q, table_[q]);
    } catch (...) {
      forget(q);
      throw;
    }
    finish_pair(q);
  }

  // Grants both ways over the pair's bootstrap socket (each side sends
  // first, then reads), then the socket is closed.
  void finish_pair(std::uint32_t p) {
    deadline_ = tcp::clock::now() + o_.timeout;
    try {
      send_grants(p);
      read_grants(p);
    } catch (const std::exception& e) {
      forget(p);
      rdx::detail::throw_rdx(errc::peer_disconnected, "mesh: " + who(p) + ": grants: " + e.what());
    }
    socks_[p] = tcp::socket{};
  }

  // A pair whose set-up failed, as if it had never begun.
  void forget(std::uint32_t p) noexcept {
    blocks_[p].reset();
    slot_windows_[p].reset();
    window_grants_[p].reset();
    slot_grants_[p].reset();
    conns_[p].reset();
    socks_[p] = tcp::socket{};
  }

  // Why a finished set-up was not taken, for the errors that follow: a
  // preamble check_preamble refused is named as such.
  [[nodiscard]] std::string refusal(const accepted& a) const {
    if (a.error == errc::rejected) {
      return a.peer + ": not a rank of this job that should connect here" +
             (o_.key ? " (or its preamble's MAC is wrong: another key)" : "");
    }
    return a.peer + ": " + a.message;
  }

  void accept_from_higher(acceptor& acc) {
    std::uint32_t missing = me_.size - me_.rank - 1;
    while (missing > 0) {
      while (auto a = acc.poll()) {
        if (a->handed_out) continue;  // a request: none in a full mesh
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
      if (missing == 0) break;
      if (tcp::clock::now() >= deadline_) {
        std::vector<std::uint32_t> ranks;
        for (std::uint32_t r = me_.rank + 1; r < me_.size; ++r)
          if (!conns_[r]) ranks.push_back(r);
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
      if (p == me_.rank) continue;
      try {
        send_grants(p);
      } catch (const std::exception& e) {
        rdx::detail::throw_rdx(errc::peer_disconnected, "mesh: " + who(p) + ": " + e.what());
      }
    }
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me_.rank) continue;
      try {
        read_grants(p);
      } catch (const std::exception& e) {
        rdx::detail::throw_rdx(errc::peer_disconnected, "mesh: " + who(p) + ": grants: " + e.what());
      }
    }
  }

  // Peer p's grants (its barrier slot, its block) made and sent on its socket.
  void send_grants(std::uint32_t p) {
    connection& c = *conns_[p];
    std::vector<window_descriptor> ds;
    slot_grants_[p].emplace(c, slots_.region(), std::span<std::uint64_t>(slots_.data() + p, 1));
    ds.push_back(slot_grants_[p]->descriptor());
    if (window_.block != 0) {
      window_grants_[p].emplace(c, *window_.region, local_block(p));
      ds.push_back(window_grants_[p]->descriptor());
    }
    const auto bytes = detail::encode_grants(ds);
    std::vector<std::byte> len(4);
    detail::put32(len.data(), static_cast<std::uint32_t>(bytes.size()));
    socks_[p].send_all(len, deadline_, "mesh grants");
    socks_[p].send_all(bytes, deadline_, "mesh grants");
  }

  void read_grants(std::uint32_t p) {
    std::vector<std::byte> len(4);
    socks_[p].recv_exact(len, deadline_, "mesh grants");
    const std::uint32_t l = detail::get32(len.data());
    if (l < 4 || l > 4 + 2 * (32 + 4 * detail::mesh_max_keys)) {
      throw error(errc::wire_format, "a grant message of " + std::to_string(l) + " bytes");
    }
    std::vector<std::byte> b(l);
    socks_[p].recv_exact(b, deadline_, "mesh grants");
    const std::uint32_t count = detail::get32(b.data());
    const std::uint32_t want = window_.block != 0 ? 2 : 1;
    if (count != want) {
      throw error(errc::wire_format, "it granted " + std::to_string(count) +
                                         " windows, this job's ranks grant " + std::to_string(want) +
                                         " (one rank made its mesh without a window?)");
    }
    std::size_t at = 4;
    std::vector<window_descriptor> ds;
    for (std::uint32_t i = 0; i < count; ++i) {
      if (b.size() - at < 32) throw error(errc::wire_format, "a grant message cut short");
      const std::byte* q = b.data() + at;
      window_descriptor d;
      d.memory = {detail::get64(q), detail::get32(q + 8), detail::get64(q + 12)};
      d.granted = static_cast<rights>(detail::get32(q + 20));
      d.element_size = detail::get32(q + 24);
      const std::uint32_t k = detail::get32(q + 28);
      if (k > detail::mesh_max_keys || b.size() - at - 32 < 4 * std::size_t{k}) {
        throw error(errc::wire_format, "a grant with " + std::to_string(k) + " keys");
      }
      for (std::uint32_t j = 0; j < k; ++j) d.keys.push_back(detail::get32(q + 32 + 4 * j));
      at += 32 + 4 * std::size_t{k};
      ds.push_back(std::move(d));
    }
    if (at != b.size()) throw error(errc::wire_format, "a grant message with bytes left over");
    slot_windows_[p].emplace(*conns_[p], ds[0]);
    if (slot_windows_[p]->size() != 1) throw error(errc::wire_format, "a barrier slot that is not one word");
    if (want == 2) {
      blocks_[p].emplace(*conns_[p], ds[1]);
      if (blocks_[p]->size() != window_.block) {
        throw error(errc::wire_format, "a block of " + std::to_string(blocks_[p]->size()) +
                                           " bytes, this rank's blocks are " + std::to_string(window_.block));
      }
    }
  }

  void barrier_until(tcp::clock::time_point deadline, const std::string& what) {
    const std::uint64_t e = ++epoch_;
    src_[0] = e;
    const std::uint32_t n = me_.size;
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == me_.rank) continue;
      ops_[p] = slot_windows_[p]->write(local_span<const std::uint64_t>(src_).subspan(0, 1), 0);
    }
    for (;;) {
      // In event mode, nothing to handle: sleep on the worker's descriptor
      // (a completion of this rank's writes wakes it; a peer's write into a
      // slot does not, so at most 1 ms), leaving the core to the ranks and
      // the kernel work that share it.
      if (w_.progress() == 0 && o_.attr.events) (void)w_.wait(std::chrono::milliseconds{1});
      bool all = true;
      for (std::uint32_t p = 0; p < n; ++p) {
        if (p == me_.rank) continue;
        if ((ops_[p].done() && ops_[p].error()) || conns_[p]->failed()) {
          rdx::detail::throw_rdx(
              errc::peer_disconnected,
              "mesh: " + what + ": " + who(p) + ": " +
                  (conns_[p]->failed() ? conns_[p]->failure_message() : ops_[p].error().message()));
        }
        const std::uint64_t got = std::atomic_ref<std::uint64_t>(slots_[p]).load(std::memory_order_acquire);
        all = all && ops_[p].done() && got >= e;
      }
      if (all) return;
      if (tcp::clock::now() >= deadline) {
        std::vector<std::uint32_t> late;
        for (std::uint32_t p = 0; p < n; ++p) {
          if (p != me_.rank && std::atomic_ref<std::uint64_t>(slots_[p]).load(std::memory_order_acquire) < e)
            late.push_back(p);
        }
        rdx::detail::throw_rdx(errc::timed_out,
                               "mesh: " + what + " of rank " + std::to_string(me_.rank) + ": " +
                                   (late.empty() ? std::string("its own writes did not complete")
                                                 : ranks_named(late) + " did not arrive"));
      }
    }
  }

  rank_info me_;
  const protection_domain* pd_;
  mesh_options o_;
  mesh_window window_;
  tcp::clock::time_point deadline_{};
  std::uint64_t fp_ = 0;
  std::vector<std::byte> job_mac_;  // keyed: the MAC of the whole table
  std::uint64_t epoch_ = 0;
  mesh_timings timings_{};
  rdx::worker w_;
  registered_buffer<std::uint64_t> slots_;  // slot p: the barrier count rank p last wrote here
  registered_buffer<std::uint64_t> src_;    // this rank's count, the source of its barrier writes
  std::vector<std::unique_ptr<connection>> conns_;
  std::vector<tcp::socket> socks_;
  std::vector<std::optional<grant<std::byte, window_rights>>> window_grants_;
  std::vector<std::optional<grant<std::uint64_t, rights::write>>> slot_grants_;
  std::vector<std::optional<remote_block>> blocks_;
  std::vector<std::optional<remote_window<std::uint64_t, rights::write>>> slot_windows_;
  std::vector<operation> ops_;
  rendezvous_table table_;             // every rank's address
  std::vector<tcp::socket> requests_;  // on_demand: requests sent, open until answered
  std::string dropped_;                // on_demand: the last set-up refused, for errors
  std::optional<acceptor> acc_;        // last: its set-ups' connections are on w_
};

}  // namespace rdx::group
