// rdx::detail: what the sealed window types share (rdx/channel/sealed_window.hpp,
// rdx/channel/sealed_fetch.hpp): the window's size for a transfer, the checks
// of their sizes, running a transfer to its end, and registered staging with
// an operation on each slot.
#pragma once

#include <rdx/channel/channel.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/message_seal.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
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
  // A transfer starts: no error yet, running.
  std::error_code begin() noexcept {
    error_ = {};
    active_ = true;
    return {};
  }

  std::error_code error_;
  bool active_ = false;
};

// Operations on `depth` slots, each in flight or not: what every sealed
// type that posts (sealed_writer, sealed_source, sealed_fetcher) keeps.
class sealed_slots {
protected:
  explicit sealed_slots(std::uint32_t depth) : ops_(depth), flying_(depth, false) {}

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
  // Every slot's operation that has ended leaves the flight (the first error kept).
  void retire_all(std::error_code& error) noexcept {
    for (std::size_t s = 0; s < ops_.size() && in_flight_ != 0; ++s) {
      (void)retire(s, error);
    }
  }
  // Slot s's operation was started: it is in flight.
  void fly(std::size_t s) noexcept {
    flying_[s] = true;
    ++in_flight_;
  }

  std::vector<operation> ops_;
  std::vector<bool> flying_;
  std::size_t in_flight_ = 0;
};

// What sealed_writer and sealed_fetcher share: their connection and seal,
// registered staging of `depth` slots of chunk + 24 bytes, the operation on
// each slot, and the checks of a window's size.
class sealed_staging : public sealed_slots {
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
      : sealed_slots(depth),
        who_(who),
        conn_(&c),
        seal_(&seal),
        chunk_(checked_sealed_chunk(who, chunk, depth, "depth")),
        stride_(std::size_t{chunk} + sealed_message_overhead),
        staging_(pd, stride_ * depth) {}
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
  std::byte* slot(std::size_t s) noexcept { return staging_.data() + s * stride_; }

  const char* who_;
  connection* conn_;
  message_seal* seal_;
  std::uint32_t chunk_;
  std::size_t stride_;
  registered_buffer<std::byte> staging_;
};

}  // namespace detail

}  // namespace rdx
