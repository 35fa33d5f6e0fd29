// rdx: the rendezvous of a job's ranks: every rank hands in a few bytes (its
// connection info, its grants) and gets back every rank's, indexed by rank.
//
// Rank 0 serves it on its rendezvous port (torchrun's MASTER_PORT) from one
// thread: poll() over the listener and every rank's socket, no thread per
// rank. The others connect (retrying until rank 0 listens), send a hello
// {magic, version, rank, size, length} and their bytes, and wait for the
// table: a reply header {magic, version, status, count}, the table's length
// in bytes, then each rank's {length, bytes}, read by each rank in one go. Everything is bounded by one
// deadline, and every failure is named:
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
#pragma once

#include <rdx/connect/authenticator.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/tcp_socket.hpp>
#include <rdx/connect/wire.hpp>
#include <rdx/detail/random.hpp>
#include <rdx/error.hpp>
#include <rdx/group/environment.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
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
  //! A key every rank of the job holds (an rdx::auth::psk_key, say): each rank
  //! proves it holds the key before rank 0 takes its bytes, and rank 0 proves
  //! the table is the job's. A process without it, or with another, is refused
  //! by name and the others are served. Every rank must be given one, or none.
  std::shared_ptr<const keyed_mac> key{};
};

//! Every rank's bytes, indexed by rank (this rank's own included).
using rendezvous_table = std::vector<std::vector<std::byte>>;

namespace detail {

inline constexpr std::uint32_t rv_magic = 0x52445847;  // "RDXG"
inline constexpr std::uint16_t rv_version = 2;
inline constexpr std::size_t rv_hello_size = 20;  // magic, version, flags, rank, size, length
inline constexpr std::size_t rv_reply_size = 12;  // magic, version, status, count or text length
inline constexpr std::uint16_t rv_ok = 0, rv_failed = 1;
inline constexpr std::uint16_t rv_challenge = 2;  // keyed: rank 0's nonce follows
inline constexpr std::uint16_t rv_refused = 3;    // keyed: this process is refused, the text follows
inline constexpr std::uint16_t rv_keyed = 1;      // a hello's flags: a nonce follows, a MAC later
inline constexpr std::size_t rv_nonce_size = 32;
using rv_mac = std::array<std::byte, keyed_mac::mac_size>;

// What each MAC covers starts with its own label.
inline std::span<const std::byte> rv_label(std::string_view l) noexcept {
  return std::as_bytes(std::span(l.data(), l.size()));
}
inline constexpr std::string_view rv_hello_label = "rdx.group.rendezvous.v2 hello";
inline constexpr std::string_view rv_digest_label = "rdx.group.rendezvous.v2 table";
inline constexpr std::string_view rv_table_label = "rdx.group.rendezvous.v2 table for";

// Equal in time that does not depend on where they differ.
inline bool rv_same(std::span<const std::byte> a, std::span<const std::byte> b) noexcept {
  if (a.size() != b.size()) return false;
  unsigned d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d |= std::to_integer<unsigned>(a[i] ^ b[i]);
  return d == 0;
}

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

  std::string missing_text() const {
    std::vector<std::uint32_t> missing;
    for (std::uint32_t r = 0; r < me_.size; ++r) {
      if (!arrived_[r]) missing.push_back(r);
    }
    return "rendezvous on port " + std::to_string(me_.rendezvous_port) + ": rank" +
           (missing.size() == 1 ? " " : "s ") + rank_list(missing) + " of " + std::to_string(me_.size) +
           " never arrived within " + tcp::detail::seconds_text(opt_.timeout) + " (" +
           std::to_string(count_) + " did)" + (refused_.empty() ? "" : "; refused: " + refused_);
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
    std::erase_if(peers_, [](const peer& p) { return p.dropped && !p.owns; });
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
        at = p.body.data() + p.got;
        want = p.body.size() - p.got;
        // Keyed: its nonce is in, so rank 0's goes out (48 bytes into an
        // empty socket buffer: the send never waits).
        if (p.keyed && !p.asked && p.got >= rv_nonce_size && !ask(p)) return;
      }
      if (want == 0) {
        if (p.hello && !p.done) complete(p);
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
    if (p.keyed || opt_.key) return true;  // checked when its body is in
    return claim(p);
  }

