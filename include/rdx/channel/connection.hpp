// rdx: a connection of K reliable queue pairs sharing one completion queue:
// the engine under windows (one-sided) and channels (two-sided). It owns the
// send-queue credit accounting, selective signaling, completion dispatch,
// flow-controlled message buffers, and event mode. Single-threaded: one
// thread uses a connection and the operations started on it.
#pragma once

#include <rdx/verbs/endpoint.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/work_request.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <poll.h>

namespace rdx {

class connection;

//! How a wait blocks: busy polling, or sleeping on the completion channel
//! (the connection must have been made with events = true).
enum class wait_mode { poll, events };

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
  //! Longest time an operation waits for send-queue room or flow-control credits.
  std::chrono::milliseconds resource_timeout{30000};
};

//! What one side tells the other to connect: its queue pairs, its
//! flow-control word and its buffer settings.
struct connection_info {
  std::vector<endpoint> endpoints;  //!< one per queue pair, in order
  remote_descriptor credit_word{};  //!< 8 bytes the peer writes its consumed count into
  std::uint32_t recv_depth = 0;
  std::uint32_t message_size = 0;
};

inline constexpr std::chrono::nanoseconds default_wait_timeout = std::chrono::seconds(30);

//! One operation: its state and its handle. Started by a window, a channel or
//! a connection, it completes exactly once, with success or the error that
//! stopped it. Neither copyable nor movable: its address travels as wr_id, so
//! it lives where it was returned (a local, or a coroutine frame when
//! co_awaited). Destroying an operation that has not completed waits for it.
class operation {
public:
  operation(const operation&) = delete;
  operation& operator=(const operation&) = delete;
  inline ~operation();

  //! True once the operation completed (no polling).
  [[nodiscard]] bool done() const noexcept { return done_; }
  //! Empty on success; errc (rdx_category) for a check that failed before
  //! posting or after an earlier failure; an ibv_wc_status (wc_category, with a
  //! hint) when the NIC reported one. Meaningful once done().
  [[nodiscard]] std::error_code error() const noexcept { return ec_; }
  [[nodiscard]] bool ok() const noexcept { return done_ && !ec_; }
  //! Bytes received (receives and notifications).
  [[nodiscard]] std::uint32_t byte_count() const noexcept { return bytes_; }
  //! The remote word's previous value (fetch_add, compare_swap).
  [[nodiscard]] std::uint64_t old_value() const noexcept { return value_; }
  //! The 32-bit tag of a notification.
  [[nodiscard]] std::uint32_t tag() const noexcept { return static_cast<std::uint32_t>(value_); }

  //! Polls the connection once without blocking. @return done().
  [[nodiscard]] inline bool test() noexcept;
  //! Waits until done or timeout, busy polling (wait_mode::poll) or sleeping
  //! on the completion channel (wait_mode::events).
  //! @return error() when done, else errc::timed_out (the operation stays pending).
  [[nodiscard]] inline std::error_code wait(std::chrono::nanoseconds timeout = default_wait_timeout,
                                            wait_mode mode = wait_mode::poll) noexcept;

  // Awaitable: the coroutine resumes inline in whichever call polls the
  // connection (wait, test, progress, wait_event) when the completion arrives.
  [[nodiscard]] bool await_ready() const noexcept { return done_; }
  inline void await_suspend(std::coroutine_handle<> h) noexcept;
  std::error_code await_resume() const noexcept { return ec_; }

  //! Internal: a started operation; start(op) posts it (or fails it).
  struct start_tag {};
  template <class F>
  operation(start_tag, connection& c, F&& start) noexcept : conn_(&c) {
    start(*this);
  }

protected:
  explicit operation(connection& c) noexcept : conn_(&c) {}

private:
  friend class connection;
  connection* conn_;
  std::error_code ec_{};
  std::uint32_t pending_ = 0;  // work requests (or the one receive) not yet finished
  std::uint32_t bytes_ = 0;
  std::uint64_t value_ = 0;
  std::coroutine_handle<> waiter_{};
  operation* next_ = nullptr;  // intrusive queues: waiting receives, resumption list
  std::byte* dst_ = nullptr;   // receive destination
  std::uint32_t dst_capacity_ = 0;
  std::uint32_t elem_size_ = 1;  // a received message must be a multiple of it
  bool exact_ = false;           // a received message must fill dst exactly
  bool done_ = false;
  bool queued_ = false;  // in a waiting-receive queue
};

