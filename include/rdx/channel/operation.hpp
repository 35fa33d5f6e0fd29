// rdx: one operation on a connection (a window access, a message, a
// notification) and the ways to wait for it: test, wait with a timeout or a
// deadline, and co_await, plain or bounded by a deadline and a stop token.
//
// Lifetime rules:
// - the caller owns an operation; it is movable at any time except while a
//   coroutine awaits it (a move of a pending one re-points the engine's
//   records at the new address);
// - it ends exactly once: with success, or the error that stopped it;
// - destroying a pending operation never waits and never resumes anything:
//   what has not reached the NIC is withdrawn (a deferred send is not sent, a
//   waiting receive takes no message), work already posted is detached (the
//   memory it names must stay registered until the connection retires it);
// - destroying the connection first ends every pending operation with
//   errc::operation_aborted and resumes no coroutine.
// More in rdx's design notes (share/doc/rdx/design.md), "Ownership" and
// "Lifetimes, cancellation and time".
//
// The members that drive the engine (test, wait, cancel, the awaiters) are
// defined in rdx/channel/connection.hpp: include that header (or a window or
// channel header) to use an operation.
#pragma once

#include <rdx/error.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <system_error>

namespace rdx {

class connection;
class operation;

//! How a wait blocks: busy polling, or sleeping on the completion channel
//! (the connection must have been made with events = true).
enum class wait_mode { poll, events };

//! The timeout of wait() without arguments.
inline constexpr std::chrono::nanoseconds default_wait_timeout = std::chrono::seconds(30);

namespace detail {

struct connection_access;
struct start_access;
class engine;
class bounded_awaiter_base;

// Which of the connection's intrusive lists holds an operation.
enum class op_list : std::uint8_t { none, receives, notifications, deferred, ready };

// What an operation does, and what a deferred one still has to post.
enum class op_kind : std::uint8_t {
  none,
  write,
  read,
  fetch_add,
  compare_swap,
  send,
  notify,
  receive,
  receive_view,  // a receive that borrows its ring buffer (message_view)
  notification
};

constexpr std::uint32_t no_slot = 0xffffffffu;

// What an operation posts. The fields a start sets come first; those that start
// at zero follow, next to operation's own zero fields, so that making an
// operation writes them with a few wide stores.
struct op_params {
  std::uint64_t laddr = 0;   // local address (the staging slot's once a send is deferred)
  std::uint64_t raddr = 0;   // remote address
  std::uint64_t length = 0;  // bytes in all
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
  std::uint32_t window = no_slot;  // the peer's keys per queue pair (engine::add_peer_window), or rkey
  std::uint32_t slot = no_slot;    // staging slot a deferred send holds; a message_view's ring buffer
  std::uint64_t operand = 0;       // fetch_add's addend, or compare_swap's compare
  std::uint64_t swap_value = 0;    // compare_swap's swap
  std::uint32_t tag = 0;           // notification tag
  std::uint32_t qp = 0;            // queue pair of the last posted request
  std::uint64_t posted = 0;        // bytes posted so far (striped writes and reads)
  std::uint64_t seq = 0;           // its send_queue sequence number (moves and withdrawals find it at once)
};

// The stop callback of a bounded await: it only flags, the poller acts.
struct stop_flag {
  bounded_awaiter_base* self;
  void operator()() const noexcept;
};

// A co_await with a deadline and/or a stop token. It lives in the awaiting
// coroutine's frame; the connection lists it while the coroutine is
// suspended and ends its operation when the deadline passes or a stop is
// requested.
class bounded_awaiter_base {
public:
  bounded_awaiter_base(operation& op, std::chrono::steady_clock::time_point deadline,
                       std::stop_token token) noexcept
      : op_(&op), deadline_(deadline), token_(std::move(token)) {}
  bounded_awaiter_base(const bounded_awaiter_base&) = delete;
  bounded_awaiter_base& operator=(const bounded_awaiter_base&) = delete;
  ~bounded_awaiter_base();

