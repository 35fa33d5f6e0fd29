// rdx::detail: creating a queue pair's ibv_qp from queue_pair_attr: by
// ibv_create_qp_ex with the extended post API where it is asked for and the
// provider offers it, else by ibv_create_qp; retried without the default
// inline size when the device refuses it; and, when creation fails, an error
// that names the call, the sizes asked for and, for an inline size the device
// does not report, the largest it accepts.
#pragma once

#include <rdx/error.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/detail/extended_post.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>
#include <rdx/verbs/shared_receive_queue.hpp>

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace rdx::detail {

// What create_qp() made.
struct created_qp {
  ibv_qp* qp = nullptr;
  ibv_qp_ex* qpx = nullptr;            // the extended post API, when created with it (owned by qp)
  std::uint32_t extended_opcodes = 0;  // bit IBV_WR_x: qpx carries opcode x
  ibv_qp_cap caps{};                   // what the device granted (at least what was asked)
};

// Largest max_inline_data the device accepts with these other sizes (binary
// search with throwaway QPs), or nullopt when even 0 is refused.
[[nodiscard]] inline std::optional<std::uint32_t> probe_max_inline(const protection_domain& pd,
                                                                   const ibv_qp_init_attr& base) {
  auto accepted = [&](std::uint32_t n) {
    ibv_qp_init_attr ia = base;
    ia.cap.max_inline_data = n;
    ibv_qp* q = ::ibv_create_qp(pd.native_handle(), &ia);
    if (q == nullptr) {
      return false;
    }
    if (int rc = ::ibv_destroy_qp(q); rc != 0) {
      report_destroy_failure("ibv_destroy_qp", rc);
    }
    return true;
  };
  if (!accepted(0)) {
    return std::nullopt;
  }
  std::uint32_t lo = 0;                         // accepted
  std::uint32_t hi = base.cap.max_inline_data;  // refused
  while (hi - lo > 1) {
    std::uint32_t mid = lo + (hi - lo) / 2;
    (accepted(mid) ? lo : hi) = mid;
  }
  return lo;
}

// One try: ibv_create_qp_ex with the extended post API when asked for
// (automatic or extended) on an RC or UC queue pair, setting out.qpx and
// out.extended_opcodes. Automatic falls back to ibv_create_qp, so a refusal
// there is the classic call's own. nullptr with errno set on failure.
inline ibv_qp* create_qp_once(const protection_domain& pd, ibv_qp_init_attr& ia, qp_type type, post_api api,
                              created_qp& out) {
  if (api == post_api::extended && type == qp_type::ud) {
    errno = EOPNOTSUPP;  // rdx posts UD sends by ibv_post_send
    return nullptr;
  }
  if (api != post_api::classic && type != qp_type::ud) {
    ibv_qp_init_attr_ex ix{};
    ix.send_cq = ia.send_cq;
    ix.recv_cq = ia.recv_cq;
    ix.srq = ia.srq;
    ix.cap = ia.cap;
    ix.qp_type = ia.qp_type;
    ix.sq_sig_all = ia.sq_sig_all;
    ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ix.pd = pd.native_handle();
    ix.send_ops_flags = extended_ops(type);
    errno = 0;
    if (ibv_qp* q = ::ibv_create_qp_ex(pd.native_handle()->context, &ix)) {
      if (ibv_qp_ex* x = ::ibv_qp_to_qp_ex(q)) {
        ia.cap = ix.cap;
        out.qpx = x;
        out.extended_opcodes = static_cast<std::uint32_t>(ix.send_ops_flags);  // bit IBV_WR_x (extended_ops)
        return q;
      }
      if (int rc = ::ibv_destroy_qp(q); rc != 0) {
        report_destroy_failure("ibv_destroy_qp", rc);
      }
      errno = EOPNOTSUPP;
    }
    if (api == post_api::extended) {
      if (errno == 0) {
        errno = EOPNOTSUPP;
      }
      return nullptr;
    }
  }
  return ::ibv_create_qp(pd.native_handle(), &ia);
}

// Creates the ibv_qp that attr describes (already checked against the
// device's limits) on device.
// @throws rdx::error (errc::limit_exceeded) for an inline size above the one
// the device accepts; rdx::error from ibv_create_qp(_ex) otherwise.
[[nodiscard]] inline created_qp create_qp(const protection_domain& pd, const completion_queue& send_cq,
                                          const completion_queue& recv_cq, const queue_pair_attr& attr,
                                          const std::string& device) {
  ibv_qp_init_attr ia{};
  ia.send_cq = send_cq.native_handle();
  ia.recv_cq = recv_cq.native_handle();
  ia.qp_type = static_cast<ibv_qp_type>(attr.type);
  ia.sq_sig_all = attr.sq_sig_all ? 1 : 0;
  ia.cap.max_send_wr = attr.max_send_wr;
  ia.cap.max_recv_wr = attr.srq != nullptr ? 0 : attr.max_recv_wr;
  ia.cap.max_send_sge = attr.max_send_sge;
  ia.cap.max_recv_sge = attr.srq != nullptr ? 0 : attr.max_recv_sge;
  if (attr.srq != nullptr) {
    ia.srq = attr.srq->native_handle();
  }
  ia.cap.max_inline_data = attr.max_inline_data.value_or(64);
  created_qp out;
  ibv_qp* qp = create_qp_once(pd, ia, attr.type, attr.post, out);
  int err = qp == nullptr ? (errno ? errno : EINVAL) : 0;
  if (qp == nullptr && !attr.max_inline_data && err == EINVAL) {
    // The default inline size is a wish, not a requirement: retry without it.
    ia.cap.max_inline_data = 0;
    qp = create_qp_once(pd, ia, attr.type, attr.post, out);
    err = qp == nullptr ? (errno ? errno : EINVAL) : 0;
  }
  if (qp == nullptr && attr.post == post_api::extended && err != EINVAL) {
    throw_errno("ibv_create_qp_ex",
                std::string(to_string(attr.type)) + " QP on " + device +
                    " with the extended post API (queue_pair_attr::post = post_api::extended): "
                    "the provider does not offer it for this queue pair; post_api::automatic "
                    "uses ibv_post_send where it is missing",
                err);
  }
  if (qp == nullptr && err == EINVAL && attr.max_inline_data.value_or(0) > 0) {
    // The device reports no inline limit: find it, so the error can name it.
    if (auto limit = probe_max_inline(pd, ia); limit && *limit < ia.cap.max_inline_data) {
      throw_rdx(errc::limit_exceeded,
                limit_message("queue_pair on " + device, "max_inline_data", ia.cap.max_inline_data, *limit));
    }
  }
  if (qp == nullptr) {
    char what[200];
    std::snprintf(what, sizeof what,
                  "%s QP on %s (max_send_wr %u, max_recv_wr %u, max_send_sge %u, max_recv_sge %u, "
                  "max_inline_data %u)",
                  std::string(to_string(attr.type)).c_str(), device.c_str(), attr.max_send_wr,
                  attr.max_recv_wr, attr.max_send_sge, attr.max_recv_sge, ia.cap.max_inline_data);
    throw_errno(attr.post == post_api::extended ? "ibv_create_qp_ex" : "ibv_create_qp", what, err);
  }
  out.qp = qp;
  out.caps = ia.cap;
  return out;
}

}  // namespace rdx::detail
