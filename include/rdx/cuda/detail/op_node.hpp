// rdx::cuda internals: what a same-host peer keeps of a pending operation and
// of a bounded co_await (a deadline, a stop token), as plain records the peer
// links into its lists. rdx/cuda/same_host_operation.hpp wraps them in the
// public types; rdx/cuda/detail/peer_state.hpp drives them.
#pragma once

#include <rdx/error.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <system_error>

namespace rdx::cuda::detail {

class peer_state;
struct bound_node;

//! No event slot: the operation is not a copy (or not pending).
inline constexpr std::uint32_t no_peer_slot = 0xffffffffu;

//! An operation as the peer sees it: its state while pending, its result once ended.
struct op_node {
  peer_state* st = nullptr;  // set while pending
  std::error_code ec = make_error_code(errc::not_ready);
  std::coroutine_handle<> waiter{};  // the coroutine awaiting it, if any
  bound_node* bounded = nullptr;     // the bounded await listing it, if any
  op_node* prev = nullptr;           // the peer's list of notification waiters
  op_node* next = nullptr;
  std::uint32_t slot = no_peer_slot;  // the copy's event slot
  std::uint32_t tag = 0;              // a received notification's tag
  bool done = false;
};

//! A bounded co_await as the peer sees it: polled by each progress pass.
struct bound_node {
  op_node* op = nullptr;
  std::chrono::steady_clock::time_point deadline{};
  std::atomic<bool> stop_requested{false};  // set by a stop callback, from any thread
  peer_state* st = nullptr;                 // set while listed
  bound_node* prev = nullptr;
  bound_node* next = nullptr;
};

}  // namespace rdx::cuda::detail
