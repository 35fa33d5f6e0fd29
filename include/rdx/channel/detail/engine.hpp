// rdx::detail: the state of a connection's engine, its construction,
// connect and progress loop. Its other parts: detail/dispatch.hpp (each
// completion, delivery, deadlines, liveness probe, failure), lifetime.hpp
// (withdraw, detach, move, teardown), events.hpp (event mode),
// posting.hpp (start functions, deferral) and device_events.hpp (the
// device's asynchronous events). connection (channel/connection.hpp) is
// their public face. Every operation ends exactly once; a dead peer is found
// by the transport's retries, the liveness probe or the stall watchdog, and
// fails the connection.
#pragma once

#include <rdx/channel/connection_attr.hpp>
#include <rdx/channel/detail/grant_base.hpp>
#include <rdx/channel/detail/op_list.hpp>
#include <rdx/channel/detail/peer_link.hpp>
#include <rdx/channel/detail/worker_core.hpp>
#include <rdx/channel/message_ring.hpp>
#include <rdx/channel/operation.hpp>
#include <rdx/channel/send_queue.hpp>
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

namespace rdx {

namespace detail {

// Kinds of send-queue records (sq_record::kind); 0 is the engine's own cover or probe.
enum : std::uint8_t { rec_probe = 0, rec_op = 1, rec_staged = 2, rec_atomic = 3, rec_credit = 4 };

class engine {
public:
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // --- used by operation and its awaiters -------------------------------------

  // A connection on a worker drives the whole worker; the test is made
  // before the engine's own progress sets up its frame.
  [[gnu::always_inline]] int progress() noexcept {
    if (worker_ != nullptr) [[unlikely]]
      return worker_->progress();
    return progress_own();
  }
  [[gnu::noinline]] inline int progress_own() noexcept;
  inline std::error_code run_until(std::chrono::steady_clock::time_point deadline, wait_mode mode,
                                   const operation* op) noexcept;
  [[gnu::always_inline]] inline void cover_all() noexcept;
  //! Withdraws op from every list and detaches its posted work (no resume).
  inline void forget(operation& op) noexcept;
  //! Ends a pending op now with ec; its coroutine resumes at the next progress.
  inline void end_now(operation& op, std::error_code ec) noexcept;
  //! Points the engine's records of from at to (a move).
  inline void relink(operation& from, operation& to) noexcept;
  inline void repoint(operation& op, operation* to) noexcept;
  inline void add_bounded(bounded_awaiter_base& a) noexcept;
  inline void remove_bounded(bounded_awaiter_base& a) noexcept;
  void signal_stop() noexcept {
    stop_requests_.fetch_add(1, std::memory_order_release);
    if (worker_ != nullptr) {
      worker_->signal_stop();
    } else if (wake_fd_ >= 0) {
      const std::uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);
    }
  }

  // --- used by windows and channels (posting.hpp) -----------------------------

  inline void fail_now(operation& op, std::error_code ec) noexcept;
  inline void start_rdma(operation& op) noexcept;
  inline void start_atomic(operation& op) noexcept;
  inline void start_send(operation& op, const void* data, std::size_t bytes) noexcept;
  inline void start_send_registered(operation& op, std::uint64_t laddr, std::uint32_t lkey,
                                    std::size_t bytes) noexcept;
  inline void start_notify(operation& op, std::uint64_t laddr, std::uint32_t lkey, std::uint64_t raddr,
                           std::uint32_t rkey, std::uint32_t bytes, std::uint32_t tag) noexcept;
  inline void start_receive(operation& op, void* dst, std::uint32_t capacity, std::uint32_t elem_size,
                            bool exact) noexcept;
  inline void start_notification(operation& op) noexcept;
  inline void start_receive_view(operation& op, std::uint32_t elem_size) noexcept;
  //! A message_view gives its ring buffer back: queued for repost (credits follow).
  inline void release_view(operation& op) noexcept;
  //! Points the ring's record of a lent buffer at op (a moved message_view).
  void relend(operation& op) noexcept { ring_.lend(op.p_.slot, &op); }

  // --- grants (grants.hpp) ------------------------------------------------------

