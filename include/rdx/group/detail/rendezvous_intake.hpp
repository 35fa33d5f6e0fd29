// rdx::group::detail: rank 0's intake for the rendezvous: connections taken
// from the listener, hellos read and checked (keyed: challenged and their MACs
// checked before their rank counts), ranks claimed, strangers dropped and
// refused processes named; each rank's bytes go into the table.
#pragma once

#include <rdx/connect/authenticator.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/tcp_socket.hpp>
#include <rdx/detail/random.hpp>
#include <rdx/error.hpp>
#include <rdx/group/detail/rendezvous_wire.hpp>
#include <rdx/group/environment.hpp>
#include <rdx/group/rendezvous_options.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace rdx::group::detail {

// Rank 0's state while the ranks arrive, and the reading of each one's hello
// and bytes; rendezvous_server drives it and sends the verdict.
class rendezvous_intake {
public:
  rendezvous_intake(const rank_info& me, std::span<const std::byte> mine, const rendezvous_options& o)
      : me_(me),
        opt_(o),
        deadline_(tcp::clock::now() + o.timeout),
        table_(me.size),
        arrived_(me.size, false),
        claimed_(me.size, false) {
    table_[0].assign(mine.begin(), mine.end());
    arrived_[0] = true;
    claimed_[0] = true;
    count_ = 1;
    listener_ = tcp::listener::bind("", me.rendezvous_port);
    tcp::detail::set_nonblocking(listener_.native_handle(), true);  // accept_all() takes until EAGAIN
    // Every rank connects at once: a backlog of the bootstrap's 16 drops
    // their SYNs, and each dropped one waits out the kernel's SYN retry (1 s,
    // then 3 s, ...). listen() again sets the largest the kernel allows.
    ::listen(listener_.native_handle(), SOMAXCONN);
  }

protected:
  struct peer {
    tcp::socket s;
    std::array<std::byte, rv_hello_size> head{};
    // After the hello: keyed, its nonce, its bytes and its MAC; else its bytes.
    std::vector<std::byte> body{};
    std::size_t got = 0;  // bytes of hello and then of the body
    std::uint32_t rank = 0;
    std::uint32_t length = 0;
    bool keyed = false;  // its hello said it holds a key
    bool heard = false;  // its header read and of rdx::group: told if the job fails
    bool hello = false;  // its header read and accepted
    bool owns = false;   // its rank claimed (keyed: once its MAC was checked)
    bool done = false;   // its bytes all read (and, keyed, its MAC checked)
    bool asked = false;  // keyed: rank 0's nonce sent
    rv_mac nonce{};      // keyed: rank 0's nonce for it
    rv_mac tag{};        // keyed: the table's MAC for it
    std::size_t sent = 0;
    bool dropped = false;
  };

