// rdx::cm: an rdx connection set up through rdma_cm instead of the TCP
// bootstrap: K requests (one rdma_cm id per queue pair, so striping works as
// over TCP) carry this side's settings, credit word and window grants in
// their private data (cm/private_data.hpp), the K replies the server's; the
// server's queue pairs reach RTS and its windows are bound before it
// replies, the client's before it establishes, so ESTABLISHED is the
// barrier. The ids stay with the connection: the peer's DISCONNECTED fails
// its pending operations at once. More in rdx's design notes (share/doc/rdx/design.md),
// "rdma_cm".
#pragma once

#include <rdx/channel/connection.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/cm/link.hpp>
#include <rdx/cm/listener.hpp>
#include <rdx/cm/private_data.hpp>
#include <rdx/detail/random.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace rdx::cm {

namespace detail {

// This side's hello for queue pair i of c, offering grants.
inline hello hello_for(message_kind kind, std::uint8_t i, const connection& c, const connection_info& mine,
                       std::uint32_t tag, std::span<const window_descriptor> grants) {
  hello h;
  h.kind = kind;
  h.qp_index = i;
  h.qp_count = static_cast<std::uint8_t>(c.queue_pair_count());
  h.tag = tag;
  for (const auto& g : grants) {
    const std::uint32_t key = g.keys.empty() ? g.memory.rkey : g.keys[i];
    if (i == 0) {
      h.windows.push_back({g.memory.addr, g.memory.length, key, static_cast<std::uint8_t>(g.granted),
                           static_cast<std::uint16_t>(g.element_size)});
    } else {
      h.keys.push_back(key);
    }
  }
  if (i == 0) {
    h.recv_depth = mine.recv_depth;
    h.message_size = mine.message_size;
    h.credit_key = mine.credit_word.rkey;
    h.credit_addr = mine.credit_word.addr;
  }
  return h;
}

inline void check_grants(std::string_view who, const connection& c, std::span<const window_descriptor> grants,
                         message_kind kind) {
  if (grants.size() > max_windows(kind)) {
    throw error(errc::invalid_argument,
                std::string(who) + ": " + std::to_string(grants.size()) + " window grants, but a " +
                    detail::kind_name(kind) + " carries at most " + std::to_string(max_windows(kind)) +
                    " in its " + std::to_string(capacity_of(kind)) +
                    " bytes of private data; offer the rest from the other side or use the TCP bootstrap");
  }
  for (const auto& g : grants) {
    if (!g.keys.empty() && g.keys.size() != c.queue_pair_count()) {
      throw error(errc::invalid_argument,
                  std::string(who) + ": a grant has keys for " + std::to_string(g.keys.size()) +
                      " queue pairs, the connection " + std::to_string(c.queue_pair_count()) +
                      " (made on another connection?)");
    }
    if (g.element_size == 0 || g.element_size > 0xffff) {
      throw error(errc::invalid_argument, std::string(who) + ": an element of " +
                                              std::to_string(g.element_size) +
                                              " bytes; over rdma_cm elements are 1 to 65535 bytes");
    }
  }
}

// What the peer's hellos (0 with the table, 1..K-1 with keys) offer.
inline peer_offer offer_of(const hello& h0, std::span<const std::vector<std::uint32_t>> keys,
                           std::span<const std::uint32_t> qpns, const std::string& peer) {
  peer_offer o;
  for (std::uint32_t q : qpns) {
    endpoint e;
    e.qpn = q;
    o.info.endpoints.push_back(e);
  }
  o.info.recv_depth = h0.recv_depth;
  o.info.message_size = h0.message_size;
  o.info.credit_word = {h0.credit_addr, h0.credit_key, 8};
  for (std::size_t j = 0; j < h0.windows.size(); ++j) {
    const window_entry& w = h0.windows[j];
    window_descriptor d{{w.addr, w.key, w.length}, static_cast<rights>(w.rights), w.element_size, {w.key}};
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].size() != h0.windows.size()) {
        throw error(errc::wire_format, "rdma_cm with " + peer + ": the private data of queue pair " +
                                           std::to_string(i + 1) + " has " + std::to_string(keys[i].size()) +
                                           " window keys, that of queue pair 0 names " +
                                           std::to_string(h0.windows.size()) + " windows");
      }
      d.keys.push_back(keys[i][j]);
    }
    o.windows.push_back(std::move(d));
  }
  return o;
}

inline void check_settings(const connection& c, const hello& h, const std::string& peer, std::string& why) {
  auto differ = [&](const char* what, std::uint64_t here, std::uint64_t there) {
    why = std::string(what) + " is " + std::to_string(there) + " at " + peer + " but " +
          std::to_string(here) + " here; both sides need the same";
  };
  if (h.qp_count != c.queue_pair_count()) {
    differ("queue_pairs", c.queue_pair_count(), h.qp_count);
  } else if (h.recv_depth != c.attributes().recv_depth) {
    differ("recv_depth", c.attributes().recv_depth, h.recv_depth);
  } else if (h.message_size != c.attributes().message_size) {
    differ("message_size", c.attributes().message_size, h.message_size);
  }
}

}  // namespace detail

