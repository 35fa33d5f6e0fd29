// rdx::cm: a connected link (the rdma_cm ids of one peer and their own event
// channel), queue-pair transitions from rdma_init_qp_attr, and the active side of a
// connection: resolve, request, response, establish. Queue pairs are the
// caller's (rdma_cm ids without a queue pair), so rdx's own queue pairs,
// completion queues and memory serve both bootstraps.
#pragma once

#include <rdx/channel/detail/peer_link.hpp>
#include <rdx/cm/detail/await.hpp>
#include <rdx/cm/event_channel.hpp>
#include <rdx/cm/id.hpp>
#include <rdx/cm/private_data.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>

#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace rdx::cm {

//! How a connection is set up over rdma_cm.
struct options {
  //! The whole set-up (resolution, request, reply, establishment), not each step.
  std::chrono::milliseconds timeout{10000};
  connect_options qp{};  //!< timeout, retries and RNR settings of the queue pairs
  //! A client tries again every 200 ms while nothing listens at the server
  //! yet (it may start a moment after the client), within timeout as a whole,
  //! as tcp::connect does; false: the first std::errc::connection_refused ends it.
  bool wait_for_listener = false;
};

namespace detail {

//! A refusal an attempt of retry_while_refused reports as a value: the error it would throw.
using refusal = std::optional<error>;

//! attempt(o, refused) once, or with o.wait_for_listener again every 200 ms while it is refused,
//! each time with what is left of o.timeout. An attempt returns its value (an std::optional
//! holding it), or reports a refusal (std::errc::connection_refused: nothing listens) as a value:
//! it sets `refused` and returns an empty optional; any other failure it throws, and that ends
//! the loop. A retry starts only with at least 200 ms left for it; if a retry runs out of time
//! after a refusal, the refusal is what the caller gets (the cause seen last, "nothing listens on
//! that port"), not a bare timeout. @throws the refusal when no retry is left.
template <class F>
auto retry_while_refused(const options& o, F&& attempt) {
  refusal refused;
  if (!o.wait_for_listener) {
    auto r = attempt(o, refused);
    if (!r) {
      throw error(*refused);
    }
    return std::move(*r);
  }
  constexpr std::chrono::milliseconds pause{200};
  const auto deadline = clock::now() + o.timeout;
  for (;;) {
    options left = o;
    left.timeout = std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now()),
                            std::chrono::milliseconds{1});
    refusal now;  // each attempt reports its own
    decltype(attempt(left, now)) r;
    try {
      r = attempt(left, now);
    } catch (const error& e) {
      // Only leaves: a timeout after a refusal says less than the refusal.
      if (refused && e.code() == make_error_code(errc::timed_out)) {
        throw error(*refused);
      }
      throw;
    }
    if (r) {
      return std::move(*r);
    }
    refused = std::move(now);
    if (clock::now() + 2 * pause >= deadline) {
      throw error(*refused);
    }
    std::this_thread::sleep_for(pause);
  }
}

//! What both sides offer for reads and atomics: min(device, 16).
inline std::uint8_t rd_atomic_of(rdma_cm_id* id) {
  ibv_device_attr a{};
  if (id->verbs == nullptr || ::ibv_query_device(id->verbs, &a) != 0) {
    return 1;
  }
  return static_cast<std::uint8_t>(std::clamp(std::min(a.max_qp_rd_atom, a.max_qp_init_rd_atom), 1, 16));
}

//! The connection parameters rdx sends with a request or an accept.
inline rdma_conn_param conn_param_for(rdma_cm_id* id, const queue_pair& qp, std::span<const std::byte> pd,
                                      const connect_options& o) {
  rdma_conn_param p{};
  p.private_data = pd.empty() ? nullptr : pd.data();
  p.private_data_len = static_cast<std::uint8_t>(pd.size());
  p.responder_resources = rd_atomic_of(id);
  p.initiator_depth = p.responder_resources;
  p.flow_control = 1;
  p.retry_count = std::min<std::uint8_t>(o.retry_cnt, 7);
  p.rnr_retry_count = std::min<std::uint8_t>(o.rnr_retry, 7);
  p.qp_num = qp.native_handle()->qp_num;
  return p;
}