  [[nodiscard]] bool await_ready() noexcept;
  void await_suspend(std::coroutine_handle<> h) noexcept;

protected:
  void finish() noexcept;
  operation* op_;

private:
  friend struct connection_access;
  friend class rdx::connection;
  friend class engine;
  friend struct stop_flag;
  std::chrono::steady_clock::time_point deadline_;
  std::stop_token token_;
  std::optional<std::stop_callback<stop_flag>> callback_;
  connection* conn_ = nullptr;  // set while listed by the connection
  bounded_awaiter_base* prev_ = nullptr;
  bounded_awaiter_base* next_ = nullptr;
  std::atomic<bool> stop_requested_{false};
};

}  // namespace detail

//! One operation on a connection; see the lifetime rules above. Started by a
//! window, a channel or a connection; complete once done(). Threading: its
//! connection's (one thread at a time); a bounded await's stop_token may be
//! stopped from any thread.
class operation {
public:
  //! An empty operation: not started, never done; wait() says errc::not_ready.
  operation() noexcept = default;
  //! Takes over o, pending or not, re-pointing the engine's records at this object; o is left
  //! empty. Not while a coroutine awaits o.
  operation(operation&& o) noexcept;
  //! Ends this operation as destruction does (a pending one is withdrawn or detached), then
  //! takes over o as the move constructor does.
  operation& operator=(operation&& o) noexcept;
  operation(const operation&) = delete;
  operation& operator=(const operation&) = delete;
  [[gnu::always_inline]] inline ~operation();

  //! True once the operation ended (no polling).
  [[nodiscard]] bool done() const noexcept { return done_; }
  //! Empty on success; errc (rdx_category) for a check that failed before
  //! posting, a cancellation or a closed connection; an ibv_wc_status
  //! (wc_category, with a hint) when the NIC reported one. Meaningful once done().
  [[nodiscard]] std::error_code error() const noexcept { return ec_; }
  //! True when done() without an error.
  [[nodiscard]] bool ok() const noexcept { return done_ && !ec_; }
  //! Bytes received (receives and notifications).
  [[nodiscard]] std::uint32_t byte_count() const noexcept { return bytes_; }
  //! The remote word's previous value (fetch_add, compare_swap).
  [[nodiscard]] std::uint64_t old_value() const noexcept { return value_; }
  //! The 32-bit tag of a notification.
  [[nodiscard]] std::uint32_t tag() const noexcept { return static_cast<std::uint32_t>(value_); }
  //! True while the operation waits for send-queue room, a flow-control
  //! credit or a staging buffer (nothing of it reached the NIC yet, or only part).
  [[nodiscard]] bool deferred() const noexcept { return list_ == detail::op_list::deferred; }

  //! Polls the connection once without blocking. @return done().
  [[nodiscard, gnu::always_inline]] inline bool test() noexcept;
  //! Waits until done or timeout, busy polling (wait_mode::poll) or sleeping
  //! on the completion channel (wait_mode::events).
  //! @return error() when done, else errc::timed_out (the operation stays
  //! pending: wait again, cancel() or destroy it).
  [[nodiscard]] std::error_code wait(std::chrono::nanoseconds timeout = default_wait_timeout,
                                     wait_mode mode = wait_mode::poll) noexcept;
  //! wait() until an absolute deadline.
  [[nodiscard]] std::error_code wait_until(std::chrono::steady_clock::time_point deadline,
                                           wait_mode mode = wait_mode::poll) noexcept;
  //! Ends a pending operation now with errc::operation_canceled (no resume):
  //! what has not been posted is withdrawn, posted work is detached.
  //! @return true when it was pending.
  bool cancel() noexcept;

  //! co_await: ready at once when done, or when empty (await_resume() then says errc::not_ready).
  [[nodiscard]] bool await_ready() const noexcept { return done_ || conn_ == nullptr; }
  //! co_await: the coroutine resumes inline in whichever call polls the connection (wait, test,
  //! progress, wait_event) when the operation ends.
  void await_suspend(std::coroutine_handle<> h) noexcept;
  //! co_await's result: error(), or errc::not_ready for an empty operation.
  [[nodiscard]] std::error_code await_resume() const noexcept {
    return conn_ == nullptr && !done_ ? make_error_code(errc::not_ready) : ec_;
  }

