// Unit tests (no device): the delay-based pacing window's arithmetic on
// synthetic completion times: start-up growth, collapse on delay, recovery,
// the floor of one chunk, the ceiling, and no overflow at extreme inputs.
#include <rdx/channel/detail/pacing_window.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <limits>

namespace {
using namespace std::chrono_literals;
using rdx::detail::pacing_limits;
using rdx::detail::pacing_window;
constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;

// A path of 50 us latency moving 64 KiB in 150 us: the completion time of a
// chunk of c bytes, scaled by `slow`.
std::chrono::nanoseconds path_time(std::uint64_t c, std::int64_t slow = 1) {
  return (50us + 150us * static_cast<std::int64_t>(c / (64 * KiB))) * slow;
}

// Completes every chunk the window allows, `rounds` times, each at the path's
// time times `slow`; returns the clock at the end.
std::chrono::nanoseconds run_rounds(pacing_window& w, int rounds, std::chrono::nanoseconds now,
                                    std::int64_t slow = 1) {
  for (int r = 0; r < rounds; ++r) {
    const std::uint64_t chunk = w.chunk();
    const std::uint64_t n = std::max<std::uint64_t>(w.window() / chunk, 1);
    const auto rtt = path_time(chunk, slow);
    now += rtt;
    for (std::uint64_t i = 0; i < n; ++i) w.on_completion(chunk, rtt, now);
  }
  return now;
}
}  // namespace

TEST_CASE("pacing: start-up doubles the window each round trip until the ceiling") {
  pacing_window w;
  CHECK(w.window() == 256 * KiB);
  CHECK(w.chunk() == 64 * KiB);
  CHECK(w.current_phase() == pacing_window::phase::start_up);
  auto now = run_rounds(w, 1, 0ns);
  CHECK(w.window() == 512 * KiB);
  CHECK(w.chunk() == 128 * KiB);
  now = run_rounds(w, 1, now);
  CHECK(w.window() == 1 * MiB);
  CHECK(w.chunk() == 256 * KiB);
  // Larger chunks take longer: a time in proportion to the size is not delay.
  now = run_rounds(w, 20, now);
  CHECK(w.window() == 64 * MiB);  // pacing_limits::max_window
  CHECK(w.chunk() == 1 * MiB);    // pacing_limits::max_chunk
  CHECK(w.decreases() == 0);
  CHECK(w.current_phase() == pacing_window::phase::start_up);
  for (std::uint64_t c = 64 * KiB; c <= MiB; c *= 2) CHECK(w.base(c) == path_time(c));
}

TEST_CASE("pacing: a late completion collapses the window, once per round trip, to at most half") {
  pacing_window w;
  auto now = run_rounds(w, 6, 0ns);
  const std::uint64_t before = w.window();
  REQUIRE(before == 16 * MiB);
  const std::uint64_t c = w.chunk();
  // A retransmission: one chunk took an ACK timeout (67 ms) longer.
  now += 67ms;
  w.on_completion(c, 67ms, now);
  CHECK(w.window() == before / 2);  // the excess is huge: the cap of 50% applies
  CHECK(w.decreases() == 1);
  CHECK(w.current_phase() == pacing_window::phase::steady);
  // The rest of that round trip's chunks carry the same news: no second cut.
  for (int i = 0; i < 10; ++i) w.on_completion(c, 67ms, now + 1ms);
  CHECK(w.window() == before / 2);
  CHECK(w.decreases() == 1);
  // A round trip later it is news again.
  now += 70ms;
  w.on_completion(w.chunk(), 67ms, now);
  CHECK(w.window() == before / 4);
  CHECK(w.decreases() == 2);
}

TEST_CASE("pacing: a lasting small excess takes a small cut; one hiccup among many takes none") {
  pacing_limits l;
  l.target_floor = 0ns;
  pacing_window w(l);
  auto now = run_rounds(w, 3, 0ns);
  const std::uint64_t c = w.chunk();
  // No chunk of this size has completed yet: its base is scaled from the
  // next smaller size, which overestimates the path's latency share.
  CHECK(w.base(c) > path_time(c));
  now += path_time(c);
  w.on_completion(c, path_time(c), now);
  REQUIRE(w.chunk() == c);
  const auto base = w.base(c);
  REQUIRE(base == path_time(c));
  CHECK(w.target(c) == base + base / 2);
  // One completion at three times the base among ones on time: smoothed
  // away (1/8 of its excess), no cut.
  const std::uint64_t steady = w.window();
  now += base * 3;
  w.on_completion(c, base * 3, now);
  for (int i = 0; i < 4; ++i) {
    now += base;
    w.on_completion(c, base, now);
  }
  CHECK(w.decreases() == 0);
  CHECK(w.window() >= steady);
  // The path stays at twice the base: the smoothed delay climbs past the
  // target (1.5 base) and the window is cut once, by less than the cap.
  std::uint64_t before = 0;
  int samples = 0;
  while (w.decreases() == 0 && samples < 50) {
    before = w.window();
    now += base * 2;
    w.on_completion(c, base * 2, now);
    ++samples;
  }
  REQUIRE(w.decreases() == 1);
  CHECK(samples > 3);  // not at the first late completion
  CHECK(w.window() < before);
  CHECK(w.window() > before * 7 / 10);  // a small excess: a small cut (the cap is half)
}