  void accept_all() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd = ::accept4(listener_.native_handle(), reinterpret_cast<sockaddr*>(&ss), &len,
                               SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) {
          continue;
        }
        return;  // EAGAIN: all taken (another error: the next poll says it again)
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      peers_.push_back(
          peer{.s = tcp::socket(fd, tcp::detail::address_text(reinterpret_cast<sockaddr*>(&ss)))});
    }
  }

  // A stranger's connection is dropped; the others are served.
  static void drop(peer& p) noexcept {
    p.dropped = true;
    p.s.close();
  }

  void read_from(peer& p) {
    for (;;) {
      std::byte* at = nullptr;
      std::size_t want = 0;
      if (!p.hello) {
        at = p.head.data() + p.got;
        want = rv_hello_size - p.got;
      } else {
        at = p.body.data() + p.got;
        want = p.body.size() - p.got;
        // Keyed: its nonce is in, so rank 0's goes out (48 bytes into an
        // empty socket buffer: the send never waits).
        if (p.keyed && !p.asked && p.got >= rv_nonce_size && !ask(p)) {
          return;
        }
      }
      if (want == 0) {
        if (p.hello && !p.done) {
          complete(p);
        }
        return;
      }
      const ssize_t n = ::recv(p.s.native_handle(), at, want, MSG_DONTWAIT);
      if (n > 0) {
        p.got += static_cast<std::size_t>(n);
        if (!p.hello && p.got == rv_hello_size && !check_hello(p)) {
          return;
        }
        continue;
      }
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      }
      // Closed or broken: before it claimed a rank, a stranger or a probe;
      // after, a rank gone.
      if (p.owns) {
        fatal(errc::peer_disconnected, "rendezvous: rank " + std::to_string(p.rank) + " (" + p.s.peer() +
                                           ") left during set-up, before the table was sent");
        return;
      }
      drop(p);
      return;
    }
  }

  // Reads the hello's fixed part. Without a key, the rank is claimed here;
  // with one, nothing it says is believed before its MAC is checked.
  bool check_hello(peer& p) {
    const std::byte* h = p.head.data();
    const std::uint32_t length = get32(h + 16);
    if (get32(h) != rv_magic || get16(h + 4) != rv_version || length > opt_.max_bytes) {
      drop(p);
      return false;
    }
    p.heard = true;
    p.keyed = (get16(h + 6) & rv_keyed) != 0;
    p.length = length;
    p.hello = true;
    p.got = 0;
    // A MAC comes only after rank 0's nonce, which only a keyed rank 0 sends.
    p.body.resize((p.keyed ? rv_nonce_size : 0) + length + (p.keyed && opt_.key ? rv_mac{}.size() : 0));
    if (p.keyed || opt_.key) {
      return true;  // checked when its body is in
    }
    return claim(p);
  }

  // The hello's rank and size, believed: a contradiction fails the job.
  bool claim(peer& p) {
    const std::byte* h = p.head.data();
    const std::uint32_t rank = get32(h + 8);
    const std::uint32_t size = get32(h + 12);
    if (size != me_.size) {
      fatal(errc::invalid_argument, "rendezvous: rank " + std::to_string(rank) + " (" + p.s.peer() +
                                        ") says the job has " + std::to_string(size) +
                                        " ranks, rank 0 says " + std::to_string(me_.size));
      return false;
    }
    if (rank >= me_.size) {
      fatal(errc::invalid_argument, "rendezvous: a process at " + p.s.peer() + " claims rank " +
                                        std::to_string(rank) + " of a job of " + std::to_string(me_.size));
      return false;
    }
    if (claimed_[rank]) {
      fatal(errc::invalid_argument, "rendezvous: two processes claim rank " + std::to_string(rank) + ": " +
                                        (rank == 0 ? std::string("rank 0 itself") : owner_of(rank)) +
                                        " and " + p.s.peer());
      return false;
    }
    p.rank = rank;
    p.owns = true;
    claimed_[rank] = true;
    return true;
  }

  // Keyed: sends rank 0's nonce to a keyed hello (a hello without a key to a
  // keyed rank 0, or the reverse, is refused once its body is in).
  bool ask(peer& p) {
    p.asked = true;
    if (!opt_.key) {
      return true;
    }
    rdx::detail::os_random(p.nonce.data(), p.nonce.size());
    std::vector<std::byte> c = rv_reply_header(rv_challenge, static_cast<std::uint32_t>(p.nonce.size()));
    c.insert(c.end(), p.nonce.begin(), p.nonce.end());
    const ssize_t n = ::send(p.s.native_handle(), c.data(), c.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(c.size())) {
      drop(p);
      return false;
    }
    return true;
  }

  // Its whole body is in: keyed, the MAC is checked before anything it said
  // counts; then its bytes go into the table.
  void complete(peer& p) {
    if (p.keyed != static_cast<bool>(opt_.key)) {
      refuse(p, p.keyed ? "it came with a key and rank 0 has none: give every rank the same key, or none"
                        : "rank 0 requires the job's key and it came without one: give every rank the "
                          "same key (rendezvous_options::key, mesh_options::key)");
      return;
    }
    std::span<const std::byte> bytes(p.body);
    if (p.keyed) {
      const auto cn = bytes.first(rv_nonce_size);
      bytes = bytes.subspan(rv_nonce_size, p.length);
      const auto theirs = std::span<const std::byte>(p.body).last(rv_mac{}.size());
      const rv_mac want = opt_.key->mac({rv_label(rv_hello_label), p.nonce, cn, p.head, bytes});
      if (!rv_same(want, theirs)) {
        refuse(p, "its MAC is wrong: it holds another key than rank 0");
        return;
      }
      if (!claim(p)) {
        return;
      }
    }
    p.done = true;
    table_[p.rank].assign(bytes.begin(), bytes.end());
    arrived_[p.rank] = true;
    ++count_;
    tell_wait(p);
  }

  // Its bytes are in: it is told how long rank 0 may still wait for the
  // others. A rank's own deadline began when it called, which can be well
  // before rank 0 listened (ranks start unevenly on a loaded host); rank 0's
  // verdict comes by its own deadline, and this says when that is. Twelve
  // bytes into a socket that holds at most the challenge: the send never
  // waits (if it fails, the rank keeps its own deadline).
  void tell_wait(peer& p) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - tcp::clock::now());
    const auto ms = static_cast<std::uint32_t>(std::max<std::chrono::milliseconds::rep>(left.count(), 0));
    const std::vector<std::byte> w = rv_reply_header(rv_waiting, ms);
    (void)::send(p.s.native_handle(), w.data(), w.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  // One process refused, by name; the job goes on without it.
  void refuse(peer& p, const std::string& why) {
    const std::string who = "a process at " + p.s.peer() + " claiming rank " +
                            std::to_string(get32(p.head.data() + 8)) + ": " + why;
    const std::string text =
        "rendezvous on port " + std::to_string(me_.rendezvous_port) + ": rank 0 refused " + who;
    refused_ += (refused_.empty() ? "" : "; ") + who;
    std::vector<std::byte> r = rv_reply_header(rv_refused, static_cast<std::uint32_t>(text.size()));
    const auto* t = reinterpret_cast<const std::byte*>(text.data());
    r.insert(r.end(), t, t + text.size());
    (void)::send(p.s.native_handle(), r.data(), r.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(p.s.native_handle(), SHUT_WR);
    drop(p);  // it owns no rank: erased from the peers
  }

  std::string owner_of(std::uint32_t rank) const {
    for (const peer& q : peers_) {
      if (q.owns && q.rank == rank) {
        return q.s.peer();
      }
    }
    return "?";
  }

  void fatal(std::error_code ec, std::string what) {
    if (fatal_.empty()) {
      fatal_code_ = ec;
      fatal_ = std::move(what);
    }
  }
  void fatal(errc e, std::string what) { fatal(make_error_code(e), std::move(what)); }

  rank_info me_;
  rendezvous_options opt_;
  tcp::clock::time_point deadline_;
  rendezvous_table table_;
  std::vector<bool> arrived_;  // its bytes all here
  std::vector<bool> claimed_;  // a hello for it accepted (arrived or on its way)
  std::uint32_t count_ = 0;
  tcp::listener listener_;
  std::vector<peer> peers_;
  std::string refused_;  // processes refused (keyed), for the verdict
  std::string fatal_;
  std::error_code fatal_code_;
};

}  // namespace rdx::group::detail