  class bounded;
  //! co_await op.until(deadline, token): ends the operation with
  //! errc::timed_out at the deadline, or errc::operation_canceled when token
  //! is stopped (from any thread), whichever comes first.
  [[nodiscard]] inline bounded until(std::chrono::steady_clock::time_point deadline,
                                     std::stop_token token = {}) noexcept;
  //! co_await op.within(timeout, token): until(now + timeout, token).
  [[nodiscard]] inline bounded within(std::chrono::nanoseconds timeout, std::stop_token token = {}) noexcept;
  //! co_await op.stop_on(token): no deadline, canceled by token.
  [[nodiscard]] bounded stop_on(std::stop_token token) noexcept;

protected:
  //! For derived operations that keep their result inside (receive_operation).
  [[nodiscard]] std::byte* destination() const noexcept { return dst_; }
  //! Points a receive's destination at d (a derived operation's own storage, after a move).
  void set_destination(std::byte* d) noexcept { dst_ = d; }
  //! A message_view's ring buffer goes back to the connection (reposted); no-op without one.
  inline void release_lease() noexcept;
  //! True while a message_view holds its ring buffer.
  [[nodiscard]] bool holds_lease() const noexcept {
    return kind_ == detail::op_kind::receive_view && p_.slot != detail::no_slot && conn_ != nullptr;
  }

private:
  friend class connection;
  friend class detail::engine;
  friend struct detail::connection_access;
  friend struct detail::start_access;
  friend class detail::bounded_awaiter_base;
  explicit operation(connection& c) noexcept : conn_(&c) {}
  operation(connection& c, detail::op_kind k, const detail::op_params& p) noexcept
      : conn_(&c), p_(p), kind_(k) {}
  void take_from(operation& o) noexcept;
  // The destructor's work for a pending, listed or lending operation (kept out of line).
  [[gnu::noinline]] inline void leave() noexcept;

  // Ordered so that the fields that start at zero follow p_'s zero tail, and
  // the few that do not (kind_, elem_size_) come last.
  connection* conn_ = nullptr;
  std::error_code ec_ = detail::no_error();
  detail::op_params p_{};
  std::coroutine_handle<> waiter_{};
  detail::bounded_awaiter_base* bounded_ = nullptr;  // the bounded await suspended on it
  operation* prev_ = nullptr;                        // intrusive list links (op_list)
  operation* next_ = nullptr;
  std::byte* dst_ = nullptr;  // receive destination
  std::uint64_t value_ = 0;
  std::uint32_t pending_ = 0;  // posted work requests not yet retired
  std::uint32_t bytes_ = 0;
  std::uint32_t dst_capacity_ = 0;
  detail::op_list list_ = detail::op_list::none;
  bool exact_ = false;  // a received message must fill dst exactly
  bool done_ = false;
  detail::op_kind kind_ = detail::op_kind::none;
  std::uint32_t elem_size_ = 1;  // a received message must be a multiple of it
};

//! The awaiter of op.until(), op.within() and op.stop_on().
class operation::bounded : public detail::bounded_awaiter_base {
public:
  using detail::bounded_awaiter_base::bounded_awaiter_base;
  //! Drops the deadline and the stop callback, then gives the operation's error() (errc::timed_out
  //! or errc::operation_canceled when the bound ended it).
  [[nodiscard]] std::error_code await_resume() noexcept {
    finish();
    return op_->await_resume();
  }
};

inline operation::bounded operation::until(std::chrono::steady_clock::time_point deadline,
                                           std::stop_token token) noexcept {
  return bounded(*this, deadline, std::move(token));
}
inline operation::bounded operation::within(std::chrono::nanoseconds timeout,
                                            std::stop_token token) noexcept {
  return until(std::chrono::steady_clock::now() + timeout, std::move(token));
}
inline operation::bounded operation::stop_on(std::stop_token token) noexcept {
  return until(std::chrono::steady_clock::time_point::max(), std::move(token));
}

}  // namespace rdx
