// rdx: sealed window reads, the other way from the sealed window writes of
// rdx/channel/sealed_window.hpp, in the same layout. The owner of the data
// seals it once into a window of its own (sealed_source::publish) and grants
// it with read rights; the peer reads the chunks one-sided (sealed_fetcher),
// depth at a time, and opens each, in order, into its own buffer while the
// next are on the wire. The owner's CPU seals; it takes no part in the
// reads. A published image opens once: its chunks carry the next sequence
// numbers of the owner's seal, which the fetcher's seal expects in turn, so
// reading it again is a replay. One window seal per direction serves sealed
// writes and sealed reads alike, in the order sealed (the peer opens them in
// that order).
#pragma once

#include <rdx/channel/detail/sealed_staging.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <system_error>

namespace rdx {

//! Holds buffers for the peer to read sealed (sealed_fetcher): publish()
//! seals one chunk by chunk into the window (grant it with read rights:
//! rdx::grant<std::byte, rights::read>), which the owner then leaves alone
//! until the peer says it has read it. Needs no connection: the peer's reads
//! take no part of this side's CPU. publish() allocates nothing and throws
//! nothing.
class sealed_source {
public:
  //! @param seal     seals the chunks (the connection's window seal); outlives the source
  //! @param capacity the most payload bytes one image holds: the window is
  //!        sealed_window_bytes(capacity, chunk) bytes
  //! @throws rdx::error: errc::invalid_argument for chunk or capacity 0 or
  //!         a chunk over 1 GiB; a failed registration.
  sealed_source(const protection_domain& pd, message_seal& seal, std::uint32_t chunk, std::size_t capacity)
      : sealed_source(pd, chunk, capacity) {
    seal_ = &seal;
  }
  //! A source whose seal comes later (seal_with), so that its window can be
  //! granted in the set-up that derives the keys (exchange_and_connect).
  sealed_source(const protection_domain& pd, std::uint32_t chunk, std::size_t capacity)
      : chunk_(detail::checked_sealed_chunk("sealed_source", chunk, capacity, "capacity")),
        stride_(std::size_t{chunk} + sealed_message_overhead),
        window_(make_window_buffer<std::byte>(pd, sealed_window_bytes(capacity, chunk))),
        capacity_(capacity) {}
  //! Seals with seal from now on (which outlives the source).
  void seal_with(message_seal& seal) noexcept { seal_ = &seal; }

  //! The window to grant to the fetcher (read rights only).
  [[nodiscard]] const registered_buffer<std::byte>& window() const noexcept { return window_; }

  //! Seals src into the window from its start: chunk k at k * (chunk + 24).
  //! The peer fetches exactly src.size() bytes (tell it, with a message).
  //! @return errc::invalid_argument for an empty src or no seal (seal_with);
  //!         errc::limit_exceeded when src is larger than the capacity or the
  //!         seal's sequence numbers are spent; the seal's error. Then
  //!         nothing is published.
  std::error_code publish(std::span<const std::byte> src) noexcept {
    published_ = 0;
    if (src.empty() || seal_ == nullptr) {
      return make_error_code(errc::invalid_argument);
    }
    if (src.size() > capacity_) {
      return make_error_code(errc::limit_exceeded);
    }
    for (std::size_t at = 0, k = 0; at < src.size(); at += chunk_, ++k) {
      const std::size_t n = std::min<std::size_t>(chunk_, src.size() - at);
      if (std::error_code ec = seal_->seal(src.subspan(at, n), window_.data() + k * stride_)) {
        return ec;
      }
    }
    published_ = src.size();
    return {};
  }

  //! Payload bytes of the image last published; 0 before one or after a failure.
  [[nodiscard]] std::size_t published() const noexcept { return published_; }
  //! Payload bytes per chunk.
  [[nodiscard]] std::uint32_t chunk() const noexcept { return chunk_; }

private:
  message_seal* seal_ = nullptr;
  std::uint32_t chunk_;
  std::size_t stride_;
  registered_buffer<std::byte> window_;
  std::size_t capacity_;
  std::size_t published_ = 0;
};

//! Reads a peer's sealed_source one-sided: `depth` chunks are read into its
//! own registered staging while the one before is opened, in order, into
//! the caller's buffer. A chunk that fails its check (changed in the window
//! or on the wire, sealed without the key, read twice, out of order) ends
//! the fetch with errc::integrity_failed and fails the connection; the
//! caller's buffer holds only chunks that checked. start() then progress(),
//! or fetch(). One thread at a time, as its connection. The data path
//! allocates nothing and throws nothing. Destroyed with reads in flight, it
//! waits for them (10 s at most), then fails the connection.
class sealed_fetcher : public detail::sealed_staging, public detail::sealed_run<sealed_fetcher> {
public:
  //! @param seal  opens the chunks (the connection's window seal); outlives the fetcher
  //! @param chunk payload bytes per chunk (as the source's)
  //! @param depth chunks read ahead
  //! @throws rdx::error: errc::invalid_argument for chunk or depth 0 or a
  //!         chunk over 1 GiB; a failed registration.
  sealed_fetcher(connection& c, const protection_domain& pd, message_seal& seal, std::uint32_t chunk,
                 std::uint32_t depth = 4)
      : sealed_staging("sealed_fetcher", c, pd, seal, chunk, depth) {}

