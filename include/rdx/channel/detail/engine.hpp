// rdx::detail: the state and the progress engine of a connection: completion
// dispatch, the ready list, bounded awaits (deadlines, stop requests), the
// liveness probe, failure and teardown. Posting (start functions, deferral)
// lives in detail/posting.hpp. connection (channel/connection.hpp) is the
// public face of both. docs/design.md, "Lifetimes" and "Dead peers".
#pragma once

#include <rdx/channel/detail/op_list.hpp>
#include <rdx/channel/message_ring.hpp>
#include <rdx/channel/operation.hpp>
#include <rdx/channel/send_queue.hpp>
#include <rdx/detail/thread_check.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

namespace rdx {

//! Settings of a connection; each side of a connection must use the same
//! queue_pairs, recv_depth and message_size (connect() checks).
struct connection_attr {
  std::uint32_t queue_pairs = 1;        //!< K: large writes and reads are striped over them
  std::uint32_t send_depth = 256;       //!< send-queue entries per queue pair
  std::uint32_t signal_interval = 64;   //!< at most this many work requests per signaled one
  std::uint32_t recv_depth = 64;        //!< pre-posted message buffers: the peer's credits
  std::uint32_t message_size = 4096;    //!< bytes per message buffer: the largest message
  std::size_t chunk_size = 512 * 1024;  //!< striping chunk, a multiple of 4 KiB
  bool events = false;                  //!< create a completion channel (event mode)
  std::uint8_t port = 0;                //!< 0: the first ACTIVE port
  std::optional<std::uint8_t> gid_index{};
  //! Receives that waited this long on an idle connection send a liveness
  //! probe, so a dead peer is noticed without traffic; 0 turns it off.
  std::chrono::milliseconds keepalive{1000};
  //! Longest time destruction waits for the flushed work of its queue pairs.
  std::chrono::milliseconds drain_timeout{2000};
};

//! What one side tells the other to connect: its queue pairs, its
//! flow-control word and its buffer settings.
struct connection_info {
  std::vector<endpoint> endpoints;  //!< one per queue pair, in order
  remote_descriptor credit_word{};  //!< 8 bytes the peer writes its consumed count into
  std::uint32_t recv_depth = 0;
  std::uint32_t message_size = 0;
};

namespace detail {

// Kinds of send-queue records (sq_record::kind); 0 is the engine's own cover or probe.
enum : std::uint8_t { rec_probe = 0, rec_op = 1, rec_staged = 2, rec_atomic = 3, rec_credit = 4 };

class engine {
public:
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // --- used by operation and its awaiters -------------------------------------

  inline int progress() noexcept;
  inline std::error_code run_until(std::chrono::steady_clock::time_point deadline, wait_mode mode,
                                   const operation* op) noexcept;
  inline void cover_all() noexcept;
  //! Withdraws op from every list and detaches its posted work (no resume).
  inline void forget(operation& op) noexcept;
  //! Ends a pending op now with ec; its coroutine resumes at the next progress.
  inline void end_now(operation& op, std::error_code ec) noexcept;
  //! Points the engine's records of from at to (a move).
  inline void relink(operation& from, operation& to) noexcept;
  inline void add_bounded(bounded_awaiter_base& a) noexcept;
  inline void remove_bounded(bounded_awaiter_base& a) noexcept;
  void signal_stop() noexcept {
    stop_requests_.fetch_add(1, std::memory_order_release);
    if (wake_fd_ >= 0) {
      const std::uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);
    }
  }

  // --- used by windows and channels (posting.hpp) -----------------------------

  inline void fail_now(operation& op, std::error_code ec) noexcept;
  inline void start_rdma(operation& op, op_kind kind, std::uint64_t laddr, std::uint32_t lkey,
                         std::uint64_t raddr, std::uint32_t rkey, std::uint64_t bytes) noexcept;
  inline void start_atomic(operation& op, bool cas, std::uint64_t raddr, std::uint32_t rkey, std::uint64_t a,
                           std::uint64_t b) noexcept;
  inline void start_send(operation& op, const void* data, std::size_t bytes) noexcept;
  inline void start_notify(operation& op, std::uint64_t laddr, std::uint32_t lkey, std::uint64_t raddr,
                           std::uint32_t rkey, std::uint32_t bytes, std::uint32_t tag) noexcept;
  inline void start_receive(operation& op, void* dst, std::uint32_t capacity, std::uint32_t elem_size,
                            bool exact) noexcept;
  inline void start_notification(operation& op) noexcept;
  [[nodiscard]] std::uint32_t message_capacity() const noexcept { return attr_.message_size; }

protected:
  static constexpr std::uint32_t atomic_slots = 64;

