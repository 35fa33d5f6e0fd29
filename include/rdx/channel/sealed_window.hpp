// rdx: sealed window writes. Bulk data goes one-sided into a window the
// receiver granted, sealed in chunks (message_seal: with rdx::auth,
// AES-256-GCM under the connection's window keys), each chunk written with
// a notification that names it. The writer seals chunk k + 1 while chunk k
// is on the wire; the reader opens each chunk as its notification arrives,
// into memory the peer cannot reach, so no byte is exposed before its tag
// has checked. A peer or a wire that writes into the window without the key
// fails the read with errc::integrity_failed, and the connection with it.
//
// Layout: chunk k of a transfer lands at k * (chunk + sealed_message_overhead)
// in the window: its sequence number, its ciphertext, its tag. Transfers on
// one connection share one sequence (the seal's), so one sealed_writer and
// one sealed_reader per direction per connection, each with its own seal
// (rdx::auth::psk_authenticator::make_window_seal, or an aes_gcm_seal made
// with seal_lane::windows): its nonces never meet the messages'.
//
// A transfer fits the window (sealed_window_bytes); the next one may start
// once the reader has opened the last (the application says so, with a
// message, as for any window). While a read runs, the reader takes the
// connection's notifications.
//
// Sealed window reads go the other way: the owner of the data seals it once
// into a window of its own (sealed_source::publish, the same layout) and
// grants it with read rights; the peer reads the chunks one-sided
// (sealed_fetcher), depth at a time, and opens each, in order, into its own
// buffer while the next are on the wire. The owner's CPU seals; it takes
// no part in the reads. A published image opens once: its chunks carry the
// next sequence numbers of the owner's seal, which the fetcher's seal
// expects in turn, so reading it again is a replay. One window seal per
// direction serves sealed writes and sealed reads alike, in the order
// sealed (the peer opens them in that order).
#pragma once

#include <rdx/channel/channel.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/message_seal.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <system_error>
#include <vector>

namespace rdx {

//! Bytes of a sealed window that holds n payload bytes in chunks of `chunk`
//! bytes: each chunk takes sealed_message_overhead more. 0 for chunk 0.
[[nodiscard]] constexpr std::size_t sealed_window_bytes(std::size_t n, std::uint32_t chunk) noexcept {
  if (chunk == 0) {
    return 0;
  }
  const std::size_t chunks = (n + chunk - 1) / chunk;
  return n + chunks * sealed_message_overhead;
}

namespace detail {

// Throws errc::invalid_argument naming `who` unless chunk is 1 byte to 1 GiB
// and n (depth or capacity, `n_name`) is at least 1.
inline std::uint32_t checked_sealed_chunk(const char* who, std::uint32_t chunk, std::size_t n,
                                          const char* n_name) {
  if (chunk == 0 || n == 0 || chunk > (1U << 30)) {
    throw_rdx(errc::invalid_argument, std::string(who) + ": chunk must be 1 byte to 1 GiB and " + n_name +
                                          " at least 1 (chunk " + std::to_string(chunk) + ", " + n_name +
                                          " " + std::to_string(n) + ")");
  }
  return chunk;
}

// What every sealed transfer (write, read, fetch) shares: it runs from
// start() until progress() says it has ended, with its error.
template <class D>
class sealed_run {
public:
  //! progress() until the transfer ends or the deadline passes.
  //! @return its error; errc::timed_out at the deadline (it goes on: call
  //!         progress() or finish() again).
  std::error_code finish(std::chrono::steady_clock::time_point deadline) noexcept {
    while (!static_cast<D&>(*this).progress()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return make_error_code(errc::timed_out);
      }
    }
    return error_;
  }
  //! Why the last transfer ended (success: no error).
  [[nodiscard]] std::error_code error() const noexcept { return error_; }
  //! True while a transfer runs.
  [[nodiscard]] bool busy() const noexcept { return active_; }

protected:
  std::error_code error_;
  bool active_ = false;
};

// What sealed_writer and sealed_fetcher share: their connection and seal,
// registered staging of `depth` slots of chunk + 24 bytes, the operation on
// each slot, and the checks of a window's size.
class sealed_staging {
public:
  sealed_staging(const sealed_staging&) = delete;
  sealed_staging& operator=(const sealed_staging&) = delete;
  sealed_staging(sealed_staging&&) = delete;
  sealed_staging& operator=(sealed_staging&&) = delete;

