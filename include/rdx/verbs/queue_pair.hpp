// rdx: queue pairs (RC, UC, UD) with explicit state transitions, one-call
// connect, device-checked limits and batched posting.
#pragma once

#include <rdx/detail/handle.hpp>
#include <rdx/detail/random.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/gid.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>
#include <rdx/verbs/shared_receive_queue.hpp>
#include <rdx/verbs/work_request.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>

namespace rdx {

//! A queue pair. Move-only; keeps its protection domain and CQs alive.
//! Setup throws rdx::error; posting returns an std::error_code and never throws.
class queue_pair : detail::move_only {
public:
  //! Creates a queue pair in RESET. Picks the port, the GID and a random
  //! starting PSN (24 bits from getrandom).
  //! @throws rdx::error (errc::limit_exceeded) naming field, value and limit for
  //! sizes above the device's; rdx::error from ibv_create_qp otherwise.
  queue_pair(const protection_domain& pd, const completion_queue& send_cq, const completion_queue& recv_cq,
             const queue_pair_attr& attr = {})
      : type_(attr.type) {
    const context ctx = pd.device_context();
    device_attributes da = ctx.query_device();
    detail::check_qp_attr(attr, da, ctx.name());
    port_ = attr.port != 0 ? attr.port : ctx.default_port();
    port_attributes pa = ctx.query_port(port_);
    gid_choice g = attr.gid_index ? use_gid_index(ctx, port_, *attr.gid_index) : select_gid(ctx, port_);
    gid_ = g.gid;
    gid_index_ = g.index;
    lid_ = pa.lid;
    active_mtu_ = pa.active_mtu;
    roce_ = pa.is_ethernet();
    psn_ = detail::random_psn();
    remote_access_ = attr.remote_access;
    qkey_ = attr.qkey;
    pkey_index_ = attr.pkey_index;
    max_rd_atomic_dev_ = da.max_qp_init_rd_atom;
    max_dest_rd_atomic_dev_ = da.max_qp_rd_atom;

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
    ibv_qp* qp = create(pd, ia, attr.post);
    int err = qp == nullptr ? (errno ? errno : EINVAL) : 0;
    if (qp == nullptr && !attr.max_inline_data && err == EINVAL) {
      // The default inline size is a wish, not a requirement: retry without it.
      ia.cap.max_inline_data = 0;
      qp = create(pd, ia, attr.post);
      err = qp == nullptr ? (errno ? errno : EINVAL) : 0;
    }
    if (qp == nullptr && attr.post == post_api::extended && err != EINVAL) {
      detail::throw_errno("ibv_create_qp_ex",
                          std::string(to_string(attr.type)) + " QP on " + ctx.name() +
                              " with the extended post API (queue_pair_attr::post = post_api::extended): "
                              "the provider does not offer it for this queue pair; post_api::automatic "
                              "uses ibv_post_send where it is missing",
                          err);
    }
    if (qp == nullptr && err == EINVAL && attr.max_inline_data.value_or(0) > 0) {
      // The device reports no inline limit: find it, so the error can name it.
      if (auto limit = probe_max_inline(pd, ia); limit && *limit < ia.cap.max_inline_data) {
        detail::throw_rdx(errc::limit_exceeded,
                          detail::limit_message("queue_pair on " + ctx.name(), "max_inline_data",
                                                ia.cap.max_inline_data, *limit));
      }
    }
    if (qp == nullptr) {
      char what[200];
      std::snprintf(what, sizeof what,
                    "%s QP on %s (max_send_wr %u, max_recv_wr %u, max_send_sge %u, max_recv_sge %u, "
                    "max_inline_data %u)",
                    std::string(to_string(attr.type)).c_str(), ctx.name().c_str(), attr.max_send_wr,
                    attr.max_recv_wr, attr.max_send_sge, attr.max_recv_sge, ia.cap.max_inline_data);
      detail::throw_errno(attr.post == post_api::extended ? "ibv_create_qp_ex" : "ibv_create_qp", what, err);
    }
    std::shared_ptr<const void> srq;
    if (attr.srq != nullptr) {
      srq = attr.srq->shared_handle();
    }
    h_ = detail::make_shared_verbs(
        qp, &::ibv_destroy_qp, "ibv_destroy_qp",
        {pd.shared_handle(), send_cq.shared_handle(), recv_cq.shared_handle(), srq});
    has_srq_ = attr.srq != nullptr;
    caps_ = ia.cap;  // what the device granted (at least what was asked)
    state_ = qp_state::reset;
  }

