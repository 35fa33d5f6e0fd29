// rdx: the send-queue engine of one queue pair: selective signaling, send-queue
// credit accounting and in-order retirement of unsignaled requests. It never
// lets the send queue overflow, and it makes sure the last posted request
// produces a completion whenever someone is about to wait (cover()).
//
// Usable on its own over any RC queue pair whose send completions the caller
// polls (connection uses one per queue pair): post() through it, hand every
// completion of that queue pair's send queue to retire(), and each posted
// request comes back exactly once, in posting order, with its status.
//
// Doorbells: each post is one ibv_post_send, unless posting is held (hold()
// and release()): requests posted meanwhile are built in the queue's own
// chain and reach the NIC together, with one ibv_post_send, at release().
#pragma once

#include <rdx/error.hpp>
#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/queue_pair_view.hpp>
#include <rdx/verbs/work_request.hpp>

#include <bit>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <system_error>
#include <utility>

namespace rdx {

//! What send_queue records per posted request and hands back at retirement.
struct sq_record {
  void* owner = nullptr;  //!< the caller's (an operation); nullptr once detached
  std::uint32_t aux = 0;  //!< the caller's (a staging or result slot)
  std::uint8_t kind = 0;  //!< the caller's; 0 is the engine's own cover request
  bool signaled = false;  //!< the request was posted signaled (it produces a completion)
};

//! Selective signaling over one queue pair. Not thread-safe: one thread
//! posts and retires (the connection's rule).
class send_queue {
public:
  //! wr_ids posted through a send_queue have this bit set (receives, which
  //! the caller posts itself, can use wr_ids without it).
  static constexpr std::uint64_t wr_id_tag = std::uint64_t{1} << 63;

  //! @param depth the queue pair's max_send_wr
  //! @param signal_interval at most this many requests per signaled one (1..depth-1)
  //! @throws rdx::error (errc::invalid_argument) for a depth under 2 or an interval out of range
  send_queue(queue_pair_view qp, std::uint32_t depth, std::uint32_t signal_interval)
      : qp_(qp),
        qp_num_(qp.qp_num()),
        ring_(std::make_unique<sq_record[]>(std::bit_ceil(depth))),
        chain_(std::make_unique<send_wr[]>(depth)),
        cap_(depth),
        mask_(std::bit_ceil(depth) - 1),
        interval_(signal_interval) {
    if (depth < 2 || signal_interval < 1 || signal_interval >= depth) {
      detail::throw_rdx(errc::invalid_argument, "send_queue: depth " + std::to_string(depth) +
                                                    " and signal_interval " +
                                                    std::to_string(signal_interval) +
                                                    ": need depth >= 2 and 1 <= signal_interval < depth");
    }
  }

  //! The queue pair whose send queue this is.
  [[nodiscard]] queue_pair_view qp() const noexcept { return qp_; }
  //! Its queue pair number.
  [[nodiscard]] std::uint32_t qp_num() const noexcept { return qp_num_; }
  //! What tells the owner of several queues that one may be left uncovered
  //! (a request posted unsignaled, or signaled ones taken back by a refused
  //! chain), so that it calls cover() only after such a post: `uncovered` is
  //! set, and when it was clear, first(ctx) is called (a worker lists the
  //! connection, so that arming visits only those).
  struct cover_watch {
    bool uncovered = false;                   //!< some queue may be uncovered
    void (*first)(void*) noexcept = nullptr;  //!< called when uncovered becomes true (nullptr: none)
    void* ctx = nullptr;                      //!< first's argument
    //! Sets uncovered, calling first when it was clear.
    [[gnu::always_inline]] void raise() noexcept {
      if (!uncovered) {
        uncovered = true;
        if (first != nullptr) [[unlikely]] {
          first(ctx);
        }
      }
    }
  };
  //! Reports to w whenever this queue may be left uncovered; w must outlive
  //! this queue (nullptr: none).
  void watch_cover(cover_watch* w) noexcept { watch_ = w; }