  //! Payload bytes per chunk.
  [[nodiscard]] std::uint32_t chunk() const noexcept { return chunk_; }

protected:
  sealed_staging(const char* who, connection& c, const protection_domain& pd, message_seal& seal,
                 std::uint32_t chunk, std::uint32_t depth)
      : who_(who),
        conn_(&c),
        seal_(&seal),
        chunk_(checked_sealed_chunk(who, chunk, depth, "depth")),
        stride_(std::size_t{chunk} + sealed_message_overhead),
        staging_(pd, stride_ * depth),
        ops_(depth),
        flying_(depth, false) {}
  // Operations still in flight use the staging: they are waited for (10 s
  // at most), and past that the connection fails, which retires them.
  ~sealed_staging() {
    if (in_flight_ == 0) {
      return;
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (std::size_t s = 0; s < ops_.size(); ++s) {
      if (flying_[s]) {
        (void)ops_[s].wait_until(end);
      }
    }
    for (std::size_t s = 0; s < ops_.size(); ++s) {
      if (flying_[s] && !ops_[s].done()) {
        char why[128];
        std::snprintf(why, sizeof why,
                      "a %s was destroyed with chunks on the wire that did not complete in 10 s", who_);
        start_access::of(*conn_).fail_sealed_window(why);
        (void)ops_[s].wait(std::chrono::seconds(10));
      }
    }
  }

  // errc::invalid_argument for no bytes or a window of another connection;
  // errc::limit_exceeded for a window under sealed_window_bytes(n) bytes or
  // 2^32 chunks or more. Else chunks is the count.
  std::error_code check_window(const connection& wc, const window_descriptor& d, std::size_t n,
                               std::uint32_t& chunks) const noexcept {
    if (n == 0 || &wc != conn_) {
      return make_error_code(errc::invalid_argument);
    }
    const std::size_t k = (n + chunk_ - 1) / chunk_;
    if (k > UINT32_MAX || d.memory.length < sealed_window_bytes(n, chunk_)) {
      return make_error_code(errc::limit_exceeded);
    }
    chunks = static_cast<std::uint32_t>(k);
    return {};
  }
  // Slot s's operation has ended (or none is in flight there): it leaves
  // the flight, its error kept in error. @return false while it runs.
  bool retire(std::size_t s, std::error_code& error) noexcept {
    if (!flying_[s] || !ops_[s].test()) {
      return !flying_[s];
    }
    flying_[s] = false;
    --in_flight_;
    if (std::error_code ec = ops_[s].error(); ec && !error) {
      error = ec;
    }
    return true;
  }
  std::byte* slot(std::size_t s) noexcept { return staging_.data() + s * stride_; }

  const char* who_;
  connection* conn_;
  message_seal* seal_;
  std::uint32_t chunk_;
  std::size_t stride_;
  registered_buffer<std::byte> staging_;
  std::vector<operation> ops_;
  std::vector<bool> flying_;
  std::size_t in_flight_ = 0;
};

}  // namespace detail

//! Writes buffers into a peer's sealed window (see sealed_reader), sealing
//! them chunk by chunk in its own registered staging: `depth` chunks are in
//! flight while the next is sealed. start() then progress(), or write().
//! One thread at a time, as its connection. The data path (start,
//! progress) allocates nothing and throws nothing. Destroyed with chunks in
//! flight, it waits for them (10 s at most), then fails the connection.
class sealed_writer : public detail::sealed_staging, public detail::sealed_run<sealed_writer> {
public:
  //! @param c     the connection (encrypted or not: the chunks are sealed either way)
  //! @param seal  seals the chunks; outlives the writer; no other user seals with it
  //! @param chunk payload bytes per chunk (as the reader's)
  //! @param depth chunks sealed ahead and in flight
  //! @throws rdx::error: errc::invalid_argument for chunk or depth 0 or a
  //!         chunk over 1 GiB; a failed registration.
  sealed_writer(connection& c, const protection_domain& pd, message_seal& seal, std::uint32_t chunk,
                std::uint32_t depth = 4)
      : sealed_staging("sealed_writer", c, pd, seal, chunk, depth) {}

