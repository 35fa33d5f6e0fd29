// rdx: queue pairs (RC, UC, UD) with explicit state transitions, one-call
// connect, device-checked limits and batched posting. The class is here; how
// its ibv_qp is created, what each transition hands ibv_modify_qp and the
// extended post API's ibv_wr_* calls are in rdx/verbs/detail/.
#pragma once

#include <rdx/detail/handle.hpp>
#include <rdx/detail/random.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/detail/extended_post.hpp>
#include <rdx/verbs/detail/queue_pair_create.hpp>
#include <rdx/verbs/detail/queue_pair_transition.hpp>
#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/gid.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>
#include <rdx/verbs/shared_receive_queue.hpp>
#include <rdx/verbs/work_request.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstdio>
#include <memory>
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
             const queue_pair_attr& attr = {}) {
    const context ctx = pd.device_context();
    device_attributes da = ctx.query_device();
    detail::check_qp_attr(attr, da, ctx.name());
    settings_ = detail::qp_settings::make(ctx, da, attr);
    psn_ = detail::random_psn();
    remote_access_ = attr.remote_access;
    detail::created_qp c = detail::create_qp(pd, send_cq, recv_cq, attr, ctx.name());
    std::shared_ptr<const void> srq;
    if (attr.srq != nullptr) {
      srq = attr.srq->shared_handle();
    }
    h_ = detail::make_shared_verbs(
        c.qp, &::ibv_destroy_qp, "ibv_destroy_qp",
        {pd.shared_handle(), send_cq.shared_handle(), recv_cq.shared_handle(), srq});
    qpx_ = c.qpx;
    extended_opcodes_ = c.extended_opcodes;
    has_srq_ = attr.srq != nullptr;
    caps_ = c.caps;
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
  [[nodiscard]] qp_type type() const noexcept { return settings_.type; }
  //! The device port it uses, from 1.
  [[nodiscard]] std::uint8_t port() const noexcept { return settings_.port; }
  //! The GID index chosen at creation (queue_pair_attr::gid_index or select_gid()).
  [[nodiscard]] std::uint8_t gid_index() const noexcept { return settings_.gid_index; }
  //! Its starting packet sequence number (random, 24 bits), which the peer needs.
  [[nodiscard]] std::uint32_t psn() const noexcept { return psn_; }
  //! The Q_Key a UD queue pair accepts (queue_pair_attr::qkey).
  [[nodiscard]] std::uint32_t qkey() const noexcept { return settings_.qkey; }
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
  [[nodiscard]] endpoint local_endpoint() const noexcept { return settings_.local(h_->qp_num, psn_); }

  // --- state transitions (each throws rdx::error naming the verb, state and QP) ---

  //! RESET -> INIT: port, P_Key index and remote access (RC/UC) or Q_Key (UD).
  void to_init() { modify(settings_.init_change(remote_access_flags()), "INIT"); }

  //! What the peer may do through this queue pair (RC/UC).
  [[nodiscard]] access remote_access() const noexcept { return remote_access_; }
  //! Changes what the peer may do through this queue pair (RC/UC): kept for
  //! the next transition in RESET, applied at once in INIT or RTS.
  //! @throws rdx::error from ibv_modify_qp, or (errc::not_ready) in another state.
  void set_remote_access(access a) {
    remote_access_ = a & (access::remote_write | access::remote_read | access::remote_atomic);
    if (settings_.type == qp_type::ud || state_ == qp_state::reset) {
      return;
    }
    if (state_ != qp_state::init && state_ != qp_state::rts) {
      detail::throw_rdx(errc::not_ready,
                        name() + ": remote access can change in RESET, INIT or RTS, the QP is in " +
                            std::string(to_string(state_)));
    }
    detail::qp_change c = state_change(static_cast<ibv_qp_state>(state_.get()));
    c.attr.qp_access_flags = remote_access_flags();
    c.mask |= IBV_QP_ACCESS_FLAGS;
    modify(c, state_ == qp_state::init ? "INIT" : "RTS");
  }

  //! INIT -> RTR towards remote (RC/UC); for UD remote is unused.
  void to_rtr(const endpoint& remote, const connect_options& opt = {}) {
    modify(settings_.rtr_change(remote, opt, remote_access_flags()), "RTR");
  }

  //! RTR -> RTS with this QP's starting PSN and the retry settings (RC).
  void to_rts(const connect_options& opt = {}) { modify(settings_.rts_change(psn_, opt), "RTS"); }

  //! Applies attributes a connection manager computed (rdma_cm's
  //! rdma_init_qp_attr: address vector, PSNs, path MTU), adding this queue
  //! pair's remote access where the target state takes it.
  //! @throws rdx::error naming the transition, as the other transitions do.
  void apply(ibv_qp_attr a, int mask, const char* target) {
    if (settings_.type != qp_type::ud && (a.qp_state == IBV_QPS_INIT || a.qp_state == IBV_QPS_RTR)) {
      a.qp_access_flags = remote_access_flags();
      mask |= IBV_QP_ACCESS_FLAGS;
    }
    if ((mask & IBV_QP_SQ_PSN) != 0) {
      psn_ = a.sq_psn;
    }
    modify({a, mask}, target);
  }

  //! Any state -> ERROR: outstanding work requests complete with IBV_WC_WR_FLUSH_ERR.
  void to_error() { modify(state_change(IBV_QPS_ERR), "ERR"); }

  //! Any state -> RESET: outstanding work is dropped without completions.
  void to_reset() { modify(state_change(IBV_QPS_RESET), "RESET"); }

  //! Connects an RC/UC queue pair to remote in one call: (RESET ->) INIT -> RTR -> RTS.
  //! Settings are checked before anything reaches the device.
  //! @throws rdx::error naming the failing transition ("ibv_modify_qp(RTR) on QP 0x12: ...").
  void connect(const endpoint& remote, const connect_options& opt = {}) {
    if (settings_.type == qp_type::ud) {
      detail::throw_rdx(errc::invalid_argument, name() + ": connect() is for RC/UC; use activate() for UD");
    }
    detail::check_connect_options(opt);
    detail::check_remote_endpoint(remote, settings_.roce);
    if (state_ != qp_state::reset && state_ != qp_state::init) {
      detail::throw_rdx(errc::not_ready, name() + ": connect() needs RESET or INIT, the QP is in " +
                                             std::string(to_string(state_)));
    }
    if (state_ == qp_state::reset) {
      to_init();
    }
    to_rtr(remote, opt);
    if (settings_.type == qp_type::rc || settings_.type == qp_type::uc) {
      to_rts(opt);
    }
  }

  //! Readies a UD queue pair to send and receive: RESET -> INIT -> RTR -> RTS.
  void activate() {
    if (settings_.type != qp_type::ud) {
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
    if (qpx_ != nullptr && detail::extended_carries(extended_opcodes_, w)) [[likely]] {
      ::ibv_wr_start(qpx_);
      detail::put_extended(qpx_, w);
      return detail::post_status(::ibv_wr_complete(qpx_));
    }
    w.native().next = nullptr;
    ibv_send_wr* bad = nullptr;
    return detail::post_status(::ibv_post_send(h_.get(), &w.native(), &bad));
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
      detail::put_extended(q, f.wr_id, f.send_flags | (inl ? unsigned{IBV_SEND_INLINE} : 0U), f.opcode,
                           f.rkey, f.remote_addr, f.compare_add, f.swap, f.imm_data, f.sge);
      return detail::post_status(::ibv_wr_complete(q));
    }
    return post_plain(f);
  }

  //! Posts a batch with one call (one doorbell).
  //! @param posted set to how many requests were posted: all on success; on
  //! failure those before the first refused (by the extended post API a
  //! refused batch is refused whole: 0).
  //! @return as post_send(send_wr&).
  [[nodiscard]] std::error_code post_send(std::span<send_wr> batch, std::size_t& posted) noexcept {
    posted = 0;
    if (state_ != qp_state::rts) {
      [[unlikely]] return make_error_code(errc::not_ready);
    }
    if (batch.empty()) {
      return detail::no_error();
    }
    bool extended = qpx_ != nullptr;
    for (send_wr& w : batch) {
      prepare(w);
      extended = extended && detail::extended_carries(extended_opcodes_, w);
    }
    if (extended) {
      ::ibv_wr_start(qpx_);
      for (const send_wr& w : batch) {
        detail::put_extended(qpx_, w);
      }
      std::error_code ec = detail::post_status(::ibv_wr_complete(qpx_));
      posted = ec ? 0 : batch.size();  // all or none
      return ec;
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      batch[i].native().next = i + 1 < batch.size() ? &batch[i + 1].native() : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    std::error_code ec = detail::post_status(::ibv_post_send(h_.get(), &batch[0].native(), &bad));
    posted = ec ? index_of(batch, bad) : batch.size();
    return ec;
  }
  //! Posts a batch with one call, when how many were posted does not matter.
  [[nodiscard]] std::error_code post_send(std::span<send_wr> batch) noexcept {
    std::size_t posted = 0;
    return post_send(batch, posted);
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
    return detail::post_status(::ibv_post_recv(h_.get(), &w.native(), &bad));
  }
  //! Posts one receive built in the call (wr::recv(...)).
  [[nodiscard]] std::error_code post_recv(recv_wr&& w) noexcept { return post_recv(w); }
  //! Posts count receives the caller already linked through their
  //! native().next, from first (the last one's is nullptr), with one call:
  //! for requests built once and posted many times.
  //! @param posted set to how many were posted: count on success (the chain is
  //! not walked); on failure those before the refused one, counted as count
  //! less the refused one and those after it (0 when the refusal names no
  //! request, or more than count remain from it).
  //! @return as post_recv(recv_wr&).
  [[nodiscard, gnu::always_inline]] std::error_code post_recv_linked(recv_wr& first, std::size_t count,
                                                                     std::size_t& posted) noexcept {
    if (state_ == qp_state::reset || has_srq_) {
      [[unlikely]] posted = 0;
      return make_error_code(has_srq_ ? errc::invalid_argument : errc::not_ready);
    }
    ibv_recv_wr* bad = nullptr;
    const int rc = ::ibv_post_recv(h_.get(), &first.native(), &bad);
    if (rc == 0) [[likely]] {
      posted = count;
      return detail::no_error();
    }
    posted = linked_before(count, bad);
    return detail::post_status(rc);
  }
  //! Posts a batch of receives with one call.
  //! @param posted set to how many were posted: all on success, on failure
  //! those before the first refused.
  //! @return as post_recv(recv_wr&).
  [[nodiscard]] std::error_code post_recv(std::span<recv_wr> batch, std::size_t& posted) noexcept {
    posted = 0;
    if (state_ == qp_state::reset || has_srq_) {
      [[unlikely]] return make_error_code(has_srq_ ? errc::invalid_argument : errc::not_ready);
    }
    if (batch.empty()) {
      return detail::no_error();
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      batch[i].native().next = i + 1 < batch.size() ? &batch[i + 1].native() : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    std::error_code ec = detail::post_status(::ibv_post_recv(h_.get(), &batch[0].native(), &bad));
    posted = ec ? index_of(batch, bad) : batch.size();
    return ec;
  }
  //! Posts a batch of receives with one call, when how many were posted does not matter.
  [[nodiscard]] std::error_code post_recv(std::span<recv_wr> batch) noexcept {
    std::size_t posted = 0;
    return post_recv(batch, posted);
  }

  //! "QP 0x12" for messages.
  [[nodiscard]] std::string name() const {
    char b[24];
    std::snprintf(b, sizeof b, "QP 0x%x", h_ ? h_->qp_num : 0u);
    return b;
  }

private:
  // post_send(flat_wr&) by ibv_post_send: not in RTS, no extended post API,
  // or an operation it does not carry.
  // By value: the caller's request need not be in memory on the usual path.
  std::error_code post_plain(flat_wr f) noexcept {
    if (state_ != qp_state::rts) {
      return make_error_code(errc::not_ready);
    }
    if (detail::inline_kind(f.opcode) && fits_inline(f.sge.length)) {
      f.send_flags |= IBV_SEND_INLINE;
    }
    send_wr w = send_wr::from(f);
    ibv_send_wr* bad = nullptr;
    return detail::post_status(::ibv_post_send(h_.get(), &w.native(), &bad));
  }

  // The queue pair is in RTS and its extended post API carries op (ready_opcodes_).
  [[nodiscard, gnu::always_inline]] bool ready_carries(ibv_wr_opcode op) const noexcept {
    return detail::has_opcode(ready_opcodes_, op);
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
  // The index of bad, the request the provider refused, in batch (0 when it is none of them).
  template <class Wr, class Native>
  static std::size_t index_of(std::span<Wr> batch, const Native* bad) noexcept {
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (&batch[i].native() == bad) {
        return i;
      }
    }
    return 0;
  }
  // Of a chain of count receives, those before bad, the one the provider
  // refused: count less bad and those linked after it. Counted from bad, so
  // the chain's head need not survive the post; 0 when bad is nullptr or
  // more than count receives follow from it (it is none of the chain's).
  [[gnu::cold]] static std::size_t linked_before(std::size_t count, const ibv_recv_wr* bad) noexcept {
    std::size_t from_bad = 0;
    for (const ibv_recv_wr* w = bad; w != nullptr && from_bad <= count; w = w->next) {
      ++from_bad;
    }
    return from_bad != 0 && from_bad <= count ? count - from_bad : 0;
  }
  // A change of state alone (ERR, RESET; the current state, to change access).
  [[nodiscard]] static detail::qp_change state_change(ibv_qp_state s) noexcept {
    detail::qp_change c;
    c.attr.qp_state = s;
    c.mask = IBV_QP_STATE;
    return c;
  }
  void modify(detail::qp_change c, const char* target) {
    if (int rc = ::ibv_modify_qp(h_.get(), &c.attr, c.mask); rc != 0) {
      detail::throw_errno(std::string("ibv_modify_qp(") + target + ")",
                          name() + " in " + std::string(to_string(state_)) + detail::modify_hint(target), rc);
    }
    state_ = static_cast<qp_state>(c.attr.qp_state);
    ready_opcodes_ = state_ == qp_state::rts && qpx_ != nullptr ? extended_opcodes_ : 0U;
  }
  [[nodiscard]] unsigned remote_access_flags() const noexcept {
    return static_cast<unsigned>(
        to_ibv(remote_access_ & (access::remote_write | access::remote_read | access::remote_atomic)));
  }

  std::shared_ptr<ibv_qp> h_;
  // The extended post API, when created with it (owned by h_; a move takes it along).
  detail::reset_on_move<ibv_qp_ex*> qpx_;
  std::uint32_t extended_opcodes_ = 0;  // bit IBV_WR_x: qpx_ carries opcode x
  // extended_opcodes_ while in RTS, else 0: post_send(flat_wr&)'s one test.
  detail::reset_on_move<std::uint32_t> ready_opcodes_;
  ibv_qp_cap caps_{};
  // A move leaves the moved-from queue pair in RESET (qp_state{}), so it refuses every post.
  detail::reset_on_move<qp_state> state_{qp_state::reset};
  detail::qp_settings settings_;  // transport, port, address and device limits, from creation
  std::uint32_t psn_ = 0;
  access remote_access_ = access::none;
  bool has_srq_ = false;
};

}  // namespace rdx
