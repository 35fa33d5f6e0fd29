// rdx::cuda: the network side of a host-staged GPU-to-GPU transfer over one
// RC queue pair. Needs no CUDA: it drives any chunk_pipeline (the CUDA
// staging_pipeline, or a host-memory one in tests).
//
// Protocol, one direction at a time: both peers use the same chunk size and
// depth, and each has registered its bounce buffers for remote write and told
// the other where they are. The sender writes chunk i, as soon as it is in
// its own bounce slot, into the same slot of the peer's bounce buffers (RDMA
// write with immediate 0x80000000 | i). Before chunk i (i >= depth) may be
// written, the receiver hands the slot back with a zero-byte send with
// immediate i, once its copy of chunk i - depth to the GPU has finished.
//
// Sealed (staged_seal): the sender seals each chunk, once the pipeline has
// put it in its bounce slot, into the same slot of a second registered
// region (chunk + 24 bytes a slot) and writes that into the peer's; the
// receiver opens it into its bounce slot before the pipeline copies it to
// the GPU, so the GPU never holds a byte that failed its check. Sealing
// chunk i runs while chunk i - 1 is on the wire and the pipeline's copies
// of the next chunks run on the GPU.
//
// Writes and slot credits go out through layer 5's send-queue engine
// (rdx/channel/send_queue.hpp): selective signaling, send-queue credit
// accounting and in-order retirement, the same as a connection's.
#pragma once

#include <rdx/channel/send_queue.hpp>
#include <rdx/connect/message_seal.hpp>
#include <rdx/cuda/staging_types.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/poll.hpp>
#include <rdx/verbs/queue_pair_view.hpp>
#include <rdx/verbs/work_request.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace rdx::cuda {

//! Seals a staged transfer's chunks (see above). Both peers set it, with
//! the same chunk size and depth.
struct staged_seal {
  //! Seals what this side sends, opens what it receives (with rdx::auth: a
  //! connection's window seal, psk_authenticator::make_window_seal); outlives the transfer.
  message_seal* seal = nullptr;
  //! This side's sealed slots: depth * (chunk_bytes + sealed_message_overhead)
  //! bytes, registered for local and remote write.
  const memory_region* local = nullptr;
  //! The peer's sealed slots (remote write).
  remote_descriptor peer{};
};

//! The network side of a host-staged transfer over one RC queue pair (the protocol above):
//! blocking, one direction at a time, through a chunk_pipeline's bounce buffers.
class staged_rdma {
public:
  //! @param qp an RC queue pair whose receives this object alone posts
  //! @param bounce the registered local bounce buffers (the pipeline's)
  //! @param peer_bounce the peer's bounce buffers (remote write)
  //! @param options chunk size and depth, equal on both peers
  //! @throws rdx::error (invalid_argument) when the peer's buffers are too
  //!         small for depth chunks
  staged_rdma(queue_pair_view qp, completion_queue& send_cq, completion_queue& recv_cq,
              const memory_region& bounce, const remote_descriptor& peer_bounce,
              const staging_options& options, std::chrono::milliseconds timeout = std::chrono::seconds(30),
              const staged_seal& sealed = {})
      : qp_(qp),
        send_cq_(send_cq),
        recv_cq_(recv_cq),
        bounce_(bounce),
        peer_(peer_bounce),
        opt_(options),
        timeout_(timeout),
        sq_(qp, send_depth(qp), send_depth(qp) / 2),
        sealed_(sealed) {
    if (sealed_.seal != nullptr) {
      const std::size_t need = sealed_stride() * opt_.depth;
      if (sealed_.local == nullptr || sealed_.local->length() < need || !contains(sealed_.peer, 0, need)) {
        rdx::detail::throw_rdx(
            errc::invalid_argument,
            "staged_rdma: a sealed transfer needs depth * (chunk + 24) = " + std::to_string(need) +
                " bytes of sealed slots on each side (staged_seal)");
      }
    }
    if (!contains(peer_, 0, opt_.chunk_bytes * opt_.depth)) {
      rdx::detail::throw_rdx(errc::invalid_argument,
                             "staged_rdma: the peer's bounce buffers (" + std::to_string(peer_.length) +
                                 " bytes) hold fewer than " + std::to_string(opt_.depth) + " chunks");
    }
    if (bounce_.length() < opt_.chunk_bytes * opt_.depth) {
      rdx::detail::throw_rdx(errc::invalid_argument, "staged_rdma: the local bounce region is smaller than " +
                                                         std::to_string(opt_.depth) + " chunks");
    }
  }