  inline void attach_grant(grant_base& g, const memory_region& mr, const void* addr, std::size_t bytes,
                           access rights, grant_options opt);
  inline void detach_grant(grant_base& g) noexcept;
  inline void relink_grant(grant_base& from, grant_base& to) noexcept;
  //! Keeps the peer's key for each queue pair of a window; the index for
  //! start_rdma, or no_slot when one key serves every queue pair.
  inline std::uint32_t add_peer_window(std::span<const std::uint32_t> keys);

  // --- connection managers (cm/) -------------------------------------------------

  //! Moves queue pair i to RTS with the attributes a connection manager computed.
  using qp_connector = std::function<void(std::size_t i, queue_pair& qp, const connect_options& o)>;
  //! connect() with the transitions done by `how` instead of from peer.endpoints
  //! (which must still have one entry per queue pair); binds the grants.
  inline void connect_with(const connection_info& peer, const connect_options& opt, const qp_connector& how);
  //! Keeps the manager's link: housekeeping polls it, event mode sleeps on it,
  //! and its DISCONNECTED fails the connection at once. Destroyed in teardown.
  void attach_link(std::unique_ptr<peer_link> l) noexcept {
    link_ = std::move(l);
    if (worker_ != nullptr && link_ != nullptr) worker_->watch_fd(link_->fd(), true, this);
  }
  [[nodiscard]] peer_link* link() const noexcept { return link_.get(); }

protected:
  static constexpr std::uint32_t atomic_slots = 64;

  // w: the worker whose completion queue it shares; nullptr: a queue of its own.
  inline engine(std::shared_ptr<worker_core> w, const protection_domain& pd, const connection_attr& attr);
  // Its ring: a part of w's receive pool when w has one (checked against it), else its own.
  static message_ring make_ring(worker_core* w, const protection_domain& pd, const connection_attr& attr,
                                engine* self) {
    receive_pool* pool = w != nullptr ? w->pool(pd, attr) : nullptr;
    return pool != nullptr ? message_ring(pd, *pool, attr.recv_depth, attr.message_size, self)
                           : message_ring(pd, attr.recv_depth, attr.message_size);
  }
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
  [[nodiscard]] std::uint64_t send_doorbells() const noexcept {
    std::uint64_t n = 0;
    for (const auto& q : sqs_) n += q.doorbells();
    return n;
  }
  // Every queue pair's posting held while f runs (connection::batch).
  template <class F>
  void batch(F&& f);
  // Posts what held queues keep, and they stay held: before any wait.
  [[gnu::always_inline]] void flush_held() noexcept {
    if (holds_ != 0) [[unlikely]]
      post_held(false);
  }
  [[gnu::noinline]] inline void post_held(bool release) noexcept;
  inline std::error_code arm() noexcept;
  inline void ack_event() noexcept;
  inline std::error_code wait_event(std::chrono::milliseconds timeout) noexcept;
  inline void shut_down() noexcept;