  //! Requests posted and not yet retired (never above depth).
  [[nodiscard]] std::uint32_t outstanding() const noexcept {
    return static_cast<std::uint32_t>(tail_ - head_);
  }
  //! Room for n more requests of the caller; one entry stays free for cover().
  [[nodiscard]] bool has_room(std::uint32_t n = 1) const noexcept { return tail_ - head_ + n + 1 <= cap_; }
  //! True when a request posted signaled has not completed yet: a completion is due.
  [[nodiscard]] bool awaits_completion() const noexcept { return covered_ > head_; }
  //! True when the last posted request will produce a completion.
  [[nodiscard]] bool covered() const noexcept { return covered_ == tail_; }
  //! Requests posted so far, signaled or not.
  [[nodiscard]] std::uint64_t posted_count() const noexcept { return tail_; }
  //! Of those, the ones posted signaled.
  [[nodiscard]] std::uint64_t signaled_count() const noexcept { return signaled_; }
  //! ibv_post_send calls so far (doorbells): one per request, one per release() of held requests.
  [[nodiscard]] std::uint64_t doorbells() const noexcept { return doorbells_; }
  //! True while posting is held (hold() without its release()).
  [[nodiscard]] bool held() const noexcept { return held_ != 0; }

  //! Posts w, signaled when the queue was idle or every signal_interval
  //! requests, and records it for retirement. The caller checked has_room().
  //! @return the provider's error (nothing recorded then).
  [[nodiscard, gnu::always_inline]] std::error_code post(send_wr& w, void* owner, std::uint8_t kind,
                                                         std::uint32_t aux = 0) noexcept {
    const bool sig = head_ == tail_ || since_signal_ + 1 >= interval_;
    return record(w, owner, kind, aux, sig);
  }

  //! post() of a request held by value: by the extended post API it goes
  //! into the provider's queue with no ibv_send_wr built (the engine's path).
  [[nodiscard, gnu::always_inline]] std::error_code post(flat_wr& w, void* owner, std::uint8_t kind,
                                                         std::uint32_t aux = 0) noexcept {
    const bool sig = head_ == tail_ || since_signal_ + 1 >= interval_;
    return record(w, owner, kind, aux, sig);
  }

  //! post() of a request nothing waits for (a message done at posting):
  //! signaled only every signal_interval requests, also when the queue was
  //! idle, so a lone one usually makes no completion; the owner covers the
  //! queue before anything waits on it (cover()).
  [[nodiscard, gnu::always_inline]] std::error_code post_moderated(flat_wr& w, void* owner, std::uint8_t kind,
                                                                   std::uint32_t aux = 0) noexcept {
    return record(w, owner, kind, aux, since_signal_ + 1 >= interval_);
  }

  //! post(), with the request built by make() (a builder call such as
  //! [&] { return wr::write(sge, to); }) where it is posted from, never
  //! copied on the way. While posting is held it is copied into the chain
  //! (emplace_held() builds it there instead).
  template <class Make>
  [[nodiscard]] std::error_code emplace(Make&& make, void* owner, std::uint8_t kind,
                                        std::uint32_t aux = 0) noexcept {
    const bool sig = head_ == tail_ || since_signal_ + 1 >= interval_;
    send_wr w = std::forward<Make>(make)();
    return record(w, owner, kind, aux, sig);
  }

  //! emplace() while posting is held (hold()): the request is built in the
  //! chain it is posted from at release().
  template <class Make>
  void emplace_held(Make&& make, void* owner, std::uint8_t kind, std::uint32_t aux = 0) noexcept {
    emplace_held_as(std::forward<Make>(make), owner, kind, aux,
                    head_ == tail_ || since_signal_ + 1 >= interval_);
  }
  //! emplace_held() of a request that is signaled whatever the interval
  //! says: its own completion retires it (a paced chunk, whose time counts).
  template <class Make>
  void emplace_held_signaled(Make&& make, void* owner, std::uint8_t kind, std::uint32_t aux = 0) noexcept {
    emplace_held_as(std::forward<Make>(make), owner, kind, aux, true);
  }
  //! emplace_held() with the signaling chosen by the caller (`sig`).
  template <class Make>
  void emplace_held_as(Make&& make, void* owner, std::uint8_t kind, std::uint32_t aux, bool sig) noexcept {
    send_wr* slot = &chain_[chained_];
    std::destroy_at(slot);
    ::new (static_cast<void*>(slot)) send_wr(std::forward<Make>(make)());
    (void)record(*slot, owner, kind, aux, sig);  // held: kept, never fails
  }

  //! Holds posting back until the matching release(): requests posted
  //! meanwhile are recorded (they count as outstanding, has_room() sees
  //! them) and kept in the queue's chain. Nests.
  void hold() noexcept { ++held_; }

