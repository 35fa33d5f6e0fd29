// rdx: queue-pair types, states, creation attributes and connection settings,
// with the checks that refuse bad values before anything reaches the device.
#pragma once

#include <rdx/error.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/gid.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/retransmission.hpp>
#include <rdx/verbs/shared_receive_queue.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace rdx {

//! Transport of a queue pair: reliable connected, unreliable connected, unreliable datagram.
enum class qp_type : int { rc = IBV_QPT_RC, uc = IBV_QPT_UC, ud = IBV_QPT_UD };

//! State of a queue pair (IBV_QPS_*): RESET, INIT, ready to receive, ready to send, and the rest.
enum class qp_state : int {
  reset = IBV_QPS_RESET,      //!< just created, or reset: no traffic
  init = IBV_QPS_INIT,        //!< port and access set; receives may be posted
  rtr = IBV_QPS_RTR,          //!< ready to receive: connected to its peer
  rts = IBV_QPS_RTS,          //!< ready to send
  sqd = IBV_QPS_SQD,          //!< send queue drained
  sqe = IBV_QPS_SQE,          //!< send queue error (UC, UD)
  error = IBV_QPS_ERR,        //!< error: outstanding requests complete flushed
  unknown = IBV_QPS_UNKNOWN,  //!< not known (a failed query)
};

//! "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERROR" or "UNKNOWN".
[[nodiscard]] constexpr std::string_view to_string(qp_state s) noexcept {
  switch (s) {
    case qp_state::reset: return "RESET";
    case qp_state::init: return "INIT";
    case qp_state::rtr: return "RTR";
    case qp_state::rts: return "RTS";
    case qp_state::sqd: return "SQD";
    case qp_state::sqe: return "SQE";
    case qp_state::error: return "ERROR";
    case qp_state::unknown: return "UNKNOWN";
  }
  return "UNKNOWN";
}
//! "RC", "UC" or "UD".
[[nodiscard]] constexpr std::string_view to_string(qp_type t) noexcept {
  switch (t) {
    case qp_type::rc: return "RC";
    case qp_type::uc: return "UC";
    case qp_type::ud: return "UD";
  }
  return "?";
}

//! How a queue pair hands send requests to the provider.
enum class post_api : int {
  //! The extended post API (ibv_wr_start, ibv_wr_*, ibv_wr_complete) where
  //! the provider offers it for an RC or UC queue pair, ibv_post_send otherwise.
  automatic,
  classic,   //!< ibv_post_send always
  extended,  //!< the extended post API, or creation fails naming the provider
};

//! "automatic", "classic" or "extended".
[[nodiscard]] constexpr std::string_view to_string(post_api a) noexcept {
  switch (a) {
    case post_api::automatic: return "automatic";
    case post_api::classic: return "classic";
    case post_api::extended: return "extended";
  }
  return "?";
}

//! Q_Key rdx uses for UD queue pairs unless told otherwise.
inline constexpr std::uint32_t default_qkey = 0x11111111;

//! How to create a queue pair; every field has a default.
struct queue_pair_attr {
  qp_type type = qp_type::rc;       //!< RC (default), UC or UD
  std::uint32_t max_send_wr = 256;  //!< send-queue depth, at least 1, at most the device's max_qp_wr
  std::uint32_t max_recv_wr = 256;  //!< receive-queue depth, at most max_qp_wr
  std::uint32_t max_send_sge = 1;   //!< SGL entries per send request, at most max_sge
  std::uint32_t max_recv_sge = 1;   //!< SGL entries per receive, at most max_sge
  //! Inline payload bytes; unset: 64 where the device allows it, else what it grants.
  std::optional<std::uint32_t> max_inline_data{};
  std::uint8_t port = 0;                    //!< 0: the context's first ACTIVE port
  std::optional<std::uint8_t> gid_index{};  //!< unset: select_gid() (RDX_GID_INDEX, RoCE v2, ...)
  //! What the peer may do through this QP (RC/UC): nothing unless asked for
  //! (remote_write, remote_read, remote_atomic); memory regions and windows
  //! still gate each range.
  access remote_access = access::none;
  std::uint16_t pkey_index = 0;       //!< P_Key table index, set at INIT
  std::uint32_t qkey = default_qkey;  //!< UD only
  bool sq_sig_all = false;            //!< every send request completes, whether signaled or not
  //! Receives come from this shared receive queue (kept alive by the QP); max_recv_* are ignored.
  const shared_receive_queue* srq = nullptr;
  //! How sends are posted (queue_pair::extended_post() says which one it got).
  //! The extended API builds each request in the provider's queue, with no
  //! ibv_send_wr between; requests it does not carry (memory-window binds,
  //! UD sends) still go by ibv_post_send.
  post_api post = post_api::automatic;
};