//! Connects c to an rdx server at host:port through rdma_cm, offering grants
//! (at most 1 fits in a request). @return what the server offered.
//! @throws rdx::error naming the peer: errc::address_error, errc::unreachable,
//! std::errc::connection_refused (nothing listens), errc::rejected (the server
//! refused: its reason is in the message), errc::wire_format (a reply that is not rdx's or disagrees),
//! errc::timed_out at o.timeout; c is then not connected. With
//! o.wait_for_listener a refused attempt is tried again until o.timeout.
inline peer_offer connect(connection& c, std::string_view host, std::uint16_t port,
                          std::span<const window_descriptor> grants = {}, const options& o = {}) {
  rdx::detail::check_connect_options(o.qp);
  detail::check_grants("cm::connect", c, grants, message_kind::request);
  const std::uint32_t k = c.queue_pair_count();
  if (k > max_queue_pairs) {
    throw error(errc::invalid_argument, "cm::connect: more than 64 queue pairs");
  }
  return detail::retry_while_refused(o, [&](const options& attempt, detail::refusal& refused) {
    std::uint32_t tag = 0;
    rdx::detail::os_random(&tag, sizeof tag);
    const connection_info mine = c.local_info();
    detail::dialer d(host, port, k, attempt);
    for (std::uint32_t i = 0; i < k; ++i) {
      const auto i8 = static_cast<std::uint8_t>(i);
      d.request(i, c.qp(i), encode_hello(detail::hello_for(message_kind::request, i8, c, mine, tag, grants)),
                attempt.qp);
    }
    std::optional<std::vector<event>> answer = d.responses(refused);
    if (!answer) {
      return std::optional<peer_offer>();
    }
    std::vector<event>& replies = *answer;
    std::vector<hello> got;
    std::vector<std::uint32_t> qpns;
    std::vector<std::vector<std::uint32_t>> keys;
    for (std::uint32_t i = 0; i < k; ++i) {
      hello h = [&] {
        try {
          return decode_hello(replies[i].private_data, message_kind::reply);
        } catch (const error& x) {
          throw error(x.code(), "cm::connect to " + d.peer() + ": " + x.what());
        }
      }();
      if (h.qp_index != i || h.qp_count != k || h.tag != tag) {
        throw error(errc::wire_format, "cm::connect to " + d.peer() + ": reply " + std::to_string(i) +
                                           " names queue pair " + std::to_string(h.qp_index) + " of " +
                                           std::to_string(h.qp_count) + " with another tag or count");
      }
      qpns.push_back(replies[i].qp_num);
      if (i > 0) {
        keys.push_back(h.keys);
      }
      got.push_back(std::move(h));
    }
    std::string why;
    detail::check_settings(c, got[0], d.peer(), why);
    if (!why.empty()) {
      throw error(errc::invalid_argument, "cm::connect: " + why);
    }
    peer_offer offer = detail::offer_of(got[0], keys, qpns, d.peer());
    rdx::detail::engine& e = rdx::detail::start_access::of(c);
    e.connect_with(offer.info, attempt.qp, [&](std::size_t i, queue_pair& qp, const connect_options& oo) {
      detail::connect_qp(d.id_of(i), qp, oo);
    });
    e.attach_link(std::make_unique<link>(d.establish(std::move(replies[0].private_data))));
    return std::optional<peer_offer>(std::move(offer));
  });
}

//! The same without throwing rdx::error: the same work as the throwing form; its rdx::error
//! becomes ec (cleared on success), with the code only, not the message's text (with
//! o.wait_for_listener a refusal is retried as there, and the last one is ec at the timeout).
//! On failure the value returned is empty and c is not connected. std::bad_alloc passes through.
inline peer_offer connect(connection& c, std::string_view host, std::uint16_t port,
                          std::span<const window_descriptor> grants, const options& o, std::error_code& ec) {
  return rdx::detail::value_or_code(ec, [&] { return cm::connect(c, host, port, grants, o); });
}

namespace detail {

inline std::vector<rdma_cm_id*> ids_of(const request& r) {
  std::vector<rdma_cm_id*> v;
  for (std::uint32_t i = 0; i < r.queue_pairs(); ++i) {
    v.push_back(r.native_handle(i));
  }
  return v;
}

//! cm::accept in two steps, so that an acceptor can wait without blocking.
//! The constructor checks the request against the connection (a mismatch
//! rejects it with the reason, which the client reads), connects the queue
//! pairs, binds the grants and sends the replies. Then ESTABLISHED is
//! awaited: wait() blocks, or take() reads what waits whenever fd() is
//! readable, and finish() gives the ids to the connection as its link.
class pending_accept {
public:
  //! Rejects a request that is not an rdx peer's. @throws errc::wire_format.
  static void refuse_foreign(request& r) {
    if (!r.rdx()) {
      refuse(r, reject_reason::malformed, errc::wire_format,
             "not an rdx peer (accept it with request::accept(queue_pair&))");
    }
  }

