// rdx: an open RDMA device (ibv_context), chosen by name, netdev or default.
#pragma once

#include <rdx/detail/env.hpp>
#include <rdx/detail/handle.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/async_event.hpp>
#include <rdx/verbs/device_list.hpp>
#include <rdx/verbs/endpoint.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include <net/if.h>

namespace rdx {

namespace detail {
// An open device's deleter: it closes the device, and holds what every owner
// of it shares: the log of its asynchronous events.
struct context_deleter : verbs_deleter<ibv_context> {
  std::unique_ptr<async_event_log> events;
};

// Shared ownership of an open device, with its event log.
[[nodiscard]] inline std::shared_ptr<ibv_context> make_shared_context(ibv_context* c) {
  std::unique_ptr<async_event_log> log;
  try {
    log = std::make_unique<async_event_log>(c);
  } catch (...) {
    ::ibv_close_device(c);
    throw;
  }
  // If allocating the control block throws, shared_ptr calls the deleter: nothing leaks.
  return {c, context_deleter{{&::ibv_close_device, "ibv_close_device", {}, false}, std::move(log)}};
}
}  // namespace detail

//! Logical state of a port (IBV_PORT_*); only an ACTIVE port carries traffic.
enum class port_state : int {
  nop = IBV_PORT_NOP,                    //!< no state change (not a real state)
  down = IBV_PORT_DOWN,                  //!< no link
  init = IBV_PORT_INIT,                  //!< link up, not yet configured by the subnet manager
  armed = IBV_PORT_ARMED,                //!< configured, not yet active
  active = IBV_PORT_ACTIVE,              //!< ready for traffic
  active_defer = IBV_PORT_ACTIVE_DEFER,  //!< logically active while the physical link is down for a moment
};

//! What a port runs on: InfiniBand, or Ethernet (RoCE).
enum class link_layer : std::uint8_t {
  unspecified = IBV_LINK_LAYER_UNSPECIFIED,  //!< not reported (older providers): taken as InfiniBand
  infiniband = IBV_LINK_LAYER_INFINIBAND,    //!< InfiniBand: addressed by LID
  ethernet = IBV_LINK_LAYER_ETHERNET,        //!< Ethernet (RoCE): addressed by GID
};

//! "NOP", "DOWN", "INIT", "ARMED", "ACTIVE" or "ACTIVE_DEFER".
[[nodiscard]] constexpr std::string_view to_string(port_state s) noexcept {
  switch (s) {
    case port_state::nop: return "NOP";
    case port_state::down: return "DOWN";
    case port_state::init: return "INIT";
    case port_state::armed: return "ARMED";
    case port_state::active: return "ACTIVE";
    case port_state::active_defer: return "ACTIVE_DEFER";
  }
  return "UNKNOWN";
}

//! One port's attributes, typed; raw keeps everything ibv_query_port returned.
struct port_attributes {
  std::uint8_t port = 0;                      //!< the port number, from 1
  port_state state = port_state::nop;         //!< its logical state
  ibv_mtu max_mtu = IBV_MTU_1024;             //!< largest MTU the port supports
  ibv_mtu active_mtu = IBV_MTU_1024;          //!< MTU in use on its link
  std::uint16_t lid = 0;                      //!< its LID (InfiniBand; 0 on Ethernet)
  std::uint16_t sm_lid = 0;                   //!< the subnet manager's LID (InfiniBand)
  int gid_table_len = 0;                      //!< entries in its GID table
  std::uint16_t pkey_table_len = 0;           //!< entries in its P_Key table
  link_layer link = link_layer::unspecified;  //!< InfiniBand or Ethernet
  ibv_port_attr raw{};                        //!< everything ibv_query_port returned

