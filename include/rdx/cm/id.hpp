// rdx::cm: an owning rdma_cm_id, and the resolution of host:port to an
// address and a route, each bounded by a deadline.
#pragma once

#include <rdx/cm/event_channel.hpp>
#include <rdx/detail/address.hpp>
#include <rdx/error.hpp>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

//! Connections set up through librdmacm (target rdx::cm).
namespace rdx::cm {

namespace detail {

//! rdx::detail::throw_errno with this thread's errno (EIO where it is 0).
[[noreturn]] inline void fail_errno(const std::string& what) {
  const int e = errno;
  rdx::detail::throw_errno(what, {}, e != 0 ? e : EIO);
}

using rdx::detail::address_text;
using rdx::detail::host_port;

//! host:port as a socket address (IPv4 first); an empty host is the wildcard.
inline sockaddr_storage resolve_host(std::string_view host, std::uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string h(host);
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(h.empty() ? nullptr : h.c_str(), service.c_str(), &hints, &res); rc != 0) {
    throw error(errc::address_error,
                "rdma_cm: cannot resolve " + host_port(host, port) + ": " + ::gai_strerror(rc));
  }
  sockaddr_storage out{};
  const addrinfo* pick = res;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  std::memcpy(&out, pick->ai_addr, pick->ai_addrlen);
  ::freeaddrinfo(res);
  return out;
}

}  // namespace detail

//! An owning rdma_cm_id (reliable connected, RDMA_PS_TCP). Move-only; the
//! destructor destroys it (the peer hears DISCONNECTED if it was connected).
class id {
public:
  id() noexcept = default;
  //! @throws rdx::error from rdma_create_id.
  explicit id(event_channel& ch, void* context = nullptr) {
    if (::rdma_create_id(ch.native_handle(), &h_, context, RDMA_PS_TCP) != 0) {
      detail::fail_errno("rdma_create_id");
    }
  }
  //! Takes ownership of an id librdmacm made (a CONNECT_REQUEST's). @throws on nullptr.
  [[nodiscard]] static id from_native_handle(rdma_cm_id* h) {
    if (h == nullptr) {
      throw error(errc::invalid_argument, "cm::id::from_native_handle: nullptr");
    }
    id i;
    i.h_ = h;
    return i;
  }
  id(const id&) = delete;
  id& operator=(const id&) = delete;
  //! Takes o's id; o is left empty.
  id(id&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  //! Destroys this id, then takes o's; o is left empty.
  id& operator=(id&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  ~id() { reset(); }

  //! The rdma_cm_id, still owned (nullptr when empty).
  [[nodiscard]] rdma_cm_id* native_handle() const noexcept { return h_; }
  //! Gives up ownership; the caller destroys the id (rdma_destroy_id).
  [[nodiscard]] rdma_cm_id* release() noexcept { return std::exchange(h_, nullptr); }
  //! True when it owns an id.
  [[nodiscard]] explicit operator bool() const noexcept { return h_ != nullptr; }

  //! The RDMA device the address resolved to (empty before resolution).
  [[nodiscard]] std::string device_name() const {
    return h_ != nullptr && h_->verbs != nullptr ? ::ibv_get_device_name(h_->verbs->device) : "";
  }
  //! The device port the id is bound to: 0 when empty or before address resolution.
  [[nodiscard]] std::uint8_t port() const noexcept { return h_ != nullptr ? h_->port_num : 0; }
  //! The peer's address as "host:port" (on a non-empty id).
  [[nodiscard]] std::string peer() const { return detail::address_text(::rdma_get_peer_addr(h_)); }
  //! This side's address as "host:port" (on a non-empty id).
  [[nodiscard]] std::string local() const { return detail::address_text(::rdma_get_local_addr(h_)); }

  //! Moves the id (and its future events) to another channel. @throws rdx::error.
  void migrate(event_channel& to) {
    if (::rdma_migrate_id(h_, to.native_handle()) != 0) {
      detail::fail_errno("rdma_migrate_id");
    }
  }

private:
  void reset() noexcept {
    if (h_ != nullptr) {
      (void)::rdma_destroy_id(h_);
    }
    h_ = nullptr;
  }
  rdma_cm_id* h_ = nullptr;
};

}  // namespace rdx::cm
