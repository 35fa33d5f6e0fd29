// rdx::cm: the passive side. A listener on one port hands out connection
// requests; an rdx peer's K requests (one per queue pair, the same tag) come
// out as one request, a foreign peer's single request as it arrived. Every
// request leaves with its own event channel, so a request, and the link made
// from it, outlive the listener and never share events with other peers.
#pragma once

#include <rdx/cm/event_channel.hpp>
#include <rdx/cm/id.hpp>
#include <rdx/cm/link.hpp>
#include <rdx/cm/private_data.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/queue_pair.hpp>

#include <rdma/rdma_cma.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdx {
class connection;
struct peer_offer;
struct window_descriptor;
}  // namespace rdx

namespace rdx::cm {

class listener;
class request;
namespace detail {
class pending_accept;
}  // namespace detail

//! One peer asking to connect: what it sent, and the ids to answer it on.
//! Answer with accept() (an rdx connection), request::accept() (a queue pair
//! of any peer) or reject(); a request destroyed unanswered is rejected.
class request {
public:
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  //! Takes o's ids and what the peer sent; o is left empty (its destructor rejects nothing).
  request(request&&) noexcept = default;
  //! Takes o's ids and what the peer sent; this request's own ids are destroyed without a reject.
  request& operator=(request&&) noexcept = default;
  ~request() {
    if (!ids_.empty() && !answered_) {
      reject(reject_reason::refused, "the server did not accept the connection");
    }
    ids_.clear();
  }

  //! The peer's address ("10.77.0.2:53122").
  [[nodiscard]] const std::string& peer() const noexcept { return peer_; }
  //! The private data of its (first) request, as it arrived.
  [[nodiscard]] const std::vector<std::byte>& private_data() const noexcept { return data_; }
  //! An rdx peer's request for queue pair 0, decoded; empty for a foreign peer.
  [[nodiscard]] const std::optional<hello>& rdx() const noexcept { return hello_; }
  //! Queue pairs the peer connects (1 for a foreign peer).
  [[nodiscard]] std::uint32_t queue_pairs() const noexcept { return static_cast<std::uint32_t>(ids_.size()); }
  //! The RDMA device the request arrived on: the connection must use it.
  [[nodiscard]] std::string device_name() const { return ids_.empty() ? "" : ids_[0].device_name(); }
  //! The rdma_cm_id of the peer's queue pair i, still owned; not bounds-checked.
  [[nodiscard]] rdma_cm_id* native_handle(std::size_t i = 0) const noexcept {
    return ids_[i].native_handle();
  }

  //! Accepts a single-queue-pair request onto qp (RC, RESET or INIT, on
  //! device_name()), replying with private_data (at most 196 bytes), and
  //! waits for ESTABLISHED: the passive side of any rdma_cm program
  //! (rdma-core's rdma_client, say). @throws rdx::error naming the peer.
  [[nodiscard]] link accept(queue_pair& qp, std::span<const std::byte> private_data = {},
                            const options& o = {}) {
    if (ids_.size() != 1) {
      throw error(errc::invalid_argument,
                  "cm::request::accept(queue_pair&): " + peer_ + " connects " + std::to_string(ids_.size()) +
                      " queue pairs; accept it with cm::accept(request, connection&)");
    }
    if (private_data.size() > reply_capacity) {
      throw error(errc::invalid_argument, "cm::request::accept: " + std::to_string(private_data.size()) +
                                              " bytes of private data, a reply carries at most " +
                                              std::to_string(reply_capacity));
    }
    rdx::detail::check_connect_options(o.qp);
    const auto deadline = clock::now() + o.timeout;
    answered_ = true;
    detail::check_qp_for(ids_[0].native_handle(), qp, peer_);
    detail::connect_qp(ids_[0].native_handle(), qp, o.qp);
    send_accept(0, qp, private_data, o.qp);
    return established(deadline, o.timeout);
  }

  //! Refuses the peer; an rdx peer reads why (rdx text in the reject's private data).
  void reject(reject_reason why, std::string_view text) noexcept {
    answered_ = true;
    const std::vector<std::byte> pd = encode_rejection(why, text);
    for (auto& i : ids_) {
      (void)::rdma_reject(i.native_handle(), pd.data(), static_cast<std::uint8_t>(pd.size()));
    }
  }

private:
  friend class listener;
  friend class detail::pending_accept;
  request() = default;