  //! True when the port is ACTIVE.
  [[nodiscard]] bool active() const noexcept { return state == port_state::active; }
  //! True for an Ethernet (RoCE) port.
  [[nodiscard]] bool is_ethernet() const noexcept { return link == link_layer::ethernet; }
  //! True for an InfiniBand port, or one that does not report its link layer.
  [[nodiscard]] bool is_infiniband() const noexcept {
    return link == link_layer::infiniband || link == link_layer::unspecified;
  }
};

//! Device attributes, typed; raw keeps everything ibv_query_device_ex returned.
struct device_attributes {
  std::string fw_ver;                           //!< firmware version, as the device reports it
  std::uint64_t node_guid = 0;                  //!< network byte order, as the device reports it
  std::uint32_t vendor_id = 0;                  //!< IEEE vendor id (0x02c9: Mellanox/NVIDIA)
  std::uint32_t vendor_part_id = 0;             //!< vendor's part number
  std::uint32_t hw_ver = 0;                     //!< hardware version
  std::uint64_t max_mr_size = 0;                //!< largest memory region, in bytes
  int max_qp = 0;                               //!< queue pairs
  int max_qp_wr = 0;                            //!< work requests per queue (send or receive)
  int max_sge = 0;                              //!< SGL entries per work request
  int max_cq = 0;                               //!< completion queues
  int max_cqe = 0;                              //!< entries per completion queue
  int max_mr = 0;                               //!< memory regions
  int max_pd = 0;                               //!< protection domains
  int max_qp_rd_atom = 0;                       //!< RDMA reads and atomics a queue pair serves at once
  int max_qp_init_rd_atom = 0;                  //!< RDMA reads and atomics a queue pair issues at once
  int max_srq = 0;                              //!< shared receive queues
  int max_srq_wr = 0;                           //!< work requests per shared receive queue
  ibv_atomic_cap atomic_cap = IBV_ATOMIC_NONE;  //!< atomics: none, within the device (HCA) or globally (GLOB)
  std::uint8_t phys_port_cnt = 0;               //!< physical ports
  ibv_device_attr_ex raw{};                     //!< everything ibv_query_device_ex returned
};

//! An open device. Move-only; protection domains and CQs keep it alive.
class context : detail::move_only {
public:
  //! Opens a device from a device_list entry.
  //! @throws rdx::error naming the device when ibv_open_device fails.
  explicit context(ibv_device* dev) {
    detail::refuse_null(dev, "context(ibv_device*)");
    ibv_context* c = ::ibv_open_device(dev);
    if (c == nullptr) {
      detail::throw_errno("ibv_open_device",
                          std::string(device_name(dev)) +
                              " (its kernel driver may be unloaded, or /dev/infiniband absent or not "
                              "readable in this container)" +
                              detail::doctor_hint("devices"),
                          errno ? errno : ENODEV);
    }
    h_ = detail::make_shared_context(c);
  }

  //! Opens the device called name.
  //! @throws rdx::error (errc::no_device) listing the devices present when none matches.
  [[nodiscard]] static context open(std::string_view name) {
    device_list list;
    ibv_device* d = list.find(name);
    if (d == nullptr) {
      detail::throw_rdx(errc::no_device, "RDMA device \"" + std::string(name) +
                                             "\" not found (devices present: " + list.names() + ")" +
                                             detail::doctor_hint("devices"));
    }
    return context(d);
  }

  //! Opens the device whose port carries the network interface netdev ("eth0").
  //! @throws rdx::error (errc::no_device) when no device is bound to it.
  [[nodiscard]] static context open_netdev(std::string_view netdev) {
    std::string nd(netdev);
    unsigned ifindex = ::if_nametoindex(nd.c_str());
    if (ifindex == 0) {
      detail::throw_rdx(errc::no_device, "network interface \"" + nd + "\" does not exist");
    }
    device_list list;
    for (ibv_device* d : list) {
      context c(d);
      if (c.carries_netdev(nd, ifindex)) {
        return c;
      }
    }
    detail::throw_rdx(errc::no_device, "no RDMA device is bound to network interface \"" + nd +
                                           "\" (devices present: " + list.names() + ")" +
                                           detail::doctor_hint("devices"));
  }

  //! Opens RDX_DEVICE if set, else the first device with an ACTIVE port.
  //! @throws rdx::error (errc::no_device) saying what was found.
  [[nodiscard]] static context open_default() {
    if (auto name = detail::env_string("RDX_DEVICE")) {
      return open(*name);
    }
    device_list list;
    std::string seen;
    for (ibv_device* d : list) {
      context c(d);
      if (c.first_active_port() != 0) {
        return c;
      }
      if (!seen.empty()) {
        seen += ", ";
      }
      seen += std::string(device_name(d)) + " (no ACTIVE port)";
    }
    detail::throw_rdx(errc::no_device, "no RDMA device with an ACTIVE port (devices present: " +
                                           (seen.empty() ? std::string("none") : seen) + ")" +
                                           detail::doctor_hint("devices"));
  }

  //! Takes ownership of an open ibv_context. @throws rdx::error on nullptr.
  [[nodiscard]] static context from_native_handle(ibv_context* c) {
    detail::refuse_null(c, "context::from_native_handle");
    return context(detail::make_shared_context(c));
  }

  //! The ibv_context, still owned (nullptr when empty).
  [[nodiscard]] ibv_context* native_handle() const noexcept { return h_.get(); }
  //! Gives up ownership. @throws rdx::error while objects created from it are alive.
  [[nodiscard]] ibv_context* release() {
    return detail::release_verbs<ibv_context, detail::context_deleter>(h_, "context");
  }
  //! Shared ownership of the native handle, for objects built on this one.
  [[nodiscard]] const std::shared_ptr<ibv_context>& shared_handle() const noexcept { return h_; }
  //! True when it owns an open device (not moved from or released).
  explicit operator bool() const noexcept { return h_ != nullptr; }
  //! Another owner of the same open device (shares the native handle).
  [[nodiscard]] context share() const noexcept { return context(h_); }

  //! The device's asynchronous events, read without blocking and kept for
  //! the owners of its queue pairs; one log per open device, shared by every
  //! owner of it (share(), its protection domains). nullptr when empty.
  [[nodiscard]] async_event_log* async_events() const noexcept {
    const auto* d = std::get_deleter<detail::context_deleter>(h_);
    return d != nullptr ? d->events.get() : nullptr;
  }

