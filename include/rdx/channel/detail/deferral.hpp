// rdx::detail: a connection's deferred operations. An operation that finds
// no send-queue room, credit, staging buffer or atomic slot waits here, and
// once one waits, every later one queues behind it: operations reach the NIC
// in the order they were started. A later progress() posts them, oldest
// first, while they fit.
#pragma once

#include <rdx/channel/detail/op_list.hpp>
#include <rdx/channel/operation.hpp>

namespace rdx::detail {

class deferral {
public:
  //! True when nothing waits: an operation started now may go to the NIC at once.
  [[nodiscard]] bool empty() const noexcept { return ops_.empty(); }
  void defer(operation& op) noexcept { ops_.push(op); }
  //! Posts the waiting operations, oldest first: post(op) is false when op
  //! does not fit (it stays first, and this returns false); posted(op) is
  //! called for each one that left the list.
  template <class Post, class Posted>
  bool post_in_order(Post&& post, Posted&& posted) noexcept {
    while (!ops_.empty()) {
      operation& op = *ops_.front();
      if (!post(op)) {
        return false;
      }
      ops_.erase(op);
      posted(op);
    }
    return true;
  }
  //! The oldest, taken off the list (a failed connection ends them all).
  [[nodiscard]] operation* pop() noexcept { return ops_.pop(); }
  //! The list itself, for withdrawing or moving an operation in it.
  [[nodiscard]] op_fifo& list() noexcept { return ops_; }

private:
  op_fifo ops_{op_list::deferred};
};

}  // namespace rdx::detail