  //! Receives the protocol keeps posted: the queue pair's max_recv_wr must be
  //! at least this.
  [[nodiscard]] std::uint32_t receive_depth() const noexcept {
    return static_cast<std::uint32_t>(opt_.depth) + 4;
  }

  //! Posts the receives; call once, before the peer may send.
  void post_receives() {
    for (std::uint32_t i = 0; i < receive_depth(); ++i) {
      post_receive();
    }
  }

  //! Sends device (or pipeline) bytes [src, src + bytes) to the peer's
  //! receive() of the same size. Up to depth chunk writes are in flight at
  //! once, overlapping with the pipeline's copies of the next chunks: a write
  //! is waited for only before its bounce slot is refilled (the pipeline's
  //! wait_slot) and at the end, when every write has completed.
  //! @throws rdx::error on a timeout, a failed completion or a protocol error;
  //!         the object is unusable afterwards (its writes may still be posted)
  template <chunk_pipeline P>
  transfer_stats send(P& pipe, const void* src, std::size_t bytes) {
    check_pipeline(pipe);
    return guarded("send", "write of chunk", [&] {
      writer w{*this};
      return pipe.send(src, bytes, w);
    });
  }

  //! Receives the peer's send() of bytes into [dst, dst + bytes). Each
  //! slot credit goes out as soon as the pipeline says the slot is free (the
  //! copy of the chunk it held has finished), without a wait; all have
  //! completed on return.
  template <chunk_pipeline P>
  transfer_stats receive(P& pipe, void* dst, std::size_t bytes) {
    check_pipeline(pipe);
    return guarded("receive", "slot credit for chunk", [&] {
      reader r{*this};
      return pipe.receive(dst, bytes, r);
    });
  }

  //! The most requests (chunk writes, slot credits) posted and not yet
  //! completed at once during the last send() or receive(): up to depth
  //! (plus one that asks for a completion) when the pipeline overlaps.
  [[nodiscard]] std::uint32_t peak_in_flight() const noexcept { return peak_; }

