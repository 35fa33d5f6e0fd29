// rdx::group::detail: a mesh's pairs connected on first use
// (mesh_options::on_demand). The higher rank of a pair always connects to the
// lower one's acceptor; a lower rank that needs a higher one first sends it a
// request, so every blocking wait is on a lower rank and none closes a cycle.
#pragma once

#include <rdx/channel/acceptor.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/tcp_socket.hpp>
#include <rdx/error.hpp>
#include <rdx/group/detail/mesh_pairs.hpp>
#include <rdx/group/detail/mesh_wire.hpp>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include <poll.h>

namespace rdx::group::detail {

class mesh_on_demand : public mesh_pairs {
protected:
  using mesh_pairs::mesh_pairs;

  // on_demand: connects the pair with p if it is not yet.
  void ensure(std::uint32_t p) {
    if (!o_.on_demand || ready(p)) {
      return;
    }
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
      if (!ready(q)) {
        connect_pair(q);
      }
    }
    const auto until = tcp::clock::now() + o_.timeout;
    std::vector<std::uint32_t> higher;
    for (std::uint32_t p = me_.rank + 1; p < me_.size; ++p) {
      if (ready(p)) {
        continue;
      }
      send_request(p);
      higher.push_back(p);
    }
    wait_for(higher, until);
  }

  // on_demand: takes what the acceptor finished: a higher rank's connection
  // (grants exchanged on its socket), or a lower rank's request (this rank
  // connects to it, a blocking wait on a lower rank only).
  void serve() {
    if (!o_.on_demand || !acc_) {
      return;
    }
    while (auto a = acc_->poll()) {
      if (a->handed_out) {
        const std::uint32_t from = detail::get32(a->preamble.data() + 16);
        if (!ready(from)) {
          connect_pair(from);
        }
        continue;
      }
      if (!*a) {
        dropped_ = refusal(*a);
        continue;
      }
      const std::uint32_t from = detail::get32(a->preamble.data() + 16);
      if (conns_[from]) {
        continue;  // a second set-up of the pair: closed here
      }
      conns_[from] = std::move(a->conn);
      socks_[from] = std::move(a->socket);
      finish_pair(from);
    }
  }

private:
  // Serves set-ups until every rank of `ps` has connected here.
  void wait_for(const std::vector<std::uint32_t>& ps, tcp::clock::time_point until) {
    for (;;) {
      serve();
      std::vector<std::uint32_t> missing;
      for (std::uint32_t p : ps) {
        if (!ready(p)) {
          missing.push_back(p);
        }
      }
      if (missing.empty()) {
        break;
      }
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
    for (std::uint32_t p : ps) {
      requests_[p] = tcp::socket{};
    }
  }

  // on_demand: asks the higher rank p to connect here (a request preamble
  // on a socket of its own, kept open until p has connected).
  void send_request(std::uint32_t p) {
    if (requests_[p].native_handle() >= 0) {
      return;
    }
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
};

}  // namespace rdx::group::detail
