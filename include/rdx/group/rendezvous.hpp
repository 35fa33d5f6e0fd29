// rdx: the rendezvous of a job's ranks: every rank hands in a few bytes (its
// connection info, its grants) and gets back every rank's, indexed by rank.
//
// Rank 0 serves it on its rendezvous port (torchrun's MASTER_PORT) from one
// thread: poll() over the listener and every rank's socket, no thread per
// rank. The others connect (retrying until rank 0 listens), send a hello
// {magic, version, rank, size, length} and their bytes, and wait for the
// table. Everything is bounded by one deadline, and every failure is named:
//   - ranks that never arrived, listed;
//   - two processes claiming one rank, or a rank that says the job has
//     another size: the job is inconsistent, every rank is told why;
//   - a rank that leaves after its hello and before the table: named, and
//     every other rank is told;
//   - a stranger's bytes (not a hello) or a hello claiming more than the
//     byte limit: that connection is dropped and the others are served.
// A failure reaches the ranks that are connected as a failure reply; rank 0
// throws the same message.
#pragma once

#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/tcp_socket.hpp>
#include <rdx/connect/wire.hpp>
#include <rdx/error.hpp>
#include <rdx/group/environment.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

namespace rdx::group {

//! How a rendezvous runs.
struct rendezvous_options {
  //! The whole rendezvous, connecting included: ranks that are not there by
  //! then are named, and every rank fails.
  std::chrono::milliseconds timeout{30000};
  //! The most bytes one rank may hand in (a larger hello is a stranger's).
  std::uint32_t max_bytes = 64 * 1024;
};

//! Every rank's bytes, indexed by rank (this rank's own included).
using rendezvous_table = std::vector<std::vector<std::byte>>;

namespace detail {

inline constexpr std::uint32_t rv_magic = 0x52445847;  // "RDXG"
inline constexpr std::uint16_t rv_version = 1;
inline constexpr std::size_t rv_hello_size = 20;  // magic, version, flags, rank, size, length
inline constexpr std::size_t rv_reply_size = 12;  // magic, version, status, count or text length
inline constexpr std::uint16_t rv_ok = 0, rv_failed = 1;

// Big-endian fields, as rdx's wire format writes them.
using rdx::wire::detail::get16;
using rdx::wire::detail::get32;
using rdx::wire::detail::get64;
using rdx::wire::detail::put16;
using rdx::wire::detail::put32;
using rdx::wire::detail::put64;

inline std::vector<std::byte> rv_reply_header(std::uint16_t status, std::uint32_t n) {
  std::vector<std::byte> h(rv_reply_size);
  put32(h.data(), rv_magic);
  put16(h.data() + 4, rv_version);
  put16(h.data() + 6, status);
  put32(h.data() + 8, n);
  return h;
}

// "3, 7 and 9" (at most `most` named, then "and N more").
inline std::string rank_list(const std::vector<std::uint32_t>& ranks, std::size_t most = 16) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size() && i < most; ++i) {
    if (i != 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  if (ranks.size() > most) s += " and " + std::to_string(ranks.size() - most) + " more";
  return s;
}

// Rank 0's side: one thread, poll() over the listener and every socket.
class rendezvous_server {
public:
  rendezvous_server(const rank_info& me, std::span<const std::byte> mine, const rendezvous_options& o)
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

  rendezvous_table run() {
    while (count_ < me_.size) {
      if (tcp::clock::now() >= deadline_) fail_all(errc::timed_out, missing_text());
      poll_once(POLLIN);
      if (!fatal_.empty()) fail_all(fatal_code_, fatal_);
    }
    send_table();
    return std::move(table_);
  }

private:
  struct peer {
    tcp::socket s;
    std::array<std::byte, rv_hello_size> head{};
    std::size_t got = 0;  // bytes of hello and then of the rank's bytes
    std::uint32_t rank = 0;
    std::uint32_t length = 0;
    bool heard = false;  // its header read and of rdx::group: told if the job fails
    bool hello = false;  // its header read and accepted
    bool done = false;   // its bytes all read
    std::size_t sent = 0;
    bool dropped = false;
  };

  std::string missing_text() const {
    std::vector<std::uint32_t> missing;
    for (std::uint32_t r = 0; r < me_.size; ++r) {
      if (!arrived_[r]) missing.push_back(r);
    }
    return "rendezvous on port " + std::to_string(me_.rendezvous_port) + ": rank" +
           (missing.size() == 1 ? " " : "s ") + rank_list(missing) + " of " + std::to_string(me_.size) +
           " never arrived within " + tcp::detail::seconds_text(opt_.timeout) + " (" +
           std::to_string(count_) + " did)";
  }

  void poll_once(short events) {
    std::vector<pollfd> fds;
    fds.reserve(peers_.size() + 1);
    fds.push_back({listener_.native_handle(), static_cast<short>(events == POLLIN ? POLLIN : 0), 0});
    for (const peer& p : peers_) fds.push_back({p.s.native_handle(), p.dropped ? short{0} : events, 0});
    const int rc = ::poll(fds.data(), fds.size(), std::min(tcp::detail::poll_ms(deadline_), 100));
    if (rc < 0 && errno != EINTR) {
      throw error(std::error_code(errno, std::generic_category()), "rendezvous: poll");
    }
    if (rc <= 0) return;
    if ((fds[0].revents & POLLIN) != 0) accept_all();
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0 || peers_[i - 1].dropped) continue;
      if (events == POLLIN) {
        read_from(peers_[i - 1]);
      } else {
        write_to(peers_[i - 1]);
      }
      if (!fatal_.empty()) return;
    }
    std::erase_if(peers_, [](const peer& p) { return p.dropped && !p.hello; });
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd = ::accept4(listener_.native_handle(), reinterpret_cast<sockaddr*>(&ss), &len,
                               SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN: all taken (another error: the next poll says it again)
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      peers_.push_back(
          peer{.s = tcp::socket(fd, tcp::detail::address_text(reinterpret_cast<sockaddr*>(&ss)))});
    }
  }