  void send_accept(std::size_t i, const queue_pair& qp, std::span<const std::byte> pd,
                   const connect_options& o) {
    rdma_conn_param p = detail::conn_param_for(ids_[i].native_handle(), qp, pd, o);
    if (::rdma_accept(ids_[i].native_handle(), &p) != 0) {
      detail::fail_errno("rdma_accept for " + peer_);
    }
  }
  link established(clock::time_point deadline, std::chrono::milliseconds budget) {
    std::vector<rdma_cm_id*> raw;
    for (auto& i : ids_) {
      raw.push_back(i.native_handle());
    }
    (void)detail::await_all(ch_, raw, RDMA_CM_EVENT_ESTABLISHED, deadline, peer_, "accepting", budget);
    return into_link();
  }
  link into_link() { return link(std::move(ch_), std::move(ids_), peer_, std::move(data_)); }

  event_channel ch_;
  std::vector<id> ids_;  // in queue-pair order; destroyed before the channel
  std::string peer_;
  std::vector<std::byte> data_;
  std::optional<hello> hello_;
  std::vector<std::uint32_t> peer_qpns_;
  std::vector<std::vector<std::uint32_t>> keys_;  // per queue pair i > 0, the peer's window keys
  bool answered_ = false;
};

//! How a listener runs.
struct listen_options {
  int backlog = 128;  //!< rdma_listen's backlog: requests the kernel queues before next() takes them
  //! An rdx peer's K requests must all arrive within this, else they are rejected.
  std::chrono::milliseconds group_timeout{10000};
};

//! Listens on host:port (an empty host: every address) for connection
//! requests. Requests that are not rdx's and not foreign either (a wrong
//! version, a malformed request) are rejected here, with the reason in the
//! reject, and counted. One thread at a time.
class listener {
public:
  //! @throws rdx::error: errc::address_error when the address has no RDMA
  //! device, EADDRINUSE when the port is taken.
  explicit listener(std::uint16_t port, std::string_view host = {}, const listen_options& o = {})
      : id_(ch_), opt_(o) {
    sockaddr_storage a = detail::resolve_host(host, port, true);
    if (::rdma_bind_addr(id_.native_handle(), reinterpret_cast<sockaddr*>(&a)) != 0) {
      detail::fail_errno("rdma_bind_addr " + detail::host_port(host, port) +
                         " (an RDMA device must own that address; port in use?)");
    }
    if (::rdma_listen(id_.native_handle(), o.backlog) != 0) {
      detail::fail_errno("rdma_listen " + detail::host_port(host, port));
    }
  }
  listener(const listener&) = delete;
  listener& operator=(const listener&) = delete;
  //! Takes o's listening id, its channel and the requests it holds; o is
  //! left empty: port() 0, fd() -1, and it is only to be destroyed.
  listener(listener&&) noexcept = default;
  listener& operator=(listener&&) = delete;
  ~listener() {
    groups_.clear();  // their ids before the listening id and the channel
  }

  //! The port it listens on (the one the kernel chose for port 0).
  [[nodiscard]] std::uint16_t port() const noexcept {
    return id_ ? ntohs(::rdma_get_src_port(id_.native_handle())) : std::uint16_t{0};
  }
  //! The event channel's descriptor: readable when a connect request (or another event) waits.
  [[nodiscard]] int fd() const noexcept { return ch_.fd(); }
  //! Requests rejected here so far, and why the last one was.
  [[nodiscard]] std::uint64_t rejected() const noexcept { return rejected_; }
  //! The peer and the reason of the last request rejected here ("" before any).
  [[nodiscard]] const std::string& last_rejection() const noexcept { return last_rejection_; }

  //! The next whole request, waiting up to timeout; a zero timeout never
  //! blocks (it takes only the events that wait). @return nullopt at the timeout.
  [[nodiscard]] std::optional<request> next(std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    for (;;) {
      expire(clock::now());
      if (!ready_.empty()) {
        request r = std::move(ready_.front());
        ready_.erase(ready_.begin());
        return r;
      }
      std::optional<event> e = ch_.next(std::min(deadline, next_expiry()));
      if (!e) {
        if (clock::now() >= deadline) {
          return std::nullopt;
        }
        continue;
      }
      if (e->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
        arrived(std::move(*e));
      }
      // Other events are about ids still waiting for their group (their
      // peer gave up: the group expires) or of the listening id itself.
    }
  }

private:
  struct part {
    id id_;
    event ev;
    std::optional<hello> h;  // decoded once, in arrived(); empty for a foreign peer
  };
  struct group {
    std::uint32_t tag = 0;
    std::string host;
    std::vector<std::optional<part>> parts;
    clock::time_point since{};
  };