  //! Starts writing src into w from its start: chunk k at k * (chunk + 24),
  //! with a notification tagged k.
  //! @return errc::not_ready while a transfer runs; errc::invalid_argument
  //!         for an empty src or a window of another connection;
  //!         errc::limit_exceeded when w holds fewer than
  //!         sealed_window_bytes(src.size(), chunk) bytes or src needs 2^32
  //!         chunks or more. Nothing is sent then.
  template <rights R>
  requires(has(R, rights::write)) std::error_code
      start(const remote_window<std::byte, R>& w, std::span<const std::byte> src)
  noexcept {
    if (busy()) {
      return make_error_code(errc::not_ready);
    }
    if (std::error_code ec = check_window(w.conn(), w.descriptor(), src.size(), chunks_)) {
      return ec;
    }
    src_ = src;
    addr_ = w.descriptor().memory.addr;
    rkey_ = w.descriptor().memory.rkey;
    next_ = 0;
    error_ = {};
    active_ = true;
    return {};
  }

  //! Retires chunks that completed, then seals and posts the next ones while
  //! staging is free. @return true when the transfer has ended (error()).
  bool progress() noexcept {
    if (!active_) {
      return true;
    }
    for (std::size_t s = 0; s < ops_.size() && in_flight_ != 0; ++s) {
      (void)retire(s, error_);
    }
    while (!error_ && next_ < chunks_) {
      const std::size_t s = next_ % ops_.size();
      if (flying_[s]) {
        break;
      }
      const std::size_t at = std::size_t{next_} * chunk_;
      const std::size_t n = std::min<std::size_t>(chunk_, src_.size() - at);
      std::byte* const out = slot(s);
      if (std::error_code ec = seal_->seal(src_.subspan(at, n), out)) {
        error_ = ec;
        break;
      }
      ops_[s] = detail::start_access::make(*conn_);
      detail::start_access::of(*conn_).start_sealed_notify(
          ops_[s], reinterpret_cast<std::uint64_t>(out), staging_.lkey(),
          addr_ + std::uint64_t{next_} * stride_, rkey_,
          static_cast<std::uint32_t>(n + sealed_message_overhead), next_);
      ++next_;
      flying_[s] = true;
      ++in_flight_;
    }
    if (in_flight_ == 0 && (error_ || next_ == chunks_)) {
      active_ = false;
      return true;
    }
    return false;
  }

  //! start() and progress() until the transfer ends or the deadline passes.
  //! @return its error; errc::timed_out at the deadline (the transfer goes
  //!         on: call progress() or write() again).
  template <rights R>
  requires(has(R, rights::write)) std::error_code
      write(const remote_window<std::byte, R>& w, std::span<const std::byte> src,
            std::chrono::steady_clock::time_point deadline)
  noexcept {
    if (std::error_code ec = start(w, src)) {
      return ec;
    }
    return finish(deadline);
  }

private:
  std::span<const std::byte> src_;
  std::uint64_t addr_ = 0;
  std::uint32_t rkey_ = 0;
  std::uint32_t chunks_ = 0;
  std::uint32_t next_ = 0;
};

//! Receives sealed_writer's transfers: owns the landing window (grant it to
//! the peer with write rights: rdx::grant<std::byte, rights::write>) and
//! opens each chunk, in order, into the caller's buffer once its
//! notification arrives. A chunk that fails its check (changed on the wire,
//! written without the key, replayed, out of order, of the wrong size or
//! tag) ends the read with errc::integrity_failed and fails the connection;
//! the caller's buffer holds only chunks that checked. start() then
//! progress(), or read(). The data path allocates nothing and throws nothing.
class sealed_reader : public detail::sealed_run<sealed_reader> {
public:
  //! @param capacity the most payload bytes one transfer carries: the
  //!        window is sealed_window_bytes(capacity, chunk) bytes
  //! @throws rdx::error: errc::invalid_argument for chunk or capacity 0 or
  //!         a chunk over 1 GiB; a failed registration.
  sealed_reader(connection& c, const protection_domain& pd, message_seal& seal, std::uint32_t chunk,
                std::size_t capacity)
      : sealed_reader(c, pd, chunk, capacity) {
    seal_ = &seal;
  }
  //! A reader whose seal comes later (seal_with), so that its landing window
  //! can be granted in the set-up that derives the keys (exchange_and_connect).
  sealed_reader(connection& c, const protection_domain& pd, std::uint32_t chunk, std::size_t capacity)
      : conn_(&c),
        chunk_(detail::checked_sealed_chunk("sealed_reader", chunk, capacity, "capacity")),
        stride_(std::size_t{chunk} + sealed_message_overhead),
        landing_(make_window_buffer<std::byte, rights::write>(pd, sealed_window_bytes(capacity, chunk))),
        capacity_(capacity) {}