  //! The immediate of the write that carries chunk i: 0x80000000 | i (i's low 31 bits).
  static constexpr std::uint32_t data_tag(std::size_t i) noexcept {
    return 0x80000000u | static_cast<std::uint32_t>(i & 0x7fffffffu);
  }
  //! The immediate of the send that hands chunk i's slot back: i's low 31 bits.
  static constexpr std::uint32_t credit_tag(std::size_t i) noexcept {
    return static_cast<std::uint32_t>(i & 0x7fffffffu);
  }

private:
  template <class P>
  void check_pipeline(const P& pipe) const {
    const staging_options& o = pipe.options();
    if (o.chunk_bytes != opt_.chunk_bytes || o.depth != opt_.depth) {
      rdx::detail::throw_rdx(errc::invalid_argument,
                             "staged_rdma: the pipeline's chunk size or depth differs");
    }
    if (static_cast<const void*>(pipe.bounce_buffers().data()) != bounce_.addr()) {
      rdx::detail::throw_rdx(errc::invalid_argument, "staged_rdma: the bounce region is not the pipeline's");
    }
  }
  // The send-queue engine's depth: the queue pair's send queue (2 at least).
  static std::uint32_t send_depth(queue_pair_view qp) noexcept {
    return std::max<std::uint32_t>(2, qp.caps().max_send_wr);
  }
  [[noreturn]] static void fail(const char* what, std::size_t chunk, const std::string& why) {
    rdx::detail::throw_rdx(errc::operation_failed, std::string("staged transfer: ") + what + " " +
                                                       std::to_string(chunk) + ": " + why);
  }
  void post_receive() {
    // Chunks land by RDMA write, credits carry no bytes: receives hold none.
    auto wr = wr::recv(std::span<const ibv_sge>{});
    if (auto ec = qp_.post_recv(wr)) {
      fail("post a receive, before chunk", 0, ec.message());
    }
  }
  completion wait(completion_queue& cq, const char* what, std::size_t chunk) {
    completion c{};
    const std::error_code ec = poll_one(cq, c, timeout_);
    if (ec) {
      fail(what, chunk,
           ec == errc::timed_out ? "no completion in time (has the peer stopped?)" : ec.message());
    }
    if (!c.ok()) {
      fail(what, chunk, c.error().message());
    }
    return c;
  }
  // Runs one transfer and waits for all it posted; a throw leaves the
  // object refusing further transfers (the protocol state is lost).
  template <class F>
  transfer_stats guarded(const char* what, const char* last_request, F&& run) {
    usable(what);
    peak_ = 0;
    try {
      transfer_stats st = run();
      drain(last_request, st.chunks == 0 ? 0 : st.chunks - 1);
      return st;
    } catch (...) {
      failed_ = true;
      throw;
    }
  }
  // The pipeline's sink: writes a chunk, and waits for a slot's write
  // before the pipeline refills that slot.
  struct writer {
    staged_rdma& s;
    void operator()(const staged_chunk& c) { s.write_chunk(c); }
    void wait_slot(std::size_t slot) { s.wait_slot(slot); }
    bool slot_done(std::size_t slot) { return s.slot_done(slot); }
  };
  // The pipeline's source: waits for a chunk's write; hands a slot back to
  // the sender once the pipeline has copied the chunk out of it.
  struct reader {
    staged_rdma& s;
    void operator()(const staged_chunk& c) { s.read_chunk(c); }
    void slot_released(std::size_t chunk) { s.release_slot(chunk); }
  };
  void read_chunk(const staged_chunk& c) {
    const completion done = expect(data_tag(c.index), "chunk", c.index);
    const std::size_t expected = c.host.size() + (sealed_.seal != nullptr ? sealed_message_overhead : 0);
    if (done.byte_len() != expected) {
      fail("chunk", c.index,
           std::to_string(done.byte_len()) + " bytes arrived, expected " + std::to_string(expected));
    }
    if (sealed_.seal != nullptr) {
      // Opened into the bounce slot only once its tag has checked.
      if (sealed_.seal->open({sealed_slot(c.slot), expected}, c.host.data())) {
        rdx::detail::throw_rdx(errc::integrity_failed, "staged transfer: chunk " + std::to_string(c.index) +
                                                           ": " + sealed_.seal->failure());
      }
    }
  }
  [[nodiscard]] std::size_t sealed_stride() const noexcept {
    return opt_.chunk_bytes + sealed_message_overhead;
  }
  // Where bounce slot `slot`'s chunk is sealed (sender) or lands sealed (receiver).
  [[nodiscard]] std::byte* sealed_slot(std::size_t slot) const noexcept {
    return static_cast<std::byte*>(sealed_.local->addr()) + slot * sealed_stride();
  }
  // Chunk k's slot is free: the sender may write chunk k + depth into it.
  void release_slot(std::size_t k) {
    const std::size_t i = k + opt_.depth;
    auto wr = wr::send_imm(std::span<const ibv_sge>{}, credit_tag(i));
    (void)post(wr, "slot credit for chunk", i, false);
  }
  // Whether the write last posted from slot has completed, without waiting.
  bool slot_done(std::size_t slot) {
    const slot_write& w = slots_[slot];
    if (!w.posted || sq_.find(w.seq) == nullptr) {
      return true;
    }
    completion c[4];
    std::size_t got = 0;
    if (const std::error_code ec = send_cq_.poll(std::span<completion>(c), got)) {
      fail("write of chunk", w.chunk, "ibv_poll_cq failed: " + ec.message());
    }
    for (std::size_t k = 0; k < got; ++k) {
      retire(c[k]);
    }
    if (error_) {
      fail("write of chunk", error_chunk_, error_.message());
    }
    return sq_.find(w.seq) == nullptr;
  }
  void write_chunk(const staged_chunk& c) {
    if (c.index >= opt_.depth) {
      (void)expect(credit_tag(c.index), "slot credit for chunk", c.index);
    }
    // Sealed, the chunk goes from its sealed slot, sealed there now.
    const bool sealed = sealed_.seal != nullptr;
    if (sealed) {
      if (auto ec = sealed_.seal->seal(c.host, sealed_slot(c.slot))) {
        fail("seal of chunk", c.index, ec.message());
      }
    }
    const std::size_t off = c.slot * (sealed ? sealed_stride() : opt_.chunk_bytes);
    auto wr = sealed ? wr::write_imm(sealed_.local->sge(off, c.host.size() + sealed_message_overhead),
                                     at(sealed_.peer, off), data_tag(c.index))
                     : wr::write_imm(bounce_.sge(off, c.host.size()), at(peer_, off), data_tag(c.index));
    // Signaled: its own completion frees the slot (slot_done, wait_slot).
    slots_[c.slot] = slot_write{post(wr, "write of chunk", c.index, true), c.index, true};
  }
  void wait_slot(std::size_t slot) {
    slot_write& w = slots_[slot];
    if (!w.posted) {
      return;
    }
    w.posted = false;
    if (sq_.find(w.seq) == nullptr) {
      return;
    }
    if (!sq_.cover()) {
      fail("write of chunk", w.chunk, "post of the request that signals it");
    }
    while (sq_.find(w.seq) != nullptr) {
      retire_one("write of chunk", w.chunk);
    }
    if (error_) {
      fail("write of chunk", error_chunk_, error_.message());
    }
  }
  void usable(const char* what) const {
    if (failed_) {
      rdx::detail::throw_rdx(errc::operation_failed, std::string("staged transfer: ") + what +
                                                         ": an earlier transfer on this queue pair failed");
    }
  }
  // Posts w through the send-queue engine (room made by retiring what has
  // completed) and returns its sequence number; the caller waits later.
  std::uint64_t post(send_wr& w, const char* what, std::size_t chunk, bool signaled) {
    while (!sq_.has_room()) {
      if (!sq_.cover()) {
        fail(what, chunk, "post of the request that signals it");
      }
      retire_one(what, chunk);
    }
    if (error_) {
      fail(what, error_chunk_, error_.message());
    }
    const std::uint64_t seq = sq_.next_seq();
    const auto aux = static_cast<std::uint32_t>(chunk);
    if (auto ec = signaled ? sq_.post_signaled(w, this, 1, aux) : sq_.post(w, this, 1, aux)) {
      fail(what, chunk, "post: " + ec.message());
    }
    peak_ = std::max(peak_, sq_.outstanding());
    return seq;
  }
  // Waits until everything posted has completed.
  void drain(const char* what, std::size_t chunk) {
    for (auto& w : slots_) {
      w.posted = false;
    }
    if (sq_.outstanding() != 0 && !sq_.cover()) {
      fail(what, chunk, "post of the request that signals it");
    }
    while (sq_.outstanding() != 0) {
      retire_one(what, chunk);
    }
    if (error_) {
      fail(what, error_chunk_, error_.message());
    }
  }
  // Takes one send completion and retires what it covers; the first failed
  // request is remembered (error_, error_chunk_).
  void retire_one(const char* what, std::size_t chunk) {
    completion c{};
    const std::error_code ec = poll_one(send_cq_, c, timeout_);
    if (ec) {
      fail(what, chunk,
           ec == errc::timed_out ? "no completion in time (has the peer stopped?)" : ec.message());
    }
    retire(c);
  }
  void retire(const completion& c) {
    sq_.retire(c, qp_failed_, [&](const sq_record& r, std::error_code e) {
      if (e && !error_) {
        error_ = e;
        error_chunk_ = r.aux;
      }
    });
    if (!c.ok()) {
      qp_failed_ = true;
    }
  }
  completion expect(std::uint32_t imm, const char* what, std::size_t chunk) {
    completion c = wait(recv_cq_, what, chunk);
    post_receive();
    if (!c.has_imm() || c.imm() != imm) {
      fail(what, chunk,
           "immediate " + (c.has_imm() ? std::to_string(c.imm()) : std::string("none")) + ", expected " +
               std::to_string(imm));
    }
    return c;
  }

  queue_pair_view qp_;
  completion_queue& send_cq_;
  completion_queue& recv_cq_;
  const memory_region& bounce_;
  remote_descriptor peer_;
  staging_options opt_;
  std::chrono::milliseconds timeout_;
  send_queue sq_;
  staged_seal sealed_;
  // The write last posted from each bounce slot (send), so that the slot is
  // refilled only once that write has completed.
  struct slot_write {
    std::uint64_t seq = 0;
    std::size_t chunk = 0;
    bool posted = false;
  };
  std::vector<slot_write> slots_ = std::vector<slot_write>(opt_.depth);
  std::uint32_t peak_ = 0;
  std::error_code error_;        // the first request that failed
  std::size_t error_chunk_ = 0;  // its chunk
  bool qp_failed_ = false;       // a completion failed: later ones are flushes
  bool failed_ = false;          // a transfer threw: the protocol state is lost
};

}  // namespace rdx::cuda