  void refuse(id& i, const std::string& peer, reject_reason why, const std::string& text) noexcept {
    const std::vector<std::byte> pd = encode_rejection(why, text);
    (void)::rdma_reject(i.native_handle(), pd.data(), static_cast<std::uint8_t>(pd.size()));
    ++rejected_;
    last_rejection_ = peer + ": " + text;
  }

  static std::string host_of(const std::string& peer) { return peer.substr(0, peer.rfind(':')); }

  void arrived(event e) {
    id child = id::from_native_handle(e.id);
    const std::string peer = child.peer();
    if (!is_rdx(e.private_data)) {
      ready_.push_back(make_request(one(std::move(child), std::move(e), std::nullopt), peer));
      return;
    }
    hello h;
    try {
      h = decode_hello(e.private_data, message_kind::request);
    } catch (const error& x) {
      const bool version =
          e.private_data.size() > 4 && std::to_integer<unsigned>(e.private_data[4]) != private_version;
      refuse(child, peer, version ? reject_reason::version : reject_reason::malformed, x.what());
      return;
    }
    if (h.qp_count == 1) {
      ready_.push_back(make_request(one(std::move(child), std::move(e), std::move(h)), peer));
      return;
    }
    const std::string host = host_of(peer);
    auto g = std::find_if(groups_.begin(), groups_.end(),
                          [&](const group& x) { return x.tag == h.tag && x.host == host; });
    if (g == groups_.end()) {
      groups_.push_back(group{h.tag, host, std::vector<std::optional<part>>(h.qp_count), clock::now()});
      g = groups_.end() - 1;
    }
    if (g->parts.size() != h.qp_count || g->parts[h.qp_index]) {
      refuse(child, peer, reject_reason::malformed,
             "request " + std::to_string(h.qp_index) + " of tag " + std::to_string(h.tag) +
                 " conflicts with an earlier one");
      return;
    }
    const std::uint8_t index = h.qp_index;
    g->parts[index].emplace(part{std::move(child), std::move(e), std::move(h)});
    if (std::all_of(g->parts.begin(), g->parts.end(), [](const auto& p) { return p.has_value(); })) {
      std::vector<part> ps;
      for (auto& p : g->parts) {
        ps.push_back(std::move(*p));
      }
      groups_.erase(g);
      const std::string first = ps[0].id_.peer();
      ready_.push_back(make_request(std::move(ps), first));
    }
  }

  static std::vector<part> one(id i, event e, std::optional<hello> h) {
    std::vector<part> v;
    v.push_back(part{std::move(i), std::move(e), std::move(h)});
    return v;
  }

  static request make_request(std::vector<part> ps, const std::string& peer) {
    request r;
    r.peer_ = peer;
    r.data_ = ps[0].ev.private_data;
    r.hello_ = std::move(ps[0].h);
    for (auto& p : ps) {
      p.id_.migrate(r.ch_);
      r.peer_qpns_.push_back(p.ev.qp_num);
      if (r.hello_ && !r.ids_.empty()) {
        r.keys_.push_back(std::move(p.h->keys));
      }
      r.ids_.push_back(std::move(p.id_));
    }
    return r;
  }

  void expire(clock::time_point now) {
    for (auto g = groups_.begin(); g != groups_.end();) {
      if (now - g->since < opt_.group_timeout) {
        ++g;
        continue;
      }
      std::size_t have = 0;
      for (auto& p : g->parts) {
        have += p.has_value() ? 1 : 0;
      }
      for (auto& p : g->parts) {
        if (p) {
          refuse(p->id_, p->id_.peer(), reject_reason::incomplete,
                 std::to_string(have) + " of " + std::to_string(g->parts.size()) +
                     " requests arrived within " + std::to_string(opt_.group_timeout.count()) + " ms");
        }
      }
      g = groups_.erase(g);
    }
  }
  [[nodiscard]] clock::time_point next_expiry() const noexcept {
    auto t = clock::time_point::max();
    for (const auto& g : groups_) {
      t = std::min(t, g.since + opt_.group_timeout);
    }
    return t;
  }

  event_channel ch_;
  id id_;
  listen_options opt_;
  std::vector<group> groups_;
  std::vector<request> ready_;
  std::uint64_t rejected_ = 0;
  std::string last_rejection_;
};

}  // namespace rdx::cm