  inline engine(const protection_domain& pd, const connection_attr& attr);
  ~engine() = default;

  [[nodiscard]] inline connection_info local_info() const;
  inline void connect(const connection_info& peer, const connect_options& opt);
  inline std::error_code drain(std::chrono::nanoseconds timeout) noexcept;
  [[nodiscard]] inline std::chrono::milliseconds detection_bound() const noexcept;
  [[nodiscard]] std::uint64_t signaled_count() const noexcept {
    std::uint64_t n = 0;
    for (const auto& q : sqs_) n += q.signaled_count();
    return n;
  }
  [[nodiscard]] std::uint64_t posted_count() const noexcept {
    std::uint64_t n = 0;
    for (const auto& q : sqs_) n += q.posted_count();
    return n;
  }
  inline std::error_code arm() noexcept;
  inline void ack_event() noexcept;
  inline std::error_code wait_event(std::chrono::milliseconds timeout) noexcept;
  inline void shut_down() noexcept;

  // Members in destruction order reversed: the queue pairs (and their send
  // queues) are declared last so that they go before the memory they use.
  connection_attr attr_;
  context ctx_;
  std::optional<completion_channel> channel_;
  completion_queue cq_;
  message_ring ring_;
  registered_buffer<std::byte> staging_;
  registered_buffer<std::uint64_t> atomics_;
  index_fifo free_staging_, free_atomics_;
  op_fifo receives_{op_list::receives}, notifications_{op_list::notifications};
  op_fifo deferred_{op_list::deferred}, ready_{op_list::ready};
  bounded_awaiter_base* bounded_ = nullptr;  // intrusive list of suspended bounded awaits
  std::array<completion, 32> cq_buf_{};
  int cq_head_ = 0, cq_count_ = 0;
  remote_descriptor peer_credit_{};
  connect_options opt_{};
  std::uint64_t rr_ = 0;
  std::uint32_t idle_polls_ = 0;
  std::uint32_t ticks_ = 0;
  std::chrono::steady_clock::time_point idle_since_{};
  bool idle_clock_ = false;
  std::atomic<std::uint32_t> stop_requests_{0};
  std::uint32_t stops_seen_ = 0;
  int wake_fd_ = -1;
  bool connected_ = false;
  bool failed_ = false;
  bool closing_ = false;
  std::error_code failure_{};
  thread_check thread_;
  std::vector<queue_pair> qps_;
  std::vector<send_queue> sqs_;

