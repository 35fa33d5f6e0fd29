// rdx::group::detail: rank 0's side of the rendezvous: one thread, poll()
// over the listener and every rank's socket; hellos read and checked by its
// intake (rendezvous_intake.hpp), then the table sent to every rank, or the
// job's failure named to every rank that said hello.
#pragma once

#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/tcp_socket.hpp>
#include <rdx/error.hpp>
#include <rdx/group/detail/rendezvous_intake.hpp>
#include <rdx/group/detail/rendezvous_wire.hpp>
#include <rdx/group/environment.hpp>
#include <rdx/group/rendezvous_options.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/socket.h>

namespace rdx::group::detail {

// Rank 0's side: one thread, poll() over the listener and every socket.
class rendezvous_server : private rendezvous_intake {
public:
  rendezvous_server(const rank_info& me, std::span<const std::byte> mine, const rendezvous_options& o)
      : rendezvous_intake(me, mine, o) {}

  rendezvous_table run() {
    while (count_ < me_.size) {
      if (tcp::clock::now() >= deadline_) {
        fail_all(errc::timed_out, missing_text());
      }
      poll_once(POLLIN);
      if (!fatal_.empty()) {
        fail_all(fatal_code_, fatal_);
      }
    }
    send_table();
    return std::move(table_);
  }

private:
  std::string missing_text() const {
    std::vector<std::uint32_t> missing;
    for (std::uint32_t r = 0; r < me_.size; ++r) {
      if (!arrived_[r]) {
        missing.push_back(r);
      }
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
    for (const peer& p : peers_) {
      fds.push_back({p.s.native_handle(), p.dropped ? short{0} : events, 0});
    }
    const int rc = ::poll(fds.data(), fds.size(), std::min(tcp::detail::poll_ms(deadline_), 100));
    if (rc < 0 && errno != EINTR) {
      throw error(std::error_code(errno, std::generic_category()), "rendezvous: poll");
    }
    if (rc <= 0) {
      return;
    }
    if ((fds[0].revents & POLLIN) != 0) {
      accept_all();
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0 || peers_[i - 1].dropped) {
        continue;
      }
      if (events == POLLIN) {
        read_from(peers_[i - 1]);
      } else {
        write_to(peers_[i - 1]);
      }
      if (!fatal_.empty()) {
        return;
      }
    }
    std::erase_if(peers_, [](const peer& p) { return p.dropped && !p.owns; });
  }

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
        if (!p.heard && !p.dropped) {
          read_from(p);
        }
        unheard = unheard || (!p.heard && !p.dropped);
      }
      if (!unheard || tcp::clock::now() >= gather) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (peer& p : peers_) {
      if (p.dropped) {
        continue;
      }
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
        if (!p.dropped) {
          fds.push_back({p.s.native_handle(), POLLIN, 0});
        }
      }
      if (fds.empty() || tcp::clock::now() >= until) {
        break;
      }
      if (::poll(fds.data(), fds.size(), tcp::detail::poll_ms(until)) <= 0) {
        continue;
      }
      for (peer& p : peers_) {
        if (p.dropped) {
          continue;
        }
        std::byte sink[4096];
        ssize_t n = 0;
        while ((n = ::recv(p.s.native_handle(), sink, sizeof sink, MSG_DONTWAIT)) > 0) {}
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          drop(p);
        }
      }
    }
    throw error(ec, what);
  }

  // Every rank's bytes to every other rank: non-blocking sends over poll().
  void send_table() {
    reply_ = rv_reply_header(rv_ok, me_.size);
    std::size_t body = 0;
    for (const auto& b : table_) {
      body += 4 + b.size();
    }
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
      if (all) {
        return;
      }
      if (tcp::clock::now() >= deadline_) {
        std::vector<std::uint32_t> late;
        for (const peer& p : peers_) {
          if (p.sent != total) {
            late.push_back(p.rank);
          }
        }
        throw error(errc::timed_out, "rendezvous: the table did not reach rank" +
                                         std::string(late.size() == 1 ? " " : "s ") + rank_list(late) +
                                         " within the deadline");
      }
      poll_once(POLLOUT);
      if (!fatal_.empty()) {
        throw error(fatal_code_, fatal_);
      }
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
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      }
      fatal(errc::peer_disconnected, "rendezvous: rank " + std::to_string(p.rank) + " (" + p.s.peer() +
                                         ") left before the table reached it");
      return;
    }
  }

  std::vector<std::byte> reply_;
};

}  // namespace rdx::group::detail