  //! Starts fetching dst.size() bytes (what the source published) from w
  //! into dst.
  //! @return errc::not_ready while a fetch runs; errc::invalid_argument for
  //!         an empty dst or a window of another connection;
  //!         errc::limit_exceeded when w holds fewer than
  //!         sealed_window_bytes(dst.size(), chunk) bytes or dst needs 2^32
  //!         chunks or more; errc::integrity_failed once a chunk has
  //!         failed. Nothing is read then.
  template <rights R>
  requires(has(R, rights::read)) std::error_code
      start(const remote_window<std::byte, R>& w, std::span<std::byte> dst)
  noexcept {
    if (busy()) {
      return make_error_code(errc::not_ready);
    }
    if (std::error_code ec = check_window(w.conn(), w.descriptor(), dst.size(), chunks_)) {
      return ec;
    }
    if (broken_) {
      return make_error_code(errc::integrity_failed);
    }
    dst_ = dst;
    addr_ = w.descriptor().memory.addr;
    rkey_ = w.descriptor().memory.rkey;
    posted_ = 0;
    opened_ = 0;
    delivered_ = 0;
    error_ = {};
    active_ = true;
    return {};
  }

  //! Opens the chunks that arrived, in order, then reads the next ones while
  //! staging is free. @return true when the fetch has ended (error()).
  bool progress() noexcept {
    if (!active_) {
      return true;
    }
    while (opened_ < posted_ && retire(opened_ % ops_.size(), error_)) {
      if (!error_ && open(opened_ % ops_.size())) {
        ++delivered_;
      }
      ++opened_;
    }
    if (error_) {
      for (std::size_t s = 0; s < ops_.size(); ++s) {
        (void)retire(s, error_);
      }
    }
    while (!error_ && posted_ < chunks_ && !flying_[posted_ % ops_.size()]) {
      const std::size_t s = posted_ % ops_.size();
      const std::size_t n = std::min<std::size_t>(chunk_, dst_.size() - std::size_t{posted_} * chunk_);
      ops_[s] = detail::start_access::make(*conn_, detail::op_kind::read,
                                           {.laddr = reinterpret_cast<std::uint64_t>(slot(s)),
                                            .raddr = addr_ + std::uint64_t{posted_} * stride_,
                                            .length = n + sealed_message_overhead,
                                            .lkey = staging_.lkey(),
                                            .rkey = rkey_});
      detail::start_access::of(*conn_).start_sealed_read(ops_[s]);
      flying_[s] = true;
      ++in_flight_;
      ++posted_;
    }
    if (in_flight_ == 0 && (error_ || opened_ == chunks_)) {
      active_ = false;
      return true;
    }
    return false;
  }

  //! start() and progress() until the fetch ends or the deadline passes.
  //! @return its error; errc::timed_out at the deadline (the fetch goes on:
  //!         call progress() or finish()).
  template <rights R>
  requires(has(R, rights::read)) std::error_code
      fetch(const remote_window<std::byte, R>& w, std::span<std::byte> dst,
            std::chrono::steady_clock::time_point deadline)
  noexcept {
    if (std::error_code ec = start(w, dst)) {
      return ec;
    }
    return finish(deadline);
  }
  //! Why a chunk failed, in words; "" before any.
  [[nodiscard]] const char* failure() const noexcept { return why_; }
  //! Chunks opened into the caller's buffer so far in the current (or last) fetch.
  [[nodiscard]] std::uint32_t chunks_opened() const noexcept { return delivered_; }

private:
  // Opens chunk opened_ from staging slot s into the caller's buffer.
  // @return false when it failed its check (the fetch and the connection fail).
  bool open(std::size_t s) noexcept {
    const std::size_t at = std::size_t{opened_} * chunk_;
    const std::size_t n = std::min<std::size_t>(chunk_, dst_.size() - at);
    if (seal_->open({slot(s), n + sealed_message_overhead}, dst_.data() + at)) {
      std::snprintf(why_, sizeof why_, "sealed window read chunk %u: %s", opened_, seal_->failure());
      broken_ = true;
      error_ = make_error_code(errc::integrity_failed);
      detail::start_access::of(*conn_).fail_sealed_window(why_);
      return false;
    }
    return true;
  }

  std::span<std::byte> dst_;
  std::uint64_t addr_ = 0;
  std::uint32_t rkey_ = 0;
  std::uint32_t chunks_ = 0;
  std::uint32_t posted_ = 0;
  std::uint32_t opened_ = 0;
  std::uint32_t delivered_ = 0;
  bool broken_ = false;
  char why_[256] = {};
};

}  // namespace rdx
