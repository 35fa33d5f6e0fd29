// rdx::detail: what a queue pair's state transitions hand ibv_modify_qp. A
// queue pair keeps from its creation its transport, port, address and the
// device's limits (qp_settings); from them, its access flags and the peer's
// endpoint, each transition's attributes and mask are built here, with the
// settings checked before anything reaches the device, and a failed
// transition is explained by its likely causes.
#pragma once

#include <rdx/error.hpp>
#include <rdx/verbs/address_handle.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/gid.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

namespace rdx::detail {

// One ibv_modify_qp's attributes and mask.
struct qp_change {
  ibv_qp_attr attr{};
  int mask = 0;
};

// What a queue pair keeps from its creation for its transitions and its
// local endpoint.
struct qp_settings {
  qp_type type = qp_type::rc;
  ibv_gid gid{};
  std::uint32_t qkey = default_qkey;
  std::uint16_t lid = 0;
  std::uint16_t pkey_index = 0;
  ibv_mtu active_mtu = IBV_MTU_1024;
  int max_rd_atomic = 1;       // the device's max_qp_init_rd_atom
  int max_dest_rd_atomic = 1;  // the device's max_qp_rd_atom
  std::uint8_t port = 1;
  std::uint8_t gid_index = 0;
  bool roce = false;

  // The port (attr.port, else the device's default), its GID (attr.gid_index,
  // else select_gid()), LID and active MTU, and the device's limits.
  [[nodiscard]] static qp_settings make(const context& ctx, const device_attributes& da,
                                        const queue_pair_attr& attr) {
    qp_settings s;
    s.type = attr.type;
    s.port = attr.port != 0 ? attr.port : ctx.default_port();
    port_attributes pa = ctx.query_port(s.port);
    gid_choice g = attr.gid_index ? use_gid_index(ctx, s.port, *attr.gid_index) : select_gid(ctx, s.port);
    s.gid = g.gid;
    s.gid_index = g.index;
    s.lid = pa.lid;
    s.active_mtu = pa.active_mtu;
    s.roce = pa.is_ethernet();
    s.qkey = attr.qkey;
    s.pkey_index = attr.pkey_index;
    s.max_rd_atomic = da.max_qp_init_rd_atom;
    s.max_dest_rd_atomic = da.max_qp_rd_atom;
    return s;
  }

  // What the peer needs to connect to queue pair qpn starting at psn.
  [[nodiscard]] endpoint local(std::uint32_t qpn, std::uint32_t psn) const noexcept {
    endpoint e;
    e.gid = gid;
    e.lid = lid;
    e.qpn = qpn;
    e.psn = psn;
    e.mtu = active_mtu;
    e.port = port;
    e.gid_index = gid_index;
    return e;
  }

  // RESET -> INIT: port, P_Key index and access_flags (RC/UC) or Q_Key (UD).
  [[nodiscard]] qp_change init_change(unsigned access_flags) const noexcept {
    qp_change c;
    c.attr.qp_state = IBV_QPS_INIT;
    c.attr.port_num = port;
    c.attr.pkey_index = pkey_index;
    c.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (type == qp_type::ud) {
      c.attr.qkey = qkey;
      c.mask |= IBV_QP_QKEY;
    } else {
      c.attr.qp_access_flags = access_flags;
      c.mask |= IBV_QP_ACCESS_FLAGS;
    }
    return c;
  }

  // INIT -> RTR towards remote (RC/UC); for UD remote is unused.
  // @throws rdx::error from the checks of opt and remote (RC/UC).
  [[nodiscard]] qp_change rtr_change(const endpoint& remote, const connect_options& opt,
                                     unsigned access_flags) const {
    qp_change c;
    c.attr.qp_state = IBV_QPS_RTR;
    c.mask = IBV_QP_STATE;
    if (type != qp_type::ud) {
      check_connect_options(opt);
      check_remote_endpoint(remote, roce);
      ibv_qp_attr& a = c.attr;
      a.path_mtu = std::min({active_mtu, remote.mtu, opt.max_mtu});
      a.dest_qp_num = remote.qpn;
      a.rq_psn = remote.psn;
      a.ah_attr = address_handle::make_attr(remote, port, gid_index, opt.hop_limit);
      a.ah_attr.sl = opt.sl;
      // InfiniBand inside a subnet: the LID is the address; the GRH is for routers.
      if (!roce && remote.lid != 0) {
        a.ah_attr.is_global = 0;
      }
      if (a.ah_attr.is_global != 0) {
        a.ah_attr.grh.traffic_class = opt.traffic_class;
      }
      a.qp_access_flags = access_flags;
      c.mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_ACCESS_FLAGS;
      if (type == qp_type::rc) {
        a.max_dest_rd_atomic = clamp_rd_atomic(opt.max_dest_rd_atomic, max_dest_rd_atomic);
        a.min_rnr_timer = opt.min_rnr_timer;
        c.mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
    }
    return c;
  }

  // RTR -> RTS starting at psn, with the retry settings (RC).
  // @throws rdx::error from the check of opt (RC).
  [[nodiscard]] qp_change rts_change(std::uint32_t psn, const connect_options& opt) const {
    qp_change c;
    c.attr.qp_state = IBV_QPS_RTS;
    c.attr.sq_psn = psn;
    c.mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (type == qp_type::rc) {
      check_connect_options(opt);
      c.attr.timeout = opt.timeout;
      c.attr.retry_cnt = opt.retry_cnt;
      c.attr.rnr_retry = opt.rnr_retry;
      c.attr.max_rd_atomic = clamp_rd_atomic(opt.max_rd_atomic, max_rd_atomic);
      c.mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    return c;
  }
};

// The likely causes of a failed transition to target, and the doctor's checks for them.
[[nodiscard]] inline std::string modify_hint(std::string_view target) {
  if (target == "RTR") {
    return "; at RTR the usual causes are a GID index that is not a RoCE v2 entry of this port or "
           "not on the peer's subnet, a path MTU above the port's active MTU, or a peer's QP number, "
           "LID or GID from another port" +
           doctor_hint("gid,mtu") + ", and `rdx-doctor --peer HOST` compares both sides";
  }
  if (target == "RTS") {
    return "; at RTS the usual cause is a timeout, retry count or rnr retry outside what the device "
           "takes" +
           doctor_hint("ports");
  }
  return doctor_hint("ports");
}

}  // namespace rdx::detail
