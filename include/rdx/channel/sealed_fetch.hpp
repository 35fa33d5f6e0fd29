// rdx: sealed window reads, the other way from the sealed window writes of
// rdx/channel/sealed_window.hpp, in the same layout. The owner of the data
// seals it chunk by chunk into a window of its own, granted with read rights,
// and announces each chunk once it is sealed (sealed_source); the peer reads
// each announced chunk one-sided into its own staging (sealed_fetcher) and
// opens it, in order, into its buffer, so chunk k is on the wire while chunk
// k + 1 is sealed and chunk k - 1 opened. The chunks carry the next sequence
// numbers of the owner's window seal, which the fetcher's seal expects in
// turn: an image opens once, and reading it again is a replay. One window
// seal per direction serves sealed writes and sealed reads alike, in the
// order sealed (the peer opens them in that order).
#pragma once

#include <rdx/channel/detail/sealed_staging.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <system_error>

namespace rdx {

//! Holds buffers for the peer to read sealed (sealed_fetcher): publishing
//! one seals it chunk by chunk into the window (grant it with read rights:
//! rdx::grant<std::byte, rights::read>) and announces each chunk once it is
//! sealed (a notification tagged k, no payload), so the peer reads chunk k
//! while chunk k + 1 is sealed. The owner then leaves the window alone until
//! the peer says it has read it. start() then progress(), or publish(). One
//! thread at a time, as its connection. The data path allocates nothing and
//! throws nothing.
class sealed_source : public detail::sealed_slots, public detail::sealed_run<sealed_source> {
public:
  //! @param seal     seals the chunks (the connection's window seal); outlives the source
  //! @param capacity the most payload bytes one image holds: the window is
  //!        sealed_window_bytes(capacity, chunk) bytes
  //! @param depth    announcements in flight (each takes a flow-control credit)
  //! @throws rdx::error: errc::invalid_argument for chunk, capacity or depth
  //!         0 or a chunk over 1 GiB; a failed registration.
  sealed_source(connection& c, const protection_domain& pd, message_seal& seal, std::uint32_t chunk,
                std::size_t capacity, std::uint32_t depth = 4)
      : sealed_source(c, pd, chunk, capacity, depth) {
    seal_ = &seal;
  }
  //! A source whose seal comes later (seal_with), so that its window can be
  //! granted in the set-up that derives the keys (exchange_and_connect).
  sealed_source(connection& c, const protection_domain& pd, std::uint32_t chunk, std::size_t capacity,
                std::uint32_t depth = 4)
      : sealed_slots(depth),
        conn_(&c),
        chunk_(detail::checked_sealed_chunk("sealed_source", chunk, std::min<std::size_t>(capacity, depth),
                                            "capacity and depth")),
        stride_(std::size_t{chunk} + sealed_message_overhead),
        window_(make_window_buffer<std::byte>(pd, sealed_window_bytes(capacity, chunk))),
        capacity_(capacity) {}
  //! Seals with seal from now on (which outlives the source).
  //! @return errc::not_ready while an image is being published.
  std::error_code seal_with(message_seal& seal) noexcept {
    if (active_) {
      return make_error_code(errc::not_ready);
    }
    seal_ = &seal;
    return {};
  }

  //! The window to grant to the fetcher (read rights only).
  [[nodiscard]] const registered_buffer<std::byte>& window() const noexcept { return window_; }

  //! Starts publishing src into the window from its start: chunk k at
  //! k * (chunk + 24), announced with tag k once sealed. The peer fetches
  //! exactly src.size() bytes (tell it, with a message).
  //! @return errc::not_ready while an image is being published;
  //!         errc::invalid_argument for an empty src or no seal (seal_with);
  //!         errc::limit_exceeded when src is larger than the capacity.
  //!         Nothing is sealed then.
  std::error_code start(std::span<const std::byte> src) noexcept {
    if (active_) {
      return make_error_code(errc::not_ready);
    }
    if (src.empty() || seal_ == nullptr) {
      return make_error_code(errc::invalid_argument);
    }
    if (src.size() > capacity_) {
      return make_error_code(errc::limit_exceeded);
    }
    src_ = src;
    chunks_ = static_cast<std::uint32_t>((src.size() + chunk_ - 1) / chunk_);
    next_ = 0;
    published_ = 0;
    return begin();
  }

  //! Retires announcements that completed, then seals and announces the
  //! next chunks while there is room. @return true when the image is
  //! published (error()).
  bool progress() noexcept {
    if (!active_) {
      return true;
    }
    retire_all(error_);
    while (!error_ && next_ < chunks_ && !flying_[next_ % ops_.size()]) {
      const std::size_t s = next_ % ops_.size();
      const std::size_t at = std::size_t{next_} * chunk_;
      const std::size_t n = std::min<std::size_t>(chunk_, src_.size() - at);
      if (std::error_code ec =
              seal_->seal(src_.subspan(at, n), window_.data() + std::size_t{next_} * stride_)) {
        error_ = ec;
        break;
      }
      ops_[s] = detail::start_access::make(*conn_);
      detail::start_access::of(*conn_).start_sealed_notify(ops_[s], 0, 0, 0, 0, 0, next_);
      fly(s);
      ++next_;
    }
    if (in_flight_ == 0 && (error_ || next_ == chunks_)) {
      active_ = false;
      published_ = error_ ? 0 : src_.size();
      return true;
    }
    return false;
  }

