// rdx: typed two-sided channels. Messages of a trivially copyable T travel
// by send with immediate into a ring of pre-posted receive buffers; credits
// (the receiver's count of taken buffers) return piggybacked in the immediate
// of the receiver's own messages, or by an RDMA write of the count, so a
// sender never posts without a receive waiting: no receiver-not-ready error,
// however slow the receiver. Notifications are RDMA writes with immediate
// carrying a 32-bit tag; the receiver takes (tag, byte count) in order.
// Besides operations, a handler style with none per message: post() is done
// when it returns, and on_message() hands each message to a callable where
// it lies in the ring, from inside the progress loop.
#pragma once

#include <rdx/channel/connection.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/error.hpp>

#include <concepts>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>

namespace rdx {

//! Types a channel carries: bytes the NIC may copy.
template <class T>
concept message_type =
    std::is_object_v<T> && std::is_trivially_copyable_v<T> && !std::is_const_v<T> && !std::is_volatile_v<T>;

//! What co_await on a receive gives: the message, or the error that ended it.
template <message_type T>
struct received {
  std::error_code error;  //!< empty when a message arrived
  T value;                //!< the message (meaningful only without error)
  //! True when a message arrived.
  [[nodiscard]] explicit operator bool() const noexcept { return !error; }
};

//! A receive of one T: the value lands inside the operation (in the caller's
//! frame or the coroutine frame).
template <message_type T>
class receive_operation : public operation {
public:
  //! Starts a receive of one T on c: the next message, which must be exactly one T.
  explicit receive_operation(connection& c) noexcept : operation(detail::start_access::make(c)) {
    detail::start_access::of(c).start_receive(*this, &value_, sizeof(T), sizeof(T), true);
  }
  //! A move re-points the destination of a receive still waiting.
  receive_operation(receive_operation&& o) noexcept : operation(std::move(o)), value_(o.value_) {
    if (destination() == reinterpret_cast<std::byte*>(&o.value_)) {
      set_destination(reinterpret_cast<std::byte*>(&value_));
    }
  }
  //! Ends this receive as destruction does, then takes over o (re-pointing a waiting destination).
  receive_operation& operator=(receive_operation&& o) noexcept {
    if (this != &o) {
      operation::operator=(std::move(o));
      value_ = o.value_;
      if (destination() == reinterpret_cast<std::byte*>(&o.value_)) {
        set_destination(reinterpret_cast<std::byte*>(&value_));
      }
    }
    return *this;
  }
  receive_operation(const receive_operation&) = delete;
  receive_operation& operator=(const receive_operation&) = delete;
  ~receive_operation() = default;
  //! The message (valid when ok()).
  [[nodiscard]] const T& value() const noexcept { return value_; }
  //! co_await's result: the error, and the message when there is none.
  received<T> await_resume() const noexcept { return {error(), value_}; }

private:
  T value_{};
};

//! A receive that borrows the message's ring buffer instead of copying it
//! out: once ok(), view() is the message where the NIC put it. The buffer
//! is lent until release(), destruction or a move-assignment; until then it
//! is not reposted, so the peer gets no credit for it (holding many views
//! slows the sender down; it never makes a receiver-not-ready). Moving a
//! view moves the loan. Destroying the connection first ends the loan:
//! view() is empty from then on and the view's destruction is safe.
template <message_type T>
class message_view : public operation {
public:
  //! Starts a view receive on c: the next message, a whole number of T (else errc::limit_exceeded).
  explicit message_view(connection& c) noexcept : operation(detail::start_access::make(c)) {
    detail::engine& e = detail::start_access::of(c);
    // A buffer would hold misaligned T (a sealed payload starts sealed_payload_offset in).
    if (c.attributes().message_size % alignof(T) != 0 ||
        (c.encrypted() && sealed_payload_offset % alignof(T) != 0)) {
      e.fail_now(*this, make_error_code(errc::invalid_argument));
    } else {
      e.start_receive_view(*this, sizeof(T));
    }
  }
  //! An empty view: not started, holds nothing.
  message_view() noexcept = default;
  message_view(const message_view&) = delete;
  message_view& operator=(const message_view&) = delete;
  //! Takes over o's receive, or o's buffer once it holds one; o is left empty.
  message_view(message_view&&) noexcept = default;
  //! Gives back this view's buffer (if it holds one), then takes over o's.
  message_view& operator=(message_view&&) noexcept = default;
  //! Gives the buffer back if it holds one (see operation's lifetime rules for a pending one).
  ~message_view() = default;
  //! The message in the ring buffer (byte_count() / sizeof(T) elements);
  //! empty before it arrived, after release() and once the connection is gone.
  [[nodiscard]] std::span<const T> view() const noexcept {
    const std::byte* d = holds() ? destination() : nullptr;
    return d == nullptr ? std::span<const T>{}
                        : std::span<const T>(reinterpret_cast<const T*>(d), byte_count() / sizeof(T));
  }
  //! True while the view holds its ring buffer.
  [[nodiscard]] bool holds() const noexcept { return holds_lease(); }
  //! Gives the buffer back now: it is reposted and its credit goes to the peer.
  void release() noexcept { release_lease(); }
};

//! A typed, flow-controlled message channel over a connection (queue pair 0).
//! Both sides make a channel of the same T. Messages up to
//! connection::message_size() bytes; a larger one fails with
//! errc::limit_exceeded before anything is posted. Threading: its
//! connection's (one thread at a time).
template <message_type T>
class channel {
public:
  //! @throws rdx::error (errc::limit_exceeded) when one T does not fit a message buffer.
  explicit channel(connection& c) : conn_(&c) {
    if (sizeof(T) > c.message_size()) {
      detail::throw_rdx(errc::limit_exceeded, "channel: one message of " + std::to_string(sizeof(T)) +
                                                  " bytes exceeds the connection's message_size " +
                                                  std::to_string(c.message_size()));
    }
  }