  //! The ibv_qp, still owned (nullptr when empty).
  [[nodiscard]] ibv_qp* native_handle() const noexcept { return h_.get(); }
  //! Gives up ownership without destroying (nullptr when empty); the caller calls ibv_destroy_qp
  //! and keeps the protection domain and CQs alive.
  //! @throws rdx::error (errc::not_ready) while another owner shares the queue pair
  [[nodiscard]] ibv_qp* release() {
    ibv_qp* q = detail::release_verbs(h_, "queue_pair");
    qpx_ = nullptr;
    ready_opcodes_ = 0;
    state_ = qp_state::reset;  // as a moved-from one: every post is refused
    return q;
  }
  //! True when it owns a queue pair (not moved from or released).
  explicit operator bool() const noexcept { return h_ != nullptr; }

  //! The queue pair number (24 bits), which the peer connects to.
  [[nodiscard]] std::uint32_t qp_num() const noexcept { return h_->qp_num; }
  //! RC, UC or UD.
  [[nodiscard]] qp_type type() const noexcept { return type_; }
  //! The device port it uses, from 1.
  [[nodiscard]] std::uint8_t port() const noexcept { return port_; }
  //! The GID index chosen at creation (queue_pair_attr::gid_index or select_gid()).
  [[nodiscard]] std::uint8_t gid_index() const noexcept { return gid_index_; }
  //! Its starting packet sequence number (random, 24 bits), which the peer needs.
  [[nodiscard]] std::uint32_t psn() const noexcept { return psn_; }
  //! The Q_Key a UD queue pair accepts (queue_pair_attr::qkey).
  [[nodiscard]] std::uint32_t qkey() const noexcept { return qkey_; }
  //! Sizes the device granted.
  [[nodiscard]] const ibv_qp_cap& caps() const noexcept { return caps_; }
  //! Largest payload posted inline, as the device granted (caps().max_inline_data).
  [[nodiscard]] std::uint32_t max_inline_data() const noexcept { return caps_.max_inline_data; }
  //! The state rdx last moved the QP to (no syscall; see query_state()).
  [[nodiscard]] qp_state state() const noexcept { return state_; }
  //! The state the device reports (a syscall). @throws rdx::error on failure.
  [[nodiscard]] qp_state query_state() const {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (int rc = ::ibv_query_qp(h_.get(), &a, IBV_QP_STATE, &ia); rc != 0) {
      detail::throw_errno("ibv_query_qp", name(), rc);
    }
    return static_cast<qp_state>(a.qp_state);
  }

  //! What the peer needs to connect to this QP.
  [[nodiscard]] endpoint local_endpoint() const noexcept {
    endpoint e;
    e.gid = gid_;
    e.lid = lid_;
    e.qpn = h_->qp_num;
    e.psn = psn_;
    e.mtu = active_mtu_;
    e.port = port_;
    e.gid_index = gid_index_;
    return e;
  }

  // --- state transitions (each throws rdx::error naming the verb, state and QP) ---

  //! RESET -> INIT: port, P_Key index and remote access (RC/UC) or Q_Key (UD).
  void to_init() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = port_;
    a.pkey_index = pkey_index_;
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (type_ == qp_type::ud) {
      a.qkey = qkey_;
      mask |= IBV_QP_QKEY;
    } else {
      a.qp_access_flags = remote_access_flags();
      mask |= IBV_QP_ACCESS_FLAGS;
    }
    modify(a, mask, "INIT");
  }