  // progress internals
  inline int poll_once() noexcept;
  inline void dispatch(const completion& c) noexcept;
  inline void retire(const sq_record& r, std::error_code ec) noexcept;
  inline void finish_part(operation& op, std::error_code ec) noexcept;
  inline void complete(operation& op) noexcept;
  inline void resume_ready() noexcept;
  inline void deliver() noexcept;
  inline void consume(std::uint32_t i) noexcept;
  inline void report_credits() noexcept;
  inline void housekeeping(std::chrono::steady_clock::time_point now) noexcept;
  inline void fail(std::error_code ec) noexcept;
  [[nodiscard]] inline bool usable(operation& op) noexcept;
  [[nodiscard]] op_fifo& fifo_of(op_list l) noexcept {
    switch (l) {
      case op_list::receives: return receives_;
      case op_list::notifications: return notifications_;
      case op_list::deferred: return deferred_;
      default: return ready_;
    }
  }
  [[nodiscard]] bool something_waits() const noexcept {
    return !receives_.empty() || !notifications_.empty() || !deferred_.empty();
  }
  // posting internals (posting.hpp)
  enum class post_result { all, blocked, failed };
  inline post_result post_some(operation& op) noexcept;
  inline void pump() noexcept;
  inline void defer(operation& op) noexcept;
  [[nodiscard]] inline bool take_staging(std::uint32_t& slot) noexcept;
};

inline engine::engine(const protection_domain& pd, const connection_attr& attr)
    : attr_(attr),
      ctx_(pd.device_context()),
      channel_(attr.events ? std::optional<completion_channel>(std::in_place, ctx_) : std::nullopt),
      cq_(ctx_, completion_queue_attr{.depth = static_cast<int>(attr.queue_pairs * attr.send_depth +
                                                                attr.recv_depth + 1),
                                      .channel = channel_ ? &*channel_ : nullptr}),
      ring_(pd, attr.recv_depth, attr.message_size),
      staging_(pd, std::size_t{2} * attr.recv_depth * attr.message_size),
      atomics_(pd, atomic_slots),
      free_staging_(2 * attr.recv_depth),
      free_atomics_(atomic_slots) {
  auto bad = [](const std::string& what) { throw_rdx(errc::invalid_argument, "connection: " + what); };
  const connection_attr& a = attr;
  if (a.queue_pairs < 1 || a.queue_pairs > 64) bad("queue_pairs = " + std::to_string(a.queue_pairs) + ", need 1 to 64");
  if (a.send_depth < 2) bad("send_depth = " + std::to_string(a.send_depth) + ", need at least 2");
  if (a.signal_interval < 1 || a.signal_interval >= a.send_depth) {
    bad("signal_interval = " + std::to_string(a.signal_interval) + ", need 1 to send_depth - 1 (" +
        std::to_string(a.send_depth - 1) + ")");
  }
  if (a.recv_depth < 1) bad("recv_depth = 0, need at least 1");
  if (a.message_size < 1) bad("message_size = 0, need at least 1");
  if (a.chunk_size == 0 || a.chunk_size % 4096 != 0 || a.chunk_size > (std::size_t{1} << 30)) {
    bad("chunk_size = " + std::to_string(a.chunk_size) + ", need a multiple of 4096 up to 1 GiB");
  }
  if (a.keepalive.count() < 0 || a.drain_timeout.count() < 0) bad("keepalive and drain_timeout must not be negative");
  if (attr_.events) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw error(std::error_code(errno, std::generic_category()), "connection: eventfd (stop-request wake-up)");
  }
  for (std::uint32_t i = 0; i < 2 * attr_.recv_depth; ++i) free_staging_.push(i);
  for (std::uint32_t i = 0; i < atomic_slots; ++i) free_atomics_.push(i);
  qps_.reserve(attr_.queue_pairs);
  sqs_.reserve(attr_.queue_pairs);
  try {
    for (std::uint32_t i = 0; i < attr_.queue_pairs; ++i) {
      queue_pair_attr qa{.max_send_wr = attr_.send_depth,
                         .max_recv_wr = i == 0 ? attr_.recv_depth : 1,
                         .port = attr_.port,
                         .gid_index = attr_.gid_index,
                         .remote_access = access::remote_write | access::remote_read | access::remote_atomic};
      qps_.emplace_back(pd, cq_, cq_, qa);
      qps_.back().to_init();
      sqs_.emplace_back(qps_.back(), attr_.send_depth, attr_.signal_interval);
    }
    for (std::uint32_t i = 0; i < attr_.recv_depth; ++i) {
      if (std::error_code ec = ring_.post(qps_[0], i)) {
        throw error(ec, "connection: posting receive buffer " + std::to_string(i));
      }
    }
  } catch (...) {
    shut_down();
    throw;
  }
}

inline connection_info engine::local_info() const {
  connection_info i;
  for (const auto& q : qps_) i.endpoints.push_back(q.local_endpoint());
  i.credit_word = ring_.credit_word();
  i.recv_depth = attr_.recv_depth;
  i.message_size = attr_.message_size;
  return i;
}