  //! Sends one value (copied before return: inline, or into a registered
  //! staging buffer). While the peer has no free buffer it is deferred (a
  //! waiting coroutine stays suspended; nothing spins) and posted in order.
  [[nodiscard]] operation send(const T& v) noexcept {
    operation op = detail::start_access::make(*conn_);
    detail::start_access::of(*conn_).start_send(op, &v, sizeof(T));
    return op;
  }
  //! Sends values as one message; more than message_size() bytes fails
  //! with errc::limit_exceeded, none with errc::invalid_argument.
  [[nodiscard]] operation send(std::span<const T> v) noexcept {
    operation op = detail::start_access::make(*conn_);
    detail::start_access::of(*conn_).start_send(op, v.data(), v.size_bytes());
    return op;
  }
  //! Sends src as one message straight from its registered memory: no
  //! staging copy (the NIC reads src itself), so src must stay registered
  //! and unchanged until the operation is done. Flow control, deferral,
  //! order and errors as send(); destroying the operation before it is
  //! posted withdraws it, after that detaches it (src must then stay
  //! registered until the connection retires the request: drain()).
  [[nodiscard]] operation send_registered(local_span<const T> src) noexcept {
    operation op = detail::start_access::make(*conn_);
    detail::start_access::of(*conn_).start_send_registered(op, reinterpret_cast<std::uint64_t>(src.data()),
                                                           src.lkey(), src.size_bytes());
    return op;
  }
  //! Sends v as one message that is done when post returns: no operation,
  //! and v's memory is free at once (copied inline into the request, or into
  //! a staging buffer until the request retires). Takes a flow-control credit
  //! like send(). Never waits: without a credit, send-queue room or a staging
  //! buffer, or behind deferred send()s, it is refused with
  //! std::errc::resource_unavailable_try_again (call progress() and post
  //! again). A failed connection refuses it with failure_reason(); a message
  //! posted before the failure that never arrived is reported by that
  //! failure alone. Other refusals: errc::not_ready (not connected),
  //! errc::unsupported (an encrypted connection), as send() for the size.
  [[nodiscard]] std::error_code post(const T& v) noexcept {
    return detail::start_access::of(*conn_).post_message(&v, sizeof(T));
  }
  //! Sends values as one message, done when post returns (see post(const T&));
  //! none fails with errc::invalid_argument, more than message_size() bytes
  //! with errc::limit_exceeded.
  [[nodiscard]] std::error_code post(std::span<const T> v) noexcept {
    return detail::start_access::of(*conn_).post_message(v.data(), v.size_bytes());
  }
  //! Every message of the connection goes to f from now on, in order, as
  //! f(std::span<const T>): the message where it lies in the receive ring,
  //! valid only during the call. f runs inside whatever polls the
  //! connection's queue: progress(), an operation's test() or wait(), a
  //! send() waiting for a staging buffer; on a worker, any of these of its
  //! connections, the worker's own, and another connection's teardown. Never
  //! after the connection failed. The buffer is reposted, and its credit returned,
  //! after f returns. f may post, and may set or remove the handler; it must
  //! not throw (progress() is noexcept), wait, or destroy a connection or
  //! worker. Messages that arrived before are handed to f at once, inside
  //! this call. F is held by value: trivially copyable, at most four
  //! pointers (capture references or a pointer to your state).
  //! @return errc::handler_set while receives wait, errc::invalid_argument
  //!   when message_size() is not a multiple of alignof(T),
  //!   errc::unsupported on an encrypted connection, errc::operation_aborted
  //!   while the connection is being destroyed. A message that is not a
  //!   whole number of T fails the connection (errc::protocol_error).
  template <class F>
  requires std::invocable<const F&, std::span<const T>>
  [[nodiscard]] std::error_code on_message(const F& f) noexcept {
    static_assert(detail::message_handler::fits<F>,
                  "on_message: the handler must be trivially copyable and at most four pointers in size "
                  "(capture references, or one pointer to the state it needs)");
    if (conn_->attributes().message_size % alignof(T) != 0) {
      return make_error_code(errc::invalid_argument);
    }
    return detail::start_access::of(*conn_).set_handler(
        detail::message_handler::make(f, &call_handler<F>, sizeof(T)));
  }
  //! Messages go to receives again; those that arrive meanwhile wait for one.
  void remove_handler() noexcept { (void)detail::start_access::of(*conn_).set_handler({}); }
  //! True while a handler takes the connection's messages.
  [[nodiscard]] bool has_handler() const noexcept { return detail::start_access::of(*conn_).has_handler(); }