namespace detail {

// What a send-queue entry retires into.
enum class sq_kind : std::uint8_t { op, staged, atomic, probe, credit };

struct sq_entry {
  operation* op = nullptr;
  std::uint64_t wr_id = 0;
  std::uint32_t aux = 0;  // staging or atomic slot
  sq_kind kind = sq_kind::op;
  bool signaled = false;
};

// A received buffer, in the ring of pre-posted receives.
struct rx_entry {
  std::uint32_t index = 0;
  std::uint32_t bytes = 0;
  std::uint32_t imm = 0;
  bool posted = false;
};

// A fixed-capacity FIFO of indices.
class index_fifo {
public:
  void reset(std::uint32_t capacity) {
    buf_ = std::make_unique<std::uint32_t[]>(capacity);
    cap_ = capacity;
    head_ = tail_ = 0;
  }
  [[nodiscard]] bool empty() const noexcept { return head_ == tail_; }
  [[nodiscard]] std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(tail_ - head_); }
  void push(std::uint32_t v) noexcept { buf_[tail_++ % cap_] = v; }
  std::uint32_t pop() noexcept { return buf_[head_++ % cap_]; }

private:
  std::unique_ptr<std::uint32_t[]> buf_;
  std::uint64_t cap_ = 1, head_ = 0, tail_ = 0;
};

// An intrusive FIFO of operations.
struct op_fifo {
  operation* head = nullptr;
  operation* tail = nullptr;
};

[[nodiscard]] inline bool serial_after(std::uint32_t a, std::uint32_t b) noexcept {
  return static_cast<std::int32_t>(a - b) > 0;
}

}  // namespace detail

//! K reliable queue pairs of one protection domain sharing one completion
//! queue sized for all of them (K x send_depth + recv_depth), so no queue can
//! overflow. Not movable: operations and receive buffers point into it.
class connection {
public:
  //! Creates the queue pairs (RESET -> INIT), the completion queue, and the
  //! registered message ring, staging and flow-control buffers; posts every
  //! receive. @throws rdx::error for settings out of range or a failed verb.
  connection(const protection_domain& pd, const connection_attr& attr = {})
      : attr_(checked(attr)),
        ctx_(pd.device_context()),
        channel_(attr.events ? std::optional<completion_channel>(std::in_place, ctx_) : std::nullopt),
        cq_(ctx_, completion_queue_attr{.depth = static_cast<int>(attr.queue_pairs * attr.send_depth +
                                                                  attr.recv_depth + 1),
                                        .channel = channel_ ? &*channel_ : nullptr}),
        rx_buf_(pd, std::size_t{attr.recv_depth} * attr.message_size),
        staging_(pd, std::size_t{attr.recv_depth} * attr.message_size),
        atomics_(pd, atomic_slots),
        control_(pd, 2, access::local_write | access::remote_write) {
    qps_.reserve(attr_.queue_pairs);
    for (std::uint32_t i = 0; i < attr_.queue_pairs; ++i) {
      queue_pair_attr qa{.max_send_wr = attr_.send_depth,
                         .max_recv_wr = i == 0 ? attr_.recv_depth : 1,
                         .port = attr_.port,
                         .gid_index = attr_.gid_index,
                         .remote_access = access::remote_write | access::remote_read | access::remote_atomic};
      qps_.emplace_back(pd, cq_, qa, attr_.send_depth);
      qps_.back().qp.to_init();
    }
    rx_ = std::make_unique<detail::rx_entry[]>(attr_.recv_depth);
    rx_messages_.reset(attr_.recv_depth);
    rx_notes_.reset(attr_.recv_depth);
    free_staging_.reset(attr_.recv_depth);
    for (std::uint32_t i = 0; i < attr_.recv_depth; ++i) free_staging_.push(i);
    free_atomics_.reset(atomic_slots);
    for (std::uint32_t i = 0; i < atomic_slots; ++i) free_atomics_.push(i);
    for (std::uint32_t i = 0; i < attr_.recv_depth; ++i) {
      rx_[i].index = i;
      if (std::error_code ec = post_rx(i))
        throw error(ec, "connection: posting receive buffer " + std::to_string(i));
    }
  }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection() = default;

  [[nodiscard]] const connection_attr& attributes() const noexcept { return attr_; }
  [[nodiscard]] std::uint32_t queue_pair_count() const noexcept { return attr_.queue_pairs; }
  [[nodiscard]] queue_pair& qp(std::size_t i) noexcept { return qps_[i].qp; }
  [[nodiscard]] completion_queue& cq() noexcept { return cq_; }
  //! Largest message a channel on this connection carries, in bytes.
  [[nodiscard]] std::uint32_t message_size() const noexcept { return attr_.message_size; }