  // A stranger's connection is dropped; the others are served.
  void drop(peer& p) noexcept {
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
        at = table_[p.rank].data() + p.got;
        want = p.length - p.got;
      }
      if (want == 0) {
        if (p.hello && !p.done) arrive(p);
        return;
      }
      const ssize_t n = ::recv(p.s.native_handle(), at, want, MSG_DONTWAIT);
      if (n > 0) {
        p.got += static_cast<std::size_t>(n);
        if (!p.hello && p.got == rv_hello_size && !check_hello(p)) return;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      // Closed or broken: before its hello a stranger or a probe; after it, a rank gone.
      if (p.hello) {
        fatal(errc::peer_disconnected, "rendezvous: rank " + std::to_string(p.rank) + " (" + p.s.peer() +
                                           ") left during set-up, before the table was sent");
        return;
      }
      drop(p);
      return;
    }
  }

  bool check_hello(peer& p) {
    const std::byte* h = p.head.data();
    const std::uint32_t rank = get32(h + 8), size = get32(h + 12), length = get32(h + 16);
    if (get32(h) != rv_magic || get16(h + 4) != rv_version || length > opt_.max_bytes) {
      drop(p);
      return false;
    }
    p.heard = true;
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
    p.length = length;
    p.hello = true;
    claimed_[rank] = true;
    p.got = 0;
    table_[rank].resize(length);
    return true;
  }

  std::string owner_of(std::uint32_t rank) const {
    for (const peer& q : peers_) {
      if (q.hello && q.rank == rank) return q.s.peer();
    }
    return "?";
  }

  void arrive(peer& p) {
    p.done = true;
    arrived_[p.rank] = true;
    ++count_;
  }

  void fatal(std::error_code ec, std::string what) {
    if (fatal_.empty()) {
      fatal_code_ = ec;
      fatal_ = std::move(what);
    }
  }
  void fatal(errc e, std::string what) { fatal(make_error_code(e), std::move(what)); }

  // Tells every rank that said hello why the job failed (best effort, for
  // at most a second), then throws it here.
  [[noreturn]] void fail_all(std::error_code ec, const std::string& what) {
    std::vector<std::byte> reply = rv_reply_header(rv_failed, static_cast<std::uint32_t>(what.size()));
    const auto* text = reinterpret_cast<const std::byte*>(what.data());
    reply.insert(reply.end(), text, text + what.size());
    const auto until = tcp::clock::now() + std::chrono::seconds(1);
    // Ranks already connecting (in the listener's backlog, which closing it
    // would reset) are taken, and hellos on their way read, for at most
    // 200 ms, so that those ranks are told too (what they say no longer
    // changes the verdict).
    const auto gather = std::min(until, tcp::clock::now() + std::chrono::milliseconds(200));
    for (;;) {
      accept_all();
      bool unheard = false;
      for (peer& p : peers_) {
        if (!p.heard && !p.dropped) read_from(p);
        unheard = unheard || (!p.heard && !p.dropped);
      }
      if (!unheard || tcp::clock::now() >= gather) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (peer& p : peers_) {
      if (p.dropped) continue;
      if (p.heard) {
        try {
          p.s.send_all(reply, until, "rendezvous failure reply");
        } catch (const rdx::error&) {
          // That rank is gone too; the others are still told.
        }
      }
      ::shutdown(p.s.native_handle(), SHUT_WR);
    }
    // A socket closed with bytes unread resets, and the reset can overtake
    // the reply: each rank's remaining bytes are taken until it closes (it
    // does once it has read the reply), for at most a second.
    for (;;) {
      std::vector<pollfd> fds;
      for (peer& p : peers_) {
        if (!p.dropped) fds.push_back({p.s.native_handle(), POLLIN, 0});
      }
      if (fds.empty() || tcp::clock::now() >= until) break;
      if (::poll(fds.data(), fds.size(), tcp::detail::poll_ms(until)) <= 0) continue;
      for (peer& p : peers_) {
        if (p.dropped) continue;
        std::byte sink[4096];
        ssize_t n = 0;
        while ((n = ::recv(p.s.native_handle(), sink, sizeof sink, MSG_DONTWAIT)) > 0) {}
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) drop(p);
      }
    }
    throw error(ec, what);
  }

  // Every rank's bytes to every other rank: non-blocking sends over poll().
  void send_table() {
    reply_ = rv_reply_header(rv_ok, me_.size);
    for (const auto& b : table_) {
      std::byte len[4];
      put32(len, static_cast<std::uint32_t>(b.size()));
      reply_.insert(reply_.end(), len, len + 4);
      reply_.insert(reply_.end(), b.begin(), b.end());
    }
    std::erase_if(peers_, [](const peer& p) { return !p.hello; });
    for (;;) {
      const bool all =
          std::all_of(peers_.begin(), peers_.end(), [&](const peer& p) { return p.sent == reply_.size(); });
      if (all) return;
      if (tcp::clock::now() >= deadline_) {
        std::vector<std::uint32_t> late;
        for (const peer& p : peers_) {
          if (p.sent != reply_.size()) late.push_back(p.rank);
        }
        throw error(errc::timed_out, "rendezvous: the table did not reach rank" +
                                         std::string(late.size() == 1 ? " " : "s ") + rank_list(late) +
                                         " within the deadline");
      }
      poll_once(POLLOUT);
      if (!fatal_.empty()) throw error(fatal_code_, fatal_);
    }
  }

  void write_to(peer& p) {
    while (p.sent < reply_.size()) {
      const ssize_t n = ::send(p.s.native_handle(), reply_.data() + p.sent, reply_.size() - p.sent,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        p.sent += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      fatal(errc::peer_disconnected, "rendezvous: rank " + std::to_string(p.rank) + " (" + p.s.peer() +
                                         ") left before the table reached it");
      return;
    }
  }

  rank_info me_;
  rendezvous_options opt_;
  tcp::clock::time_point deadline_;
  rendezvous_table table_;
  std::vector<bool> arrived_;  // its bytes all here
  std::vector<bool> claimed_;  // a hello for it accepted (arrived or on its way)
  std::uint32_t count_ = 0;
  tcp::listener listener_;
  std::vector<peer> peers_;
  std::vector<std::byte> reply_;
  std::string fatal_;
  std::error_code fatal_code_;
};