  //! What the peer may do through this queue pair (RC/UC).
  [[nodiscard]] access remote_access() const noexcept { return remote_access_; }
  //! Changes what the peer may do through this queue pair (RC/UC): kept for
  //! the next transition in RESET, applied at once in INIT or RTS.
  //! @throws rdx::error from ibv_modify_qp, or (errc::not_ready) in another state.
  void set_remote_access(access a) {
    remote_access_ = a & (access::remote_write | access::remote_read | access::remote_atomic);
    if (type_ == qp_type::ud || state_ == qp_state::reset) return;
    if (state_ != qp_state::init && state_ != qp_state::rts) {
      detail::throw_rdx(errc::not_ready,
                        name() + ": remote access can change in RESET, INIT or RTS, the QP is in " +
                            std::string(to_string(state_)));
    }
    ibv_qp_attr at{};
    at.qp_state = static_cast<ibv_qp_state>(state_.get());
    at.qp_access_flags = remote_access_flags();
    modify(at, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS, state_ == qp_state::init ? "INIT" : "RTS");
  }

  //! INIT -> RTR towards remote (RC/UC); for UD remote is unused.
  void to_rtr(const endpoint& remote, const connect_options& opt = {}) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    int mask = IBV_QP_STATE;
    if (type_ != qp_type::ud) {
      detail::check_connect_options(opt);
      detail::check_remote_endpoint(remote, roce_);
      a.path_mtu = std::min({active_mtu_, remote.mtu, opt.max_mtu});
      a.dest_qp_num = remote.qpn;
      a.rq_psn = remote.psn;
      a.ah_attr = address_handle::make_attr(remote, port_, gid_index_, opt.hop_limit);
      a.ah_attr.sl = opt.sl;
      // InfiniBand inside a subnet: the LID is the address; the GRH is for routers.
      if (!roce_ && remote.lid != 0) {
        a.ah_attr.is_global = 0;
      }
      if (a.ah_attr.is_global != 0) {
        a.ah_attr.grh.traffic_class = opt.traffic_class;
      }
      a.qp_access_flags = remote_access_flags();
      mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_ACCESS_FLAGS;
      if (type_ == qp_type::rc) {
        a.max_dest_rd_atomic = detail::clamp_rd_atomic(opt.max_dest_rd_atomic, max_dest_rd_atomic_dev_);
        a.min_rnr_timer = opt.min_rnr_timer;
        mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
    }
    modify(a, mask, "RTR");
  }

  //! RTR -> RTS with this QP's starting PSN and the retry settings (RC).
  void to_rts(const connect_options& opt = {}) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = psn_;
    int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (type_ == qp_type::rc) {
      detail::check_connect_options(opt);
      a.timeout = opt.timeout;
      a.retry_cnt = opt.retry_cnt;
      a.rnr_retry = opt.rnr_retry;
      a.max_rd_atomic = detail::clamp_rd_atomic(opt.max_rd_atomic, max_rd_atomic_dev_);
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    modify(a, mask, "RTS");
  }

  //! Applies attributes a connection manager computed (rdma_cm's
  //! rdma_init_qp_attr: address vector, PSNs, path MTU), adding this queue
  //! pair's remote access where the target state takes it.
  //! @throws rdx::error naming the transition, as the other transitions do.
  void apply(ibv_qp_attr a, int mask, const char* target) {
    if (type_ != qp_type::ud && (a.qp_state == IBV_QPS_INIT || a.qp_state == IBV_QPS_RTR)) {
      a.qp_access_flags = remote_access_flags();
      mask |= IBV_QP_ACCESS_FLAGS;
    }
    if ((mask & IBV_QP_SQ_PSN) != 0) psn_ = a.sq_psn;
    modify(a, mask, target);
  }