  // Members in destruction order reversed: the queue pairs (and their send
  // queues) are declared last so that they go before the memory they use.
  connection_attr attr_;
  std::shared_ptr<worker_core> wk_;  // the worker it is attached to (outlives the queue pairs)
  worker_core* worker_ = nullptr;
  context ctx_;
  protection_domain pd_;
  bool windows_supported_;  // type 2 memory windows (else grants are exact registrations)
  std::optional<completion_channel> channel_;
  completion_queue cq_;
  message_ring ring_;
  std::optional<registered_buffer<std::byte>> staging_;  // none on a receive pool (its staging is shared)
  registered_buffer<std::uint64_t> atomics_;
  index_fifo free_staging_, free_atomics_;
  // Send staging: its own, or the worker's receive pool's.
  index_fifo* stage_free_ = nullptr;
  std::byte* stage_base_ = nullptr;
  std::uint32_t stage_lkey_ = 0;
  std::uint32_t stage_stride_ = 0;
  op_fifo receives_{op_list::receives}, notifications_{op_list::notifications};
  op_fifo deferred_{op_list::deferred}, ready_{op_list::ready};
  bounded_awaiter_base* bounded_ = nullptr;  // intrusive list of suspended bounded awaits
  std::array<completion, 32> cq_buf_{};
  int cq_head_ = 0, cq_count_ = 0;
  int polling_ = 0;          // poll_once calls under way: receive reposts wait for the outermost's end
  std::uint32_t holds_ = 0;  // batch() calls under way: every send queue is held
  remote_descriptor peer_credit_{};
  connect_options opt_{};
  std::uint64_t rr_ = 0;
  std::uint32_t nqp_ = 0;  // sqs_.size(), kept (a size is a division by sizeof(send_queue))
  std::uint32_t idle_polls_ = 0;
  std::uint32_t ticks_ = 0;
  std::chrono::steady_clock::time_point idle_since_{};   // empty: the idle clock is not running
  std::chrono::steady_clock::time_point stall_since_{};  // first seen awaiting a completion; empty: not
  std::atomic<std::uint32_t> stop_requests_{0};
  std::uint32_t stops_seen_ = 0;
  int wake_fd_ = -1;
  bool connected_ = false;
  bool failed_ = false;
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
  grant_base* grants_ = nullptr;          // intrusive list of this connection's grants
  access granted_ = access::none;         // the union of their rights
  std::vector<std::uint32_t> peer_keys_;  // the peer's key per queue pair, K per striped window
  grant_base credit_grant_;               // the 8-byte credit word, queue pair 0
  std::unique_ptr<peer_link> link_;       // rdma_cm's ids, when cm connected this connection
  std::chrono::steady_clock::time_point link_checked_{};
  std::vector<queue_pair> qps_;
  std::vector<send_queue> sqs_;