  // The hello's rank and size, believed: a contradiction fails the job.
  bool claim(peer& p) {
    const std::byte* h = p.head.data();
    const std::uint32_t rank = get32(h + 8), size = get32(h + 12);
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
    if (!opt_.key) return true;
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
      if (!claim(p)) return;
    }
    p.done = true;
    table_[p.rank].assign(bytes.begin(), bytes.end());
    arrived_[p.rank] = true;
    ++count_;
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
      if (q.owns && q.rank == rank) return q.s.peer();
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
    std::size_t body = 0;
    for (const auto& b : table_) body += 4 + b.size();
    reply_.resize(rv_reply_size + 8);
    put64(reply_.data() + rv_reply_size, body);
    reply_.reserve(reply_.size() + body);
    for (const auto& b : table_) {
      std::byte len[4];
      put32(len, static_cast<std::uint32_t>(b.size()));
      reply_.insert(reply_.end(), len, len + 4);
      reply_.insert(reply_.end(), b.begin(), b.end());
    }
    std::erase_if(peers_, [](const peer& p) { return !p.hello || !p.done; });
    if (opt_.key) {
      // One MAC over the table, then one per rank over its nonces and that.
      const rv_mac digest = opt_.key->mac({rv_label(rv_digest_label), reply_});
      for (peer& p : peers_) {
        const auto cn = std::span<const std::byte>(p.body).first(rv_nonce_size);
        p.tag = opt_.key->mac({rv_label(rv_table_label), p.nonce, cn, digest});
      }
    }
    const std::size_t total = reply_.size() + (opt_.key ? rv_mac{}.size() : 0);
    for (;;) {
      const bool all =
          std::all_of(peers_.begin(), peers_.end(), [&](const peer& p) { return p.sent == total; });
      if (all) return;
      if (tcp::clock::now() >= deadline_) {
        std::vector<std::uint32_t> late;
        for (const peer& p : peers_) {
          if (p.sent != total) late.push_back(p.rank);
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
    const std::size_t tail = opt_.key ? p.tag.size() : 0;
    while (p.sent < reply_.size() + tail) {
      const bool head = p.sent < reply_.size();
      const std::byte* from = head ? reply_.data() + p.sent : p.tag.data() + (p.sent - reply_.size());
      const std::size_t left = head ? reply_.size() - p.sent : reply_.size() + tail - p.sent;
      const ssize_t n = ::send(p.s.native_handle(), from, left, MSG_DONTWAIT | MSG_NOSIGNAL);
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
  std::string refused_;  // processes refused (keyed), for the verdict
  std::string fatal_;
  std::error_code fatal_code_;
};

// A rank other than 0: hello, bytes, then the table or rank 0's reason.
inline rendezvous_table rendezvous_client(const rank_info& me, std::span<const std::byte> mine,
                                          const rendezvous_options& o) {
  const auto deadline = tcp::clock::now() + o.timeout;
  const std::string where = me.rendezvous_host + ":" + std::to_string(me.rendezvous_port);
  tcp::socket s = tcp::connect(me.rendezvous_host, me.rendezvous_port, o.timeout);
  const keyed_mac* key = o.key.get();
  std::vector<std::byte> hello(rv_hello_size);
  put32(hello.data(), rv_magic);
  put16(hello.data() + 4, rv_version);
  put16(hello.data() + 6, key != nullptr ? rv_keyed : 0);
  put32(hello.data() + 8, me.rank);
  put32(hello.data() + 12, me.size);
  put32(hello.data() + 16, static_cast<std::uint32_t>(mine.size()));
  rv_mac cn{};  // keyed: this rank's nonce
  if (key != nullptr) {
    rdx::detail::os_random(cn.data(), cn.size());
    hello.insert(hello.end(), cn.begin(), cn.end());
  }
  hello.insert(hello.end(), mine.begin(), mine.end());
  s.send_all(hello, deadline, "rendezvous hello");
  // Rank 0 names the ranks missing at its own deadline, which began about
  // when this one's did: its reason gets a grace period to arrive.
  const auto reply_by =
      deadline + std::max<std::chrono::milliseconds>(std::chrono::seconds(2), o.timeout / 10);
  std::array<std::byte, rv_reply_size> h{};
  auto read_header = [&] {
    s.recv_exact(h, reply_by, "rendezvous reply (rank 0 waits for every rank)");
    if (get32(h.data()) != rv_magic || get16(h.data() + 4) != rv_version) {
      throw error(errc::wire_format, "rendezvous at " + where +
                                         ": the reply is not rdx::group's (another program on the port?)");
    }
  };
  read_header();
  rv_mac sn{};  // keyed: rank 0's nonce
  if (key != nullptr && get16(h.data() + 6) == rv_challenge && get32(h.data() + 8) == sn.size()) {
    s.recv_exact(sn, reply_by, "rendezvous challenge");
    const rv_mac m =
        key->mac({rv_label(rv_hello_label), sn, cn, std::span(hello).first(rv_hello_size), mine});
    s.send_all(m, deadline, "rendezvous proof");
    read_header();
  } else if (key != nullptr && get16(h.data() + 6) == rv_ok) {
    throw error(errc::authentication_failed, "rendezvous at " + where +
                                                 ": rank 0 sent a table without asking for the key (it has "
                                                 "none: give every rank the same key, or none)");
  }
  const std::uint16_t status = get16(h.data() + 6);
  const std::uint32_t n = get32(h.data() + 8);
  if (status == rv_failed || status == rv_refused) {
    if (n > 4096)
      throw error(errc::wire_format,
                  "rendezvous at " + where + ": a failure reply of " + std::to_string(n) + " bytes");
    std::string text(n, '\0');
    s.recv_exact(std::as_writable_bytes(std::span(text)), reply_by, "rendezvous failure reply");
    if (status == rv_refused) throw error(errc::authentication_failed, text);
    throw error(errc::operation_failed, "rendezvous at " + where + " failed: " + text);
  }
  if (status != rv_ok) {
    throw error(errc::wire_format,
                "rendezvous at " + where + ": a reply of status " + std::to_string(status) +
                    (status == rv_challenge ? " (a key asked for: this rank has none; give "
                                              "every rank the same key, or none)"
                                            : ""));
  }
  if (n != me.size) {
    throw error(errc::protocol_error, "rendezvous at " + where + ": a table of " + std::to_string(n) +
                                          " ranks for a job of " + std::to_string(me.size));
  }
  // The table in one read: its length first, bounded by what n ranks may
  // hand in, so a forged length cannot make this rank allocate more.
  std::array<std::byte, 8> len{};
  s.recv_exact(len, reply_by, "rendezvous table");
  const std::uint64_t body = get64(len.data());
  if (body < 4ull * n || body > std::uint64_t{n} * (4ull + o.max_bytes)) {
    throw error(errc::protocol_error, "rendezvous at " + where + ": a table of " + std::to_string(body) +
                                          " bytes for " + std::to_string(n) + " ranks of at most " +
                                          std::to_string(o.max_bytes) + " bytes each");
  }
  std::vector<std::byte> all(static_cast<std::size_t>(body));
  s.recv_exact(all, reply_by, "rendezvous table");
  if (key != nullptr) {
    rv_mac theirs{};
    s.recv_exact(theirs, reply_by, "rendezvous table's MAC");
    const rv_mac digest = key->mac({rv_label(rv_digest_label), h, len, all});
    if (!rv_same(key->mac({rv_label(rv_table_label), sn, cn, digest}), theirs)) {
      throw error(errc::authentication_failed,
                  "rendezvous at " + where +
                      ": the table's MAC is wrong (rank 0 holds another key, or the table was altered)");
    }
  }
  rendezvous_table table(n);
  std::size_t at = 0;
  for (std::uint32_t r = 0; r < n; ++r) {
    const std::uint32_t l = at + 4 <= all.size() ? get32(all.data() + at) : 0xffffffffu;
    if (l > o.max_bytes || at + 4 + l > all.size()) {
      throw error(errc::protocol_error, "rendezvous at " + where + ": rank " + std::to_string(r) +
                                            "'s entry runs past the table or above the limit " +
                                            std::to_string(o.max_bytes));
    }
    table[r].assign(all.begin() + static_cast<std::ptrdiff_t>(at + 4),
                    all.begin() + static_cast<std::ptrdiff_t>(at + 4 + l));
    at += 4 + l;
  }
  if (at != all.size()) {
    throw error(errc::protocol_error, "rendezvous at " + where + ": " + std::to_string(all.size() - at) +
                                          " bytes past the table's last entry");
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