  //! start() and progress() until the image is published or the deadline
  //! passes (the peer's fetch returns the credits the announcements take:
  //! an image of more chunks than the peer's receive depth is published
  //! while it fetches). @return as start(), then as finish().
  std::error_code publish(std::span<const std::byte> src,
                          std::chrono::steady_clock::time_point deadline) noexcept {
    if (std::error_code ec = start(src)) {
      return ec;
    }
    return finish(deadline);
  }

  //! Payload bytes of the image last published whole; 0 before one, while
  //! one is published, or after a failure.
  [[nodiscard]] std::size_t published() const noexcept { return published_; }
  //! Payload bytes per chunk.
  [[nodiscard]] std::uint32_t chunk() const noexcept { return chunk_; }

private:
  connection* conn_;
  message_seal* seal_ = nullptr;
  std::uint32_t chunk_;
  std::size_t stride_;
  registered_buffer<std::byte> window_;
  std::size_t capacity_;  // the slots' operations are announcements: they read no memory
  std::span<const std::byte> src_;
  std::uint32_t chunks_ = 0;
  std::uint32_t next_ = 0;
  std::size_t published_ = 0;
};

//! Reads a peer's sealed_source one-sided: each chunk once the source has
//! announced it, `depth` chunks read into its own registered staging while
//! the one before is opened, in order, into the caller's buffer. While a
//! fetch runs it takes the connection's notifications (the announcements). A chunk that fails its check
//! (changed in the window or on the wire, sealed without the key, read twice, out of order) ends the fetch
//! with errc::integrity_failed and fails the connection; the caller's buffer holds only chunks that checked.
//! start() then progress(), or fetch(). One thread at a time, as its connection. The data path allocates
//! nothing and throws nothing. Destroyed with reads in flight, it waits for them (10 s at most), then fails
//! the connection.
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
    announced_ = 0;
    posted_ = 0;
    opened_ = 0;
    delivered_ = 0;
    note_ = channel<std::byte>(*conn_).next_notification();
    return begin();
  }

  //! Takes the source's announcements, opens the chunks that arrived, in
  //! order, then reads the next announced ones while staging is free.
  //! @return true when the fetch has ended (error()).
  bool progress() noexcept {
    if (!active_) {
      return true;
    }
    while (!error_ && announced_ < chunks_ && note_.test()) {
      if (std::error_code ec = note_.error()) {
        error_ = ec;
        break;
      }
      if (note_.tag() != announced_ || note_.byte_count() != 0) {
        std::snprintf(
            why_, sizeof why_,
            "sealed window read: an announcement tagged %u of %u bytes arrived where chunk %u's was "
            "expected",
            note_.tag(), note_.byte_count(), announced_);
        broken();
        break;
      }
      note_ = ++announced_ < chunks_ ? channel<std::byte>(*conn_).next_notification() : operation();
    }
    while (opened_ < posted_ && retire(opened_ % ops_.size(), error_)) {
      if (!error_ && open(opened_ % ops_.size())) {
        ++delivered_;
      }
      ++opened_;
    }
    if (error_) {
      retire_all(error_);
    }
    while (!error_ && posted_ < announced_ && !flying_[posted_ % ops_.size()]) {
      const std::size_t s = posted_ % ops_.size();
      const std::size_t n = std::min<std::size_t>(chunk_, dst_.size() - std::size_t{posted_} * chunk_);
      ops_[s] = detail::start_access::make(*conn_, detail::op_kind::read,
                                           {.laddr = reinterpret_cast<std::uint64_t>(slot(s)),
                                            .raddr = addr_ + std::uint64_t{posted_} * stride_,
                                            .length = n + sealed_message_overhead,
                                            .lkey = staging_.lkey(),
                                            .rkey = rkey_});
      detail::start_access::of(*conn_).start_sealed_read(ops_[s]);
      fly(s);
      ++posted_;
    }
    if (in_flight_ == 0 && (error_ || opened_ == chunks_)) {
      note_ = operation();
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
      broken();
      return false;
    }
    return true;
  }
  // A check failed (why_ says which): the fetch and the connection fail.
  void broken() noexcept {
    broken_ = true;
    error_ = make_error_code(errc::integrity_failed);
    detail::start_access::of(*conn_).fail_sealed_window(why_);
  }

  std::span<std::byte> dst_;
  std::uint64_t addr_ = 0;
  std::uint32_t rkey_ = 0;
  std::uint32_t chunks_ = 0;
  std::uint32_t announced_ = 0;
  std::uint32_t posted_ = 0;
  std::uint32_t opened_ = 0;
  std::uint32_t delivered_ = 0;
  operation note_;  // the next announcement
  bool broken_ = false;
  char why_[256] = {};
};

}  // namespace rdx
