// rdx::cm: the rdma_cm event channel (owning, non-blocking) and its events,
// copied and acknowledged as soon as they are read, so that no id is ever
// kept from being destroyed by an event still held (rdma_destroy_id waits
// for those). Every wait for an event has the caller's deadline.
#pragma once

#include <rdx/error.hpp>

#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <poll.h>

namespace rdx::cm {

//! The clock of every rdma_cm deadline.
using clock = std::chrono::steady_clock;

//! One connection-manager event, copied out of librdmacm's record.
struct event {
  rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_RESOLVED;  //!< what happened (RDMA_CM_EVENT_*)
  int status = 0;                        //!< errno (negative) or, for REJECTED, the reject reason
  rdma_cm_id* id = nullptr;              //!< the id it is about (a new id for CONNECT_REQUEST)
  rdma_cm_id* listen_id = nullptr;       //!< the listening id, for CONNECT_REQUEST
  std::vector<std::byte> private_data;   //!< as it arrived (the transport pads it with zeros)
  std::uint32_t qp_num = 0;              //!< the peer's queue pair (REQUEST, RESPONSE)
  std::uint8_t responder_resources = 0;  //!< reads and atomics the peer serves at once (REQUEST, RESPONSE)
  std::uint8_t initiator_depth = 0;      //!< reads and atomics the peer issues at once (REQUEST, RESPONSE)

  //! librdmacm's name for the type ("RDMA_CM_EVENT_REJECTED").
  [[nodiscard]] const char* name() const noexcept { return ::rdma_event_str(type); }
};

//! An owning rdma_event_channel whose descriptor never blocks.
class event_channel {
public:
  //! @throws rdx::error when the rdma_cm device (/dev/infiniband/rdma_cm) cannot be opened.
  event_channel() : ch_(::rdma_create_event_channel()) {
    if (ch_ == nullptr) {
      const int e = errno;
      throw error(std::error_code(e, std::generic_category()),
                  "rdma_create_event_channel (is the rdma_ucm module loaded and /dev/infiniband/rdma_cm "
                  "readable?)");
    }
    const int fl = ::fcntl(ch_->fd, F_GETFL);
    if (fl < 0 || ::fcntl(ch_->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
      const int e = errno;
      ::rdma_destroy_event_channel(ch_);
      throw error(std::error_code(e, std::generic_category()),
                  "fcntl(O_NONBLOCK) on an rdma_cm event channel");
    }
  }
  event_channel(const event_channel&) = delete;
  event_channel& operator=(const event_channel&) = delete;
  //! Takes o's channel; o is left empty.
  event_channel(event_channel&& o) noexcept : ch_(std::exchange(o.ch_, nullptr)) {}
  //! Destroys this channel, then takes o's; o is left empty.
  event_channel& operator=(event_channel&& o) noexcept {
    if (this != &o) {
      reset();
      ch_ = std::exchange(o.ch_, nullptr);
    }
    return *this;
  }
  //! Every id on the channel must be gone (or migrated) first.
  ~event_channel() { reset(); }

  //! The rdma_event_channel, still owned (nullptr when empty).
  [[nodiscard]] rdma_event_channel* native_handle() const noexcept { return ch_; }
  //! The channel's descriptor (non-blocking), readable when an event waits; -1 when empty.
  [[nodiscard]] int fd() const noexcept { return ch_ != nullptr ? ch_->fd : -1; }

  //! Takes the next event if one waits. @throws rdx::error for a failed read.
  [[nodiscard]] std::optional<event> try_next() {
    rdma_cm_event* e = nullptr;
    if (::rdma_get_cm_event(ch_, &e) != 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) {
        return std::nullopt;
      }
      throw error(std::error_code(err, std::generic_category()), "rdma_get_cm_event");
    }
    event out;
    out.type = e->event;
    out.status = e->status;
    out.id = e->id;
    out.listen_id = e->listen_id;
    const bool conn = e->event == RDMA_CM_EVENT_CONNECT_REQUEST ||
                      e->event == RDMA_CM_EVENT_CONNECT_RESPONSE || e->event == RDMA_CM_EVENT_REJECTED ||
                      e->event == RDMA_CM_EVENT_ESTABLISHED;
    if (conn && e->param.conn.private_data != nullptr) {
      const auto* p = static_cast<const std::byte*>(e->param.conn.private_data);
      out.private_data.assign(p, p + e->param.conn.private_data_len);
    }
    if (conn) {
      out.qp_num = e->param.conn.qp_num;
      out.responder_resources = e->param.conn.responder_resources;
      out.initiator_depth = e->param.conn.initiator_depth;
    }
    ::rdma_ack_cm_event(e);
    return out;
  }

  //! Waits for the next event until deadline. @return nullopt at the deadline.
  [[nodiscard]] std::optional<event> next(clock::time_point deadline) {
    for (;;) {
      if (auto e = try_next()) {
        return e;
      }
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now()).count();
      if (left <= 0) {
        return std::nullopt;
      }
      pollfd p{ch_->fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30))) < 0 && errno != EINTR) {
        throw error(std::error_code(errno, std::generic_category()), "poll on an rdma_cm event channel");
      }
    }
  }

private:
  void reset() noexcept {
    if (ch_ != nullptr) {
      ::rdma_destroy_event_channel(ch_);
    }
    ch_ = nullptr;
  }
  rdma_event_channel* ch_ = nullptr;
};

}  // namespace rdx::cm