inline void engine::connect(const connection_info& peer, const connect_options& opt) {
  auto differ = [](const char* what, std::uint64_t here, std::uint64_t there) {
    throw_rdx(errc::invalid_argument, std::string("connection::connect: ") + what + " is " + std::to_string(here) +
                                          " here but " + std::to_string(there) + " at the peer; both sides need the same");
  };
  if (peer.endpoints.size() != qps_.size()) differ("queue_pairs", qps_.size(), peer.endpoints.size());
  if (peer.recv_depth != attr_.recv_depth) differ("recv_depth", attr_.recv_depth, peer.recv_depth);
  if (peer.message_size != attr_.message_size) differ("message_size", attr_.message_size, peer.message_size);
  if (peer.credit_word.length < 8 || peer.credit_word.addr % 8 != 0) {
    throw_rdx(errc::invalid_argument, "connection::connect: the peer's credit word is not 8 aligned bytes");
  }
  // 7 means "retry forever" for rnr_retry (IBTA) and, in Soft-RoCE, for
  // retry_cnt too: a connection's waits must end, so both become 6.
  connect_options o = opt;
  if (o.rnr_retry == 7) o.rnr_retry = 6;
  if (o.retry_cnt == 7) o.retry_cnt = 6;
  for (std::size_t i = 0; i < qps_.size(); ++i) qps_[i].connect(peer.endpoints[i], o);
  peer_credit_ = peer.credit_word;
  opt_ = o;
  connected_ = true;
}

inline std::chrono::milliseconds engine::detection_bound() const noexcept {
  const double ack_us = 4.096 * static_cast<double>(std::uint64_t{1} << opt_.timeout);
  const double retries_us = (opt_.retry_cnt + 1.0) * 4.0 * ack_us;
  return attr_.keepalive + std::chrono::milliseconds(static_cast<std::int64_t>(retries_us / 1000.0) + 1);
}

// --- progress ---------------------------------------------------------------------

inline int engine::poll_once() noexcept {
  if (cq_head_ == cq_count_) {
    const int n = cq_.poll(std::span<completion>(cq_buf_));
    if (n < 0) {
      fail({-n, std::generic_category()});
      return 0;
    }
    cq_head_ = 0;
    cq_count_ = n;
  }
  // Each completion is taken off the buffer before it is handled, so a
  // nested poll (a coroutine resumed here polls again) keeps the order.
  int handled = 0;
  while (cq_head_ < cq_count_) {
    const completion c = cq_buf_[cq_head_++];
    dispatch(c);
    ++handled;
  }
  return handled;
}

inline int engine::progress() noexcept {
  thread_check::scope guard(thread_, "progress");
  if (stop_requests_.load(std::memory_order_acquire) != stops_seen_) housekeeping({});
  const int handled = poll_once();
  if (handled > 0) {
    idle_polls_ = 0;
    idle_clock_ = false;
  }
  if (!deferred_.empty()) pump();
  if (ring_.report_due() && connected_ && !failed_) report_credits();
  if ((handled == 0 && (++idle_polls_ & 63) == 0) || (bounded_ != nullptr && (++ticks_ & 63) == 0)) {
    housekeeping(std::chrono::steady_clock::now());
  }
  resume_ready();
  return handled;
}

inline std::error_code engine::run_until(std::chrono::steady_clock::time_point deadline, wait_mode mode,
                                         const operation* op) noexcept {
  cover_all();
  unsigned spins = 0;
  for (;;) {
    if (op != nullptr && op->done()) return op->error();
    if (op == nullptr && failed_) return failure_;
    if (mode == wait_mode::events) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return make_error_code(errc::timed_out);
      std::error_code ec = wait_event(left);
      if (ec && ec != errc::timed_out) return ec;
      continue;
    }
    progress();
    if (++spins % 64 == 0 && std::chrono::steady_clock::now() >= deadline) {
      if (op == nullptr || !op->done()) return make_error_code(errc::timed_out);
    }
  }
}

inline void engine::cover_all() noexcept {
  if (failed_) return;
  for (auto& q : sqs_) (void)q.cover();
}