TEST_CASE("pacing: after a collapse the window grows again by one chunk per round trip") {
  pacing_window w;
  auto now = run_rounds(w, 4, 0ns);
  now += 67ms;
  w.on_completion(w.chunk(), 67ms, now);
  const std::uint64_t low = w.window();
  REQUIRE(w.current_phase() == pacing_window::phase::steady);
  now = run_rounds(w, 1, now + 100ms);
  const std::uint64_t one = w.window();
  CHECK(one > low);
  CHECK(one - low <= 64 * KiB + 4 * KiB);  // about one smallest chunk per round trip
  CHECK(one - low >= 48 * KiB);
  now = run_rounds(w, 40, now);
  CHECK(w.window() >= one + 40 * 48 * KiB);
  CHECK(w.decreases() == 1);
}

TEST_CASE("pacing: the window never falls below one chunk, nor rises above its ceiling") {
  pacing_window w;
  auto now = run_rounds(w, 2, 0ns);
  for (int i = 0; i < 100; ++i) {
    now += 1s;
    w.on_completion(w.chunk(), 1s, now);
    CHECK(w.window() >= w.chunk());
    CHECK(w.chunk() >= 64 * KiB);
    CHECK(w.chunk() % 4096 == 0);
  }
  CHECK(w.window() == 64 * KiB);
  CHECK(w.chunk() == 64 * KiB);
  CHECK(w.may_send(0));  // nothing in flight: one chunk always goes
  CHECK(!w.may_send(64 * KiB));
  CHECK(w.may_send(60 * KiB));
}

TEST_CASE("pacing: extreme inputs neither overflow nor stall") {
  pacing_limits l;
  l.max_window = std::numeric_limits<std::uint64_t>::max();
  l.initial_window = std::numeric_limits<std::uint64_t>::max() - 5;
  pacing_window w(l);
  w.on_completion(std::numeric_limits<std::uint64_t>::max(), 1ns, 1ns);
  CHECK(w.window() == std::numeric_limits<std::uint64_t>::max());
  CHECK(w.chunk() == 1 * MiB);
  w.on_completion(std::numeric_limits<std::uint64_t>::max(), std::chrono::nanoseconds::max(), 2ns);
  CHECK(w.window() == std::numeric_limits<std::uint64_t>::max() / 2);
  w.on_completion(0, 5ms, 3ns);  // zero bytes: ignored
  w.on_completion(64 * KiB, 0ns, std::chrono::nanoseconds::max());
  w.on_completion(64 * KiB, -5ns, std::chrono::nanoseconds::max());
  CHECK(w.window() >= 64 * KiB);
  // Nonsense limits are made sane: chunks 4 KiB aligned, max >= min.
  pacing_limits odd;
  odd.min_chunk = 5000;
  odd.max_chunk = 100;
  odd.max_window = 1;
  odd.max_decrease_percent = 0;
  odd.epoch = 0;
  pacing_window v(odd);
  CHECK(v.chunk() == 4096);
  CHECK(v.window() == 4096);
  v.on_completion(4096, 10us, 10us);
  v.on_completion(4096, 10s, 20s);
  CHECK(v.window() == 4096);
}

TEST_CASE("pacing: the base is re-learned each epoch, so a slower path is not judged late for ever") {
  pacing_limits l;
  l.epoch = 8;
  pacing_window w(l);
  auto now = run_rounds(w, 3, 0ns);
  const std::uint64_t c = w.chunk();
  now += path_time(c);
  w.on_completion(c, path_time(c), now);
  REQUIRE(w.base(c) == path_time(c));
  // The path becomes four times slower for good (a longer route, say): the
  // first completions are late, then one epoch later the new time is the base.
  const auto slow = path_time(c, 4);
  for (int i = 0; i < 16; ++i) {
    now += slow;
    w.on_completion(c, slow, now);
  }
  CHECK(w.base(c) == slow);
  const std::uint64_t d = w.decreases();
  CHECK(d >= 1);
  const std::uint64_t win = w.window();
  for (int i = 0; i < 32; ++i) {
    now += slow;
    w.on_completion(c, slow, now);
  }
  CHECK(w.decreases() == d);
  CHECK(w.window() > win);
}

