// rdx: the delay-based window that paces striped writes and reads.
//
// RoCE's go-back-N recovery resends everything in flight after one lost
// packet, so the bytes in flight are what a loss costs. This window limits
// them from one signal, the completion time of each chunk:
//   - the base is the shortest completion time seen for chunks of that size
//     class (64 KiB, 128 KiB, ... 1 MiB), re-learned every `epoch`
//     completions so that a path that became slower is not judged against an
//     old, faster one;
//   - each completion's delay against its base is smoothed (1/8 a sample),
//     so that one hiccup among many is not news but an ACK timeout's wait is;
//   - while the smoothed delay is within the target (base + max(base x
//     target_percent%, target_floor)), a completion grows the window: by the completed bytes in start-up
//     (doubling per round trip), then by one smallest chunk per window's worth
//     of completions (additive increase);
//   - a smoothed delay above the target shrinks it, at most once per round trip,
//     by a factor that grows with the excess delay (1 - beta x excess / rtt,
//     beta 0.8) and is at most max_decrease_percent% (multiplicative
//     decrease); start-up ends there;
//   - the chunk follows the window (min_chunk doubled while it fits four
//     times in the window, up to max_chunk, so each chunk size is one size
//     class): a lossy path resends small chunks, a clean one sends large ones.
// The window never falls below one chunk and never exceeds max_window. All
// arithmetic is on 64-bit integers, saturating; nothing allocates or throws.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>

namespace rdx::detail {

//! a + b for b >= 0, saturating at the largest int64 instead of overflowing.
[[nodiscard]] inline std::int64_t sat_add(std::int64_t a, std::int64_t b) noexcept {
  return a > std::numeric_limits<std::int64_t>::max() - b ? std::numeric_limits<std::int64_t>::max() : a + b;
}

//! The bounds and gains of a pacing_window; the defaults are rdx's.
struct pacing_limits {
  // 64-bit, so that the defaults below are computed in 64 bits.
  static constexpr std::uint64_t kib = 1024;
  static constexpr std::uint64_t mib = 1024 * kib;

  std::uint64_t min_chunk = 64 * kib;             //!< smallest chunk and smallest window, 4 KiB multiple
  std::uint64_t max_chunk = mib;                  //!< largest chunk, 4 KiB multiple
  std::uint64_t max_window = 64 * mib;            //!< most bytes in flight
  std::uint64_t initial_window = 256 * kib;       //!< bytes in flight before any completion
  std::uint32_t target_percent = 50;              //!< target = base + base x this / 100 ...
  std::chrono::nanoseconds target_floor{50'000};  //!< ... or base + this, whichever is larger
  std::uint32_t max_decrease_percent = 50;        //!< the most one decrease takes
  std::uint32_t epoch = 256;                      //!< completions between re-learnings of the base
  std::uint64_t lossy_request = 8 * kib;          //!< the request a chunk is cut into on a lossy path
};

class pacing_window {
public:
  enum class phase : std::uint8_t { start_up, steady };

  explicit pacing_window(const pacing_limits& l = {}) noexcept : l_(sane(l)) {
    window_ = std::clamp(l_.initial_window, l_.min_chunk, l_.max_window);
    base_.fill(none);
    epoch_min_.fill(none);
  }