//! Connection settings (RTR and RTS); each field shows its default, 0 = from the device.
struct connect_options {
  std::uint8_t timeout = 14;        //!< 4.096 us * 2^timeout; 0 (infinite) is refused
  std::uint8_t retry_cnt = 6;       //!< 7 is "forever" in Soft-RoCE (rxe), so a bounded default is 6
  std::uint8_t rnr_retry = 7;       //!< 7 = retry forever
  std::uint8_t min_rnr_timer = 12;  //!< RC: the RNR NAK delay we ask of a sender, IB encoding (12 = 0.64 ms)
  std::uint8_t max_rd_atomic = 0;   //!< outstanding reads/atomics we issue; 0: min(device, 16)
  std::uint8_t max_dest_rd_atomic = 0;  //!< outstanding reads/atomics we serve; 0: min(device, 16)
  ibv_mtu max_mtu = IBV_MTU_4096;       //!< path MTU = min(local active, remote, this)
  std::uint8_t sl = 0;                  //!< service level of the path
  std::uint8_t traffic_class = 0;  //!< GRH traffic class (RoCE: DSCP and ECN bits), when the path has a GRH
  std::uint8_t hop_limit = 64;     //!< GRH hop limit (IP TTL on RoCE v2)

  //! Sets `timeout` to the smallest code whose wait is at least `d` and
  //! returns the wait it became (ack_timeout_code: refuses zero or above 2.4 h).
  std::chrono::nanoseconds set_ack_timeout(std::chrono::nanoseconds d) {
    timeout = ack_timeout_code(d);
    return ack_timeout_of(timeout);
  }
  //! The wait `timeout` stands for (4.096 us x 2^timeout).
  [[nodiscard]] std::chrono::nanoseconds ack_timeout() const noexcept { return ack_timeout_of(timeout); }
  //! Sets `min_rnr_timer` to the code of the smallest delay at least `d` and
  //! returns the delay it became (rnr_timer_code: 0.01 ms to 655.36 ms).
  std::chrono::nanoseconds set_rnr_timer(std::chrono::nanoseconds d) {
    min_rnr_timer = rnr_timer_code(d);
    return rnr_timer_of(min_rnr_timer);
  }
  //! The delay `min_rnr_timer` stands for (code 0 is the longest, 655.36 ms).
  [[nodiscard]] std::chrono::nanoseconds rnr_timer() const noexcept { return rnr_timer_of(min_rnr_timer); }
};

//! One line that says what the retransmission settings mean in time, e.g.
//! "ACK timeout 67.1 ms (code 14), 6 retries: an unanswered request fails
//! after 470 ms to 1.88 s; RNR timer 0.64 ms (code 12), RNR retries forever",
//! with the traps named (retry_cnt 7 retries forever on Soft-RoCE).
[[nodiscard]] inline std::string retransmission_summary(const connect_options& o) {
  auto ms = [](std::chrono::nanoseconds d) {
    char b[32];
    const double v = std::chrono::duration<double, std::milli>(d).count();
    if (v >= 1000.0) {
      std::snprintf(b, sizeof b, "%.3g s", v / 1000.0);
    } else {
      std::snprintf(b, sizeof b, "%.3g ms", v);
    }
    return std::string(b);
  };
  const auto window = retry_window(o.timeout, o.retry_cnt);
  std::string s = "ACK timeout " + ms(o.ack_timeout()) + " (code " + std::to_string(o.timeout) + "), " +
                  std::to_string(o.retry_cnt) + " retries: an unanswered request fails after " + ms(window) +
                  " to " + ms(window * 4);
  if (o.retry_cnt == 7) {
    s += " (on Soft-RoCE retry_cnt 7 retries forever)";
  }
  s += "; RNR timer " + ms(o.rnr_timer()) + " (code " + std::to_string(o.min_rnr_timer) + ")";
  if (o.min_rnr_timer == 0) {
    s += " (code 0 is the longest wait, not the shortest)";
  }
  s += o.rnr_retry == 7 ? ", RNR retries forever" : ", " + std::to_string(o.rnr_retry) + " RNR retries";
  return s;
}