  // progress internals
  friend class worker_core;
  // Resumes the next coroutine whose operation ended; false when none (this may be gone after true).
  inline bool resume_one() noexcept;
  // The earlier of until and the deadline of each suspended bounded await.
  [[nodiscard]] inline std::chrono::steady_clock::time_point earliest_deadline(
      std::chrono::steady_clock::time_point until) const noexcept;
  [[gnu::noinline]] inline int poll_once() noexcept;
  // What progress() does after its poll, for a connection on a worker: reposts, credits, clocks.
  [[gnu::always_inline]] inline void settle() noexcept;
  // Something needs the clocks: the keepalive (something waits), the stall
  // watchdog or an rdma_cm link (something waits or is outstanding), or a
  // failure whose cause the device may still report.
  [[nodiscard]] bool housekeeping_due() const noexcept {
    return (attr_.keepalive.count() > 0 && something_waits()) ||
           ((link_ != nullptr || attr_.stall_timeout.count() > 0) &&
            (something_waits() || sends_outstanding())) ||
           cause_open_;
  }
  [[gnu::always_inline]] inline int poll_inline() noexcept;
  // Inlined into both polls, the engine's own (site 0) and a worker's (site
  // 1): one instantiation each, so that each inlines its own retirement
  // (the data path, whose instruction count rdx's cost model measures).
  template <int site>
  [[gnu::always_inline]] inline void dispatch(const completion& c) noexcept;
  [[gnu::always_inline]] inline void retire(const sq_record& r, std::error_code ec) noexcept;
  inline void finish_part(operation& op, std::error_code ec) noexcept;
  inline void complete(operation& op) noexcept;
  inline void resume_ready() noexcept;
  inline void deliver() noexcept;
  // deliver() when it has something to do: a receive started before its
  // message came (the usual case) costs a few loads, not a call.
  [[gnu::always_inline]] void deliver_if_due() noexcept {
    if ((!receives_.empty() && ring_.messages_waiting() != 0) ||
        (!notifications_.empty() && ring_.notifications_waiting() != 0) ||
        (polling_ == 0 && ring_.queued() != 0) || failed_) {
      deliver();
    }
  }
  inline void consume(std::uint32_t i) noexcept;
  inline void repost_consumed() noexcept;
  inline void report_credits() noexcept;
  inline void housekeeping(std::chrono::steady_clock::time_point now) noexcept;
  inline void check_stall(std::chrono::steady_clock::time_point now) noexcept;
  [[nodiscard]] inline std::chrono::milliseconds stall_bound() const noexcept;
  inline void fail(std::error_code ec) noexcept;
  // The peer sent beyond the credits a receive pool gave it.
  [[gnu::cold]] void fail_overrun() noexcept {
    std::snprintf(failure_text_, sizeof failure_text_,
                  "the peer sent message %u but was given credits for %u (the receive pool takes no more)",
                  ring_.share().received, ring_.share().consumed + ring_.depth());
    fail(make_error_code(errc::protocol_error));
  }
  // The peer broke the credit protocol: fails with errc::protocol_error and says what arrived.
  void fail_protocol() noexcept {
    std::snprintf(failure_text_, sizeof failure_text_,
                  "the peer's credit count says %u messages were consumed, but this side sent %u",
                  ring_.peer_consumed(), ring_.sent());
    fail(make_error_code(errc::protocol_error));
  }
  inline void to_error() noexcept;
  // the device's asynchronous events (device_events.hpp)
  inline void start_device_events() noexcept;
  [[nodiscard]] inline bool owns_event(const async_event& e) const noexcept;
  inline void take_device_events() noexcept;
  inline void on_device_event(const async_event& e) noexcept;
  [[gnu::noinline, gnu::cold]] inline void explain_failure() noexcept;
  inline void write_device_text() noexcept;
  inline void look_at_device(std::chrono::steady_clock::time_point now) noexcept;
  [[nodiscard]] inline bool usable(operation& op) noexcept;
  [[nodiscard]] op_fifo& fifo_of(op_list l) noexcept {
    switch (l) {
      case op_list::receives: return receives_;
      case op_list::notifications: return notifications_;
      case op_list::deferred: return deferred_;
      default: return ready_;
    }
  }
  [[nodiscard]] bool sends_outstanding() const noexcept {
    for (const auto& q : sqs_) {
      if (q.outstanding() != 0) return true;
    }
    return false;
  }
  // A deferred send's staging buffer goes back to the free list.
  void release_slot(op_params& p) noexcept {
    if (p.slot != no_slot) stage_free_->push(std::exchange(p.slot, no_slot));
  }
  [[nodiscard]] bool something_waits() const noexcept {
    return !receives_.empty() || !notifications_.empty() || !deferred_.empty();
  }
  // posting internals (posting.hpp)
  enum class post_result { all, blocked, failed };
  inline post_result post_some(operation& op) noexcept;
  [[nodiscard, gnu::always_inline]] inline bool send_admitted(operation& op, std::size_t bytes) noexcept;
  // Bytes from op's next remote address to the end of its chunk (chunk_size boundaries).
  [[nodiscard, gnu::always_inline]] std::uint64_t chunk_left(const op_params& p) const noexcept {
    const std::uint64_t chunk = attr_.chunk_size;
    const std::uint64_t at = p.raddr + p.posted;
    return chunk - ((chunk & (chunk - 1)) == 0 ? at & (chunk - 1) : at % chunk);
  }
  // The queue pair of the next chunk (round-robin).
  [[nodiscard, gnu::always_inline]] std::uint32_t next_qp() const noexcept {
    return nqp_ == 1 ? 0 : static_cast<std::uint32_t>(rr_ % nqp_);
  }
  // The write or read of op's next len bytes on queue pair qi. A window's key
  // is per queue pair (each memory window is bound to one).
  [[nodiscard, gnu::always_inline]] flat_wr chunk_request(const operation& op, std::uint64_t len,
                                                          std::uint32_t qi) const noexcept {
    const op_params& p = op.p_;
    return flat_wr{.sge = {p.laddr + p.posted, static_cast<std::uint32_t>(len), p.lkey},
                   .remote_addr = p.raddr + p.posted,
                   .rkey = p.window == no_slot ? p.rkey : peer_keys_[p.window * nqp_ + qi],
                   .opcode = op.kind_ == op_kind::read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE};
  }
  [[gnu::noinline]] inline post_result post_chunks(operation& op) noexcept;
  [[gnu::noinline]] inline post_result post_rdma(operation& op) noexcept;
  [[gnu::noinline, gnu::cold]] inline post_result refused(operation& op, std::error_code ec) noexcept;
  inline void pump() noexcept;
  inline void defer(operation& op) noexcept;
  inline void submit(operation& op) noexcept;
  [[nodiscard]] inline bool take_staging(std::uint32_t& slot) noexcept;
  inline void bind_grants();
  inline void revoke_grants() noexcept;
};

inline engine::engine(std::shared_ptr<worker_core> w, const protection_domain& pd,
                      const connection_attr& attr)
    : attr_(attr),
      wk_(std::move(w)),
      worker_(wk_.get()),
      ctx_(pd.device_context()),
      pd_(pd.share()),
      windows_supported_(device_has_type2_windows(ctx_)),
      channel_(attr.events && worker_ == nullptr ? std::optional<completion_channel>(std::in_place, ctx_)
                                                 : std::nullopt),
      cq_(worker_ != nullptr
              ? worker_->cq().share()
              : completion_queue(
                    ctx_, completion_queue_attr{.depth = static_cast<int>(attr.queue_pairs * attr.send_depth +
                                                                          attr.recv_depth + 1),
                                                .channel = channel_ ? &*channel_ : nullptr})),
      ring_(make_ring(worker_, pd, attr, this)),
      staging_(ring_.pool() != nullptr
                   ? std::nullopt
                   : std::optional<registered_buffer<std::byte>>(
                         std::in_place, pd, std::size_t{2} * attr.recv_depth * attr.message_size)),
      atomics_(pd, atomic_slots),
      free_staging_(ring_.pool() != nullptr ? 1 : 2 * attr.recv_depth),
      free_atomics_(atomic_slots) {
  if (receive_pool* rp = ring_.pool()) {
    stage_free_ = &rp->free_staging();
    stage_base_ = rp->staging_base();
    stage_lkey_ = rp->staging_lkey();
    stage_stride_ = rp->buffer_size();
  } else {
    stage_free_ = &free_staging_;
    stage_base_ = staging_->data();
    stage_lkey_ = staging_->region().lkey();
    stage_stride_ = attr.message_size;
  }
  auto bad = [](const std::string& what) { throw_rdx(errc::invalid_argument, "connection: " + what); };
  const connection_attr& a = attr;
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
  if (a.keepalive.count() < 0 || a.drain_timeout.count() < 0 || a.stall_timeout.count() < 0)
    bad("keepalive, drain_timeout and stall_timeout must not be negative");
  if (worker_ != nullptr) {
    if (worker_->device_context().native_handle() != ctx_.native_handle()) {
      bad("the protection domain is of device " + ctx_.name() + " but the worker's completion queue is of " +
          worker_->device_context().name() + "; make the worker on the connection's device");
    }
    if (attr.events && !worker_->events()) {
      bad("events is set but the worker was made without events (worker_attr::events): its connections "
          "sleep on the worker's descriptor");
    }
    thread_ = &worker_->thread();
  } else if (attr_.events) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0)
      throw error(std::error_code(errno, std::generic_category()),
                  "connection: eventfd (stop-request wake-up)");
  }
  start_device_events();
  if (ring_.pool() == nullptr) {
    for (std::uint32_t i = 0; i < 2 * attr_.recv_depth; ++i) free_staging_.push(i);
  }
  for (std::uint32_t i = 0; i < atomic_slots; ++i) free_atomics_.push(i);
  qps_.reserve(attr_.queue_pairs);
  sqs_.reserve(attr_.queue_pairs);
  try {
    // On a worker: its queue entries reserved (or refused) before any queue
    // pair exists; shut_down() gives them back if anything below throws.
    if (worker_ != nullptr) {
      // On a receive pool its receives complete from the pool's share of the queue.
      worker_->join(*this, static_cast<int>(attr.queue_pairs * attr.send_depth +
                                            (ring_.pool() != nullptr ? 0 : attr.recv_depth) + 1));
    }
    for (std::uint32_t i = 0; i < attr_.queue_pairs; ++i) {
      queue_pair_attr qa{.max_send_wr = attr_.send_depth,
                         .max_recv_wr = i == 0 ? attr_.recv_depth : 1,
                         .port = attr_.port,
                         .gid_index = attr_.gid_index,
                         // Zero-length writes (cover, probe) need remote write on every queue
                         // pair (it reaches no memory: only a grant does); grants add read and
                         // atomic as they need them.
                         .remote_access = access::remote_write,
                         // On a receive pool, queue pair 0 takes its receives from the pool's queue.
                         .srq = i == 0 && ring_.pool() != nullptr ? &ring_.pool()->srq() : nullptr,
                         .post = attr_.post};
      qps_.emplace_back(pd, cq_, cq_, qa);
      if (worker_ != nullptr) worker_->add_queue_pair(qps_.back().qp_num(), *this);
      qps_.back().to_init();
      sqs_.emplace_back(qps_.back(), attr_.send_depth, attr_.signal_interval);
      sqs_.back().watch_cover(&uncovered_);
      nqp_ = static_cast<std::uint32_t>(sqs_.size());
    }
    for (std::uint32_t i = 0; ring_.pool() == nullptr && i < attr_.recv_depth; ++i) {
      if (std::error_code ec = ring_.post(qps_[0], i)) {
        throw error(ec, "connection: posting receive buffer " + std::to_string(i));
      }
    }
    credit_grant_.first_qp_only_ = true;
    attach_grant(credit_grant_, ring_.control_region(), ring_.credit_word_address(), 8, access::remote_write,
                 {});
  } catch (...) {
    shut_down();
    throw;
  }
}