//! Checks that qp can be connected through id: same device, same port.
inline void check_qp_for(rdma_cm_id* id, const queue_pair& qp, const std::string& peer) {
  const std::string dev = ::ibv_get_device_name(qp.native_handle()->context->device);
  const std::string cm_dev = id->verbs != nullptr ? ::ibv_get_device_name(id->verbs->device) : "?";
  if (dev != cm_dev) {
    throw error(errc::invalid_argument, "rdma_cm with " + peer + ": the address is reached through " +
                                            cm_dev + ", but the queue pair is on " + dev +
                                            "; make the protection domain on " + cm_dev +
                                            " (RDX_DEVICE=" + cm_dev + ")");
  }
  if (qp.state() != qp_state::reset && qp.port() != id->port_num) {
    throw error(errc::invalid_argument, "rdma_cm with " + peer + ": the address is reached through port " +
                                            std::to_string(id->port_num) + " of " + cm_dev +
                                            ", the queue pair uses port " + std::to_string(qp.port()) +
                                            " (connection_attr::port)");
  }
  if (qp.state() != qp_state::reset && qp.state() != qp_state::init) {
    throw error(errc::not_ready, "rdma_cm with " + peer +
                                     ": the queue pair must be in RESET or INIT, it is in " +
                                     std::string(to_string(qp.state())));
  }
}

//! (RESET ->) INIT -> RTR -> RTS with what the connection manager computed
//! (address vector, PSNs, path MTU, read depths) and rdx's retry settings.
inline void connect_qp(rdma_cm_id* id, queue_pair& qp, const connect_options& o) {
  auto attrs = [&](ibv_qp_state s, int& mask) {
    ibv_qp_attr a{};
    a.qp_state = s;
    mask = 0;
    if (::rdma_init_qp_attr(id, &a, &mask) != 0) {
      fail_errno("rdma_init_qp_attr");
    }
    return a;
  };
  int mask = 0;
  if (qp.state() == qp_state::reset) {
    ibv_qp_attr a = attrs(IBV_QPS_INIT, mask);
    qp.apply(a, mask, "INIT");
  }
  ibv_qp_attr r = attrs(IBV_QPS_RTR, mask);
  r.min_rnr_timer = o.min_rnr_timer;
  mask |= IBV_QP_MIN_RNR_TIMER;
  qp.apply(r, mask, "RTR");
  ibv_qp_attr t = attrs(IBV_QPS_RTS, mask);
  t.timeout = o.timeout;
  t.retry_cnt = o.retry_cnt;
  t.rnr_retry = o.rnr_retry;
  mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
  qp.apply(t, mask, "RTS");
}

}  // namespace detail

//! The rdma_cm side of a connection to one peer: its ids (one per queue
//! pair) on an event channel of their own. Destroying it disconnects. Given
//! to a connection (cm::connect, listener::accept), it fails the connection
//! at once when the peer disconnects. Move-only; one thread at a time.
class link final : public rdx::detail::peer_link {
public:
  //! Takes connected ids (one per queue pair), the event channel they are on, the peer's name
  //! and the private data it sent; cm::connect and listener::accept build links.
  link(event_channel ch, std::vector<id> ids, std::string peer, std::vector<std::byte> peer_data)
      : ch_(std::move(ch)), ids_(std::move(ids)), peer_(std::move(peer)), peer_data_(std::move(peer_data)) {}
  link(const link&) = delete;
  link& operator=(const link&) = delete;
  //! Takes o's ids and channel; o is left with none.
  link(link&&) noexcept = default;
  //! Disconnects and destroys this link's ids, then takes o's.
  link& operator=(link&& o) noexcept {
    if (this != &o) {
      disconnect();
      ids_.clear();
      ch_ = std::move(o.ch_);
      ids_ = std::move(o.ids_);
      peer_ = std::move(o.peer_);
      peer_data_ = std::move(o.peer_data_);
      gone_ = o.gone_;
      said_ = o.said_;
    }
    return *this;
  }
  ~link() override {
    disconnect();
    ids_.clear();  // before the channel they are on
  }

  //! The event channel's descriptor: readable when an rdma_cm event waits (event mode sleeps on it).
  [[nodiscard]] int fd() const noexcept override { return ch_.fd(); }
  //! The peer as "host:port", for messages.
  [[nodiscard]] const char* peer() const noexcept override { return peer_.c_str(); }
  //! The private data the peer sent with its request (server) or reply (client).
  [[nodiscard]] const std::vector<std::byte>& peer_private_data() const noexcept { return peer_data_; }
  //! Number of ids: one per queue pair.
  [[nodiscard]] std::size_t size() const noexcept { return ids_.size(); }
  //! The rdma_cm_id of queue pair i, still owned; not bounds-checked.
  [[nodiscard]] rdma_cm_id* native_handle(std::size_t i = 0) const noexcept {
    return ids_[i].native_handle();
  }
  //! True once the peer's DISCONNECTED arrived (poll() or wait_disconnected() saw it).
  [[nodiscard]] bool disconnected() const noexcept { return gone_; }