inline void engine::dispatch(const completion& c) noexcept {
  if ((c.wr_id() & send_queue::wr_id_tag) != 0) {
    for (auto& q : sqs_) {
      if (q.qp_num() != c.qp_num()) continue;
      const bool was_failed = failed_;
      q.retire(c, was_failed, [this](const sq_record& r, std::error_code ec) { retire(r, ec); });
      if (!c.ok() && !was_failed) fail(c.error());
      return;
    }
    return;
  }
  if (!ring_.owns(c.wr_id())) return;
  if (ring_.arrived(c) == message_ring::arrival::failed) {
    if (!failed_) fail(c.error());
    return;
  }
  if (!ring_.peer_count_valid()) return fail(make_error_code(errc::protocol_error));
  deliver();
}

inline void engine::retire(const sq_record& r, std::error_code ec) noexcept {
  auto* op = static_cast<operation*>(r.owner);
  if (r.kind == rec_staged) free_staging_.push(r.aux);
  if (r.kind == rec_atomic) {
    if (op != nullptr && !ec) op->value_ = atomics_[r.aux];
    free_atomics_.push(r.aux);
  }
  if (op != nullptr) finish_part(*op, closing_ ? make_error_code(errc::operation_aborted) : ec);
}

inline void engine::finish_part(operation& op, std::error_code ec) noexcept {
  if (ec && !op.ec_) op.ec_ = ec;
  if (op.pending_ > 0) --op.pending_;
  if (op.pending_ == 0 && op.list_ != op_list::deferred) complete(op);
}

inline void engine::complete(operation& op) noexcept {
  op.done_ = true;
  if (closing_) {
    op.waiter_ = {};
    return;
  }
  if (op.waiter_) ready_.push(op);
}

inline void engine::resume_ready() noexcept {
  // Each is taken off the list first: a coroutine that polls again (nested)
  // keeps the order, and one that destroys a sibling takes it off the list.
  while (!closing_ && !ready_.empty()) {
    operation* op = ready_.pop();
    std::coroutine_handle<> h = std::exchange(op->waiter_, {});
    if (h) h.resume();  // op may be gone after this
  }
}

// Hands queued messages and notifications to waiting receives, in order.
inline void engine::deliver() noexcept {
  while (!receives_.empty() && ring_.messages_waiting() > 0) {
    operation& op = *receives_.pop();
    const std::uint32_t i = ring_.take_message();
    const std::uint32_t n = ring_.entry(i).bytes;
    op.bytes_ = n;
    if (n > op.dst_capacity_ || n % op.elem_size_ != 0 || (op.exact_ && n != op.dst_capacity_)) {
      op.ec_ = make_error_code(errc::limit_exceeded);
    } else {
      std::memcpy(op.dst_, ring_.data(i), n);
    }
    consume(i);
    complete(op);
  }
  while (!notifications_.empty() && ring_.notifications_waiting() > 0) {
    operation& op = *notifications_.pop();
    const std::uint32_t i = ring_.take_notification();
    op.bytes_ = ring_.entry(i).bytes;
    op.value_ = ring_.entry(i).imm;
    consume(i);
    complete(op);
  }
  if (failed_) {
    // Nothing more will arrive: waiting receives end with the failure.
    while (!receives_.empty()) {
      operation& op = *receives_.pop();
      op.ec_ = failure_;
      complete(op);
    }
    while (!notifications_.empty()) {
      operation& op = *notifications_.pop();
      op.ec_ = failure_;
      complete(op);
    }
  }
}

// Reposts a taken buffer and counts it; credits go back piggybacked on the
// next message, or by an RDMA write of the count once a quarter is owed.
inline void engine::consume(std::uint32_t i) noexcept {
  if (failed_) return;
  if (std::error_code ec = ring_.post(qps_[0], i)) return fail(ec);
  ring_.count_consumed();
  if (ring_.report_due() && connected_) report_credits();
}

inline void engine::report_credits() noexcept {
  send_queue& q = sqs_[0];
  if (!q.has_room()) return;  // no room now; progress() tries again
  send_wr w = ring_.credit_report(peer_credit_);
  if (!q.post(w, nullptr, rec_credit)) ring_.reported();
}