TEST_CASE("tail probe: due once the oldest chunk waits 1.5 chunk times plus the floor, then spaced") {
  using rdx::detail::tail_probe;
  constexpr std::int64_t ms = 1'000'000;
  tail_probe t(2ms);
  // Before any completion the patience is the floor alone.
  CHECK(t.patience() == 2 * ms);
  CHECK_FALSE(t.due(0, 2 * ms - 1));
  CHECK(t.due(0, 2 * ms));
  // Chunks streaming back to back, 4 ms each: posted together at 100 ms,
  // completing every 4 ms (each chunk's time counts from the one before).
  std::int64_t now = 100 * ms;
  for (int i = 1; i <= 40; ++i) t.on_completion(100 * ms, now += 4 * ms);
  CHECK(t.chunk_time() > 3 * ms);
  CHECK(t.chunk_time() <= 4 * ms);
  const std::int64_t patience = t.patience();
  CHECK(patience == t.chunk_time() + t.chunk_time() / 2 + 2 * ms);
  // The next chunk's completion is late: not due before the patience has
  // passed since the last completion (later than the chunk's posting).
  CHECK_FALSE(t.due(100 * ms, now + patience - 1));
  CHECK(t.due(100 * ms, now + patience));
  // A probe restarts the wait: the next is due a patience after it.
  t.probed(now + patience);
  CHECK(t.probes() == 1);
  CHECK_FALSE(t.due(100 * ms, now + 2 * patience - 1));
  CHECK(t.due(100 * ms, now + 2 * patience));
  // A chunk posted after the last completion and the probe waits from its posting.
  const std::int64_t later = now + 10 * patience;
  CHECK_FALSE(t.due(later, later + patience - 1));
  CHECK(t.due(later, later + patience));
}

TEST_CASE("tail probe: an idle gap is not a chunk's time; extreme times neither overflow nor go negative") {
  using rdx::detail::tail_probe;
  constexpr std::int64_t ms = 1'000'000;
  tail_probe t(1ms);
  t.on_completion(0, 5 * ms);
  const std::int64_t before = t.chunk_time();
  CHECK(before == 5 * ms);
  // A chunk posted after a minute idle and done 5 ms later took 5 ms, not a minute.
  t.on_completion(60'000 * ms, 60'005 * ms);
  CHECK(t.chunk_time() == before);
  // A completion "before" its posting (clock misuse) counts as zero time.
  t.on_completion(70'000 * ms, 69'000 * ms);
  CHECK(t.chunk_time() >= 0);
  tail_probe huge(std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::max()));
  huge.on_completion(0, std::numeric_limits<std::int64_t>::max() / 2);
  CHECK(huge.patience() == std::numeric_limits<std::int64_t>::max());
  CHECK_FALSE(huge.due(0, std::numeric_limits<std::int64_t>::max() / 2));
  tail_probe negative(-5ms);
  CHECK(negative.patience() == 0);
}

TEST_CASE("pacing: a chunk that waited out a retransmission keeps the window and makes requests small") {
  pacing_limits l;
  l.epoch = 16;
  pacing_window w(l);
  auto now = run_rounds(w, 8, 0ns);
  const std::uint64_t win = w.window();
  const std::uint64_t c = w.chunk();
  REQUIRE(c > l.lossy_request);
  CHECK(w.request() == c);
  const std::uint64_t d = w.decreases();
  w.on_loss();
  CHECK(w.decreases() == d);
  CHECK(w.window() == win);
  CHECK(w.losses() == 1);
  CHECK(w.request() == l.lossy_request);
  // An epoch of on-time completions later, requests are whole chunks again.
  for (std::uint32_t i = 0; i < l.epoch; ++i) {
    now += path_time(c);
    w.on_completion(c, path_time(c), now);
  }
  CHECK(w.request() == w.chunk());
}

TEST_CASE("tail probe: a retransmission's wait stays out of the chunk time") {
  using rdx::detail::tail_probe;
  constexpr std::int64_t ms = 1'000'000;
  tail_probe t;
  std::int64_t now = 0;
  for (int i = 0; i < 32; ++i) t.on_completion(0, now += 4 * ms);
  const std::int64_t before = t.chunk_time();
  t.on_completion(0, now += 70 * ms, true);
  CHECK(t.chunk_time() == before);
  // The next chunk's time counts from that completion, not from before it.
  t.on_completion(0, now += 4 * ms);
  CHECK(t.chunk_time() == before - before / 8 + (4 * ms) / 8);
}