  //! Ends a hold(); the outermost one posts the held requests with one
  //! ibv_post_send. When the provider refuses request j, those before it
  //! are posted and stay outstanding; j and the ones after it never reached
  //! the NIC: their records are taken back (the queue is as if they had
  //! never been posted) and each is handed to unposted(record, error), in
  //! posting order. unposted must not post on this queue.
  //! @return the provider's error, or empty.
  template <class F>
  [[nodiscard]] std::error_code release(F&& unposted) noexcept {
    if (held_ == 0 || --held_ != 0) {
      return {};
    }
    return flush(std::forward<F>(unposted));
  }

  //! Posts the held requests now, as release() does, and stays held (a
  //! wait inside a hold must not wait for requests that never left).
  template <class F>
  [[nodiscard]] std::error_code flush(F&& unposted) noexcept {
    if (chained_ == 0) {
      return {};
    }
    const std::uint32_t n = std::exchange(chained_, 0);
    std::size_t posted = 0;
    ++doorbells_;
    const std::error_code ec = qp_.post_send(std::span<send_wr>(chain_.get(), n), posted);
    if (!ec) {
      return {};
    }
    const std::uint64_t end = tail_;
    const std::uint64_t first = tail_ - (n - posted);
    for (std::uint64_t s = first; s != end; ++s) {
      if (ring_[slot(s)].signaled) {
        --signaled_;
      }
    }
    tail_ = first;
    resignal();
    for (std::uint64_t s = first; s != end; ++s) {
      unposted(ring_[slot(s)], ec);
    }
    return ec;
  }

  //! Posts w signaled, so its own completion retires it (a memory-window
  //! bind, which must not wait for a later request). The caller checked has_room().
  [[nodiscard]] std::error_code post_signaled(send_wr& w, void* owner, std::uint8_t kind,
                                              std::uint32_t aux = 0) noexcept {
    return record(w, owner, kind, aux, true);
  }

  //! Makes the last posted request produce a completion: posts a signaled
  //! zero-length RDMA write (it needs no address or key) when it does not.
  //! @return false when that post failed.
  [[gnu::always_inline]] bool cover() noexcept {
    if (covered_ == tail_ || tail_ - head_ >= cap_) {
      return true;  // full: its last entry is signaled
    }
    flat_wr w{};
    return !record(w, nullptr, 0, 0, true);
  }

  //! Posts a signaled zero-length RDMA write even when covered (a liveness
  //! probe: it fails with retry exceeded when the peer is gone).
  bool probe() noexcept {
    if (tail_ - head_ >= cap_) {
      return false;
    }
    send_wr w = wr::write(std::span<const ibv_sge>{}, remote_ptr{0, 0});
    return !record(w, nullptr, 0, 0, true);
  }

  //! A completion of this queue pair's send queue: retires what it covers and
  //! calls f(record, status) for each, in posting order. Success retires the
  //! signaled request and every unsignaled one before it. An error names the
  //! request that failed; the ones before it succeeded, unless the queue had
  //! already failed (failed_before), when they were flushed.
  template <class F>
  [[gnu::always_inline]] void retire(const completion& c, bool failed_before, F&& f) noexcept {
    if (c.ok()) {
      while (head_ != tail_) {
        const sq_record r = ring_[slot(head_)];
        ++head_;
        f(r, detail::no_error());
        if (r.signaled) {
          break;
        }
      }
      return;
    }
    const std::uint64_t seq = c.wr_id() & ~wr_id_tag;
    if (seq < head_ || seq >= tail_) {
      return;  // not ours, or retired already
    }
    while (head_ <= seq) {
      const sq_record r = ring_[slot(head_)];
      const bool failed_here = head_ == seq;
      ++head_;
      f(r, failed_here     ? c.error()
           : failed_before ? make_wc_error_code(IBV_WC_WR_FLUSH_ERR)
                           : detail::no_error());
    }
  }

  //! Retires every outstanding request with ec (after the queue pair was
  //! destroyed or when its completions can no longer come).
  template <class F>
  void retire_all(std::error_code ec, F&& f) noexcept {
    while (head_ != tail_) {
      const sq_record r = ring_[slot(head_)];
      ++head_;
      f(r, ec);
    }
    covered_ = tail_;
  }

  //! The sequence number the next post will get.
  [[nodiscard]] std::uint64_t next_seq() const noexcept { return tail_; }
  //! The outstanding record with sequence number seq, or nullptr once retired.
  [[nodiscard]] sq_record* find(std::uint64_t seq) noexcept {
    return seq >= head_ && seq < tail_ ? &ring_[slot(seq)] : nullptr;
  }