  //! Any state -> ERROR: outstanding work requests complete with IBV_WC_WR_FLUSH_ERR.
  void to_error() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    modify(a, IBV_QP_STATE, "ERR");
  }

  //! Any state -> RESET: outstanding work is dropped without completions.
  void to_reset() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    modify(a, IBV_QP_STATE, "RESET");
  }

  //! Connects an RC/UC queue pair to remote in one call: (RESET ->) INIT -> RTR -> RTS.
  //! Settings are checked before anything reaches the device.
  //! @throws rdx::error naming the failing transition ("ibv_modify_qp(RTR) on QP 0x12: ...").
  void connect(const endpoint& remote, const connect_options& opt = {}) {
    if (type_ == qp_type::ud) {
      detail::throw_rdx(errc::invalid_argument, name() + ": connect() is for RC/UC; use activate() for UD");
    }
    detail::check_connect_options(opt);
    detail::check_remote_endpoint(remote, roce_);
    if (state_ != qp_state::reset && state_ != qp_state::init) {
      detail::throw_rdx(errc::not_ready, name() + ": connect() needs RESET or INIT, the QP is in " +
                                             std::string(to_string(state_)));
    }
    if (state_ == qp_state::reset) {
      to_init();
    }
    to_rtr(remote, opt);
    if (type_ == qp_type::rc || type_ == qp_type::uc) {
      to_rts(opt);
    }
  }

  //! Readies a UD queue pair to send and receive: RESET -> INIT -> RTR -> RTS.
  void activate() {
    if (type_ != qp_type::ud) {
      detail::throw_rdx(errc::invalid_argument, name() + ": activate() is for UD; use connect()");
    }
    if (state_ == qp_state::reset) {
      to_init();
    }
    to_rtr(endpoint{});
    to_rts();
  }

  // --- data path: no allocation, no exception, no lock in rdx ---

  //! True when sends go by the extended post API (queue_pair_attr::post):
  //! each request is written into the provider's queue by ibv_wr_* calls,
  //! with no ibv_send_wr for the provider to read and convert.
  [[nodiscard]] bool extended_post() const noexcept { return h_ != nullptr && qpx_ != nullptr; }

  //! Posts one send-queue work request (inline when it fits max_inline_data),
  //! by the extended post API where the queue pair has it.
  //! @return empty, errc::not_ready when the QP is not in RTS, or the errno from
  //! ibv_post_send or ibv_wr_complete (ENOMEM, ENOSPC: send queue full).
  [[nodiscard, gnu::always_inline]] std::error_code post_send(send_wr& w) noexcept {
    if (state_ != qp_state::rts) {
      [[unlikely]] return make_error_code(errc::not_ready);
    }
    prepare(w);
    if (qpx_ != nullptr && extended_carries(w)) [[likely]] {
      ::ibv_wr_start(qpx_);
      put_extended(w);
      return post_result(::ibv_wr_complete(qpx_));
    }
    w.native().next = nullptr;
    ibv_send_wr* bad = nullptr;
    return post_result(::ibv_post_send(h_.get(), &w.native(), &bad));
  }
  //! Posts one send-queue request built in the call (wr::send(...), wr::write(...)).
  [[nodiscard, gnu::always_inline]] std::error_code post_send(send_wr&& w) noexcept { return post_send(w); }

  //! Posts one request held by value (inline when it fits max_inline_data):
  //! by the extended post API straight from f's fields, or by ibv_post_send.
  //! @return as post_send(send_wr&).
  [[nodiscard, gnu::always_inline]] std::error_code post_send(flat_wr& f) noexcept {
    // One test for all three: the extended post API, RTS, and an operation it carries.
    if (ready_carries(f.opcode)) [[likely]] {
      ibv_qp_ex* const q = qpx_;
      // Inline when 1 to max_inline_data bytes, in 32 bits (fits_inline's 64-bit
      // form costs 3 instructions more; it also counts 0 bytes as fitting).
      const bool inl = detail::inline_kind(f.opcode) && f.sge.length - 1U < caps_.max_inline_data;
      ::ibv_wr_start(q);
      put_extended(q, f.wr_id, f.send_flags | (inl ? unsigned{IBV_SEND_INLINE} : 0U), f.opcode, f.rkey,
                   f.remote_addr, f.compare_add, f.swap, f.imm_data, f.sge);
      return post_result(::ibv_wr_complete(q));
    }
    return post_plain(f);
  }

  //! Posts a batch with one call (one doorbell). On failure *bad_index, when
  //! given, is the index of the first request not posted; those before it were.
  //! By the extended post API a refused batch is refused whole (*bad_index 0).
  [[nodiscard]] std::error_code post_send(std::span<send_wr> batch,
                                          std::size_t* bad_index = nullptr) noexcept {
    if (bad_index != nullptr) {
      *bad_index = 0;
    }
    if (state_ != qp_state::rts) {
      [[unlikely]] return make_error_code(errc::not_ready);
    }
    if (batch.empty()) {
      return {};
    }
    bool extended = qpx_ != nullptr;
    for (send_wr& w : batch) {
      prepare(w);
      extended = extended && extended_carries(w);
    }
    if (extended) {
      ::ibv_wr_start(qpx_);
      for (const send_wr& w : batch) put_extended(w);
      return post_result(::ibv_wr_complete(qpx_));  // all or none: *bad_index stays 0
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      batch[i].native().next = i + 1 < batch.size() ? &batch[i + 1].native() : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    std::error_code ec = post_result(::ibv_post_send(h_.get(), &batch[0].native(), &bad));
    if (ec && bad_index != nullptr) {
      *bad_index = index_of(batch, bad);
    }
    return ec;
  }

  //! Posts one receive. @return empty, errc::not_ready in RESET,
  //! errc::invalid_argument on a QP that takes receives from an SRQ, or the errno
  //! from ibv_post_recv (ENOMEM: receive queue full).
  [[nodiscard]] std::error_code post_recv(recv_wr& w) noexcept {
    if (state_ == qp_state::reset || has_srq_) {
      [[unlikely]] return make_error_code(has_srq_ ? errc::invalid_argument : errc::not_ready);
    }
    w.native().next = nullptr;
    ibv_recv_wr* bad = nullptr;
    return post_result(::ibv_post_recv(h_.get(), &w.native(), &bad));
  }
  //! Posts one receive built in the call (wr::recv(...)).
  [[nodiscard]] std::error_code post_recv(recv_wr&& w) noexcept { return post_recv(w); }
  //! Posts receives the caller already linked through their native().next
  //! (the last one's is nullptr), with one call: for requests built once and
  //! posted many times. @param bad set to the first one refused (nullptr on success).
  [[nodiscard]] std::error_code post_recv_linked(recv_wr& first, ibv_recv_wr*& bad) noexcept {
    bad = nullptr;
    if (state_ == qp_state::reset || has_srq_) {
      [[unlikely]] bad = &first.native();
      return make_error_code(has_srq_ ? errc::invalid_argument : errc::not_ready);
    }
    return post_result(::ibv_post_recv(h_.get(), &first.native(), &bad));
  }
  //! Posts a batch of receives with one call.
  [[nodiscard]] std::error_code post_recv(std::span<recv_wr> batch,
                                          std::size_t* bad_index = nullptr) noexcept {
    if (bad_index != nullptr) {
      *bad_index = 0;
    }
    if (state_ == qp_state::reset || has_srq_) {
      [[unlikely]] return make_error_code(has_srq_ ? errc::invalid_argument : errc::not_ready);
    }
    if (batch.empty()) {
      return {};
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      batch[i].native().next = i + 1 < batch.size() ? &batch[i + 1].native() : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    std::error_code ec = post_result(::ibv_post_recv(h_.get(), &batch[0].native(), &bad));
    if (ec && bad_index != nullptr) {
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (&batch[i].native() == bad) {
          *bad_index = i;
        }
      }
    }
    return ec;
  }

  //! "QP 0x12" for messages.
  [[nodiscard]] std::string name() const {
    char b[24];
    std::snprintf(b, sizeof b, "QP 0x%x", h_ ? h_->qp_num : 0u);
    return b;
  }

private:
  // Largest max_inline_data the device accepts with these other sizes (binary
  // search with throwaway QPs), or nullopt when even 0 is refused.
  static std::optional<std::uint32_t> probe_max_inline(const protection_domain& pd,
                                                       const ibv_qp_init_attr& base) {
    auto accepted = [&](std::uint32_t n) {
      ibv_qp_init_attr ia = base;
      ia.cap.max_inline_data = n;
      ibv_qp* q = ::ibv_create_qp(pd.native_handle(), &ia);
      if (q == nullptr) {
        return false;
      }
      if (int rc = ::ibv_destroy_qp(q); rc != 0) {
        detail::report_destroy_failure("ibv_destroy_qp", rc);
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

  // Each IBV_QP_EX_WITH_x flag is bit IBV_WR_x, so extended_ops() is also
  // the set of opcodes the queue pair carries (extended_opcodes_).
  static_assert(IBV_QP_EX_WITH_RDMA_WRITE == 1U << IBV_WR_RDMA_WRITE &&
                IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM == 1U << IBV_WR_RDMA_WRITE_WITH_IMM &&
                IBV_QP_EX_WITH_SEND == 1U << IBV_WR_SEND &&
                IBV_QP_EX_WITH_SEND_WITH_IMM == 1U << IBV_WR_SEND_WITH_IMM &&
                IBV_QP_EX_WITH_RDMA_READ == 1U << IBV_WR_RDMA_READ &&
                IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP == 1U << IBV_WR_ATOMIC_CMP_AND_SWP &&
                IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD == 1U << IBV_WR_ATOMIC_FETCH_AND_ADD);
  // The operations rdx posts by the extended API (UC has no reads or atomics).
  [[nodiscard]] static std::uint64_t extended_ops(qp_type t) noexcept {
    std::uint64_t ops = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                        IBV_QP_EX_WITH_SEND_WITH_IMM;
    if (t == qp_type::rc) {
      ops |=
          IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    }
    return ops;
  }

  // ibv_create_qp_ex with the extended post API when asked for (automatic or
  // extended) on an RC or UC queue pair; sets qpx_. Automatic falls back to
  // ibv_create_qp, so a refusal there is the classic call's own.
  ibv_qp* create(const protection_domain& pd, ibv_qp_init_attr& ia, post_api api) {
    if (api == post_api::extended && type_ == qp_type::ud) {
      errno = EOPNOTSUPP;  // rdx posts UD sends by ibv_post_send
      return nullptr;
    }
    if (api != post_api::classic && type_ != qp_type::ud) {
      ibv_qp_init_attr_ex ix{};
      ix.send_cq = ia.send_cq;
      ix.recv_cq = ia.recv_cq;
      ix.srq = ia.srq;
      ix.cap = ia.cap;
      ix.qp_type = ia.qp_type;
      ix.sq_sig_all = ia.sq_sig_all;
      ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
      ix.pd = pd.native_handle();
      ix.send_ops_flags = extended_ops(type_);
      errno = 0;
      if (ibv_qp* q = ::ibv_create_qp_ex(pd.native_handle()->context, &ix)) {
        if (ibv_qp_ex* x = ::ibv_qp_to_qp_ex(q)) {
          ia.cap = ix.cap;
          qpx_ = x;
          extended_opcodes_ = static_cast<std::uint32_t>(ix.send_ops_flags);  // bit IBV_WR_x (below)
          return q;
        }
        if (int rc = ::ibv_destroy_qp(q); rc != 0) {
          detail::report_destroy_failure("ibv_destroy_qp", rc);
        }
        errno = EOPNOTSUPP;
      }
      if (api == post_api::extended) {
        if (errno == 0) errno = EOPNOTSUPP;
        return nullptr;
      }
    }
    return ::ibv_create_qp(pd.native_handle(), &ia);
  }

  // post_send(flat_wr&) by ibv_post_send: not in RTS, no extended post API,
  // or an operation it does not carry.
  // By value: the caller's request need not be in memory on the usual path.
  std::error_code post_plain(flat_wr f) noexcept {
    if (state_ != qp_state::rts) return make_error_code(errc::not_ready);
    if (detail::inline_kind(f.opcode) && fits_inline(f.sge.length)) {
      f.send_flags |= IBV_SEND_INLINE;
    }
    send_wr w = send_wr::from(f);
    ibv_send_wr* bad = nullptr;
    return post_result(::ibv_post_send(h_.get(), &w.native(), &bad));
  }

  // What the extended post API carries here: the operations the queue pair
  // was created with (extended_ops()) with at most one SGE. Binds,
  // invalidations and gather lists go by ibv_post_send: Soft-RoCE before
  // rdma-core 64 (Debian 12 ships 44) sets a list's length to its first
  // entry's times the count in ibv_wr_set_sge_list, which verbs_datapath's
  // scatter-gather test caught.
  [[nodiscard, gnu::always_inline]] bool extended_carries(ibv_wr_opcode op) const noexcept {
    return has_opcode(extended_opcodes_, op);
  }
  // extended_carries(op), and the queue pair is in RTS (ready_opcodes_).
  [[nodiscard, gnu::always_inline]] bool ready_carries(ibv_wr_opcode op) const noexcept {
    return has_opcode(ready_opcodes_, op);
  }
  // Bit op of a set of opcodes (bit IBV_WR_x: opcode x).
  [[nodiscard, gnu::always_inline]] static bool has_opcode(std::uint32_t set, ibv_wr_opcode op) noexcept {
    return static_cast<unsigned>(op) < 32 && ((set >> static_cast<unsigned>(op)) & 1U) != 0;
  }
  [[nodiscard, gnu::always_inline]] bool extended_carries(const send_wr& w) const noexcept {
    return w.native().num_sge <= 1 && extended_carries(w.opcode());
  }

  // Writes a request into the provider's send queue between ibv_wr_start
  // and ibv_wr_complete: its opcode's call, then its data (sge.length 0: a
  // zero-length request). The flags go as they are (IBV_SEND_INLINE
  // included: some providers read it there). Everything by value, so a
  // request built at the call site never needs to be in memory.
  [[gnu::always_inline]] static void put_extended(ibv_qp_ex* const q, std::uint64_t wr_id, unsigned flags,
                                                  ibv_wr_opcode op, std::uint32_t rkey, std::uint64_t raddr,
                                                  std::uint64_t compare_add, std::uint64_t swap, __be32 imm,
                                                  ibv_sge sge) noexcept {
    q->wr_id = wr_id;
    q->wr_flags = flags;
    switch (op) {
      case IBV_WR_RDMA_WRITE: ::ibv_wr_rdma_write(q, rkey, raddr); break;
      case IBV_WR_RDMA_WRITE_WITH_IMM: ::ibv_wr_rdma_write_imm(q, rkey, raddr, imm); break;
      case IBV_WR_SEND: ::ibv_wr_send(q); break;
      case IBV_WR_SEND_WITH_IMM: ::ibv_wr_send_imm(q, imm); break;
      case IBV_WR_RDMA_READ: ::ibv_wr_rdma_read(q, rkey, raddr); break;
      case IBV_WR_ATOMIC_CMP_AND_SWP: ::ibv_wr_atomic_cmp_swp(q, rkey, raddr, compare_add, swap); break;
      case IBV_WR_ATOMIC_FETCH_AND_ADD: ::ibv_wr_atomic_fetch_add(q, rkey, raddr, compare_add); break;
      default: break;  // extended_carries() sent it to ibv_post_send
    }
    if (sge.length == 0) {
      static const ibv_sge none{};
      ::ibv_wr_set_sge_list(q, 0, &none);
    } else if ((flags & IBV_SEND_INLINE) != 0) {
      ::ibv_wr_set_inline_data(q, reinterpret_cast<void*>(static_cast<std::uintptr_t>(sge.addr)), sge.length);
    } else {
      ::ibv_wr_set_sge(q, sge.lkey, sge.addr, sge.length);
    }
  }
  // A request the builders made (one SGE or none; extended_carries()).
  [[gnu::always_inline]] void put_extended(const send_wr& w) const noexcept {
    const ibv_send_wr& n = w.native();
    const ibv_sge sge = n.num_sge == 1 ? n.sg_list[0] : ibv_sge{};
    if (n.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || n.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      put_extended(qpx_, n.wr_id, n.send_flags, n.opcode, n.wr.atomic.rkey, n.wr.atomic.remote_addr,
                   n.wr.atomic.compare_add, n.wr.atomic.swap, n.imm_data, sge);
    } else {
      put_extended(qpx_, n.wr_id, n.send_flags, n.opcode, n.wr.rdma.rkey, n.wr.rdma.remote_addr, 0, 0,
                   n.imm_data, sge);
    }
  }

  // A payload of length bytes fits the queue pair's inline limit.
  [[nodiscard, gnu::always_inline]] bool fits_inline(std::uint64_t length) const noexcept {
    return caps_.max_inline_data != 0 && length <= caps_.max_inline_data;
  }
  void prepare(send_wr& w) const noexcept {
    if (w.inline_candidate() && fits_inline(w.total_length())) {
      w.native().send_flags |= IBV_SEND_INLINE;
    }
  }
  [[gnu::always_inline]] static std::error_code post_result(int rc) noexcept {
    if (rc == 0) [[likely]] {
      return detail::no_error();
    }
    return post_error(rc);
  }
  [[gnu::cold, gnu::noinline]] static std::error_code post_error(int rc) noexcept {
    int e = rc > 0 ? rc : (errno != 0 ? errno : EINVAL);
    return {e, std::generic_category()};
  }
  static std::size_t index_of(std::span<send_wr> batch, const ibv_send_wr* bad) noexcept {
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (&batch[i].native() == bad) {
        return i;
      }
    }
    return 0;
  }
  // The likely causes of a failed transition, and the doctor's checks for them.
  static std::string modify_hint(std::string_view target) {
    if (target == "RTR") {
      return "; at RTR the usual causes are a GID index that is not a RoCE v2 entry of this port or "
             "not on the peer's subnet, a path MTU above the port's active MTU, or a peer's QP number, "
             "LID or GID from another port" +
             detail::doctor_hint("gid,mtu") + ", and `rdx-doctor --peer HOST` compares both sides";
    }
    if (target == "RTS") {
      return "; at RTS the usual cause is a timeout, retry count or rnr retry outside what the device "
             "takes" +
             detail::doctor_hint("ports");
    }
    return detail::doctor_hint("ports");
  }
  void modify(ibv_qp_attr& a, int mask, const char* target) {
    if (int rc = ::ibv_modify_qp(h_.get(), &a, mask); rc != 0) {
      detail::throw_errno(std::string("ibv_modify_qp(") + target + ")",
                          name() + " in " + std::string(to_string(state_)) + modify_hint(target), rc);
    }
    state_ = static_cast<qp_state>(a.qp_state);
    ready_opcodes_ = state_ == qp_state::rts && qpx_ != nullptr ? extended_opcodes_ : 0U;
  }

  std::shared_ptr<ibv_qp> h_;
  // The extended post API, when created with it (owned by h_; a move takes it along).
  detail::reset_on_move<ibv_qp_ex*> qpx_;
  std::uint32_t extended_opcodes_ = 0;  // bit IBV_WR_x: qpx_ carries opcode x
  // extended_opcodes_ while in RTS, else 0: post_send(flat_wr&)'s one test.
  detail::reset_on_move<std::uint32_t> ready_opcodes_;
  ibv_qp_cap caps_{};
  qp_type type_ = qp_type::rc;
  // A move leaves the moved-from queue pair in RESET (qp_state{}), so it refuses every post.
  detail::reset_on_move<qp_state> state_{qp_state::reset};
  ibv_gid gid_{};
  std::uint32_t psn_ = 0;
  std::uint32_t qkey_ = default_qkey;
  std::uint16_t lid_ = 0;
  std::uint16_t pkey_index_ = 0;
  ibv_mtu active_mtu_ = IBV_MTU_1024;
  [[nodiscard]] unsigned remote_access_flags() const noexcept {
    return static_cast<unsigned>(
        to_ibv(remote_access_ & (access::remote_write | access::remote_read | access::remote_atomic)));
  }
  access remote_access_ = access::none;
  int max_rd_atomic_dev_ = 1;
  int max_dest_rd_atomic_dev_ = 1;
  std::uint8_t port_ = 1;
  std::uint8_t gid_index_ = 0;
  bool roce_ = false;
  bool has_srq_ = false;
};

}  // namespace rdx
