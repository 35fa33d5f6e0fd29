// rdx::detail: a connection's engine, declared. It holds its parts as
// members: its send slots (send_slots.hpp), deferred operations
// (deferral.hpp), liveness clocks (liveness.hpp) and grants
// (grant_table.hpp), beside its queue pairs, send queues and message ring.
// Its member functions are defined in the files of engine_parts/, each of
// which includes this one: engine_setup.hpp (construction, connect),
// progress.hpp (the progress loop), dispatch.hpp (each completion,
// delivery), failure.hpp (deadlines, the watchdog, failure), lifetime.hpp (withdrawal, moves,
// teardown), events.hpp (event mode), posting.hpp (start functions),
// striping.hpp (a write's or read's requests, chunks and pacing),
// grants.hpp and device_events.hpp (the device's asynchronous events);
// engine_all.hpp includes them all, and
// connection (channel/connection.hpp) is their public face. Every operation
// ends exactly once; a dead peer is found by the transport's retries, the
// liveness probe or the stall watchdog, and fails the connection. The rules:
// rdx's design notes (share/doc/rdx/design.md), "Lifetimes, cancellation
// and time", "Dead peers", "Teardown".
#pragma once

#include <rdx/channel/connection_attr.hpp>
#include <rdx/channel/detail/deferral.hpp>
#include <rdx/channel/detail/grant_table.hpp>
#include <rdx/channel/detail/liveness.hpp>
#include <rdx/channel/detail/message_handler.hpp>
#include <rdx/channel/detail/op_list.hpp>
#include <rdx/channel/detail/pacing_window.hpp>
#include <rdx/channel/detail/peer_link.hpp>
#include <rdx/channel/detail/send_slots.hpp>
#include <rdx/channel/detail/worker_core.hpp>
#include <rdx/channel/message_ring.hpp>
#include <rdx/channel/operation.hpp>
#include <rdx/channel/send_queue.hpp>
#include <rdx/connect/message_seal.hpp>
#include <rdx/detail/thread_check.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/async_event.hpp>
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
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

namespace rdx::detail {

// Kinds of send-queue records (sq_record::kind); 0 is the engine's own cover or probe.
enum : std::uint8_t {
  rec_probe = 0,
  rec_op = 1,
  rec_staged = 2,
  rec_atomic = 3,
  rec_credit = 4,
  rec_paced = 5
};

class engine {
public:
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // --- used by operation and its awaiters -------------------------------------

  // On a worker they drive the whole worker, tested before progress_own() sets up its frame.
  [[gnu::always_inline]] int progress() noexcept;
  [[gnu::always_inline]] int progress_covered() noexcept;  // progress() right after cover_all()
  [[gnu::noinline]] inline int progress_own() noexcept;
  std::error_code run_until(std::chrono::steady_clock::time_point deadline, wait_mode mode,
                            const operation* op) noexcept;
  [[gnu::always_inline]] void cover_all() noexcept;
  //! Withdraws op from every list and detaches its posted work (no resume).
  void withdraw(operation& op) noexcept;
  //! Ends a pending op now with ec; its coroutine resumes at the next progress.
  void end_now(operation& op, std::error_code ec) noexcept;
  //! Points the engine's records of from at to (a move).
  void follow_move(operation& from, operation& to) noexcept;
  void point_records(operation& op, operation* to) noexcept;
  void add_bounded(bounded_awaiter_base& a) noexcept;
  void remove_bounded(bounded_awaiter_base& a) noexcept;
  void signal_stop() noexcept;

  // --- used by windows and channels (posting.hpp) -----------------------------

