// rdx::detail: an intrusive FIFO of operations (doubly linked, so an
// operation destroyed or moved anywhere in it leaves in constant time). The
// list an operation is in is recorded in the operation itself.
#pragma once

#include <rdx/channel/operation.hpp>

namespace rdx::detail {

struct connection_access;

class op_fifo {
public:
  explicit op_fifo(op_list which) noexcept : which_(which) {}
  [[nodiscard]] bool empty() const noexcept { return head_ == nullptr; }
  [[nodiscard]] operation* front() const noexcept { return head_; }
  [[nodiscard]] op_list which() const noexcept { return which_; }

  inline void push(operation& op) noexcept;
  inline operation* pop() noexcept;
  inline void erase(operation& op) noexcept;
  //! Puts to where from was (from leaves; to must be in no list).
  inline void replace(operation& from, operation& to) noexcept;

private:
  operation* head_ = nullptr;
  operation* tail_ = nullptr;
  op_list which_;
};

// The operation's links are private; this is the one place that touches them.
struct connection_access {
  static operation*& prev(operation& op) noexcept { return op.prev_; }
  static operation*& next(operation& op) noexcept { return op.next_; }
  static op_list& list(operation& op) noexcept { return op.list_; }
};

inline void op_fifo::push(operation& op) noexcept {
  connection_access::prev(op) = tail_;
  connection_access::next(op) = nullptr;
  connection_access::list(op) = which_;
  if (tail_ != nullptr) {
    connection_access::next(*tail_) = &op;
  } else {
    head_ = &op;
  }
  tail_ = &op;
}

inline operation* op_fifo::pop() noexcept {
  operation* op = head_;
  if (op != nullptr) {
    erase(*op);
  }
  return op;
}

inline void op_fifo::erase(operation& op) noexcept {
  operation* p = connection_access::prev(op);
  operation* n = connection_access::next(op);
  if (p != nullptr) {
    connection_access::next(*p) = n;
  } else {
    head_ = n;
  }
  if (n != nullptr) {
    connection_access::prev(*n) = p;
  } else {
    tail_ = p;
  }
  connection_access::prev(op) = nullptr;
  connection_access::next(op) = nullptr;
  connection_access::list(op) = op_list::none;
}

inline void op_fifo::replace(operation& from, operation& to) noexcept {
  operation* p = connection_access::prev(from);
  operation* n = connection_access::next(from);
  connection_access::prev(to) = p;
  connection_access::next(to) = n;
  connection_access::list(to) = which_;
  if (p != nullptr) {
    connection_access::next(*p) = &to;
  } else {
    head_ = &to;
  }
  if (n != nullptr) {
    connection_access::prev(*n) = &to;
  } else {
    tail_ = &to;
  }
  connection_access::prev(from) = nullptr;
  connection_access::next(from) = nullptr;
  connection_access::list(from) = op_list::none;
}

}  // namespace rdx::detail