// Deadlines, stop requests and the liveness probe; now is empty when only
// stop requests are to be looked at.
inline void engine::housekeeping(std::chrono::steady_clock::time_point now) noexcept {
  stops_seen_ = stop_requests_.load(std::memory_order_acquire);
  for (bounded_awaiter_base* a = bounded_; a != nullptr;) {
    bounded_awaiter_base* next = a->next_;
    operation& op = *a->op_;
    if (!op.done_) {
      if (a->stop_requested_.load(std::memory_order_acquire)) {
        end_now(op, make_error_code(errc::operation_canceled));
      } else if (now != std::chrono::steady_clock::time_point{} && a->deadline_ <= now) {
        end_now(op, make_error_code(errc::timed_out));
      }
    }
    a = next;
  }
  if (now == std::chrono::steady_clock::time_point{} || attr_.keepalive.count() == 0) return;
  // Liveness: receives (or deferred sends) wait and nothing is in flight
  // that would notice a dead peer by itself.
  if (!connected_ || failed_ || !something_waits() || sqs_[0].outstanding() != 0) {
    idle_clock_ = false;
    return;
  }
  if (!idle_clock_) {
    idle_clock_ = true;
    idle_since_ = now;
  } else if (now - idle_since_ >= attr_.keepalive) {
    (void)sqs_[0].probe();
    idle_since_ = now;
  }
}

// The first failure: every queue pair goes to error so that all posted work
// flushes; deferred operations end now, waiting receives once nothing is left.
inline void engine::fail(std::error_code ec) noexcept {
  if (failed_) return;
  failed_ = true;
  failure_ = ec;
  for (auto& q : qps_) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    (void)::ibv_modify_qp(q.native_handle(), &a, IBV_QP_STATE);
  }
  while (!deferred_.empty()) {
    operation& op = *deferred_.pop();
    if (op.p_.slot != no_slot) free_staging_.push(std::exchange(op.p_.slot, no_slot));
    if (!op.ec_) op.ec_ = ec;
    if (op.pending_ == 0) complete(op);
  }
  deliver();
}

// --- lifetimes ----------------------------------------------------------------------

inline void engine::forget(operation& op) noexcept {
  thread_check::scope guard(thread_, "destroying or canceling an operation");
  if (op.list_ != op_list::none) fifo_of(op.list_).erase(op);
  if (op.p_.slot != no_slot) free_staging_.push(std::exchange(op.p_.slot, no_slot));
  if (op.pending_ != 0) {
    for (auto& q : sqs_) {
      q.for_each_outstanding([&](sq_record& r) {
        if (r.owner == &op) r.owner = nullptr;
      });
    }
    op.pending_ = 0;
  }
}

inline void engine::end_now(operation& op, std::error_code ec) noexcept {
  forget(op);
  op.ec_ = ec;
  complete(op);
}

inline void engine::relink(operation& from, operation& to) noexcept {
  if (from.list_ != op_list::none) fifo_of(from.list_).replace(from, to);
  if (from.pending_ != 0) {
    for (auto& q : sqs_) {
      q.for_each_outstanding([&](sq_record& r) {
        if (r.owner == &from) r.owner = &to;
      });
    }
  }
  if (from.bounded_ != nullptr) from.bounded_->op_ = &to;
}

inline void engine::add_bounded(bounded_awaiter_base& a) noexcept {
  a.prev_ = nullptr;
  a.next_ = bounded_;
  if (bounded_ != nullptr) bounded_->prev_ = &a;
  bounded_ = &a;
}

inline void engine::remove_bounded(bounded_awaiter_base& a) noexcept {
  if (a.prev_ != nullptr) {
    a.prev_->next_ = a.next_;
  } else if (bounded_ == &a) {
    bounded_ = a.next_;
  }
  if (a.next_ != nullptr) a.next_->prev_ = a.prev_;
  a.prev_ = a.next_ = nullptr;
  a.conn_ = nullptr;
}

inline std::error_code engine::drain(std::chrono::nanoseconds timeout) noexcept {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  cover_all();
  for (unsigned spins = 0;; ++spins) {
    bool busy = false;
    for (const auto& q : sqs_) busy = busy || q.outstanding() != 0;
    if (!busy) return {};
    progress();
    if (spins % 64 == 63 && std::chrono::steady_clock::now() >= deadline) return make_error_code(errc::timed_out);
  }
}

