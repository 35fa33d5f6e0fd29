// rdx::detail: how a connection posts a window write or read: one request,
// or chunks split at chunk_size boundaries over its queue pairs, paced where
// pacing is on. A part of detail/engine_all.hpp (include that).
#pragma once

#include <rdx/channel/detail/engine.hpp>

namespace rdx::detail {

// A write or read: one request, or post_chunks when it spans several chunks.
// Kept apart from post_some, so that its few live values stay in registers
// across the provider's calls.
engine::post_result engine::post_rdma(operation& op) noexcept {
  op_params& p = op.p_;
  const std::uint64_t len = p.length - p.posted;
  // More than a page across a chunk boundary: post_chunks, one doorbell per queue pair.
  if (len > whole_ && len > chunk_left(p)) {
    return post_chunks(op);
  }
  const std::uint32_t qi = next_qp();
  send_queue& q = sqs_[qi];
  if (!q.has_room()) {
    return post_result::blocked;
  }
  p.qp = qi;
  p.seq = q.next_seq();
  flat_wr w = chunk_request(op, len, qi);
  // Counted before the post (taken back if refused), so that little stays live across it.
  ++rr_;
  ++op.pending_;
  p.posted += len;
  if (std::error_code ec = q.post(w, &op, rec_op)) [[unlikely]] {
    --op.pending_;
    p.posted -= len;
    return refused(op, ec);
  }
  return post_result::all;
}

// The provider refused op's request: what was posted of op finishes on its
// own; the rest fails here.
engine::post_result engine::refused(operation& op, std::error_code ec) noexcept {
  release_slot(op.p_);
  if (!op.ec_) {
    op.ec_ = ec;
  }
  if (op.pending_ == 0) {
    op.done_ = true;
  }
  return post_result::failed;
}

// The chunks of a write or read that spans several: split at chunk_size
// boundaries of the remote address, round-robin over the queue pairs, each
// queue pair's chunks held in its chain and posted with one doorbell.
engine::post_result engine::post_chunks(operation& op) noexcept {
  op_params& p = op.p_;
  std::error_code ec;
  bool blocked = false;
  for (auto& q : sqs_) {
    q.hold();
  }
  while (p.posted < p.length) {
    std::uint64_t len = std::min(p.length - p.posted, pacing_ ? paced_left(p) : chunk_left(p));
    const std::uint32_t qi = next_qp();
    send_queue& q = sqs_[qi];
    if (!q.has_room()) {
      blocked = true;
      break;
    }
    p.qp = qi;
    p.seq = q.next_seq();
    if (pacing_) {
      // The window is full: the rest waits in the deferred list, posted as
      // paced chunks complete (pump()).
      if (!pacer_.may_send(paced_bytes_)) {
        blocked = true;
        break;
      }
      // On a lossy path the chunk goes as several requests (the window's
      // request()): the last is signaled and timed, the others are not.
      const std::uint64_t req = pacer_.request();
      const std::uint64_t parts = (len + req - 1) / req;
      if (parts > 1 && !q.has_room(static_cast<std::uint32_t>(parts))) {
        blocked = true;
        break;
      }
      const auto now = std::chrono::steady_clock::now().time_since_epoch();
      paced_bytes_ += len;
      paced_[qi].push({std::chrono::duration_cast<std::chrono::nanoseconds>(now).count(), len, paced_bytes_,
                       len == pacer_.chunk()});
      for (std::uint64_t k = 1; k < parts; ++k) {
        q.emplace_held([&] { return send_wr::from(chunk_request(op, req, qi)); }, &op, rec_op);
        ++op.pending_;
        p.posted += req;
        len -= req;
      }
      p.seq = q.next_seq();
      q.emplace_held_signaled([&] { return send_wr::from(chunk_request(op, len, qi)); }, &op, rec_paced, qi);
    } else {
      q.emplace_held([&] { return send_wr::from(chunk_request(op, len, qi)); }, &op, rec_op);
    }
    ++rr_;
    ++op.pending_;
    p.posted += len;
  }
  // Chunks a queue pair refused never reached the NIC: each ends its part of
  // the operation with the error (retire), and nothing more of it is posted.
  for (auto& q : sqs_) {
    const std::error_code rec = q.release([this](const sq_record& r, std::error_code e) { retire(r, e); });
    if (rec && !ec) {
      ec = rec;
    }
  }
  if (!ec) {
    return blocked ? post_result::blocked : post_result::all;
  }
  p.posted = p.length;
  if (!op.ec_) {
    op.ec_ = ec;
  }
  if (op.pending_ == 0) {
    op.done_ = true;
  }
  return post_result::failed;
}

// A paced chunk retired (completed, flushed or never posted): its bytes
// leave the window, and a whole chunk that completed teaches it its time.
inline void engine::paced_done(std::uint32_t qi, std::error_code ec) noexcept {
  if (qi >= paced_.size()) {
    return;
  }
  const paced_chunks::entry e = paced_[qi].pop();
  paced_bytes_ -= std::min(paced_bytes_, e.bytes);
  if (ec) {
    return;
  }
  const std::chrono::nanoseconds now = std::chrono::steady_clock::now().time_since_epoch();
  const std::chrono::nanoseconds rtt = now - std::chrono::nanoseconds(e.posted_ns);
  // Half the ACK timeout or more from posting to completion: it waited out a retransmission.
  const bool lost = rtt.count() >= loss_wait_ns_;
  paced_[qi].tail.on_completion(e.posted_ns, now.count(), lost);
  if (lost) {
    pacer_.on_loss();
    return;
  }
  if (!e.full) {
    return;
  }
  // The chunk waited behind what was queued when it left: its time per its
  // share of that queue is what a crowded or lossy path lengthens, where the
  // bare completion time grows with the window itself.
  const auto share = std::chrono::nanoseconds(
      static_cast<std::int64_t>(static_cast<double>(rtt.count()) * static_cast<double>(e.bytes) /
                                static_cast<double>(std::max(e.queued, e.bytes))));
  pacer_.on_completion(e.bytes, share, now, rtt);
}

// Tail-loss probes (see tail_probe): a zero-length write behind each queue
// pair's paced chunks whose oldest has waited past its patience. Called
// while progress finds nothing (every 16th such poll, a clock read) and
// between event waits.
inline void engine::probe_tails() noexcept {
  if (failed_ || paced_bytes_ == 0) {
    return;
  }
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  for (std::uint32_t qi = 0; qi < paced_.size(); ++qi) {
    paced_chunks& pc = paced_[qi];
    const paced_chunks::entry* e = pc.oldest();
    if (e != nullptr && pc.tail.due(e->posted_ns, now) && sqs_[qi].has_room() && sqs_[qi].probe()) {
      pc.tail.probed(now);
    }
  }
}

}  // namespace rdx::detail