  //! The window to grant to the writer (write rights only).
  [[nodiscard]] const registered_buffer<std::byte>& landing() const noexcept { return landing_; }
  //! Opens the chunks with seal from now on (which outlives the reader).
  //! @return errc::not_ready while a read runs.
  std::error_code seal_with(message_seal& seal) noexcept {
    if (active_) {
      return make_error_code(errc::not_ready);
    }
    seal_ = &seal;
    return {};
  }

  //! Starts reading a transfer of dst.size() bytes into dst.
  //! @return errc::not_ready while a read runs; errc::invalid_argument for an
  //!         empty dst or no seal (seal_with); errc::limit_exceeded when
  //!         dst is larger than the capacity; errc::integrity_failed
  //!         once a chunk has failed.
  std::error_code start(std::span<std::byte> dst) noexcept {
    if (active_) {
      return make_error_code(errc::not_ready);
    }
    if (seal_ == nullptr) {
      return make_error_code(errc::invalid_argument);
    }
    if (dst.empty()) {
      return make_error_code(errc::invalid_argument);
    }
    if (dst.size() > capacity_) {
      return make_error_code(errc::limit_exceeded);
    }
    if (broken_) {
      return make_error_code(errc::integrity_failed);
    }
    dst_ = dst;
    chunks_ = static_cast<std::uint32_t>((dst.size() + chunk_ - 1) / chunk_);
    next_ = 0;
    error_ = {};
    active_ = true;
    op_ = channel<std::byte>(*conn_).next_notification();
    return {};
  }

  //! Opens the chunks that have arrived. @return true when the read has
  //! ended (error()).
  bool progress() noexcept {
    while (active_ && op_.test()) {
      if (std::error_code ec = op_.error()) {
        return end(ec);
      }
      const std::size_t at = std::size_t{next_} * chunk_;
      const std::size_t n = std::min<std::size_t>(chunk_, dst_.size() - at);
      if (op_.tag() != next_ || op_.byte_count() != n + sealed_message_overhead) {
        std::snprintf(
            why_, sizeof why_,
            "sealed window: a notification tagged %u of %u bytes arrived where chunk %u of %zu bytes "
            "was expected",
            op_.tag(), op_.byte_count(), next_, n + sealed_message_overhead);
        return broken();
      }
      if (seal_->open({landing_.data() + std::size_t{next_} * stride_, n + sealed_message_overhead},
                      dst_.data() + at)) {
        std::snprintf(why_, sizeof why_, "sealed window chunk %u: %s", next_, seal_->failure());
        return broken();
      }
      if (++next_ == chunks_) {
        return end({});
      }
      op_ = channel<std::byte>(*conn_).next_notification();
    }
    return !active_;
  }

  //! start() and progress() until the read ends or the deadline passes.
  //! @return its error; errc::timed_out at the deadline (the read goes on:
  //!         call progress() or finish()).
  std::error_code read(std::span<std::byte> dst, std::chrono::steady_clock::time_point deadline) noexcept {
    if (std::error_code ec = start(dst)) {
      return ec;
    }
    return finish(deadline);
  }
  //! Why a chunk failed, in words; "" before any.
  [[nodiscard]] const char* failure() const noexcept { return why_; }
  //! Chunks opened so far in the current (or last) read.
  [[nodiscard]] std::uint32_t chunks_opened() const noexcept { return next_; }

private:
  bool end(std::error_code ec) noexcept {
    error_ = ec;
    active_ = false;
    op_ = operation();
    return true;
  }
  bool broken() noexcept {
    broken_ = true;
    detail::start_access::of(*conn_).fail_sealed_window(why_);
    return end(make_error_code(errc::integrity_failed));
  }

  connection* conn_;
  message_seal* seal_ = nullptr;
  std::uint32_t chunk_;
  std::size_t stride_;
  registered_buffer<std::byte> landing_;
  std::size_t capacity_;
  std::span<std::byte> dst_;
  operation op_;
  std::uint32_t chunks_ = 0;
  std::uint32_t next_ = 0;
  bool broken_ = false;
  char why_[256] = {};
};

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