// A rank other than 0: hello, bytes, then the table or rank 0's reason.
inline rendezvous_table rendezvous_client(const rank_info& me, std::span<const std::byte> mine,
                                          const rendezvous_options& o) {
  const auto deadline = tcp::clock::now() + o.timeout;
  const std::string where = me.rendezvous_host + ":" + std::to_string(me.rendezvous_port);
  tcp::socket s = tcp::connect(me.rendezvous_host, me.rendezvous_port, o.timeout);
  std::vector<std::byte> hello(rv_hello_size);
  put32(hello.data(), rv_magic);
  put16(hello.data() + 4, rv_version);
  put16(hello.data() + 6, 0);
  put32(hello.data() + 8, me.rank);
  put32(hello.data() + 12, me.size);
  put32(hello.data() + 16, static_cast<std::uint32_t>(mine.size()));
  hello.insert(hello.end(), mine.begin(), mine.end());
  s.send_all(hello, deadline, "rendezvous hello");
  // Rank 0 names the ranks missing at its own deadline, which began about
  // when this one's did: its reason gets a grace period to arrive.
  const auto reply_by =
      deadline + std::max<std::chrono::milliseconds>(std::chrono::seconds(2), o.timeout / 10);
  std::array<std::byte, rv_reply_size> h{};
  s.recv_exact(h, reply_by, "rendezvous reply (rank 0 waits for every rank)");
  if (get32(h.data()) != rv_magic || get16(h.data() + 4) != rv_version) {
    throw error(errc::wire_format,
                "rendezvous at " + where + ": the reply is not rdx::group's (another program on the port?)");
  }
  const std::uint32_t n = get32(h.data() + 8);
  if (get16(h.data() + 6) == rv_failed) {
    if (n > 4096)
      throw error(errc::wire_format,
                  "rendezvous at " + where + ": a failure reply of " + std::to_string(n) + " bytes");
    std::string text(n, '\0');
    s.recv_exact(std::as_writable_bytes(std::span(text)), reply_by, "rendezvous failure reply");
    throw error(errc::operation_failed, "rendezvous at " + where + " failed: " + text);
  }
  if (n != me.size) {
    throw error(errc::protocol_error, "rendezvous at " + where + ": a table of " + std::to_string(n) +
                                          " ranks for a job of " + std::to_string(me.size));
  }
  rendezvous_table table(n);
  for (std::uint32_t r = 0; r < n; ++r) {
    std::array<std::byte, 4> len{};
    s.recv_exact(len, reply_by, "rendezvous table");
    const std::uint32_t l = get32(len.data());
    if (l > o.max_bytes) {
      throw error(errc::protocol_error, "rendezvous at " + where + ": rank " + std::to_string(r) +
                                            "'s entry of " + std::to_string(l) +
                                            " bytes is above the limit " + std::to_string(o.max_bytes));
    }
    table[r].resize(l);
    s.recv_exact(table[r], reply_by, "rendezvous table");
  }
  return table;
}

}  // namespace detail

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
  if (me.size == 1) return rendezvous_table{std::vector<std::byte>(mine.begin(), mine.end())};
  if (me.rank == 0) return detail::rendezvous_server(me, mine, o).run();
  return detail::rendezvous_client(me, mine, o);
}

}  // namespace rdx::group