  //! What the peer needs to connect (send it through tcp exchange or any means).
  [[nodiscard]] connection_info local_info() const {
    connection_info i;
    for (const auto& q : qps_) i.endpoints.push_back(q.qp.local_endpoint());
    remote_descriptor d = control_.remote();
    i.credit_word = {d.addr + 8, d.rkey, 8};
    i.recv_depth = attr_.recv_depth;
    i.message_size = attr_.message_size;
    return i;
  }

  //! Connects every queue pair to the peer's. @throws rdx::error when the
  //! peer's settings differ from ours (queue pairs, recv_depth, message_size)
  //! or a transition fails.
  void connect(const connection_info& peer, const connect_options& opt = {}) {
    auto differ = [](const char* what, std::uint64_t here, std::uint64_t there) {
      detail::throw_rdx(errc::invalid_argument,
                        std::string("connection::connect: ") + what + " is " + std::to_string(here) +
                            " here but " + std::to_string(there) + " at the peer; both sides need the same");
    };
    if (peer.endpoints.size() != qps_.size()) differ("queue_pairs", qps_.size(), peer.endpoints.size());
    if (peer.recv_depth != attr_.recv_depth) differ("recv_depth", attr_.recv_depth, peer.recv_depth);
    if (peer.message_size != attr_.message_size)
      differ("message_size", attr_.message_size, peer.message_size);
    if (peer.credit_word.length < 8 || peer.credit_word.addr % 8 != 0) {
      detail::throw_rdx(errc::invalid_argument,
                        "connection::connect: the peer's credit word is not 8 aligned bytes");
    }
    for (std::size_t i = 0; i < qps_.size(); ++i) qps_[i].qp.connect(peer.endpoints[i], opt);
    peer_credit_ = peer.credit_word;
    connected_ = true;
  }

  // --- progress -----------------------------------------------------------

  //! Polls the completion queue once (no blocking) and finishes what
  //! completed; coroutines waiting on those operations resume here, inline.
  //! @return completions handled.
  int progress() noexcept {
    int handled = 0;
    if (cq_head_ == cq_count_) {
      int n = cq_.poll(std::span<completion>(cq_buf_));
      if (n < 0) {
        fail({-n, std::generic_category()});
        resume_ready();
        return 0;
      }
      cq_head_ = 0;
      cq_count_ = n;
    }
    // Each completion is taken off the buffer before it is handled, so a
    // coroutine resumed here may poll again (nested) without reordering.
    while (cq_head_ < cq_count_) {
      const completion c = cq_buf_[cq_head_++];
      dispatch(c);
      ++handled;
    }
    if (credit_report_due()) report_credits();
    resume_ready();
    return handled;
  }

  //! True once a work request failed: every later operation fails at once
  //! with errc::operation_failed; failure_reason() holds the first error.
  [[nodiscard]] bool failed() const noexcept { return failed_; }
  [[nodiscard]] std::error_code failure_reason() const noexcept { return failure_; }

  //! Work requests posted and not yet retired on queue pair i (send-queue
  //! credit accounting: never above send_depth).
  [[nodiscard]] std::uint32_t outstanding(std::size_t i = 0) const noexcept {
    return static_cast<std::uint32_t>(qps_[i].tail - qps_[i].head);
  }
  //! Signaled work requests posted so far (all queue pairs).
  [[nodiscard]] std::uint64_t signaled_count() const noexcept { return signaled_; }
  [[nodiscard]] std::uint64_t posted_count() const noexcept { return posted_; }

  // --- event mode -----------------------------------------------------------