  static void fail_now(operation& op, std::error_code ec) noexcept;
  void start_rdma(operation& op) noexcept;
  //! start_rdma of a read whose bytes the caller opens before it exposes
  //! them (sealed_fetcher): allowed on an encrypted connection.
  void start_sealed_read(operation& op) noexcept;
  void start_atomic(operation& op) noexcept;
  void start_send(operation& op, const void* data, std::size_t bytes) noexcept;
  void start_send_registered(operation& op, std::uint64_t laddr, std::uint32_t lkey,
                             std::size_t bytes) noexcept;
  void start_notify(operation& op, std::uint64_t laddr, std::uint32_t lkey, std::uint64_t raddr,
                    std::uint32_t rkey, std::uint32_t bytes, std::uint32_t tag) noexcept;
  //! start_notify of bytes the caller sealed already (sealed_writer): allowed
  //! on an encrypted connection, where a plain notify is refused.
  void start_sealed_notify(operation& op, std::uint64_t laddr, std::uint32_t lkey, std::uint64_t raddr,
                           std::uint32_t rkey, std::uint32_t bytes, std::uint32_t tag) noexcept;
  //! A sealed window chunk failed its check (sealed_reader): the connection
  //! fails with errc::integrity_failed, failure_message() ending in why.
  [[gnu::cold]] void fail_sealed_window(const char* why) noexcept;
  void post_or_defer_rdma(operation& op) noexcept;
  void start_receive(operation& op, void* dst, std::uint32_t capacity, std::uint32_t elem_size,
                     bool exact) noexcept;
  void start_notification(operation& op) noexcept;
  void start_receive_view(operation& op, std::uint32_t elem_size) noexcept;
  //! A message done at posting (channel::post): copied inline or into
  //! staging, no operation (handlers.hpp).
  std::error_code post_message(const void* data, std::size_t bytes) noexcept;
  // Its paths off the inline one, out of line so that one stays small (handlers.hpp).
  [[gnu::noinline, gnu::cold]] inline std::error_code post_refused(std::size_t bytes) const noexcept;
  [[gnu::noinline, gnu::cold]] inline std::error_code post_would_block() noexcept;
  [[gnu::noinline]] inline std::error_code post_staged(const void* data, std::size_t bytes) noexcept;
  //! Sets (h.call) or removes the handler that takes the connection's messages.
  std::error_code set_handler(const message_handler& h) noexcept;
  [[nodiscard]] bool has_handler() const noexcept { return handler_.call != nullptr; }
  //! A message_view gives its ring buffer back: queued for repost (credits follow).
  void release_view(operation& op) noexcept;
  //! Points the ring's record of a lent buffer at op (a moved message_view).
  void lend_to(operation& op) noexcept { ring_.lend(op.p_.slot, &op); }
  //! Payload bytes one message carries: message_size, less the seal's overhead.
  [[nodiscard]] std::uint32_t payload_size() const noexcept {
    return attr_.encrypt ? attr_.message_size - sealed_message_overhead : attr_.message_size;
  }
  //! Installs the seal of an encrypted connection, before connect().
  void seal_with(std::unique_ptr<message_seal> s);

  // --- grants (grants.hpp) ------------------------------------------------------

  void attach_grant(grant_base& g, const memory_region& mr, const void* addr, std::size_t bytes,
                    access rights, grant_options opt);
  void detach_grant(grant_base& g) noexcept;
  void follow_grant_move(grant_base& from, grant_base& to) noexcept;
  //! Keeps the peer's key for each queue pair of a window; the index for
  //! start_rdma, or no_slot when one key serves every queue pair.
  std::uint32_t add_peer_window(std::span<const std::uint32_t> keys);

  // --- connection managers (cm/) -------------------------------------------------

  //! Moves queue pair i to RTS with the attributes a connection manager computed.
  using qp_connector = std::function<void(std::size_t i, queue_pair& qp, const connect_options& o)>;
  //! connect() with the transitions done by `how` instead of from peer.endpoints
  //! (which must still have one entry per queue pair); binds the grants.
  void connect_with(const connection_info& peer, const connect_options& opt, const qp_connector& how);
  //! Keeps the manager's link: housekeeping polls it, event mode sleeps on it,
  //! and its DISCONNECTED fails the connection at once. Destroyed in teardown.
  void attach_link(std::unique_ptr<peer_link> l) noexcept;
  [[nodiscard]] peer_link* link() const noexcept { return link_.get(); }

protected:
  // w: the worker whose completion queue it shares; nullptr: a queue of its own.
  engine(std::shared_ptr<worker_core> w, const protection_domain& pd, const connection_attr& attr);
  // Its ring: a part of w's receive pool when w has one (checked against it), else its own.
  static message_ring make_ring(worker_core* w, const protection_domain& pd, const connection_attr& attr,
                                engine* self) {
    receive_pool* pool = w != nullptr ? w->pool(pd, attr) : nullptr;
    return pool != nullptr ? message_ring(pd, *pool, attr.recv_depth, attr.message_size, self)
                           : message_ring(pd, attr.recv_depth, attr.message_size);
  }
  ~engine() = default;