inline connection_info engine::local_info() const {
  connection_info i;
  for (const auto& q : qps_) i.endpoints.push_back(q.local_endpoint());
  i.credit_word = {reinterpret_cast<std::uint64_t>(ring_.credit_word_address()), credit_grant_.rkeys_.at(0),
                   8};
  i.recv_depth = attr_.recv_depth;
  i.message_size = attr_.message_size;
  return i;
}

inline void engine::connect(const connection_info& peer, const connect_options& opt) {
  connect_with(peer, opt, {});
}

inline void engine::connect_with(const connection_info& peer, const connect_options& opt,
                                 const qp_connector& how) {
  auto differ = [](const char* what, std::uint64_t here, std::uint64_t there) {
    throw_rdx(errc::invalid_argument, std::string("connection::connect: ") + what + " is " +
                                          std::to_string(here) + " here but " + std::to_string(there) +
                                          " at the peer; both sides need the same");
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
  if (connected_) throw_rdx(errc::not_ready, "connection::connect: already connected");
  for (std::size_t i = 0; i < qps_.size(); ++i) {
    if (how) {
      how(i, qps_[i], o);
    } else {
      qps_[i].connect(peer.endpoints[i], o);
    }
  }
  peer_credit_ = peer.credit_word;
  opt_ = o;
  connected_ = true;
  // The windows bind through their queue pairs, which are in RTS now; the
  // peer learns of them only at the barrier that follows.
  bind_grants();
}

inline std::chrono::milliseconds engine::stall_bound() const noexcept {
  return std::max(attr_.stall_timeout, detection_bound());
}

inline std::chrono::milliseconds engine::detection_bound() const noexcept {
  const double ack_us = 4.096 * static_cast<double>(std::uint64_t{1} << opt_.timeout);
  const double retries_us = (opt_.retry_cnt + 1.0) * 4.0 * ack_us;
  // The probe leaves within keepalive + keepalive / 4 of the last completion
  // (event mode sleeps at most keepalive / 4 at a time).
  return attr_.keepalive + attr_.keepalive / 4 +
         std::chrono::milliseconds(static_cast<std::int64_t>(retries_us / 1000.0) + 1);
}

// --- progress ---------------------------------------------------------------------

int engine::poll_once() noexcept {
  if (worker_ != nullptr) {
    const std::uint64_t before = wk_handled_;
    worker_->poll();
    return static_cast<int>(wk_handled_ - before);
  }
  return poll_inline();
}

// poll_once(), inlined into progress(): the data path's poll, whose instruction count rdx's cost
// model measures.
inline int engine::poll_inline() noexcept {
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
  ++polling_;
  while (cq_head_ < cq_count_) {
    const completion c = cq_buf_[cq_head_++];
    dispatch<0>(c);
    ++handled;
  }
  // The buffers of every message delivered in this poll go back with one doorbell.
  if (--polling_ == 0 && ring_.queued() != 0) repost_consumed();
  return handled;
}

int engine::progress_own() noexcept {
  thread_check::scope guard(*thread_, "progress");
  flush_held();
  if (stop_requests_.load(std::memory_order_acquire) != stops_seen_) housekeeping({});
  const int handled = poll_inline();
  if (handled > 0) {
    idle_polls_ = 0;
    idle_since_ = {};
    stall_since_ = {};
  }
  if (!deferred_.empty()) pump();
  if (ring_.report_due() && connected_ && !failed_) report_credits();
  // The clock is read only when something needs it (a clock read can be a
  // system call in a VM): bounded awaits every 64 calls, and the keepalive
  // every 1024 idle polls while receives or deferred operations wait.
  // A connection manager's link is looked at on the same clock, also while
  // only one-sided work is in flight (a disconnect ends it at once).
  // The stall watchdog looks on the same clock while sends are outstanding.
  const bool keepalive_due = handled == 0 && (++idle_polls_ & 1023) == 0 && housekeeping_due();
  if (keepalive_due || (bounded_ != nullptr && (++ticks_ & 63) == 0)) {
    housekeeping(std::chrono::steady_clock::now());
  }
  resume_ready();
  return handled;
}

// Drives progress until op ends (or, without op, the connection fails) or
// the deadline passes. Busy polling looks at the clock every 64 polls.
inline std::error_code engine::run_until(std::chrono::steady_clock::time_point deadline, wait_mode mode,
                                         const operation* op) noexcept {
  auto finished = [&] { return op != nullptr ? op->done() : failed_; };
  auto result = [&] { return op != nullptr ? op->error() : failure_; };
  cover_all();
  if (mode == wait_mode::events) {
    while (!finished()) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return make_error_code(errc::timed_out);
      std::error_code ec = wait_event(left);
      if (ec && ec != errc::timed_out) return ec;
    }
    return result();
  }
  for (unsigned spins = 1; !finished(); ++spins) {
    progress();
    if (spins % 64 == 0 && !finished() && std::chrono::steady_clock::now() >= deadline) {
      return make_error_code(errc::timed_out);
    }
  }
  return result();
}

