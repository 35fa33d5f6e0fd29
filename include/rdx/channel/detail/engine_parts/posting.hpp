// rdx::detail: how a connection posts operations. An operation that finds
// everything it needs (send-queue room, a flow-control credit, a staging
// buffer, an atomic result slot) is posted at once; otherwise it is deferred,
// in order, and posted by a later progress() when the room or the credit
// comes, so nothing spins and a coroutine simply stays suspended. Once one
// operation is deferred, later ones queue behind it: operations reach the
// NIC in the order they were started. A part of detail/engine_all.hpp (include that).
#pragma once

#include <rdx/channel/detail/engine.hpp>

namespace rdx::detail {

inline void engine::fail_now(operation& op, std::error_code ec) noexcept {
  op.ec_ = ec;
  op.pending_ = 0;
  op.done_ = true;
}

inline bool engine::usable(operation& op) const noexcept {
  if (failed_) {
    fail_now(op, make_error_code(closing_ ? errc::operation_aborted : errc::operation_failed));
    return false;
  }
  if (!connected_) {
    fail_now(op, make_error_code(errc::not_ready));
    return false;
  }
  return true;
}

inline void engine::defer(operation& op) noexcept {
  deferred_.defer(op);
  if (worker_ != nullptr) {
    worker_->mark_pumping(*this);
  }
  // Room comes back with completions: the last posted request must make one.
  cover_all();
}

// Posts op now, or defers it behind those already waiting (NIC order is
// start order).
inline void engine::submit(operation& op) noexcept {
  if (!deferred_.empty() || post_some(op) == post_result::blocked) {
    defer(op);
  }
}

// A staging buffer for a send. When all are in flight, the oldest come back
// with the NIC's acknowledgements (never with the peer application's
// progress), so this waits for the NIC, bounded by the retry budget; when
// deferred sends hold them all, there is nothing to wait for.
inline bool engine::take_staging(std::uint32_t& slot) noexcept {
  if (slots_.staging_empty() && sqs_[0].outstanding() != 0) {
    flush_held();
    const auto deadline = std::chrono::steady_clock::now() + detection_bound();
    (void)sqs_[0].cover();
    for (unsigned spins = 0; slots_.staging_empty() && !failed_ && sqs_[0].outstanding() != 0; ++spins) {
      poll_once();
      if (spins % 64 == 63 && std::chrono::steady_clock::now() >= deadline) {
        break;
      }
    }
  }
  if (slots_.staging_empty()) {
    return false;
  }
  slot = slots_.take_staging();
  return true;
}

// A write or read made with its parameters (start_access::make).
// open_ answers unsealed_refused() and usable() in one test; when it is
// false they run in turn and say why.
inline void engine::start_rdma(operation& op) noexcept {
  thread_check::scope guard(*thread_, "starting a window operation");
  if (!open_ && (unsealed_refused(op) || !usable(op))) [[unlikely]] {
    return;
  }
  post_or_defer_rdma(op);
}

inline void engine::start_sealed_read(operation& op) noexcept {
  thread_check::scope guard(*thread_, "starting a sealed window read");
  if (usable(op)) {
    post_or_defer_rdma(op);
  }
}

// A usable connection's write or read (start_rdma, start_sealed_read).
inline void engine::post_or_defer_rdma(operation& op) noexcept {
  if (op.p_.length == 0) {
    return fail_now(op, make_error_code(errc::invalid_argument));
  }
  if (!deferred_.empty() || post_rdma(op) == post_result::blocked) {
    defer(op);  // submit(), without the switch
  }
}

// A fetch_add or compare_swap made with its parameters (start_access::make).
inline void engine::start_atomic(operation& op) noexcept {
  thread_check::scope guard(*thread_, "starting an atomic");
  if (!open_ && (unsealed_refused(op) || !usable(op))) [[unlikely]] {
    return;
  }
  if (!deferred_.empty() || post_atomic(op) == post_result::blocked) {
    defer(op);  // submit(), without the switch
  }
}

// A fetch_add or compare_swap: one request on the first queue pair, its result
// into an atomic slot.
engine::post_result engine::post_atomic(operation& op) noexcept {
  op_params& p = op.p_;
  send_queue& q0 = sqs_[0];
  if (slots_.atomics_empty() || !q0.has_room()) {
    return post_result::blocked;
  }
  const std::uint32_t slot = slots_.take_atomic();
  flat_wr w{
      .sge = slots_.atomic_sge(slot),
      .remote_addr = p.raddr,
      .compare_add = p.operand,
      .swap = p.swap_value,
      .rkey = p.rkey,
      .opcode = op.kind_ == op_kind::compare_swap ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD};
  p.seq = q0.next_seq();
  if (std::error_code ec = q0.post(w, &op, rec_atomic, slot)) [[unlikely]] {
    slots_.give_atomic(slot);
    return refused(op, ec);
  }
  op.pending_ = 1;
  return post_result::all;
}

// A send of bytes may start: the connection is usable and the size is one
// message's (else op ends now with the reason).
inline bool engine::send_admitted(operation& op, std::size_t bytes) noexcept {
  op.kind_ = op_kind::send;
  if (!usable(op)) {
    return false;
  }
  if (bytes == 0) {
    fail_now(op, make_error_code(errc::invalid_argument));
    return false;
  }
  if (bytes > payload_size()) {
    fail_now(op, make_error_code(errc::limit_exceeded));
    return false;
  }
  return true;
}

// One-sided work and sends from registered memory bypass the seal of an
// encrypted connection: refused, rather than sent in the clear.
inline bool engine::unsealed_refused(operation& op) const noexcept {
  if (attr_.encrypt) {
    fail_now(op, make_error_code(errc::unsupported));
    return true;
  }
  return false;
}

inline void engine::start_send(operation& op, const void* data, std::size_t bytes) noexcept {
  thread_check::scope guard(*thread_, "sending");
  if (!send_admitted(op, bytes)) {
    return;
  }
  op.p_.length = bytes;  // the rest as made (start_access::make): one store, not the whole
  send_queue& q = sqs_[0];
  const bool now = deferred_.empty() && ring_.credits() > 0 && q.has_room();
  if (now && bytes <= q.qp().max_inline_data() && !q.held() && !attr_.encrypt) {
    // Inline: the payload is copied into the work request at post time
    // (not in a batch, which posts later: the payload goes to staging).
    flat_wr w{.sge = {reinterpret_cast<std::uint64_t>(data), static_cast<std::uint32_t>(bytes), 0},
              .imm_data = htonl(ring_.piggyback()),
              .opcode = IBV_WR_SEND_WITH_IMM};
    op.p_.seq = q.next_seq();
    if (std::error_code ec = q.post(w, &op, rec_op)) {
      return fail_now(op, ec);
    }
    ring_.count_sent();
    op.pending_ = 1;
    return;
  }
  // Otherwise the payload goes to a staging buffer now, so the caller's
  // memory is free once send() returns, posted now or later.
  std::uint32_t slot = 0;
  if (!take_staging(slot)) {
    return fail_now(op, make_error_code(failed_ ? errc::operation_failed : errc::limit_exceeded));
  }
  if (attr_.encrypt) {
    // Sealed in place when it is posted (post_some), so sequence numbers
    // follow the order on the wire and a send withdrawn before it left
    // takes none.
    std::memcpy(slots_.staging(slot) + sealed_payload_offset, data, bytes);
    op.p_.length = bytes + sealed_message_overhead;
  } else {
    std::memcpy(slots_.staging(slot), data, bytes);
  }
  op.p_.slot = slot;
  if (!now || post_some(op) == post_result::blocked) {
    defer(op);
  }
}

// A send straight from registered memory: no staging copy; the memory is
// the NIC's until the operation ends (as a window write's source is).
inline void engine::start_send_registered(operation& op, std::uint64_t laddr, std::uint32_t lkey,
                                          std::size_t bytes) noexcept {
  thread_check::scope guard(*thread_, "sending");
  if (!send_admitted(op, bytes) || unsealed_refused(op)) {
    return;
  }
  op.p_.laddr = laddr;  // the rest as made (start_access::make)
  op.p_.length = bytes;
  op.p_.lkey = lkey;
  submit(op);
}

inline void engine::start_notify(operation& op, std::uint64_t laddr, std::uint32_t lkey, std::uint64_t raddr,
                                 std::uint32_t rkey, std::uint32_t bytes, std::uint32_t tag) noexcept {
  thread_check::scope guard(*thread_, "notifying");
  op.kind_ = op_kind::notify;
  if (unsealed_refused(op) || !usable(op)) {
    return;
  }
  op.p_ = op_params{.laddr = laddr, .raddr = raddr, .length = bytes, .lkey = lkey, .rkey = rkey, .tag = tag};
  submit(op);
}

inline void engine::start_sealed_notify(operation& op, std::uint64_t laddr, std::uint32_t lkey,
                                        std::uint64_t raddr, std::uint32_t rkey, std::uint32_t bytes,
                                        std::uint32_t tag) noexcept {
  thread_check::scope guard(*thread_, "notifying");
  op.kind_ = op_kind::notify;
  if (!usable(op)) {
    return;
  }
  op.p_ = op_params{.laddr = laddr, .raddr = raddr, .length = bytes, .lkey = lkey, .rkey = rkey, .tag = tag};
  submit(op);
}

inline void engine::start_receive(operation& op, void* dst, std::uint32_t capacity, std::uint32_t elem_size,
                                  bool exact) noexcept {
  thread_check::scope guard(*thread_, "receiving");
  op.kind_ = op_kind::receive;
  op.dst_ = static_cast<std::byte*>(dst);
  op.dst_capacity_ = capacity;
  op.elem_size_ = elem_size == 0 ? 1 : elem_size;
  op.exact_ = exact;
  if (closing_) {
    return fail_now(op, make_error_code(errc::operation_aborted));
  }
  if (handler_.call != nullptr) {
    return fail_now(op, make_error_code(errc::handler_set));
  }
  receives_.push(op);
  deliver_if_due();
}

inline void engine::start_receive_view(operation& op, std::uint32_t elem_size) noexcept {
  thread_check::scope guard(*thread_, "receiving");
  op.kind_ = op_kind::receive_view;
  op.elem_size_ = elem_size == 0 ? 1 : elem_size;
  if (closing_) {
    return fail_now(op, make_error_code(errc::operation_aborted));
  }
  if (handler_.call != nullptr) {
    return fail_now(op, make_error_code(errc::handler_set));
  }
  receives_.push(op);
  deliver_if_due();
}

inline void engine::release_view(operation& op) noexcept {
  thread_check::scope guard(*thread_, "releasing a message view");
  const std::uint32_t i = std::exchange(op.p_.slot, no_slot);
  op.dst_ = nullptr;
  ring_.lend(i, nullptr);
  consume(i);  // due at once: a view held it (message_ring::queue_taken)
  if (polling_ == 0 && ring_.queued() != 0) {
    repost_consumed();
  }
}

inline void engine::start_notification(operation& op) noexcept {
  thread_check::scope guard(*thread_, "waiting for a notification");
  op.kind_ = op_kind::notification;
  if (closing_) {
    return fail_now(op, make_error_code(errc::operation_aborted));
  }
  notifications_.push(op);
  deliver_if_due();
}

// Posts what it can of op. all: everything posted (or it failed at once);
// blocked: it waits for room, a credit or a slot.
inline engine::post_result engine::post_some(operation& op) noexcept {
  op_params& p = op.p_;
  send_queue& q0 = sqs_[0];
  std::error_code ec;
  switch (op.kind_) {
    case op_kind::write:
    case op_kind::read: return post_rdma(op);
    case op_kind::fetch_add:
    case op_kind::compare_swap: return post_atomic(op);
    case op_kind::send: {
      if (ring_.credits() == 0 || !q0.has_room()) {
        return post_result::blocked;
      }
      // From a staging slot, or straight from the caller's registered memory.
      const bool staged = p.slot != no_slot;
      if (seal_ != nullptr && staged) {
        std::byte* m = slots_.staging(p.slot);
        const std::size_t plain = p.length - sealed_message_overhead;
        if ((ec = seal_->seal({m + sealed_payload_offset, plain}, m))) {
          break;
        }
      }
      const ibv_sge sge = staged ? slots_.staging_sge(p.slot, static_cast<std::uint32_t>(p.length))
                                 : ibv_sge{p.laddr, static_cast<std::uint32_t>(p.length), p.lkey};
      p.seq = q0.next_seq();
      flat_wr w{.sge = sge, .imm_data = htonl(ring_.piggyback()), .opcode = IBV_WR_SEND_WITH_IMM};
      if ((ec = q0.post(w, &op, staged ? rec_staged : rec_op, staged ? p.slot : 0))) {
        break;
      }
      p.slot = no_slot;  // the record holds it now
      ring_.count_sent();
      op.pending_ = 1;
      break;
    }
    case op_kind::notify: {
      if (ring_.credits() == 0 || !q0.has_room()) {
        return post_result::blocked;
      }
      const remote_ptr at{p.raddr, p.rkey};
      const ibv_sge sge{p.laddr, static_cast<std::uint32_t>(p.length), p.lkey};
      send_wr w = p.length == 0 ? wr::write_imm(std::span<const ibv_sge>{}, at, p.tag)
                                : wr::write_imm(sge, at, p.tag);
      p.seq = q0.next_seq();
      if ((ec = q0.post(w, &op, rec_op))) {
        break;
      }
      ring_.count_sent();
      op.pending_ = 1;
      break;
    }
    default: break;
  }
  if (ec) {
    return refused(op, ec);
  }
  return post_result::all;
}

// Posts deferred operations, oldest first, while they fit.
inline void engine::pump() noexcept {
  if (failed_) {
    return;
  }
  if (!ring_.peer_count_valid()) {
    return fail_protocol();
  }
  const bool all =
      deferred_.post_in_order([this](operation& op) { return post_some(op) != post_result::blocked; },
                              [this](operation& op) {
                                if (op.pending_ == 0) {
                                  complete(op);
                                }
                              });
  if (!all) {
    cover_all();
    return;
  }
  // What was deferred may be waited on already (wait() covered the queues
  // before these requests were posted, a coroutine awaits it): the last
  // request posted must make a completion, or its operation never ends.
  cover_all();
}

}  // namespace rdx::detail