  //! Takes the events that wait, without blocking.
  //! @return errc::peer_disconnected once the peer has gone, the error of a failed event read, else
  //! empty.
  [[nodiscard]] std::error_code poll() noexcept override {
    try {
      while (auto e = ch_.try_next()) {
        note(*e);
      }
    } catch (const error& x) {
      return x.code();
    }
    return gone_ ? make_error_code(errc::peer_disconnected) : std::error_code{};
  }

  //! Waits until the peer disconnects or deadline. @return true when it did.
  bool wait_disconnected(clock::time_point deadline) {
    while (!gone_) {
      std::optional<event> e = ch_.next(deadline);
      if (!e) {
        return false;
      }
      note(*e);
    }
    return true;
  }

  //! Tells the peer this side is going (rdma_disconnect on every id): once, never throws.
  void disconnect() noexcept override {
    if (said_) {
      return;
    }
    said_ = true;
    for (auto& i : ids_) {
      if (i) {
        (void)::rdma_disconnect(i.native_handle());
      }
    }
  }

private:
  void note(const event& e) noexcept {
    if (e.type == RDMA_CM_EVENT_DISCONNECTED || e.type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      gone_ = true;
      disconnect();  // answers the peer's DREQ
    }
  }
  event_channel ch_;
  std::vector<id> ids_;
  std::string peer_;
  std::vector<std::byte> peer_data_;
  bool gone_ = false;
  bool said_ = false;
};

namespace detail {

//! The active side, step by step, for K queue pairs: resolve, request,
//! response, (the caller connects its queue pairs), establish.
class dialer {
public:
  dialer(std::string_view host, std::uint16_t port, std::size_t k, const options& o)
      : peer_(host_port(host, port)), budget_(o.timeout), deadline_(clock::now() + o.timeout) {
    const sockaddr_storage to = resolve_host(host, port, false);
    const int ms = static_cast<int>(std::max<long long>(1, o.timeout.count()));
    for (std::size_t i = 0; i < k; ++i) {
      ids_.emplace_back(ch_);
    }
    resolve_addresses(to);
    for (auto& i : ids_) {
      if (::rdma_resolve_route(i.native_handle(), ms) != 0) {
        fail_errno("rdma_resolve_route for " + peer_);
      }
    }
    (void)await(RDMA_CM_EVENT_ROUTE_RESOLVED, "resolving the route");
  }

  [[nodiscard]] rdma_cm_id* id_of(std::size_t i) const noexcept { return ids_[i].native_handle(); }
  [[nodiscard]] const std::string& peer() const noexcept { return peer_; }
  [[nodiscard]] clock::time_point deadline() const noexcept { return deadline_; }

  //! Sends request i for qp with private data pd.
  void request(std::size_t i, const queue_pair& qp, std::span<const std::byte> pd, const connect_options& o) {
    check_qp_for(id_of(i), qp, peer_);
    rdma_conn_param p = conn_param_for(id_of(i), qp, pd, o);
    if (::rdma_connect(id_of(i), &p) != 0) {
      fail_errno("rdma_connect to " + peer_ + " (private data of " + std::to_string(pd.size()) +
                 " bytes; at most " + std::to_string(request_capacity) + ")");
    }
  }
  //! The peer's replies, one per request; none, with `refused` set to the error, when nothing
  //! listens at the port (the one failure a caller may retry, so not thrown).
  std::optional<std::vector<event>> responses(refusal& refused) {
    std::vector<event> r = await(RDMA_CM_EVENT_CONNECT_RESPONSE, "connecting", &refused);
    if (refused) {
      return std::nullopt;
    }
    return r;
  }
  //! Tells the peer every queue pair is ready (its side sees ESTABLISHED) and
  //! hands over the ids.
  link establish(std::vector<std::byte> reply) {
    for (auto& i : ids_) {
      if (::rdma_establish(i.native_handle()) != 0) {
        fail_errno("rdma_establish with " + peer_);
      }
    }
    return link(std::move(ch_), std::move(ids_), peer_, std::move(reply));
  }

private:
  std::vector<event> await(rdma_cm_event_type want, std::string_view step, refusal* refused = nullptr) {
    std::vector<rdma_cm_id*> raw;
    for (auto& i : ids_) {
      raw.push_back(i.native_handle());
    }
    return await_all(ch_, raw, want, deadline_, peer_, step, budget_, refused);
  }