  //! Receives the next message, which must be one T (else errc::limit_exceeded).
  [[nodiscard]] receive_operation<T> receive() noexcept { return receive_operation<T>(*conn_); }
  //! Receives the next message without copying it out of the receive ring
  //! (see message_view). Needs message_size() a multiple of alignof(T), so
  //! every buffer holds aligned T (else errc::invalid_argument at once).
  [[nodiscard]] message_view<T> receive_view() noexcept { return message_view<T>(*conn_); }
  //! Receives the next message into dst; byte_count() / sizeof(T) elements
  //! arrived. A message larger than dst fails with errc::limit_exceeded (and is dropped).
  [[nodiscard]] operation receive(std::span<T> dst) noexcept {
    operation op = detail::start_access::make(*conn_);
    const std::size_t cap = dst.size_bytes() > UINT32_MAX ? UINT32_MAX : dst.size_bytes();
    detail::start_access::of(*conn_).start_receive(op, dst.data(), static_cast<std::uint32_t>(cap), sizeof(T),
                                                   false);
    return op;
  }

  //! Writes src into the peer's window at offset and delivers tag to the
  //! peer's next_notification(), in order with other notifications. Uses one
  //! flow-control credit, like a message.
  template <class U, rights R>
  requires(has(R, rights::write)) [[nodiscard]] operation
      notify(remote_window<U, R>& w, std::type_identity_t<local_span<const U>> src, std::size_t offset,
             std::uint32_t tag) noexcept {
    operation op = detail::start_access::make(*conn_);
    detail::engine& e = detail::start_access::of(*conn_);
    if (&w.conn() != conn_) {
      e.fail_now(op, make_error_code(errc::invalid_argument));
    } else if (std::error_code ec = w.check(offset, src.size())) {
      e.fail_now(op, ec);
    } else if (src.size_bytes() > UINT32_MAX) {
      e.fail_now(op, make_error_code(errc::limit_exceeded));
    } else {
      e.start_notify(op, reinterpret_cast<std::uint64_t>(src.data()), src.lkey(),
                     w.descriptor().memory.addr + offset * sizeof(U), w.descriptor().memory.rkey,
                     static_cast<std::uint32_t>(src.size_bytes()), tag);
    }
    return op;
  }
  //! A bare tag: no data (byte count 0 at the peer).
  [[nodiscard]] operation notify(std::uint32_t tag) noexcept {
    operation op = detail::start_access::make(*conn_);
    detail::start_access::of(*conn_).start_notify(op, 0, 0, 0, 0, 0, tag);
    return op;
  }
  //! The next notification: tag() and byte_count() once done.
  [[nodiscard]] operation next_notification() noexcept {
    operation op = detail::start_access::make(*conn_);
    detail::start_access::of(*conn_).start_notification(op);
    return op;
  }

  //! Messages this side may send before the peer returns credits.
  [[nodiscard]] std::uint32_t credits() const noexcept { return conn_->credits(); }
  //! The connection the channel uses.
  [[nodiscard]] connection& conn() const noexcept { return *conn_; }

private:
  // A message's bytes, as the span of T the handler F takes.
  template <class F>
  static void call_handler(const void* store, const std::byte* data, std::uint32_t n) noexcept {
    detail::message_handler::held<F>(store)(
        std::span<const T>(reinterpret_cast<const T*>(data), n / sizeof(T)));
  }

  connection* conn_;
};

}  // namespace rdx