  //! Visits the outstanding records (to detach an owner, say).
  template <class F>
  void for_each_outstanding(F&& f) noexcept {
    for (std::uint64_t s = head_; s != tail_; ++s) {
      f(ring_[slot(s)]);
    }
  }

private:
  // The records' ring has a power-of-two size (depth rounded up): a mask, not a division.
  [[nodiscard]] std::uint64_t slot(std::uint64_t seq) const noexcept { return seq & mask_; }

  // Inlined into every post: the data path, whose instruction count rdx's cost model measures.
  // W is a send_wr (the builders') or a flat_wr (the engine's, by value).
  // The request is recorded before the provider sees it, and taken back when
  // the provider refuses it: little stays live across the provider's calls.
  template <class W>
  [[nodiscard, gnu::always_inline]] std::error_code record(W& w, void* owner, std::uint8_t kind,
                                                           std::uint32_t aux, bool sig) noexcept {
    stamp(w, wr_id_tag | tail_, sig);
    if (held_ != 0) [[unlikely]] {
      hold_back(w);
      commit(owner, kind, aux, sig);
      return detail::no_error();
    }
    ++doorbells_;
    commit(owner, kind, aux, sig);
    if (std::error_code ec = qp_.post_send(w)) [[unlikely]] {
      take_back();
      return ec;
    }
    return detail::no_error();
  }
  // The last record never reached the NIC: the queue is as before it.
  [[gnu::noinline, gnu::cold]] void take_back() noexcept {
    --tail_;
    if (ring_[slot(tail_)].signaled) {
      --signaled_;
    }
    resignal();
  }
  // The signaling state as it was after the last request that was posted.
  void resignal() noexcept {
    covered_ = head_;
    since_signal_ = 0;
    for (std::uint64_t s = head_; s != tail_; ++s) {
      if (ring_[slot(s)].signaled) {
        covered_ = s + 1;
        since_signal_ = 0;
      } else {
        ++since_signal_;
      }
    }
    if (covered_ != tail_ && watch_ != nullptr) {
      watch_->raise();
    }
  }
  [[gnu::always_inline]] static void stamp(send_wr& w, std::uint64_t id, bool sig) noexcept {
    w.id(id);
    w.signaled(sig);
  }
  [[gnu::always_inline]] static void stamp(flat_wr& w, std::uint64_t id, bool sig) noexcept {
    w.wr_id = id;
    w.send_flags = sig ? (w.send_flags | IBV_SEND_SIGNALED) : (w.send_flags & ~unsigned{IBV_SEND_SIGNALED});
  }
  // The posted request's record and the signaling state.
  [[gnu::always_inline]] void commit(void* owner, std::uint8_t kind, std::uint32_t aux, bool sig) noexcept {
    ring_[slot(tail_)] = sq_record{owner, aux, kind, sig};
    ++tail_;
    if (sig) {
      since_signal_ = 0;
      covered_ = tail_;
      ++signaled_;
    } else {
      ++since_signal_;
      if (watch_ != nullptr) {
        watch_->raise();
      }
    }
  }

  // Held: w goes to the chain for release() (emplace() built it there already).
  [[gnu::noinline]] void hold_back(send_wr& w) noexcept {
    if (&w != &chain_[chained_]) {
      chain_[chained_] = w;
    }
    ++chained_;
  }
  // By value: the engine's request need not be in memory on the usual path.
  [[gnu::noinline]] void hold_back(flat_wr w) noexcept {
    chain_[chained_] = send_wr::from(w);
    ++chained_;
  }

  queue_pair_view qp_;
  std::uint32_t qp_num_;
  cover_watch* watch_ = nullptr;  // watch_cover()
  std::unique_ptr<sq_record[]> ring_;
  std::unique_ptr<send_wr[]> chain_;  // held requests, built in place, posted at release()
  std::uint64_t cap_;
  std::uint64_t mask_;  // ring_'s size - 1
  std::uint32_t interval_;
  std::uint32_t since_signal_ = 0;
  std::uint64_t head_ = 0;                      // next record to retire
  std::uint64_t tail_ = 0;                      // next record to post
  std::uint64_t covered_ = 0;                   // tail_ right after the last signaled post
  std::uint64_t signaled_ = 0, doorbells_ = 0;  // posted_count() is tail_
  std::uint32_t held_ = 0;                      // hold() depth
  std::uint32_t chained_ = 0;                   // requests in chain_
};

}  // namespace rdx
