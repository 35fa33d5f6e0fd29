// rdx::detail: the handler-style message path, with no operation per
// message. A post (channel<T>::post) is done when it returns: the message is
// copied inline into the request or into a staging buffer, it takes a
// credit like any send, and its send-queue record has no owner. It is
// signaled only every signal_interval requests (send_queue::post_moderated),
// so most make no completion; a later completion retires it with those
// before it, and a staging buffer goes back. Without a
// credit, send-queue room or a staging buffer it is refused with
// std::errc::resource_unavailable_try_again (would block) and never waits;
// a failed connection refuses it with its failure reason. A handler
// (channel<T>::on_message) takes every arrived message in the ring, inside
// the poll that found it; the buffer is queued for the poll's one repost
// when the handler returns, and credits go back as for a receive. The rules:
// rdx's design notes (share/doc/rdx/design.md), "Data path". A part of
// detail/engine_all.hpp (include that).
#pragma once

#include <rdx/channel/detail/engine.hpp>

namespace rdx::detail {

inline std::error_code engine::post_message(const void* data, std::size_t bytes) noexcept {
  thread_check::scope guard(*thread_, "posting a message");
  // open_: connected, not failed, not sealed (so the payload is all of message_size).
  if (!open_ || bytes - 1 >= attr_.message_size) [[unlikely]] {
    return post_refused(bytes);
  }
  send_queue& q = sqs_[0];
  // Behind deferred sends (order on the wire is start order), without a
  // credit, or without room: would block.
  if (!deferred_.empty() || ring_.credits() == 0 || !q.has_room()) [[unlikely]] {
    return post_would_block();
  }
  if (bytes <= q.qp().max_inline_data() && !q.held()) [[likely]] {
    // Inline: the provider copies the payload into the request now.
    flat_wr w{.sge = {reinterpret_cast<std::uint64_t>(data), static_cast<std::uint32_t>(bytes), 0},
              .imm_data = htonl(ring_.piggyback()),
              .opcode = IBV_WR_SEND_WITH_IMM};
    if (std::error_code ec = q.post_moderated(w, nullptr, rec_op)) [[unlikely]] {
      return ec;
    }
    ring_.count_sent();
    return no_error();
  }
  return post_staged(data, bytes);
}

// A post refused before anything is posted: why.
std::error_code engine::post_refused(std::size_t bytes) const noexcept {
  if (failed_) {
    return failure_;  // operation_aborted once it is being destroyed
  }
  if (!connected_) {
    return make_error_code(errc::not_ready);
  }
  if (bytes == 0) {
    return make_error_code(errc::invalid_argument);
  }
  return make_error_code(attr_.encrypt ? errc::unsupported : errc::limit_exceeded);
}

// No credit, room or staging buffer now: the queue is covered, so that the
// next progress() brings room back.
std::error_code engine::post_would_block() noexcept {
  cover_all();
  return std::make_error_code(std::errc::resource_unavailable_try_again);
}

// Larger than the inline limit, or inside a batch (posted later, when data
// may be gone): a staging buffer holds the copy until the request retires.
std::error_code engine::post_staged(const void* data, std::size_t bytes) noexcept {
  send_queue& q = sqs_[0];
  if (slots_.staging_empty()) {
    return post_would_block();
  }
  const std::uint32_t slot = slots_.take_staging();
  std::memcpy(slots_.staging(slot), data, bytes);
  flat_wr w{.sge = slots_.staging_sge(slot, static_cast<std::uint32_t>(bytes)),
            .imm_data = htonl(ring_.piggyback()),
            .opcode = IBV_WR_SEND_WITH_IMM};
  if (std::error_code ec = q.post_moderated(w, nullptr, rec_staged, slot)) [[unlikely]] {
    slots_.give_staging(slot);
    return ec;
  }
  ring_.count_sent();
  return no_error();
}

inline std::error_code engine::set_handler(const message_handler& h) noexcept {
  thread_check::scope guard(*thread_, "setting a message handler");
  if (h.call == nullptr) {
    handler_.call = nullptr;
    ++handler_sets_;
    return no_error();
  }
  if (closing_) {
    return make_error_code(errc::operation_aborted);
  }
  if (attr_.encrypt) {
    return make_error_code(errc::unsupported);
  }
  if (!receives_.empty()) {
    return make_error_code(errc::handler_set);
  }
  handler_ = h;
  ++handler_sets_;
  // Messages that arrived before it was set are its now, at once (no later
  // poll would hand them over while no new message comes).
  if (!failed_ && ring_.messages_waiting() != 0) {
    deliver();
  }
  return no_error();
}

inline void engine::hand_over() noexcept {
  // Called from a copy: a handler that sets another, or removes itself,
  // does not overwrite the callable that runs; the next message goes to
  // what is set then (to receives once none is).
  message_handler h = handler_;
  const std::uint32_t sets = handler_sets_;
  while (!failed_ && ring_.messages_waiting() > 0) {
    const std::uint32_t i = ring_.take_message();
    const std::uint32_t n = ring_.entry(i).bytes;
    if (h.elem_size != 1 && n % h.elem_size != 0) [[unlikely]] {
      consume(i);
      fail_shape(n, h.elem_size);
      return;
    }
    h.call(h.store, ring_.data(i), n);
    consume(i);
    if (handler_sets_ != sets) [[unlikely]] {
      if (handler_.call != nullptr) {
        hand_over();
      }
      return;
    }
  }
}

// The message in buffer i (n bytes), with none queued before it: to the
// handler at once, as hand_over() would.
inline void engine::hand_one(std::uint32_t i, std::uint32_t n) noexcept {
  const message_handler h = handler_;  // called from a copy (hand_over)
  const std::uint32_t sets = handler_sets_;
  if (h.elem_size != 1 && n % h.elem_size != 0) [[unlikely]] {
    consume(i);
    fail_shape(n, h.elem_size);
    return;
  }
  h.call(h.store, ring_.data(i), n);
  consume(i);
  // The handler changed, or a poll inside it queued more: as hand_over() goes on.
  if (handler_sets_ != sets || ring_.messages_waiting() != 0) [[unlikely]] {
    if (handler_.call != nullptr) {
      hand_over();
    }
  }
}

// The peer sent a message the handler cannot take: not a whole number of
// its elements (an impossible value from the peer).
inline void engine::fail_shape(std::uint32_t n, std::uint32_t elem_size) noexcept {
  std::snprintf(failure_text_, sizeof failure_text_,
                "the peer sent a message of %u bytes, not a whole number of the handler's %u-byte elements",
                n, elem_size);
  fail(make_error_code(errc::protocol_error));
}

}  // namespace rdx::detail
