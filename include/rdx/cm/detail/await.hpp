// rdx::cm internals: the connection manager's events as typed errors naming
// the peer and the step, and the wait for one event type on each of a
// peer's ids, blocking (await_all) or one event at a time (event_gate).
#pragma once

#include <rdx/cm/event_channel.hpp>
#include <rdx/cm/private_data.hpp>
#include <rdx/error.hpp>

#include <rdma/rdma_cma.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace rdx::cm::detail {

// IB CM reject reasons a user meets (IBTA 12.6.7.2).
inline constexpr int rej_invalid_service_id = 8;
inline constexpr int rej_consumer = 28;

//! True for the reject that means nothing listens at the port (IB CM reason 8, invalid service ID).
[[nodiscard]] inline bool is_refusal(const event& e) noexcept {
  return e.type == RDMA_CM_EVENT_REJECTED && e.status == rej_invalid_service_id;
}

//! The error an unexpected event stands for, naming the peer and the step.
[[nodiscard]] inline error event_failure(const event& e, const std::string& peer, std::string_view step) {
  const std::string at = std::string(step) + " with " + peer + ": ";
  const std::string why = e.status < 0 ? " (" + std::generic_category().message(-e.status) + ")" : "";
  switch (e.type) {
    case RDMA_CM_EVENT_ADDR_ERROR:
      return error(errc::address_error, at + "the address resolves to no local RDMA device" + why +
                                            "; is an RDMA device bound to the interface that routes there "
                                            "(rdma link add rxe0 type rxe netdev eth0)?");
    case RDMA_CM_EVENT_ROUTE_ERROR: return error(errc::unreachable, at + "no route" + why);
    case RDMA_CM_EVENT_UNREACHABLE:
      return error(errc::unreachable, at + "the peer's connection manager did not answer" + why +
                                          " (is the host up and its RDMA device active?)");
    case RDMA_CM_EVENT_CONNECT_ERROR: return error(errc::unreachable, at + "the connection failed" + why);
    case RDMA_CM_EVENT_REJECTED: {
      if (is_refusal(e)) {
        // As TCP says it, so a client can retry while its server starts.
        return error(std::make_error_code(std::errc::connection_refused),
                     at + "nothing listens on that port (rejected: invalid service ID)");
      }
      if (auto r = decode_rejection(e.private_data)) {
        return error(errc::rejected, at + "rejected by the rdx server (speaks version " +
                                         std::to_string(r->version) + "): " + r->text);
      }
      return error(errc::rejected, at + "rejected (IB CM reason " + std::to_string(e.status) + ")");
    }
    case RDMA_CM_EVENT_DISCONNECTED: return error(errc::peer_disconnected, at + "the peer disconnected");
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return error(errc::no_device, at + "the RDMA device was removed");
    default: return error(errc::protocol_error, at + "unexpected " + e.name());
  }
}

//! Collects `want` on each of ids (in any order), one event at a time, so a
//! blocking wait (await_all) and a non-blocking one (an acceptor's, as the
//! channel becomes readable) read events the same way.
class event_gate {
public:
  event_gate(std::span<rdma_cm_id* const> ids, rdma_cm_event_type want, std::string peer,
             std::string_view step)
      : ids_(ids.begin(), ids.end()),
        want_(want),
        peer_(std::move(peer)),
        step_(step),
        got_(ids.size()),
        have_(ids.size(), false),
        left_(ids.size()) {}
  //! Takes one event. @return true once every id had `want`.
  //! @throws the event_failure of any other event about the ids.
  bool take(event e) {
    const auto it = std::find(ids_.begin(), ids_.end(), e.id);
    if (it == ids_.end()) {
      return done();  // an id this wait is not about
    }
    if (e.type != want_) {
      if (e.type == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
        return done();
      }
      throw event_failure(e, peer_, step_);
    }
    const auto i = static_cast<std::size_t>(it - ids_.begin());
    if (!have_[i]) {
      have_[i] = true;
      got_[i] = std::move(e);
      --left_;
    }
    return done();
  }
  [[nodiscard]] bool done() const noexcept { return left_ == 0; }
  //! True when e is about one of the ids.
  [[nodiscard]] bool about(const event& e) const noexcept {
    return std::find(ids_.begin(), ids_.end(), e.id) != ids_.end();
  }
  //! Ids that had `want`, of size().
  [[nodiscard]] std::size_t arrived() const noexcept { return ids_.size() - left_; }
  [[nodiscard]] std::size_t size() const noexcept { return ids_.size(); }
  //! The events, in ids' order.
  [[nodiscard]] std::vector<event> take_events() noexcept { return std::move(got_); }

private:
  std::vector<rdma_cm_id*> ids_;
  rdma_cm_event_type want_;
  std::string peer_;
  std::string step_;
  std::vector<event> got_;
  std::vector<bool> have_;
  std::size_t left_;
};

//! Waits for `want` on each of ids (in any order); the events, in ids' order.
//! With `refused`, a refusal (is_refusal: nothing listens) is a value, not thrown: its
//! event_failure goes to *refused and the result is empty.
//! @throws the event_failure of any other event about them, or errc::timed_out.
inline std::vector<event> await_all(event_channel& ch, std::span<rdma_cm_id* const> ids,
                                    rdma_cm_event_type want, clock::time_point deadline,
                                    const std::string& peer, std::string_view step,
                                    std::chrono::milliseconds budget,
                                    std::optional<error>* refused = nullptr) {
  event_gate gate(ids, want, peer, step);
  while (!gate.done()) {
    std::optional<event> e = ch.next(deadline);
    if (!e) {
      throw error(errc::timed_out, std::string(step) + " with " + peer + ": no " + ::rdma_event_str(want) +
                                       " within " + std::to_string(budget.count()) + " ms");
    }
    if (refused != nullptr && is_refusal(*e) && gate.about(*e)) {
      *refused = event_failure(*e, peer, step);
      return {};
    }
    (void)gate.take(std::move(*e));
  }
  return gate.take_events();
}

}  // namespace rdx::cm::detail