// Only after a post that may have left a queue uncovered (send_queue::watch_cover).
inline void engine::cover_all() noexcept {
  flush_held();
  if (failed_ || !uncovered_.uncovered) return;
  uncovered_.uncovered = false;
  bool again = false;
  for (auto& q : sqs_) {
    if (!q.cover()) again = true;
  }
  if (again) uncovered_.raise();  // tried again at the next cover_all (a worker lists it again)
}

// Holds every send queue while f runs: the requests f's operations post go
// out with one doorbell per queue pair when it returns (or throws). A wait
// or progress inside f posts what is held first.
template <class F>
void engine::batch(F&& f) {
  thread_check::scope guard(*thread_, "a batch");
  if (holds_++ == 0 && worker_ != nullptr) worker_->holding_changed(1);
  for (auto& q : sqs_) q.hold();
  try {
    std::forward<F>(f)();
  } catch (...) {
    post_held(true);
    throw;
  }
  post_held(true);
}

// Posts what the send queues hold (one doorbell each); with release, ends
// the outermost batch's hold. Requests the provider refused end their
// operations' parts with its error, as a refused post does.
void engine::post_held(bool release) noexcept {
  auto unposted = [this](const sq_record& r, std::error_code e) { retire(r, e); };
  for (auto& q : sqs_) (void)(release ? q.release(unposted) : q.flush(unposted));
  if (release && --holds_ == 0 && worker_ != nullptr) worker_->holding_changed(-1);
}

}  // namespace detail
}  // namespace rdx

#include <rdx/channel/detail/device_events.hpp>
#include <rdx/channel/detail/dispatch.hpp>
#include <rdx/channel/detail/events.hpp>
#include <rdx/channel/detail/grants.hpp>
#include <rdx/channel/detail/lifetime.hpp>
#include <rdx/channel/detail/posting.hpp>
#include <rdx/channel/detail/worker_drive.hpp>