  [[nodiscard]] connection_info local_info() const;
  void connect(const connection_info& peer, const connect_options& opt);
  std::error_code drain(std::chrono::nanoseconds timeout) noexcept;
  [[nodiscard]] std::chrono::milliseconds detection_bound() const noexcept {
    return liveness::detection_bound(attr_, opt_);
  }
  [[nodiscard]] std::uint64_t signaled_count() const noexcept {
    std::uint64_t n = 0;
    for (const auto& q : sqs_) {
      n += q.signaled_count();
    }
    return n;
  }
  [[nodiscard]] std::uint64_t posted_count() const noexcept {
    std::uint64_t n = 0;
    for (const auto& q : sqs_) {
      n += q.posted_count();
    }
    return n;
  }
  [[nodiscard]] pacing_state pacing() const noexcept {
    std::uint64_t probes = 0;
    for (const auto& pc : paced_) {
      probes += pc.tail.probes();
    }
    return {pacing_ ? pacer_.window() : 0,
            pacing_ ? pacer_.chunk() : chunk_,
            pacer_.decreases(),
            paced_bytes_,
            probes,
            pacer_.losses()};
  }
  [[nodiscard]] std::uint64_t send_doorbells() const noexcept {
    std::uint64_t n = 0;
    for (const auto& q : sqs_) {
      n += q.doorbells();
    }
    return n;
  }
  // Every queue pair's posting held while f runs (connection::batch).
  template <class F>
  void batch(F&& f);
  // Posts what held queues keep, and they stay held: before any wait.
  [[gnu::always_inline]] void flush_held() noexcept;
  [[gnu::noinline]] inline void post_held(bool release) noexcept;
  std::error_code arm() noexcept;
  void ack_event() noexcept;
  std::error_code wait_event(std::chrono::milliseconds timeout) noexcept;
  void shut_down() noexcept;

  // Members in destruction order reversed: the queue pairs (and their send
  // queues) are declared last so that they go before the memory they use.
  connection_attr attr_;
  std::shared_ptr<worker_core> wk_;  // the worker it is attached to (outlives the queue pairs)
  worker_core* worker_ = nullptr;
  context ctx_;
  protection_domain pd_;
  std::optional<completion_channel> channel_;
  completion_queue cq_;
  message_ring ring_;
  send_slots slots_;  // staging (its own, or the receive pool's) and atomic result slots
  op_fifo receives_{op_list::receives}, notifications_{op_list::notifications};
  op_fifo ready_{op_list::ready};
  message_handler handler_{};       // channel::on_message: messages go to it, not to receives
  std::uint32_t handler_sets_ = 0;  // set_handler calls: a handler changed by a handler
  deferral deferred_;
  bounded_awaiter_base* bounded_ = nullptr;  // intrusive list of suspended bounded awaits
  std::array<completion, 32> cq_buf_{};
  int cq_head_ = 0, cq_count_ = 0;
  int polling_ = 0;          // poll_once calls under way: receive reposts wait for the outermost's end
  std::uint32_t holds_ = 0;  // batch() calls under way: every send queue is held
  remote_descriptor peer_credit_{};
  connect_options opt_{};
  std::uint64_t rr_ = 0, chunk_ = 0;  // striping chunk: attr_.chunk_size; 1 when paced (see engine_setup)
  std::uint64_t whole_ = 0;           // a write or read of at most this is one request (engine_setup)
  // Pacing (attr_.pacing): the window, each queue pair's paced chunks, the bytes in flight.
  bool pacing_ = false;
  pacing_window pacer_;
  std::vector<paced_chunks> paced_;
  std::uint64_t paced_bytes_ = 0;
  std::uint32_t paced_idle_polls_ = 0;  // polls that found nothing while paced chunks were in flight
  std::int64_t loss_wait_ns_ =
      std::numeric_limits<std::int64_t>::max();  // half the ACK timeout, set at connect
  std::uint32_t nqp_ = 0;  // sqs_.size(), kept (a size is a division by sizeof(send_queue))
  liveness live_;
  std::atomic<std::uint32_t> stop_requests_{0};
  std::uint32_t stops_seen_ = 0;
  int wake_fd_ = -1;
  bool connected_ = false;
  bool failed_ = false;
  bool open_ = false;  // connected_, not failed_, not attr_.encrypt: one test for unsealed posts
  void set_failed() noexcept {
    failed_ = true;
    open_ = false;
  }
  send_queue::cover_watch uncovered_{};  // a send queue may be uncovered (cover_all has work)
  bool closing_ = false;
  std::error_code failure_{};
  // The failure in detail: what arrived, who disconnected, what stalled (no allocation).
  char failure_text_[256] = {};
  // The device's account of it: an asynchronous event of its queue pairs, port or device.
  char device_text_[384] = {};
  async_event_log* device_events_ = nullptr;  // the context's log (device_events.hpp)
  std::uint64_t events_from_ = 0;  // the log's sequence when this was made: earlier events are of others
  std::uint64_t events_seen_ = 0;  // the log's sequence at the last look
  async_event device_note_{};      // the weightiest event of its own so far, named if it fails
  bool cause_open_ = false;        // failed with nothing the device said: a later event fills it in
  std::chrono::steady_clock::time_point cause_until_{}, events_checked_{};
  thread_check own_thread_;
  thread_check* thread_ = &own_thread_;  // the worker's, on a worker: one thread drives them all
  // A worker's lists (worker_core::link) and what it reserved and counts for this connection.
  std::array<engine*, wl_count> wk_next_{}, wk_prev_{};
  std::array<bool, wl_count> wk_in_{};
  bool joined_ = false;
  bool wk_touched_ = false;  // listed in worker_core::touched_
  int wk_entries_ = 0;
  std::uint64_t wk_handled_ = 0;
  grant_table grants_;
  std::unique_ptr<peer_link> link_;     // rdma_cm's ids, when cm connected this connection
  std::unique_ptr<message_seal> seal_;  // attr_.encrypt: seals sends, opens receives
  std::vector<queue_pair> qps_;
  std::vector<send_queue> sqs_;

