// rdx::cuda internals: the operations of a same-host peer over what it owns
// (peer_resources.hpp): copies queued with their events, notifications
// waited for and sent, bounded awaits, the set-up waits, and the progress
// loop that polls events and the socket without ever blocking. Windows and
// grants share it (std::shared_ptr, taken at their creation), so any order of
// destruction is safe: destroying the peer object closes it and ends what is
// pending.
#pragma once

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/detail/mapping_cache.hpp>
#include <rdx/cuda/detail/op_node.hpp>
#include <rdx/cuda/detail/peer_resources.hpp>
#include <rdx/cuda/detail/unix_socket.hpp>
#include <rdx/cuda/same_host_types.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

#include <unistd.h>

namespace rdx::cuda::detail {

class peer_state : public peer_resources, public std::enable_shared_from_this<peer_state> {
public:
  //! Takes a connected socket, makes the stream and events, says hello. Throws before anything
  //! is left behind.
  peer_state(unique_fd sock, const same_host_options& o) : peer_resources(std::move(sock), o) {}

  //! Queues a copy and its event; the operation ends when progress finds the event done. dst and
  //! src lie on CUDA devices dst_dev and src_dev: on two (a staged route) the copy goes by
  //! cudaMemcpyPeerAsync, which needs no P2P access (the driver stages it through host memory).
  void start_copy(op_node& op, void* dst, const void* src, std::size_t n, const mapping* m, bool notify,
                  std::uint32_t tag, std::uint64_t grant, int dst_dev, int src_dev) noexcept {
    if (std::error_code ec = usable()) {
      return fail_now(op, ec);
    }
    if (count_ == slots_.size()) {
      (void)progress();
    }
    if (count_ == slots_.size()) {
      return fail_now(op, make_error_code(errc::limit_exceeded));
    }
    cudaStream_t s = stream();
    cudaError_t e = dst_dev != src_dev       ? cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, s)
                    : opt_.copier != nullptr ? opt_.copier(dst, src, n, s)
                                             : cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
    const std::size_t i = (head_ + count_) % slots_.size();
    if (e == cudaSuccess) {
      e = cudaEventRecord(slots_[i].ev, s);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaStreamSynchronize(s);  // nothing of this copy may run on after it failed
      return fail_now(op, make_error_code(e));
    }
    slots_[i] = {slots_[i].ev, &op, m, grant, tag, notify};
    ++count_;
    op.st = this;
    op.slot = static_cast<std::uint32_t>(i);
    op.done = false;
  }
  //! A notification from the peer: at once when one has arrived unread, else when one does.
  void start_notification(op_node& op) noexcept {
    if (unread_ > 0) {
      op.tag = arrived_[first_unread_];
      first_unread_ = (first_unread_ + 1) % arrived_.size();
      --unread_;
      return end_now(op, {});
    }
    if (std::error_code ec = usable()) {
      return fail_now(op, ec);
    }
    op.st = this;
    op.done = false;
    op.prev = tail_;
    op.next = nullptr;
    (tail_ != nullptr ? tail_->next : head_op_) = &op;
    tail_ = &op;
  }
  //! Sends a notification at once (no write before it).
  void start_notify(op_node& op, std::uint32_t tag) noexcept {
    if (std::error_code ec = usable()) {
      return fail_now(op, ec);
    }
    frame f;
    f.type = frame_type::notify;
    f.tag = tag;
    const int e = send_frame(sock_.get(), &f, sizeof f);
    end_now(op, e == 0 ? std::error_code{}
                       : make_error_code(e == EAGAIN ? errc::limit_exceeded : errc::peer_disconnected));
  }
  static void fail_now(op_node& op, std::error_code ec) noexcept { end_now(op, ec); }