  //! The completion channel's descriptor for an application's epoll loop
  //! (readable when a completion waits), or -1 without events.
  [[nodiscard]] int fd() const noexcept { return channel_ ? channel_->fd() : -1; }
  //! Before blocking on fd(): makes sure every posted work request will
  //! produce a completion and arms the CQ. After fd() is readable call
  //! ack_event(), then progress(). @return errc::not_ready without events.
  [[nodiscard]] std::error_code arm() noexcept {
    if (!channel_) return make_error_code(errc::not_ready);
    for (auto& q : qps_) ensure_covered(q);
    return cq_.arm();
  }
  //! Takes the event that made fd() readable (non-blocking; nothing waits: ok).
  void ack_event() noexcept {
    if (!channel_) return;
    pollfd p{channel_->fd(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return;
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    if (::ibv_get_cq_event(channel_->native_handle(), &cq, &ctx) == 0) ::ibv_ack_cq_events(cq, 1);
  }
  //! Event mode: progress if anything completed, else arm, sleep on the channel
  //! up to timeout, and progress. @return empty when something was handled
  //! or an event came; errc::timed_out; errc::not_ready without events.
  [[nodiscard]] std::error_code wait_event(std::chrono::milliseconds timeout) noexcept {
    if (!channel_) return make_error_code(errc::not_ready);
    if (progress() > 0) return {};
    if (std::error_code ec = arm()) return ec;
    if (progress() > 0) return {};  // completions that came before arming raise no event
    std::error_code ec = cq_.wait_event(timeout);
    progress();
    return ec;
  }

  // --- internal: used by operation, windows and channels ------------------

  //! Fails op at once (a check before posting).
  void fail_now(operation& op, std::error_code ec) noexcept {
    op.ec_ = ec;
    op.pending_ = 0;
    op.done_ = true;
  }

  //! RDMA write or read of bytes between local memory (lkey) and the peer
  //! (raddr, rkey), split in chunk_size pieces aligned to chunk_size in the
  //! remote address space, round-robin over the queue pairs.
  void start_rdma(operation& op, ibv_wr_opcode opcode, std::uint64_t laddr, std::uint32_t lkey,
                  std::uint64_t raddr, std::uint32_t rkey, std::uint64_t bytes) noexcept {
    if (!usable(op)) return;
    if (bytes == 0) return fail_now(op, make_error_code(errc::invalid_argument));
    const std::uint64_t chunk = attr_.chunk_size;
    std::uint64_t chunks = 0;
    for (std::uint64_t pos = 0; pos < bytes;) {
      pos += std::min(bytes - pos, chunk - (raddr + pos) % chunk);
      ++chunks;
    }
    op.pending_ = static_cast<std::uint32_t>(chunks);
    std::uint64_t pos = 0;
    for (std::uint64_t k = 0; k < chunks; ++k) {
      const std::uint64_t len = std::min(bytes - pos, chunk - (raddr + pos) % chunk);
      auto& q = qps_[qps_.size() == 1 ? 0 : rr_++ % qps_.size()];
      std::error_code ec = spin_until([&] { return room(q); });
      if (!ec) {
        ibv_sge sge{laddr + pos, static_cast<std::uint32_t>(len), lkey};
        send_wr w = opcode == IBV_WR_RDMA_READ ? wr::read(sge, remote_ptr{raddr + pos, rkey}, &op)
                                               : wr::write(sge, remote_ptr{raddr + pos, rkey}, &op);
        ec = post(q, w, &op, detail::sq_kind::op, 0);
      }
      if (ec) {
        // Chunks already posted finish on their own; the rest fail here.
        const auto left = static_cast<std::uint32_t>(chunks - k);
        for (std::uint32_t j = 0; j < left; ++j) finish_part(op, ec);
        break;
      }
      pos += len;
    }
    resume_ready();
  }

  //! Fetch-and-add or compare-and-swap on the peer's 8-byte word.
  void start_atomic(operation& op, bool cas, std::uint64_t raddr, std::uint32_t rkey, std::uint64_t a,
                    std::uint64_t b) noexcept {
    if (!usable(op)) return;
    op.pending_ = 1;
    auto& q = qps_[0];
    std::error_code ec = spin_until([&] { return !free_atomics_.empty() && room(q); });
    if (ec) {
      finish_part(op, ec);
      resume_ready();
      return;
    }
    const std::uint32_t slot = free_atomics_.pop();
    ibv_sge sge = atomics_.sge(slot, 1);
    send_wr w = cas ? wr::compare_swap(sge, remote_ptr{raddr, rkey}, a, b, &op)
                    : wr::fetch_add(sge, remote_ptr{raddr, rkey}, a, &op);
    if ((ec = post(q, w, &op, detail::sq_kind::atomic, slot))) {
      free_atomics_.push(slot);
      finish_part(op, ec);
    }
    resume_ready();
  }

  //! Sends one message (send with immediate; the immediate returns credits)
  //! on queue pair 0. Waits, polling, for a flow-control credit, so the
  //! peer never sees a send without a posted receive.
  void start_send(operation& op, const void* data, std::size_t bytes) noexcept {
    if (!usable(op)) return;
    if (bytes == 0) return fail_now(op, make_error_code(errc::invalid_argument));
    if (bytes > attr_.message_size) return fail_now(op, make_error_code(errc::limit_exceeded));
    op.pending_ = 1;
    auto& q = qps_[0];
    const bool inl = bytes <= q.qp.max_inline_data();
    // One check of everything it needs: a coroutine resumed while polling
    // may take a credit or a slot, so none is held across a poll.
    std::error_code ec =
        spin_until([&] { return credits() > 0 && (inl || !free_staging_.empty()) && room(q); });
    if (ec) {
      finish_part(op, ec);
      resume_ready();
      return;
    }
    ibv_sge sge{};
    std::uint32_t slot = 0;
    detail::sq_kind kind = detail::sq_kind::op;
    if (inl) {
      // Inline: the payload is copied into the work request at post time.
      sge = {reinterpret_cast<std::uint64_t>(data), static_cast<std::uint32_t>(bytes), 0};
    } else {
      slot = free_staging_.pop();
      std::memcpy(staging_.data() + std::size_t{slot} * attr_.message_size, data, bytes);
      sge = staging_.sge(std::size_t{slot} * attr_.message_size, bytes);
      kind = detail::sq_kind::staged;
    }
    send_wr w = wr::send_imm(sge, consumed_, &op);
    reported_ = consumed_;
    if ((ec = post(q, w, &op, kind, slot))) {
      if (kind == detail::sq_kind::staged) free_staging_.push(slot);
      finish_part(op, ec);
    } else {
      ++sent_;
    }
    resume_ready();
  }

  //! RDMA write with immediate (tag) on queue pair 0: consumes one of the
  //! peer's receive buffers like a message. bytes may be 0 (a bare tag).
  void start_notify(operation& op, std::uint64_t laddr, std::uint32_t lkey, std::uint64_t raddr,
                    std::uint32_t rkey, std::uint32_t bytes, std::uint32_t tag) noexcept {
    if (!usable(op)) return;
    op.pending_ = 1;
    auto& q = qps_[0];
    std::error_code ec = spin_until([&] { return credits() > 0 && room(q); });
    if (ec) {
      finish_part(op, ec);
      resume_ready();
      return;
    }
    ibv_sge sge{laddr, bytes, lkey};
    send_wr w = bytes == 0 ? wr::write_imm(std::span<const ibv_sge>{}, remote_ptr{raddr, rkey}, tag, &op)
                           : wr::write_imm(sge, remote_ptr{raddr, rkey}, tag, &op);
    if ((ec = post(q, w, &op, detail::sq_kind::op, 0))) {
      finish_part(op, ec);
    } else {
      ++sent_;
    }
    resume_ready();
  }

  //! Waits for the next message (in arrival order) and copies it to dst.
  void start_receive(operation& op, void* dst, std::uint32_t capacity, std::uint32_t elem_size,
                     bool exact) noexcept {
    op.dst_ = static_cast<std::byte*>(dst);
    op.dst_capacity_ = capacity;
    op.elem_size_ = elem_size == 0 ? 1 : elem_size;
    op.exact_ = exact;
    op.pending_ = 1;
    enqueue(recv_waiters_, op);
    deliver();
    resume_ready();
  }
  //! Waits for the next notification (in arrival order): tag() and byte_count().
  void start_notification(operation& op) noexcept {
    op.pending_ = 1;
    enqueue(note_waiters_, op);
    deliver();
    resume_ready();
  }

  //! Messages received and not yet taken.
  [[nodiscard]] std::uint32_t messages_waiting() const noexcept { return rx_messages_.size(); }
  //! Messages this side may still send before the peer returns credits.
  [[nodiscard]] std::uint32_t credits() const noexcept {
    const std::uint32_t used = sent_ - peer_consumed();
    return used >= attr_.recv_depth ? 0 : attr_.recv_depth - used;
  }

  //! Makes sure the last work request posted on every queue pair produces a
  //! completion (posts a signaled zero-length write where none does).
  void cover() noexcept {
    for (auto& q : qps_) ensure_covered(q);
  }

  //! Ends a pending operation being destroyed: a queued receive leaves its
  //! queue; posted work is waited for (its wr_id points at op).
  void abandon(operation& op) noexcept {
    if (op.queued_) {
      remove(recv_waiters_, op);
      remove(note_waiters_, op);
      op.queued_ = false;
      op.done_ = true;
      return;
    }
    cover();
    while (!op.done_) progress();
  }

private:
  static constexpr std::uint32_t atomic_slots = 64;

  struct qp_slot {
    queue_pair qp;
    std::unique_ptr<detail::sq_entry[]> ring;
    std::uint32_t cap;
    std::uint64_t head = 0;     // next entry to retire
    std::uint64_t tail = 0;     // next entry to post
    std::uint64_t covered = 0;  // tail right after the last signaled post
    std::uint32_t since_signal = 0;
    qp_slot(const protection_domain& pd, completion_queue& cq, const queue_pair_attr& a, std::uint32_t depth)
        : qp(pd, cq, cq, a), ring(std::make_unique<detail::sq_entry[]>(depth)), cap(depth) {}
  };

  static connection_attr checked(const connection_attr& a) {
    auto bad = [](const std::string& what) {
      detail::throw_rdx(errc::invalid_argument, "connection: " + what);
    };
    if (a.queue_pairs < 1 || a.queue_pairs > 64)
      bad("queue_pairs = " + std::to_string(a.queue_pairs) + ", need 1 to 64");
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
    return a;
  }

  [[nodiscard]] bool usable(operation& op) noexcept {
    if (failed_) {
      fail_now(op, make_error_code(errc::operation_failed));
      return false;
    }
    if (!connected_) {
      fail_now(op, make_error_code(errc::not_ready));
      return false;
    }
    return true;
  }

  [[nodiscard]] std::uint32_t peer_consumed() const noexcept {
    // The peer writes its count of consumed messages here by RDMA write.
    const std::uint32_t written =
        std::atomic_ref<std::uint64_t>(control_[1]).load(std::memory_order_acquire) & 0xffffffffu;
    return detail::serial_after(written, peer_piggy_) ? written : peer_piggy_;
  }

  // Spins (polling) until pred() or failure or the resource timeout.
  template <class P>
  [[nodiscard]] std::error_code spin_until(P pred) noexcept {
    if (failed_) return make_error_code(errc::operation_failed);
    if (pred()) return {};
    const auto deadline = std::chrono::steady_clock::now() + attr_.resource_timeout;
    unsigned spins = 0;
    while (!pred()) {
      if (failed_) return make_error_code(errc::operation_failed);
      cover();
      progress();
      if (++spins % 64 == 0 && std::chrono::steady_clock::now() >= deadline)
        return make_error_code(errc::timed_out);
    }
    return failed_ ? make_error_code(errc::operation_failed) : std::error_code{};
  }
  // Room for one more operation's request; one entry stays reserved for a probe.
  [[nodiscard]] static bool room(const qp_slot& q) noexcept { return q.tail - q.head + 2 <= q.cap; }

  // Posts one work request, signaled when the queue pair was idle or every
  // signal_interval requests; records it for retirement.
  [[nodiscard]] std::error_code post(qp_slot& q, send_wr& w, operation* op, detail::sq_kind kind,
                                     std::uint32_t aux) noexcept {
    const bool sig = q.head == q.tail || q.since_signal + 1 >= attr_.signal_interval;
    w.signaled(sig);
    if (std::error_code ec = q.qp.post_send(w)) return ec;
    q.ring[q.tail % q.cap] = detail::sq_entry{op, w.wr_id(), aux, kind, sig};
    ++q.tail;
    ++posted_;
    if (sig) {
      q.since_signal = 0;
      q.covered = q.tail;
      ++signaled_;
    } else {
      ++q.since_signal;
    }
    return {};
  }

  // A signaled zero-length RDMA write (needs no address or key, IBTA C9-88):
  // its completion retires every unsignaled request before it.
  void ensure_covered(qp_slot& q) noexcept {
    if (q.covered == q.tail || failed_) return;
    if (q.tail - q.head >= q.cap) return;  // full: its last entry is signaled
    send_wr w = wr::write(std::span<const ibv_sge>{}, remote_ptr{0, 0}, &q);
    w.signaled(true);
    if (q.qp.post_send(w)) return;
    q.ring[q.tail % q.cap] = detail::sq_entry{nullptr, w.wr_id(), 0, detail::sq_kind::probe, true};
    ++q.tail;
    ++posted_;
    ++signaled_;
    q.since_signal = 0;
    q.covered = q.tail;
  }

  void dispatch(const completion& c) noexcept {
    const auto id = c.wr_id();
    const auto lo = reinterpret_cast<std::uint64_t>(rx_.get());
    const auto hi = lo + sizeof(detail::rx_entry) * attr_.recv_depth;
    if (id >= lo && id < hi) return on_receive(c, *reinterpret_cast<detail::rx_entry*>(id));
    for (auto& q : qps_) {
      if (q.qp.qp_num() == c.qp_num()) return on_send(q, c);
    }
  }

  void on_send(qp_slot& q, const completion& c) noexcept {
    if (c.ok()) {
      // Send queues complete in order: this signaled request retires itself
      // and every unsignaled one before it.
      while (q.head != q.tail) {
        const detail::sq_entry e = q.ring[q.head % q.cap];
        ++q.head;
        retire(e, {});
        if (e.signaled) break;
      }
      return;
    }
    // Errors come for every request, signaled or not; those before the one
    // that failed completed (or, once failed, were flushed without a report).
    const bool was_failed = failed_;
    bool found = false;
    for (std::uint64_t s = q.head; s != q.tail; ++s) {
      if (q.ring[s % q.cap].wr_id == c.wr_id()) {
        found = true;
        break;
      }
    }
    if (found) {
      while (q.head != q.tail) {
        const detail::sq_entry e = q.ring[q.head % q.cap];
        ++q.head;
        const bool match = e.wr_id == c.wr_id();
        retire(e, match        ? c.error()
                  : was_failed ? make_wc_error_code(IBV_WC_WR_FLUSH_ERR)
                               : std::error_code{});
        if (match) break;
      }
    }
    if (!was_failed) fail(c.error());
  }

  void retire(const detail::sq_entry& e, std::error_code ec) noexcept {
    switch (e.kind) {
      case detail::sq_kind::probe:
      case detail::sq_kind::credit: return;
      case detail::sq_kind::staged: free_staging_.push(e.aux); break;
      case detail::sq_kind::atomic:
        if (!ec) e.op->value_ = atomics_[e.aux];
        free_atomics_.push(e.aux);
        break;
      case detail::sq_kind::op: break;
    }
    finish_part(*e.op, ec);
  }

  void finish_part(operation& op, std::error_code ec) noexcept {
    if (ec && !op.ec_) op.ec_ = ec;
    if (--op.pending_ == 0) complete(op);
  }
  void complete(operation& op) noexcept {
    op.done_ = true;
    if (op.waiter_) {
      op.next_ = nullptr;
      if (ready_.tail != nullptr)
        ready_.tail->next_ = &op;
      else
        ready_.head = &op;
      ready_.tail = &op;
    }
  }
  // Resumes waiting coroutines in completion order; each is taken off the
  // list first, so one that polls again (nested) keeps the order.
  void resume_ready() noexcept {
    while (ready_.head != nullptr) {
      operation* op = ready_.head;
      ready_.head = op->next_;
      if (ready_.head == nullptr) ready_.tail = nullptr;
      std::coroutine_handle<> h = std::exchange(op->waiter_, {});
      h.resume();  // op may be gone after this
    }
  }

  void on_receive(const completion& c, detail::rx_entry& e) noexcept {
    e.posted = false;
    if (!c.ok()) {
      if (!failed_) fail(c.error());
      return;
    }
    e.bytes = c.byte_len();
    if (c.opcode() == IBV_WC_RECV_RDMA_WITH_IMM) {
      e.imm = c.imm();
      rx_notes_.push(e.index);
    } else {
      if (c.has_imm() && detail::serial_after(c.imm(), peer_piggy_)) peer_piggy_ = c.imm();
      rx_messages_.push(e.index);
    }
    deliver();
  }

  // Hands queued messages and notifications to waiting receives, in order.
  void deliver() noexcept {
    while (recv_waiters_.head != nullptr && !rx_messages_.empty()) {
      operation& op = *dequeue(recv_waiters_);
      const std::uint32_t i = rx_messages_.pop();
      const std::uint32_t n = rx_[i].bytes;
      op.bytes_ = n;
      if (n > op.dst_capacity_ || n % op.elem_size_ != 0 || (op.exact_ && n != op.dst_capacity_)) {
        op.ec_ = make_error_code(errc::limit_exceeded);
      } else {
        std::memcpy(op.dst_, rx_buf_.data() + std::size_t{i} * attr_.message_size, n);
      }
      consume(i);
      finish_part(op, {});
    }
    while (note_waiters_.head != nullptr && !rx_notes_.empty()) {
      operation& op = *dequeue(note_waiters_);
      const std::uint32_t i = rx_notes_.pop();
      op.bytes_ = rx_[i].bytes;
      op.value_ = rx_[i].imm;
      consume(i);
      finish_part(op, {});
    }
    if (failed_) {
      // Nothing more will arrive: waiting receives end with the failure.
      while (recv_waiters_.head != nullptr && rx_messages_.empty()) {
        finish_part(*dequeue(recv_waiters_), make_error_code(errc::operation_failed));
      }
      while (note_waiters_.head != nullptr && rx_notes_.empty()) {
        finish_part(*dequeue(note_waiters_), make_error_code(errc::operation_failed));
      }
    }
  }

  // Reposts a taken buffer and counts it; credits go back piggybacked on the
  // next message, or by an RDMA write of the count once a quarter is owed.
  void consume(std::uint32_t i) noexcept {
    if (failed_) return;
    if (std::error_code ec = post_rx(i)) {
      fail(ec);
      return;
    }
    ++consumed_;
    if (credit_report_due()) report_credits();
  }
  [[nodiscard]] bool credit_report_due() const noexcept {
    const std::uint32_t owed = consumed_ - reported_;
    return owed != 0 && owed >= std::max<std::uint32_t>(1, attr_.recv_depth / 4) && !failed_ && connected_;
  }
  void report_credits() noexcept {
    auto& q = qps_[0];
    if (!room(q)) return;  // no room now; progress() tries again
    control_[0] = consumed_;
    send_wr w = wr::write(control_.sge(0, 1), remote_ptr{peer_credit_.addr, peer_credit_.rkey}, &q);
    if (post(q, w, nullptr, detail::sq_kind::credit, 0)) return;
    reported_ = consumed_;
  }

  [[nodiscard]] std::error_code post_rx(std::uint32_t i) noexcept {
    ibv_sge sge = rx_buf_.sge(std::size_t{i} * attr_.message_size, attr_.message_size);
    std::error_code ec = qps_[0].qp.post_recv(wr::recv(sge, &rx_[i]));
    if (!ec) rx_[i].posted = true;
    return ec;
  }

  // The first failure: every queue pair goes to error so that all posted work
  // flushes; later operations fail at once.
  void fail(std::error_code ec) noexcept {
    if (failed_) return;
    failed_ = true;
    failure_ = ec;
    for (auto& q : qps_) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      (void)::ibv_modify_qp(q.qp.native_handle(), &a, IBV_QP_STATE);
    }
    deliver();
  }

  static void enqueue(detail::op_fifo& f, operation& op) noexcept {
    op.next_ = nullptr;
    op.queued_ = true;
    if (f.tail != nullptr)
      f.tail->next_ = &op;
    else
      f.head = &op;
    f.tail = &op;
  }
  static operation* dequeue(detail::op_fifo& f) noexcept {
    operation* op = f.head;
    f.head = op->next_;
    if (f.head == nullptr) f.tail = nullptr;
    op->queued_ = false;
    op->next_ = nullptr;
    return op;
  }
  static void remove(detail::op_fifo& f, operation& op) noexcept {
    operation* prev = nullptr;
    for (operation* p = f.head; p != nullptr; prev = p, p = p->next_) {
      if (p != &op) continue;
      if (prev != nullptr)
        prev->next_ = p->next_;
      else
        f.head = p->next_;
      if (f.tail == p) f.tail = prev;
      return;
    }
  }

  connection_attr attr_;
  context ctx_;
  std::optional<completion_channel> channel_;
  completion_queue cq_;
  std::vector<qp_slot> qps_;
  registered_buffer<std::byte> rx_buf_;
  registered_buffer<std::byte> staging_;
  registered_buffer<std::uint64_t> atomics_;
  registered_buffer<std::uint64_t> control_;  // [0] our count, sent; [1] the peer's, written by it
  std::unique_ptr<detail::rx_entry[]> rx_;
  detail::index_fifo rx_messages_, rx_notes_, free_staging_, free_atomics_;
  detail::op_fifo recv_waiters_, note_waiters_, ready_;
  std::array<completion, 32> cq_buf_{};
  int cq_head_ = 0, cq_count_ = 0;
  remote_descriptor peer_credit_{};
  std::uint32_t sent_ = 0;        // messages and notifications sent
  std::uint32_t peer_piggy_ = 0;  // the peer's consumed count, piggybacked
  std::uint32_t consumed_ = 0;    // buffers we took and reposted
  std::uint32_t reported_ = 0;    // consumed_ as last told to the peer
  std::uint64_t rr_ = 0;
  std::uint64_t posted_ = 0, signaled_ = 0;
  bool connected_ = false;
  bool failed_ = false;
  std::error_code failure_{};
};

// --- operation, needing connection ------------------------------------------

inline operation::~operation() {
  if (!done_ && conn_ != nullptr) conn_->abandon(*this);
}

inline bool operation::test() noexcept {
  if (done_) return true;
  conn_->cover();
  conn_->progress();
  return done_;
}

inline std::error_code operation::wait(std::chrono::nanoseconds timeout, wait_mode mode) noexcept {
  if (done_) return ec_;
  conn_->cover();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  unsigned spins = 0;
  while (!done_) {
    if (mode == wait_mode::events) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) return make_error_code(errc::timed_out);
      std::error_code ec = conn_->wait_event(left + std::chrono::milliseconds(1));
      if (ec && ec != errc::timed_out) return ec;
      if (!done_ && std::chrono::steady_clock::now() >= deadline) return make_error_code(errc::timed_out);
      continue;
    }
    conn_->progress();
    if (!done_ && ++spins % 64 == 0 && std::chrono::steady_clock::now() >= deadline) {
      return make_error_code(errc::timed_out);
    }
  }
  return ec_;
}

inline void operation::await_suspend(std::coroutine_handle<> h) noexcept {
  waiter_ = h;
  // Someone must poll; the last posted request must produce a completion.
  conn_->cover();
}

}  // namespace rdx