// Queue pairs to error, drained (bounded), every operation ended with
// operation_aborted and no coroutine resumed; then the queue pairs go, and
// after them (member order) the memory they used.
inline void engine::shut_down() noexcept {
  closing_ = true;
  while (bounded_ != nullptr) {
    bounded_awaiter_base& a = *bounded_;
    a.callback_.reset();  // waits for a stop callback running on another thread
    remove_bounded(a);
  }
  const std::error_code aborted = make_error_code(errc::operation_aborted);
  for (op_fifo* f : {&deferred_, &receives_, &notifications_}) {
    while (!f->empty()) {
      operation& op = *f->pop();
      if (op.p_.slot != no_slot) free_staging_.push(std::exchange(op.p_.slot, no_slot));
      op.ec_ = aborted;
      if (op.pending_ == 0) complete(op);
    }
  }
  failed_ = true;
  if (!failure_) failure_ = aborted;
  for (auto& q : qps_) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    (void)::ibv_modify_qp(q.native_handle(), &a, IBV_QP_STATE);
  }
  const auto deadline = std::chrono::steady_clock::now() + attr_.drain_timeout;
  for (unsigned spins = 0;; ++spins) {
    bool busy = ring_.posted() != 0;
    for (const auto& q : sqs_) busy = busy || q.outstanding() != 0;
    if (!busy) break;
    poll_once();
    if (spins % 64 == 63 && std::chrono::steady_clock::now() >= deadline) {
      report_destroy_failure("connection: draining its queue pairs after error (drain_timeout)", ETIMEDOUT);
      break;
    }
  }
  for (auto& q : sqs_) q.retire_all(aborted, [this](const sq_record& r, std::error_code ec) { retire(r, ec); });
  while (!ready_.empty()) ready_.pop()->waiter_ = {};
  sqs_.clear();
  qps_.clear();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
}

// --- event mode ---------------------------------------------------------------------

inline std::error_code engine::arm() noexcept {
  if (!channel_) return make_error_code(errc::not_ready);
  cover_all();
  return cq_.arm();
}

inline void engine::ack_event() noexcept {
  if (!channel_) return;
  pollfd p{channel_->fd(), POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return;
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  if (::ibv_get_cq_event(channel_->native_handle(), &cq, &ctx) == 0) ::ibv_ack_cq_events(cq, 1);
}

inline std::error_code engine::wait_event(std::chrono::milliseconds timeout) noexcept {
  if (!channel_) return make_error_code(errc::not_ready);
  if (progress() > 0) return {};
  if (std::error_code ec = arm()) return ec;
  if (progress() > 0) return {};  // completions that came before arming raise no event
  // Sleep no longer than the next deadline, the keepalive, or (while sends
  // wait for credits, which arrive by RDMA write and raise no event) 1 ms.
  auto now = std::chrono::steady_clock::now();
  auto until = now + timeout;
  for (bounded_awaiter_base* a = bounded_; a != nullptr; a = a->next_) until = std::min(until, a->deadline_);
  if (attr_.keepalive.count() > 0 && something_waits()) until = std::min(until, now + attr_.keepalive / 4);
  if (!deferred_.empty()) until = std::min(until, now + std::chrono::milliseconds(1));
  const int ms = static_cast<int>(std::max<std::int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(until - now).count()));
  pollfd p[2] = {{channel_->fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  const int r = ::poll(p, 2, ms);
  if (r > 0 && (p[1].revents & POLLIN) != 0) {
    std::uint64_t v = 0;
    (void)!::read(wake_fd_, &v, sizeof v);
  }
  if (r > 0 && (p[0].revents & POLLIN) != 0) ack_event();
  housekeeping(std::chrono::steady_clock::now());
  progress();
  if (r < 0 && errno != EINTR) return {errno, std::generic_category()};
  return r == 0 && std::chrono::steady_clock::now() >= now + timeout ? make_error_code(errc::timed_out) : std::error_code{};
}

}  // namespace detail
}  // namespace rdx

#include <rdx/channel/detail/posting.hpp>