  //! Bytes allowed in flight now.
  [[nodiscard]] std::uint64_t window() const noexcept { return window_; }
  //! Whether one more chunk may go with `in_flight` bytes outstanding: always
  //! when nothing is in flight (the window is at least one chunk), so the
  //! window never stalls the transfer.
  [[nodiscard]] bool may_send(std::uint64_t in_flight) const noexcept { return in_flight < window_; }
  //! The chunk size to cut the next pieces at: min_chunk x 2^k, the largest
  //! at most a quarter of the window, and at most max_chunk.
  [[nodiscard]] std::uint64_t chunk() const noexcept {
    std::uint64_t c = l_.min_chunk;
    while (c <= l_.max_chunk / 2 && c * 2 <= window_ / 4) {
      c *= 2;
    }
    return c;
  }
  //! The size of the requests a chunk is posted as: the whole chunk, or
  //! lossy_request while losses were seen in the last epoch's completions.
  //! RoCE's go-back-N asks for an ACK at the end of each request: small
  //! requests on a lossy path end a retransmission sooner (a requester that
  //! is retransmitting ignores the next sequence NAK until an ACK comes, and
  //! then waits out a whole ACK timeout).
  [[nodiscard]] std::uint64_t request() const noexcept {
    return lossy_left_ != 0 ? std::min(l_.lossy_request, chunk()) : chunk();
  }
  //! A chunk completed after waiting out a retransmission (the engine
  //! says so when it took half the ACK timeout or more): the path drops
  //! packets, and the window does not judge it as a queue. The window stays
  //! (a cut makes more bursts, each with a last packet only a timeout
  //! recovers) and the requests become small for an epoch of completions.
  void on_loss() noexcept {
    ++losses_;
    lossy_left_ = l_.epoch;
  }
  //! Chunks that waited out a retransmission.
  [[nodiscard]] std::uint64_t losses() const noexcept { return losses_; }
  [[nodiscard]] phase current_phase() const noexcept { return phase_; }
  //! The base completion time of a chunk of `bytes` (zero before any sample).
  [[nodiscard]] std::chrono::nanoseconds base(std::uint64_t bytes) const noexcept {
    const std::int64_t b = base_of(class_of(bytes), bytes);
    return std::chrono::nanoseconds{b == none ? 0 : b};
  }
  //! The completion time above which a chunk of `bytes` counts as delayed.
  [[nodiscard]] std::chrono::nanoseconds target(std::uint64_t bytes) const noexcept {
    const std::int64_t b = base_of(class_of(bytes), bytes);
    return std::chrono::nanoseconds{b == none ? std::numeric_limits<std::int64_t>::max() : goal_of(b)};
  }
  [[nodiscard]] std::uint64_t decreases() const noexcept { return decreases_; }

  //! A chunk of `bytes` completed `rtt` after it was posted; `now` is the
  //! time of the completion (any monotonic clock, the same on every call).
  void on_completion(std::uint64_t bytes, std::chrono::nanoseconds rtt,
                     std::chrono::nanoseconds now) noexcept {
    on_completion(bytes, rtt, now, rtt);
  }
  //! The same, judged by `delay` (the chunk's completion time per the bytes
  //! that were queued ahead of it, say) while `rtt` spaces the decreases.
  void on_completion(std::uint64_t bytes, std::chrono::nanoseconds delay, std::chrono::nanoseconds now,
                     std::chrono::nanoseconds rtt) noexcept {
    if (bytes == 0) {
      return;
    }
    if (lossy_left_ != 0) {
      --lossy_left_;
    }
    const std::int64_t t = std::max<std::int64_t>(delay.count(), 1);
    const unsigned c = class_of(bytes);
    // Judged against the base before this sample (a first chunk of a size
    // has its base estimated from the nearest size), then learned from.
    const std::int64_t b = base_of(c, bytes);
    learn(c, t);
    if (b == none) {
      return on_time(bytes);  // the first chunk of all: nothing to judge it by
    }
    const auto base = static_cast<std::uint64_t>(std::max<std::int64_t>(b, 1));
    // The delay against the base, in thousandths, smoothed by 1/8 a sample:
    // one slow completion among many (a scheduler's hiccup) is not news, one
    // that waited out an ACK timeout (tens of times the base) is, and so is a
    // path that stays slower.
    const std::uint64_t ratio =
        std::min<std::uint64_t>(mul_div(static_cast<std::uint64_t>(t), 1000, base), std::uint64_t{1} << 40);
    smooth_ = smooth_ == 0 ? ratio : smooth_ - smooth_ / 8 + ratio / 8;
    const std::uint64_t goal_ratio = mul_div(static_cast<std::uint64_t>(goal_of(b)), 1000, base);
    if (b > 0 && smooth_ > goal_ratio) {  // a base estimated as 0 judges nothing
      decrease(static_cast<std::int64_t>(smooth_), static_cast<std::int64_t>(goal_ratio), now.count(),
               std::max<std::int64_t>(rtt.count(), t));
      return;
    }
    on_time(bytes);
  }

private:
  // A chunk completed within the target: start-up doubles the window per
  // round trip, then one smallest chunk per window's worth of completions.
  void on_time(std::uint64_t bytes) noexcept {
    if (phase_ == phase::start_up) {
      grow(bytes);
    } else {
      grow(std::max<std::uint64_t>(mul_div(l_.min_chunk, bytes, window_), 1));
    }
  }

  std::uint64_t losses_ = 0;
  std::uint32_t lossy_left_ = 0;  // completions left in lossy mode (small requests)
  static constexpr std::int64_t none = -1;
  static constexpr unsigned classes = 16;

  // The completion time above which a chunk whose base is b counts as delayed.
  [[nodiscard]] std::int64_t goal_of(std::int64_t b) const noexcept {
    return sat_add(b, std::max<std::int64_t>(b / 100 * l_.target_percent, l_.target_floor.count()));
  }