  // progress internals
  friend class worker_core;
  // Resumes the next coroutine whose operation ended; false when none (this may be gone after true).
  bool resume_one() noexcept;
  // The earlier of until and the deadline of each suspended bounded await.
  [[nodiscard]] std::chrono::steady_clock::time_point earliest_deadline(
      std::chrono::steady_clock::time_point until) const noexcept;
  [[gnu::noinline]] inline int poll_once() noexcept;
  // What progress() does after its poll, for a connection on a worker: reposts, credits, clocks.
  [[gnu::always_inline]] void settle() noexcept;
  // Something needs the clocks: the keepalive (something waits), the stall
  // watchdog or an rdma_cm link (something waits or is outstanding), or a
  // failure whose cause the device may still report.
  [[nodiscard]] bool housekeeping_due() const noexcept {
    return (attr_.keepalive.count() > 0 && something_waits()) ||
           ((link_ != nullptr || attr_.stall_timeout.count() > 0) &&
            (something_waits() || sends_outstanding())) ||
           cause_open_;
  }
  [[gnu::always_inline]] int poll_inline() noexcept;
  // Inlined into both polls, the engine's own (site 0) and a worker's (site
  // 1): one instantiation each, so that each inlines its own retirement
  // (the data path, whose instruction count rdx's cost model measures).
  template <int site>
  [[gnu::always_inline]] void dispatch(const completion& c) noexcept;
  [[gnu::always_inline]] void retire(const sq_record& r, std::error_code ec) noexcept;
  void finish_part(operation& op, std::error_code ec) noexcept;
  void complete(operation& op) noexcept;
  void resume_ready() noexcept;
  void deliver() noexcept;
  // A message that arrived with none queued before it, to the oldest waiting receive.
  void take_one(std::uint32_t i, std::uint32_t n) noexcept;
  // Hands queued messages to the handler (handlers.hpp).
  void hand_over() noexcept;
  // A message that arrived with none queued before it, to the handler (handlers.hpp).
  [[gnu::always_inline]] void hand_one(std::uint32_t i, std::uint32_t n) noexcept;
  // A message for the handler that is not a whole number of its elements.
  [[gnu::cold]] void fail_shape(std::uint32_t n, std::uint32_t elem_size) noexcept;
  // deliver() when it has something to do: a receive started before its
  // message came (the usual case) costs a few loads, not a call.
  [[gnu::always_inline]] void deliver_if_due() noexcept {
    if ((!receives_.empty() && ring_.messages_waiting() != 0) ||
        (!notifications_.empty() && ring_.notifications_waiting() != 0) ||
        (polling_ == 0 && ring_.queued() != 0) || failed_) {
      deliver();
    }
  }
  void consume(std::uint32_t i) noexcept;
  void repost_consumed() noexcept;
  void report_credits() noexcept;
  void housekeeping(std::chrono::steady_clock::time_point now) noexcept;
  void check_stall(std::chrono::steady_clock::time_point now) noexcept;
  [[nodiscard]] std::chrono::milliseconds stall_bound() const noexcept {
    return liveness::stall_bound(attr_, opt_);
  }
  void fail(std::error_code ec) noexcept;
  // The peer sent beyond the credits a receive pool gave it.
  [[gnu::cold]] void fail_overrun() noexcept;
  // The peer broke the credit protocol: fails with errc::protocol_error and says what arrived.
  void fail_protocol() noexcept;
  // attr_.encrypt: one-sided work is refused (ends op now, errc::unsupported).
  bool unsealed_refused(operation& op) const noexcept;
  // attr_.encrypt: opens message i (n bytes) for op; false when it failed its check.
  bool open_sealed(operation& op, std::uint32_t i, std::uint32_t n) noexcept;
  [[gnu::cold]] void fail_integrity() noexcept;
  void to_error() noexcept;
  // the device's asynchronous events (device_events.hpp)
  void start_device_events() noexcept;
  [[nodiscard]] bool owns_event(const async_event& e) const noexcept;
  void take_device_events() noexcept;
  void on_device_event(const async_event& e) noexcept;
  [[gnu::noinline, gnu::cold]] inline void explain_failure() noexcept;
  void write_device_text() noexcept;
  void look_at_device(std::chrono::steady_clock::time_point now) noexcept;
  [[nodiscard]] bool usable(operation& op) const noexcept;
  [[nodiscard]] op_fifo& fifo_of(op_list l) noexcept {
    switch (l) {
      case op_list::receives: return receives_;
      case op_list::notifications: return notifications_;
      case op_list::deferred: return deferred_.list();
      default: return ready_;
    }
  }
  [[nodiscard]] bool sends_outstanding() const noexcept {
    return std::ranges::any_of(sqs_, [](const send_queue& q) { return q.outstanding() != 0; });
  }
  // A deferred send's staging buffer goes back to the free list.
  void release_slot(op_params& p) noexcept {
    if (p.slot != no_slot) {
      slots_.give_staging(std::exchange(p.slot, no_slot));
    }
  }
  // A handler waits for messages as a receive does (the keepalive probes for it).
  [[nodiscard]] bool something_waits() const noexcept {
    return !receives_.empty() || !notifications_.empty() || !deferred_.empty() || handler_.call != nullptr;
  }
  // posting internals (posting.hpp, striping.hpp)
  enum class post_result { all, blocked, failed };
  post_result post_some(operation& op) noexcept;
  [[nodiscard, gnu::always_inline]] bool send_admitted(operation& op, std::size_t bytes) noexcept;
  // Bytes from op's next remote address to the end of its chunk (chunk_size boundaries).
  [[nodiscard, gnu::always_inline]] std::uint64_t chunk_left(const op_params& p) const noexcept {
    const std::uint64_t chunk = chunk_;
    const std::uint64_t at = p.raddr + p.posted;
    return chunk - ((chunk & (chunk - 1)) == 0 ? at & (chunk - 1) : at % chunk);
  }
  // The same at the pacing window's chunk (a power of two).
  [[nodiscard]] std::uint64_t paced_left(const op_params& p) const noexcept {
    const std::uint64_t chunk = pacer_.chunk();
    return chunk - ((p.raddr + p.posted) & (chunk - 1));
  }
  // The queue pair of the next chunk (round-robin).
  [[nodiscard, gnu::always_inline]] std::uint32_t next_qp() const noexcept {
    return nqp_ == 1 ? 0 : static_cast<std::uint32_t>(rr_ % nqp_);
  }
  // The write or read of op's next len bytes on queue pair qi (a window's key is per queue pair).
  [[nodiscard, gnu::always_inline]] flat_wr chunk_request(const operation& op, std::uint64_t len,
                                                          std::uint32_t qi) const noexcept {
    const op_params& p = op.p_;
    return flat_wr{.sge = {p.laddr + p.posted, static_cast<std::uint32_t>(len), p.lkey},
                   .remote_addr = p.raddr + p.posted,
                   .rkey = p.window == no_slot ? p.rkey : grants_.peer_key(p.window, nqp_, qi),
                   .opcode = op.kind_ == op_kind::read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE};
  }
  [[gnu::noinline]] inline post_result post_chunks(operation& op) noexcept;
  // A paced chunk of queue pair qi retired: the window learns its time.
  void paced_done(std::uint32_t qi, std::error_code ec) noexcept;
  // A zero-length write behind each queue pair whose paced tail waits too long.
  void probe_tails() noexcept;
  // Whether progress should look for a tail to probe (pacing, bytes in flight).
  [[nodiscard]] bool tails_in_flight() const noexcept { return pacing_ && paced_bytes_ != 0; }
  [[gnu::noinline]] inline post_result post_rdma(operation& op) noexcept;
  [[gnu::noinline]] inline post_result post_atomic(operation& op) noexcept;
  [[gnu::noinline, gnu::cold]] inline post_result refused(operation& op, std::error_code ec) noexcept;
  void pump() noexcept;
  void defer(operation& op) noexcept;
  void submit(operation& op) noexcept;
  [[nodiscard]] bool take_staging(std::uint32_t& slot) noexcept;
  void bind_grants();
  void revoke_grants() noexcept;
};

}  // namespace rdx::detail