  //! @throws rdx::error naming the peer; the request is then answered.
  pending_accept(request&& r, connection& c, std::span<const window_descriptor> grants, const options& o)
      : req_(std::move(r)), c_(&c), gate_(ids_of(req_), RDMA_CM_EVENT_ESTABLISHED, req_.peer(), "accepting") {
    refuse_foreign(req_);
    try {
      rdx::detail::check_connect_options(o.qp);
      check_grants("cm::accept", c, grants, message_kind::reply);
    } catch (const error& x) {
      refuse(req_, reject_reason::failed, errc::invalid_argument, x.what());
    }
    std::string why;
    check_settings(c, *req_.rdx(), req_.peer(), why);
    if (!why.empty()) {
      refuse(req_, reject_reason::settings, errc::invalid_argument, why);
    }
    try {
      offer_ = offer_of(*req_.rdx(), req_.keys_, req_.peer_qpns_, req_.peer());
      for (std::size_t i = 0; i < req_.ids_.size(); ++i) {
        check_qp_for(req_.ids_[i].native_handle(), c.qp(i), req_.peer());
      }
    } catch (const error& x) {
      refuse(req_, reject_reason::failed,
             x.code() == errc::wire_format ? errc::wire_format : errc::invalid_argument, x.what());
    }
    rdx::detail::engine& e = rdx::detail::start_access::of(c);
    req_.answered_ = true;  // from here a failure destroys the ids: the client hears it
    e.connect_with(offer_.info, o.qp, [&](std::size_t i, queue_pair& qp, const connect_options& oo) {
      connect_qp(req_.ids_[i].native_handle(), qp, oo);
    });
    const connection_info mine = c.local_info();
    const std::uint32_t tag = req_.rdx()->tag;
    for (std::size_t i = 0; i < req_.ids_.size(); ++i) {
      const auto i8 = static_cast<std::uint8_t>(i);
      req_.send_accept(i, c.qp(i), encode_hello(hello_for(message_kind::reply, i8, c, mine, tag, grants)),
                       o.qp);
    }
  }

  //! The request's own event channel (non-blocking): readable when an event about its ids waits.
  [[nodiscard]] int fd() const noexcept { return req_.ch_.fd(); }
  //! Ids that reached ESTABLISHED, of queue_pairs().
  [[nodiscard]] std::size_t established() const noexcept { return gate_.arrived(); }
  [[nodiscard]] std::size_t queue_pairs() const noexcept { return gate_.size(); }

  //! Takes the events that wait, never blocking; leaves those after the last ESTABLISHED to the link.
  //! @return true once every id is ESTABLISHED. @throws event_failure (REJECTED, DISCONNECTED, ...).
  bool take() {
    while (!gate_.done()) {
      std::optional<event> e = req_.ch_.try_next();
      if (!e) {
        return false;
      }
      (void)gate_.take(std::move(*e));
    }
    return true;
  }
  //! Once take() returned true: the link goes to the connection. @return what the client offered.
  peer_offer finish() { return attach(req_.into_link()); }
  //! Blocks until ESTABLISHED on every id, then finish(). @throws event_failure, errc::timed_out.
  peer_offer wait(clock::time_point deadline, std::chrono::milliseconds budget) {
    return attach(req_.established(deadline, budget));
  }

private:
  [[noreturn]] static void refuse(request& r, reject_reason why, errc code, const std::string& text) {
    r.reject(why, text);
    throw error(code, "cm::accept from " + r.peer() + ": " + text);
  }
  peer_offer attach(link l) {
    rdx::detail::start_access::of(*c_).attach_link(std::make_unique<link>(std::move(l)));
    return std::move(offer_);
  }

  request req_;
  connection* c_;
  peer_offer offer_;
  event_gate gate_;
};

}  // namespace detail

//! Accepts an rdx peer's request onto c (same queue pairs, recv_depth and
//! message_size; on r.device_name()), offering grants (at most 7 fit in a
//! reply), and waits for ESTABLISHED. A request that does not match c is
//! rejected with the reason, which the client reads. @return what the client
//! offered. @throws rdx::error naming the peer; the request is then answered.
inline peer_offer accept(request&& r, connection& c, std::span<const window_descriptor> grants = {},
                         const options& o = {}) {
  const auto deadline = clock::now() + o.timeout;
  detail::pending_accept p(std::move(r), c, grants, o);
  return p.wait(deadline, o.timeout);
}

//! The same without throwing rdx::error: the same work as the throwing form; its rdx::error
//! becomes ec (cleared on success), with the code only, not the message's text. On failure the
//! value returned is empty, c is not connected and the request is answered. std::bad_alloc
//! passes through.
inline peer_offer accept(request&& r, connection& c, std::span<const window_descriptor> grants,
                         const options& o, std::error_code& ec) {
  return rdx::detail::value_or_code(ec, [&] { return cm::accept(std::move(r), c, grants, o); });
}

}  // namespace rdx::cm