  static pacing_limits sane(pacing_limits l) noexcept {
    auto align = [](std::uint64_t v) { return std::max<std::uint64_t>(v & ~std::uint64_t{4095}, 4096); };
    l.min_chunk = align(l.min_chunk);
    l.max_chunk = std::max(align(l.max_chunk), l.min_chunk);
    l.max_chunk = std::min(l.max_chunk, l.min_chunk << 15);  // the size classes cover 2^15 x min_chunk
    l.max_window = std::max(l.max_window, l.min_chunk);
    l.max_decrease_percent = std::clamp<std::uint32_t>(l.max_decrease_percent, 1, 99);
    l.epoch = std::max<std::uint32_t>(l.epoch, 1);
    l.lossy_request = std::min(align(l.lossy_request), l.min_chunk);
    return l;
  }
  // Size classes by powers of two above min_chunk: 0 for up to min_chunk.
  unsigned class_of(std::uint64_t bytes) const noexcept {
    unsigned c = 0;
    for (std::uint64_t s = l_.min_chunk; s < bytes && c + 1 < classes; s *= 2) {
      ++c;
    }
    return c;
  }
  std::uint64_t class_bytes(unsigned c) const noexcept { return l_.min_chunk << c; }
  // The base of class c, or one scaled from the nearest class that has one
  // (by size: an estimate until a chunk of this class completes).
  std::int64_t base_of(unsigned c, std::uint64_t bytes) const noexcept {
    if (base_[c] != none) {
      return base_[c];
    }
    for (unsigned d = 1; d < classes; ++d) {
      for (int sign : {-1, 1}) {
        const int k = static_cast<int>(c) + sign * static_cast<int>(d);
        if (k < 0 || k >= static_cast<int>(classes) || base_[static_cast<unsigned>(k)] == none) {
          continue;
        }
        return static_cast<std::int64_t>(mul_div(static_cast<std::uint64_t>(base_[static_cast<unsigned>(k)]),
                                                 std::max(bytes, l_.min_chunk),
                                                 class_bytes(static_cast<unsigned>(k))));
      }
    }
    return none;
  }
  void learn(unsigned c, std::int64_t t) noexcept {
    if (base_[c] == none || t < base_[c]) {
      base_[c] = t;
    }
    if (epoch_min_[c] == none || t < epoch_min_[c]) {
      epoch_min_[c] = t;
    }
    if (++seen_ < l_.epoch) {
      return;
    }
    // Epoch over: the base becomes the shortest time of the last epoch for
    // the classes that had completions in it.
    seen_ = 0;
    for (unsigned k = 0; k < classes; ++k) {
      if (epoch_min_[k] != none) {
        base_[k] = epoch_min_[k];
      }
      epoch_min_[k] = none;
    }
  }
  void grow(std::uint64_t by) noexcept {
    window_ = by >= l_.max_window - window_ ? l_.max_window : window_ + by;  // window_ <= max_window
  }
  void decrease(std::int64_t t, std::int64_t goal, std::int64_t now, std::int64_t rtt) noexcept {
    phase_ = phase::steady;
    // At most once per round trip: the chunks in flight when the first one
    // was late carry the same news.
    if (last_decrease_ != none && now - last_decrease_ < rtt) {
      return;
    }
    last_decrease_ = now;
    ++decreases_;
    smooth_ = 1000;  // the news is taken: what comes after is judged afresh
    // factor = 1 - 0.8 x (t - goal) / t, at least 1 - max_decrease.
    const std::uint64_t excess_permille =
        mul_div(800, static_cast<std::uint64_t>(t - goal), static_cast<std::uint64_t>(t));
    const std::uint64_t keep = std::max<std::uint64_t>(1000 - std::min<std::uint64_t>(excess_permille, 1000),
                                                       1000 - std::uint64_t{l_.max_decrease_percent} * 10);
    window_ = std::max(l_.min_chunk, mul_div(window_, keep, 1000));
  }
  // a x b / d, saturating instead of overflowing.
  static std::uint64_t mul_div(std::uint64_t a, std::uint64_t b, std::uint64_t d) noexcept {
    constexpr std::uint64_t top = std::numeric_limits<std::uint64_t>::max();
    if (d == 0) {
      return top;
    }
    const std::uint64_t q = a / d;
    const std::uint64_t r = a % d;  // a x b / d = q x b + r x b / d
    if (b != 0 && q > top / b) {
      return top;
    }
    const std::uint64_t whole = q * b;
    const std::uint64_t part =
        (r != 0 && b > top / r) ? static_cast<std::uint64_t>(static_cast<long double>(r) * b / d) : r * b / d;
    return whole > top - part ? top : whole + part;
  }