namespace detail {
//! Checks queue sizes against the device; the error names field, value and limit.
inline void check_qp_attr(const queue_pair_attr& a, const device_attributes& d, std::string_view device) {
  std::string obj = "queue_pair on " + std::string(device);
  auto over = [&](const char* field, std::uint64_t v, int limit) {
    if (v > static_cast<std::uint64_t>(limit < 0 ? 0 : limit)) {
      throw_rdx(errc::limit_exceeded, limit_message(obj, field, v, static_cast<std::uint64_t>(limit)));
    }
  };
  if (a.type != qp_type::rc && a.type != qp_type::uc && a.type != qp_type::ud) {
    throw_rdx(errc::invalid_argument, obj + ": type must be RC, UC or UD");
  }
  if (a.max_send_wr == 0) {
    throw_rdx(errc::invalid_argument, obj + ": max_send_wr = 0, need at least 1");
  }
  over("max_send_wr", a.max_send_wr, d.max_qp_wr);
  over("max_recv_wr", a.max_recv_wr, d.max_qp_wr);
  over("max_send_sge", a.max_send_sge, d.max_sge);
  over("max_recv_sge", a.max_recv_sge, d.max_sge);
  if (a.type == qp_type::ud && has(a.remote_access, access::remote_read)) {
    // Not an error: UD ignores remote access; keep the value for RC/UC only.
  }
}

//! Checks connection settings; timeout 0 disables retransmission (rxe hangs), so it is refused.
inline void check_connect_options(const connect_options& o) {
  auto bad = [](const char* field, unsigned v, const char* allowed) {
    throw_rdx(errc::invalid_argument,
              std::string("connect: ") + field + " = " + std::to_string(v) + " is invalid (" + allowed + ")");
  };
  if (o.timeout == 0) {
    bad("timeout", 0, "1 to 31; 0 would disable retransmission");
  }
  if (o.timeout > 31) {
    bad("timeout", o.timeout, "1 to 31");
  }
  if (o.retry_cnt > 7) {
    bad("retry_cnt", o.retry_cnt, "0 to 7");
  }
  if (o.rnr_retry > 7) {
    bad("rnr_retry", o.rnr_retry, "0 to 7");
  }
  if (o.min_rnr_timer > 31) {
    bad("min_rnr_timer", o.min_rnr_timer, "0 to 31");
  }
  if (mtu_bytes(o.max_mtu) == 0) {
    bad("max_mtu", static_cast<unsigned>(o.max_mtu), "IBV_MTU_256 to IBV_MTU_4096");
  }
}

//! Checks a peer's endpoint before it reaches ibv_modify_qp.
inline void check_remote_endpoint(const endpoint& r, bool roce) {
  if (r.qpn == 0 || r.qpn > 0xffffffu) {
    throw_rdx(errc::invalid_argument,
              "connect: remote qpn = " + std::to_string(r.qpn) + " is not a 24-bit QP number");
  }
  if (r.psn > 0xffffffu) {
    throw_rdx(errc::invalid_argument, "connect: remote psn = " + std::to_string(r.psn) + " exceeds 24 bits");
  }
  if (mtu_bytes(r.mtu) == 0) {
    throw_rdx(errc::invalid_argument,
              "connect: remote mtu = " + std::to_string(static_cast<int>(r.mtu)) + " is not an ibv_mtu");
  }
  if (roce && gid_is_zero(r.gid)) {
    throw_rdx(errc::invalid_argument,
              "connect: remote endpoint has a zero GID, which a RoCE port cannot reach");
  }
  if (!roce && r.lid == 0 && gid_is_zero(r.gid)) {
    throw_rdx(errc::invalid_argument, "connect: remote endpoint has neither a LID nor a GID");
  }
}

[[nodiscard]] inline std::uint8_t clamp_rd_atomic(std::uint8_t asked, int device) noexcept {
  int v = asked != 0 ? asked : std::min(device, 16);
  return static_cast<std::uint8_t>(std::clamp(v, 1, 255));
}
}  // namespace detail

}  // namespace rdx
