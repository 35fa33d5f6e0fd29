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
//
// Sealed window reads, the other way, are in rdx/channel/sealed_fetch.hpp.
#pragma once

#include <rdx/channel/detail/sealed_staging.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <system_error>

namespace rdx {

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
    return begin();
  }

  //! Retires chunks that completed, then seals and posts the next ones while
  //! staging is free. @return true when the transfer has ended (error()).
  bool progress() noexcept {
    if (!active_) {
      return true;
    }
    retire_all(error_);
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
      fly(s);
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
    op_ = channel<std::byte>(*conn_).next_notification();
    return begin();
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

}  // namespace rdx