  //! The device's kernel name ("rxe0", "mlx5_0").
  [[nodiscard]] std::string name() const { return std::string(device_name(h_->device)); }

  //! The device's attributes and limits.
  //! @throws rdx::error when ibv_query_device_ex fails.
  [[nodiscard]] device_attributes query_device() const {
    device_attributes a;
    if (int rc = ::ibv_query_device_ex(h_.get(), nullptr, &a.raw); rc != 0) {
      detail::throw_errno("ibv_query_device_ex", name(), rc);
    }
    const ibv_device_attr& o = a.raw.orig_attr;
    a.fw_ver = o.fw_ver;
    a.node_guid = o.node_guid;
    a.vendor_id = o.vendor_id;
    a.vendor_part_id = o.vendor_part_id;
    a.hw_ver = o.hw_ver;
    a.max_mr_size = o.max_mr_size;
    a.max_qp = o.max_qp;
    a.max_qp_wr = o.max_qp_wr;
    a.max_sge = o.max_sge;
    a.max_cq = o.max_cq;
    a.max_cqe = o.max_cqe;
    a.max_mr = o.max_mr;
    a.max_pd = o.max_pd;
    a.max_qp_rd_atom = o.max_qp_rd_atom;
    a.max_qp_init_rd_atom = o.max_qp_init_rd_atom;
    a.max_srq = o.max_srq;
    a.max_srq_wr = o.max_srq_wr;
    a.atomic_cap = o.atomic_cap;
    a.phys_port_cnt = o.phys_port_cnt;
    return a;
  }

  //! A port's attributes, queried now (its state can change).
  //! @throws rdx::error naming the port when ibv_query_port fails (e.g. no such port).
  [[nodiscard]] port_attributes query_port(std::uint8_t port) const {
    port_attributes p;
    p.port = port;
    if (int rc = ::ibv_query_port(h_.get(), port, &p.raw); rc != 0) {
      detail::throw_errno("ibv_query_port", name() + " port " + std::to_string(port), rc);
    }
    p.state = static_cast<port_state>(p.raw.state);
    p.max_mtu = p.raw.max_mtu;
    p.active_mtu = p.raw.active_mtu;
    p.lid = p.raw.lid;
    p.sm_lid = p.raw.sm_lid;
    p.gid_table_len = p.raw.gid_tbl_len;
    p.pkey_table_len = p.raw.pkey_tbl_len;
    p.link = static_cast<link_layer>(p.raw.link_layer);
    return p;
  }

  //! Number of physical ports.
  [[nodiscard]] std::uint8_t port_count() const {
    ibv_device_attr a{};
    if (int rc = ::ibv_query_device(h_.get(), &a); rc != 0) {
      detail::throw_errno("ibv_query_device", name(), rc);
    }
    return a.phys_port_cnt;
  }

  //! The first ACTIVE port (1-based), or 0 when none is.
  [[nodiscard]] std::uint8_t first_active_port() const {
    std::uint8_t n = port_count();
    for (std::uint8_t p = 1; p <= n && p != 0; ++p) {
      ibv_port_attr a{};
      if (::ibv_query_port(h_.get(), p, &a) == 0 && a.state == IBV_PORT_ACTIVE) {
        return p;
      }
    }
    return 0;
  }

  //! The port to use by default: the first ACTIVE one, else port 1.
  [[nodiscard]] std::uint8_t default_port() const {
    std::uint8_t p = first_active_port();
    return p != 0 ? p : std::uint8_t{1};
  }

private:
  friend class protection_domain;
  explicit context(std::shared_ptr<ibv_context> h) noexcept : h_(std::move(h)) {}

  // True when a GID entry of any port is bound to the interface (ibv_query_gid_ex
  // reports its ifindex; sysfs gid_attrs/ndevs where that verb is missing).
  bool carries_netdev(const std::string& netdev, unsigned ifindex) const {
    std::uint8_t n = port_count();
    for (std::uint8_t p = 1; p <= n && p != 0; ++p) {
      ibv_port_attr a{};
      if (::ibv_query_port(h_.get(), p, &a) != 0) {
        continue;
      }
      for (int i = 0; i < a.gid_tbl_len; ++i) {
        ibv_gid_entry e{};
        int rc = ::ibv_query_gid_ex(h_.get(), p, static_cast<std::uint32_t>(i), &e, 0);
        if (rc == 0) {
          if (e.ndev_ifindex == ifindex) {
            return true;
          }
          continue;
        }
        if (rc != EOPNOTSUPP && rc != ENOSYS) {
          continue;  // empty entry
        }
        std::ifstream f(std::string(h_->device->ibdev_path) + "/ports/" + std::to_string(p) +
                        "/gid_attrs/ndevs/" + std::to_string(i));
        std::string dev;
        if (f && std::getline(f, dev) && dev == netdev) {
          return true;
        }
      }
    }
    return false;
  }

  std::shared_ptr<ibv_context> h_;
};

}  // namespace rdx