  //! One pass: frames from the socket, finished copies, deadlines and stops. Never blocks.
  //! @return operations ended.
  std::size_t progress() noexcept {
    std::shared_ptr<peer_state> keep;  // taken only when a coroutine resumes (it may drop the last owner)
    std::size_t n = 0;
    if (head_op_ != nullptr || (++tick_ & 63) == 0) {
      read_frames(keep);
    }
    bool read = false;
    while (count_ > 0) {
      slot& s = slots_[head_];
      const cudaError_t q = cudaEventQuery(s.ev);
      if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        break;
      }
      if (!read) {  // the peer's departure, seen before the copies are reported
        read = true;
        read_frames(keep);
      }
      std::error_code ec = q == cudaSuccess ? std::error_code{} : make_error_code(q);
      if (q != cudaSuccess) {
        (void)cudaGetLastError();
      }
      if (!ec && failure_) {
        ec = failure_;
      }
      if (!ec && s.notify && !closed_) {
        frame f;
        f.type = frame_type::notify;
        f.id = s.grant;
        f.tag = s.tag;
        const int e = send_frame(sock_.get(), &f, sizeof f);
        if (e == EAGAIN) {
          break;  // the peer's socket buffer is full: again next time
        }
        if (e != 0) {
          ec = make_error_code(errc::peer_disconnected);
        }
      }
      op_node* op = std::exchange(s.op, nullptr);
      s.map = nullptr;
      head_ = (head_ + 1) % slots_.size();
      --count_;
      ++n;
      if (op != nullptr) {
        finish(*op, ec, keep);
      }
    }
    if (bounds_ != nullptr) {
      n += check_bounds(keep);
    }
    return n;
  }

  //! Ends op now with ec, without resuming its coroutine (cancel, destruction).
  void end_pending(op_node& op, std::error_code ec) noexcept {
    unlist(op);
    op.done = true;
    op.ec = ec;
    op.st = nullptr;
    op.waiter = {};
  }
  //! A moved operation's new address, in its slot or list.
  void moved(op_node& from, op_node& to) noexcept {
    if (to.slot != no_peer_slot) {
      slots_[to.slot].op = &to;
      return;
    }
    (from.prev != nullptr ? from.prev->next : head_op_) = &to;
    (from.next != nullptr ? from.next->prev : tail_) = &to;
  }

  //! Waits (set-up only) until pred() holds, reading frames; throws on timeout or departure.
  template <class Pred>
  void pump_until(Pred pred, std::chrono::steady_clock::time_point deadline, const char* what) {
    for (;;) {
      std::shared_ptr<peer_state> keep;
      read_frames(keep);
      if (pred()) {
        return;
      }
      if (std::error_code ec = usable()) {
        throw_failure(ec, what);
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        rdx::detail::throw_rdx(errc::timed_out, std::string(what) + ": nothing from the peer in time");
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
      (void)wait_readable(sock_.get(),
                          std::min(left + std::chrono::milliseconds(1), std::chrono::milliseconds(50)));
    }
  }
  //! Sends a set-up frame (a grant, a revoke), waiting for room up to the set-up timeout.
  void send_setup(const frame& f, int fd) {
    const auto deadline = std::chrono::steady_clock::now() + opt_.setup_timeout;
    for (;;) {
      if (std::error_code ec = usable()) {
        throw_failure(ec, "same-host peer");
      }
      const int e = send_frame(sock_.get(), &f, sizeof f, fd);
      if (e == 0) {
        return;
      }
      if (e != EAGAIN || std::chrono::steady_clock::now() >= deadline) {
        errno = e;
        throw_errno("sendmsg", "(to the same-host peer)");
      }
      std::shared_ptr<peer_state> keep;
      read_frames(keep);
      ::usleep(100);
    }
  }
  //! The peer object is going: says goodbye, ends every pending operation with
  //! errc::operation_aborted (no resume), and lets queued copies finish.
  void close() noexcept {
    if (closed_) {
      return;
    }
    frame f;
    f.type = frame_type::bye;
    (void)send_frame(sock_.get(), &f, sizeof f);
    closed_ = true;
    sock_.reset();
    for (std::size_t k = 0; k < count_; ++k) {
      slot& s = slots_[(head_ + k) % slots_.size()];
      if (s.op != nullptr) {
        end_pending(*s.op, make_error_code(errc::operation_aborted));
      }
    }
    while (head_op_ != nullptr) {
      end_pending(*head_op_, make_error_code(errc::operation_aborted));
    }
    check_noexcept(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (peer teardown)");
    count_ = 0;
  }

  // For bound_node.
  void list(bound_node& b) noexcept {
    b.st = this;
    b.prev = nullptr;
    b.next = bounds_;
    if (bounds_ != nullptr) {
      bounds_->prev = &b;
    }
    bounds_ = &b;
  }
  void unlist(bound_node& b) noexcept {
    (b.prev != nullptr ? b.prev->next : bounds_) = b.next;
    if (b.next != nullptr) {
      b.next->prev = b.prev;
    }
    b.st = nullptr;
    b.prev = b.next = nullptr;
  }

private:
  static void end_now(op_node& op, std::error_code ec) noexcept {
    op.done = true;
    op.ec = ec;
    op.st = nullptr;
  }
  // Takes op out of its slot (the copy runs on, detached) or its list, and out of a bound.
  void unlist(op_node& op) noexcept {
    if (op.slot != no_peer_slot) {
      slots_[op.slot].op = nullptr;
      op.slot = no_peer_slot;
    } else if (op.st != nullptr) {
      (op.prev != nullptr ? op.prev->next : head_op_) = op.next;
      (op.next != nullptr ? op.next->prev : tail_) = op.prev;
      op.prev = op.next = nullptr;
    }
    if (op.bounded != nullptr) {
      if (op.bounded->st != nullptr) {
        unlist(*op.bounded);
      }
      op.bounded = nullptr;
    }
  }
  // Ends op with ec and resumes its coroutine, if one awaits it.
  void finish(op_node& op, std::error_code ec, std::shared_ptr<peer_state>& keep) noexcept {
    std::coroutine_handle<> h = op.waiter;
    end_pending(op, ec);
    if (h) {
      if (!keep) {
        keep = shared_from_this();
      }
      h.resume();
    }
  }
  void fail_peer(std::error_code ec, std::shared_ptr<peer_state>& keep) noexcept {
    if (!failure_) {
      failure_ = ec;
    }
    while (head_op_ != nullptr) {
      finish(*head_op_, ec, keep);
    }
  }
  void read_frames(std::shared_ptr<peer_state>& keep) noexcept {
    if (closed_ || failure_) {
      return;
    }
    for (int i = 0; i < 16; ++i) {
      frame f;
      frame_in in = receive_frame(sock_.get(), &f, sizeof f);
      if (in.closed) {
        return fail_peer(make_error_code(errc::peer_disconnected), keep);
      }
      if (in.bytes == 0) {
        return;
      }
      if (const std::string why = frame_problem(f, in.bytes); !why.empty()) {
        rdx::detail::log_hook_ref()("same-host peer: protocol error: " + why);
        return fail_peer(make_error_code(errc::protocol_error), keep);
      }
      switch (f.type) {
        case frame_type::hello: peer_ = facts_of(f); break;
        case frame_type::grant: grants_.push_back({f, std::move(in.fd)}); break;
        case frame_type::revoke: revoked_.push_back(f.id); break;
        case frame_type::bye: return fail_peer(make_error_code(errc::peer_disconnected), keep);
        case frame_type::notify:
          if (head_op_ != nullptr) {
            head_op_->tag = f.tag;
            finish(*head_op_, {}, keep);
          } else if (unread_ == arrived_.size()) {
            rdx::detail::log_hook_ref()(
                "same-host peer: more notifications arrived than max_unread_notifications");
            return fail_peer(make_error_code(errc::protocol_error), keep);
          } else {
            arrived_[(first_unread_ + unread_) % arrived_.size()] = f.tag;
            ++unread_;
          }
          break;
      }
    }
  }
  std::size_t check_bounds(std::shared_ptr<peer_state>& keep) noexcept {
    std::size_t n = 0;
    const auto now = std::chrono::steady_clock::now();
    for (bound_node* b = bounds_; b != nullptr;) {
      bound_node* next = b->next;
      const bool stop = b->stop_requested.load(std::memory_order_acquire);
      if (stop || now >= b->deadline) {
        finish(*b->op, make_error_code(stop ? errc::operation_canceled : errc::timed_out), keep);
        ++n;
        next = bounds_;  // a resumed coroutine may have changed the list: start again
      }
      b = next;
    }
    return n;
  }

  op_node* head_op_ = nullptr;  // notification waiters, oldest first
  op_node* tail_ = nullptr;
  bound_node* bounds_ = nullptr;
  unsigned tick_ = 0;
};

}  // namespace rdx::cuda::detail