  pacing_limits l_;
  std::uint64_t window_ = 0;
  phase phase_ = phase::start_up;
  std::array<std::int64_t, classes> base_{};
  std::array<std::int64_t, classes> epoch_min_{};
  std::uint32_t seen_ = 0;
  std::int64_t last_decrease_ = none;
  std::uint64_t decreases_ = 0;
  std::uint64_t smooth_ = 0;  // delay / base in thousandths, smoothed
};

//! When a queue pair's paced chunks deserve a tail probe. RoCE learns of a
//! lost packet from the packets after it (the responder's sequence NAK, a
//! read's later responses); the last packets of a burst have none after
//! them, and their loss (or their ACK's) is found only when the ACK timeout
//! passes: 67 ms at rdx's default, tens of chunks' time. A zero-length write
//! posted behind them is such a later packet: the responder NAKs the gap, or
//! acknowledges everything when only the ACK was lost, and a read's gap shows
//! in the probe's ACK. A probe is due when the oldest chunk in flight has
//! waited one and a half chunk times (smoothed, 1/8 a sample: the time from
//! when the chunk was posted, or the completion before it, to its own) plus
//! `floor` since it was posted, the last completion or the last probe,
//! whichever is latest. A needless probe costs one empty packet.
class tail_probe {
public:
  explicit tail_probe(std::chrono::nanoseconds floor = std::chrono::milliseconds(2)) noexcept
      : floor_(std::max<std::int64_t>(floor.count(), 0)) {}
  //! A chunk posted at `posted` completed at `now` (ns, one monotonic
  //! clock); `lost` when it waited out a retransmission, whose time does
  //! not enter the smoothing.
  void on_completion(std::int64_t posted, std::int64_t now, bool lost = false) noexcept {
    const std::int64_t t = std::max<std::int64_t>(now - std::max(posted, last_), 0);
    last_ = std::max(last_, now);
    if (!lost) {
      chunk_time_ = chunk_time_ == 0 ? t : chunk_time_ - chunk_time_ / 8 + t / 8;
    }
  }
  //! How long the oldest chunk may wait before a probe.
  [[nodiscard]] std::int64_t patience() const noexcept {
    return sat_add(chunk_time_ + chunk_time_ / 2, floor_);
  }
  //! Whether a probe is due at `now`, the oldest chunk in flight posted at `oldest`.
  [[nodiscard]] bool due(std::int64_t oldest, std::int64_t now) const noexcept {
    return now - std::max({oldest, last_, probed_}) >= patience();
  }
  //! A probe went out at `now`.
  void probed(std::int64_t now) noexcept {
    probed_ = now;
    ++probes_;
  }
  [[nodiscard]] std::uint64_t probes() const noexcept { return probes_; }
  [[nodiscard]] std::int64_t chunk_time() const noexcept { return chunk_time_; }

private:
  std::int64_t floor_;
  std::int64_t chunk_time_ = 0;
  std::int64_t last_ = 0;
  std::int64_t probed_ = 0;
  std::uint64_t probes_ = 0;
};

//! The paced chunks of one queue pair in posting order, with their posting
//! time (a reliable connection completes them in that order). Sized for the
//! queue pair's send depth at set-up; push and pop allocate nothing.
class paced_chunks {
public:
  struct entry {
    std::int64_t posted_ns = 0;  //!< steady clock at posting
    std::uint64_t bytes = 0;
    std::uint64_t queued = 0;  //!< bytes in flight when it was posted, itself included
    bool full = false;         //!< a whole chunk of the window's size then (only those teach it)
  };
  explicit paced_chunks(std::uint32_t depth) {
    std::uint64_t n = 1;
    while (n < std::uint64_t{depth} + 1) {
      n *= 2;
    }
    ring_ = std::make_unique<entry[]>(n);
    mask_ = n - 1;
  }
  void push(const entry& e) noexcept { ring_[tail_++ & mask_] = e; }
  //! The oldest chunk, or an empty entry when none is recorded.
  entry pop() noexcept { return head_ == tail_ ? entry{} : ring_[head_++ & mask_]; }
  //! The oldest chunk still in flight, or nullptr.
  [[nodiscard]] const entry* oldest() const noexcept {
    return head_ == tail_ ? nullptr : &ring_[head_ & mask_];
  }

  tail_probe tail;  //!< when this queue pair's tail deserves a probe

private:
  std::unique_ptr<entry[]> ring_;
  std::uint64_t mask_ = 0, head_ = 0, tail_ = 0;
};

}  // namespace rdx::detail