  // Resolves every id's address, each try bounded by resolve_try: the kernel
  // looks at the neighbour table again at the end of a try, and a try that
  // ends without an address (ADDR_ERROR, ETIMEDOUT) is started again until
  // the deadline. One try as long as the whole budget could miss an ARP
  // reply that came while it was being queued (seen with several clients
  // resolving at once) and then answer just after the deadline.
  static constexpr std::chrono::milliseconds resolve_try{1000};
  void resolve_addresses(const sockaddr_storage& to) {
    auto start = [&](rdma_cm_id* i) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - clock::now());
      const int ms = static_cast<int>(std::clamp<long long>(left.count(), 1, resolve_try.count()));
      if (::rdma_resolve_addr(i, nullptr, reinterpret_cast<sockaddr*>(const_cast<sockaddr_storage*>(&to)),
                              ms) != 0) {
        fail_errno("rdma_resolve_addr for " + peer_);
      }
    };
    std::vector<rdma_cm_id*> pending;
    for (auto& i : ids_) {
      pending.push_back(i.native_handle());
      start(pending.back());
    }
    auto timed_out = [&] {
      return error(errc::timed_out, "resolving the address with " + peer_ + ": no " +
                                        ::rdma_event_str(RDMA_CM_EVENT_ADDR_RESOLVED) + " within " +
                                        std::to_string(budget_.count()) +
                                        " ms (no link-layer address for it: is the host up and on a "
                                        "network an RDMA device here reaches?)");
    };
    while (!pending.empty()) {
      std::optional<event> e = ch_.next(deadline_);
      if (!e) {
        throw timed_out();
      }
      const auto it = std::find(pending.begin(), pending.end(), e->id);
      if (it == pending.end()) {
        continue;  // an id resolved already, or not this dialer's
      }
      if (e->type == RDMA_CM_EVENT_ADDR_RESOLVED) {
        pending.erase(it);
      } else if (e->type == RDMA_CM_EVENT_ADDR_ERROR && e->status == -ETIMEDOUT) {
        // The last try ends at the deadline: the same error as no event at all.
        if (clock::now() >= deadline_) {
          throw timed_out();
        }
        start(*it);  // no address within this try: again
      } else if (e->type != RDMA_CM_EVENT_TIMEWAIT_EXIT) {
        throw event_failure(*e, peer_, "resolving the address");
      }
    }
  }
  event_channel ch_;
  std::vector<id> ids_;  // declared after the channel: destroyed first
  std::string peer_;
  std::chrono::milliseconds budget_;
  clock::time_point deadline_;
};

}  // namespace detail

//! Connects qp (RC, in RESET or INIT, on the device the address resolves to)
//! to a server at host:port through rdma_cm, sending private_data (at most
//! 56 bytes) with the request: the active side of any rdma_cm program
//! (rdma-core's rdma_server, say). @return the link; the peer's reply data is
//! link::peer_private_data(). @throws rdx::error: errc::address_error,
//! errc::unreachable, std::errc::connection_refused (nothing listens),
//! errc::rejected (the server refused),
//! errc::timed_out at o.timeout; each names the peer. With o.wait_for_listener
//! a refused attempt is tried again until o.timeout.
[[nodiscard]] inline link connect(queue_pair& qp, std::string_view host, std::uint16_t port,
                                  std::span<const std::byte> private_data = {}, const options& o = {}) {
  rdx::detail::check_connect_options(o.qp);
  if (private_data.size() > request_capacity) {
    throw error(errc::invalid_argument, "cm::connect: " + std::to_string(private_data.size()) +
                                            " bytes of private data, a request carries at most " +
                                            std::to_string(request_capacity));
  }
  return detail::retry_while_refused(o, [&](const options& attempt, detail::refusal& refused) {
    detail::dialer d(host, port, 1, attempt);
    d.request(0, qp, private_data, attempt.qp);
    std::optional<std::vector<event>> r = d.responses(refused);
    if (!r) {
      return std::optional<link>();
    }
    detail::connect_qp(d.id_of(0), qp, attempt.qp);
    return std::optional<link>(d.establish(std::move((*r)[0].private_data)));
  });
}

}  // namespace rdx::cm
