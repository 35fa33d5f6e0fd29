// rdx::group::detail: a mesh's state and what one pair of ranks needs:
// connecting to a lower rank's acceptor, checking a connecting rank's
// preamble, the grants both ways over a pair's bootstrap socket, and the
// barrier over every pair. mesh_on_demand.hpp adds connecting pairs on first
// use, and rdx::group::mesh (group/mesh.hpp) the full mesh and the public face.
#pragma once

#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/channel/worker.hpp>
#include <rdx/connect/authenticator.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/tcp_socket.hpp>
#include <rdx/error.hpp>
#include <rdx/group/detail/mesh_wire.hpp>
#include <rdx/group/detail/rendezvous_wire.hpp>
#include <rdx/group/environment.hpp>
#include <rdx/group/mesh_options.hpp>
#include <rdx/group/rendezvous_options.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace rdx::group::detail {

// rdx::group::mesh's fields, in their order, and the functions that one pair
// needs; mesh_on_demand and mesh reach them as protected members.
class mesh_pairs {
public:
  mesh_pairs(const mesh_pairs&) = delete;
  mesh_pairs& operator=(const mesh_pairs&) = delete;
  mesh_pairs(mesh_pairs&&) = delete;
  mesh_pairs& operator=(mesh_pairs&&) = delete;

  //! The rights each peer has on its block of a window.
  static constexpr rights window_rights = rights::read | rights::write;
  //! A peer's block of a rank's window, as this rank reaches it.
  using remote_block = remote_window<std::byte, window_rights>;
  // Peer p's block of this rank's own window (what p writes and reads).
  [[nodiscard]] std::span<std::byte> local_block(std::uint32_t p) const noexcept {
    if (window_.block == 0 || p >= me_.size) {
      return {};
    }
    return window_.bytes.subspan(std::size_t{p} * window_.block, window_.block);
  }

protected:
  mesh_pairs(const rank_info& me, const protection_domain& pd, mesh_window window, mesh_options o)
      : me_(me),
        pd_(&pd),
        o_(std::move(o)),
        window_(window),
        w_(pd, worker_attr{.events = o_.attr.events}),
        slots_(make_window_buffer<std::uint64_t>(pd, std::max<std::uint32_t>(me.size, 1))),
        src_(pd, 1) {}
  ~mesh_pairs() = default;

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
      if (b.size() - at < 32) {
        throw error(errc::wire_format, "a grant message cut short");
      }
      const std::byte* q = b.data() + at;
      window_descriptor d;
      d.memory = {detail::get64(q), detail::get32(q + 8), detail::get64(q + 12)};
      d.granted = static_cast<rights>(detail::get32(q + 20));
      d.element_size = detail::get32(q + 24);
      const std::uint32_t k = detail::get32(q + 28);
      if (k > detail::mesh_max_keys || b.size() - at - 32 < 4 * std::size_t{k}) {
        throw error(errc::wire_format, "a grant with " + std::to_string(k) + " keys");
      }
      for (std::uint32_t j = 0; j < k; ++j) {
        d.keys.push_back(detail::get32(q + 32 + 4 * std::size_t{j}));
      }
      at += 32 + 4 * std::size_t{k};
      ds.push_back(std::move(d));
    }
    if (at != b.size()) {
      throw error(errc::wire_format, "a grant message with bytes left over");
    }
    slot_windows_[p].emplace(*conns_[p], ds[0]);
    if (slot_windows_[p]->size() != 1) {
      throw error(errc::wire_format, "a barrier slot that is not one word");
    }
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
      if (p == me_.rank) {
        continue;
      }
      ops_[p] = slot_windows_[p]->write(local_span<const std::uint64_t>(src_).subspan(0, 1), 0);
    }
    for (;;) {
      // In event mode, nothing to handle: sleep on the worker's descriptor
      // (a completion of this rank's writes wakes it; a peer's write into a
      // slot does not, so at most 1 ms), leaving the core to the ranks and
      // the kernel work that share it.
      if (w_.progress() == 0 && o_.attr.events) {
        (void)w_.wait(std::chrono::milliseconds{1});
      }
      bool all = true;
      for (std::uint32_t p = 0; p < n; ++p) {
        if (p == me_.rank) {
          continue;
        }
        if ((ops_[p].done() && ops_[p].error()) || conns_[p]->failed()) {
          rdx::detail::throw_rdx(
              errc::peer_disconnected,
              "mesh: " + what + ": " + who(p) + ": " +
                  (conns_[p]->failed() ? conns_[p]->failure_message() : ops_[p].error().message()));
        }
        const std::uint64_t got = std::atomic_ref<std::uint64_t>(slots_[p]).load(std::memory_order_acquire);
        all = all && ops_[p].done() && got >= e;
      }
      if (all) {
        return;
      }
      if (tcp::clock::now() >= deadline) {
        std::vector<std::uint32_t> late;
        for (std::uint32_t p = 0; p < n; ++p) {
          if (p != me_.rank &&
              std::atomic_ref<std::uint64_t>(slots_[p]).load(std::memory_order_acquire) < e) {
            late.push_back(p);
          }
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

}  // namespace rdx::group::detail
