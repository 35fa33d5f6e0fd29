// rdx's programs: the settings block two sides of one program swap before any
// RDMA traffic, so that each can name what differs. A block is a four-letter
// magic, then fixed-size big-endian fields (rdx's own wire helpers); its
// meaning is the program's. Not part of the library and not installed.
#pragma once

#include <rdx/connect/tcp_socket.hpp>
#include <rdx/connect/wire.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace app {

//! Bytes of the magic that starts every settings block.
inline constexpr std::size_t settings_magic_size = 4;

//! Writes a settings block field after field: the magic, then big-endian integers.
class settings_writer {
public:
  explicit settings_writer(std::span<std::byte> out) noexcept : out_(out) {}

  //! Writes the four-letter magic.
  settings_writer& magic(std::string_view m) {
    std::memcpy(take(settings_magic_size), m.data(), settings_magic_size);
    return *this;
  }
  settings_writer& u32(std::uint32_t v) {
    rdx::wire::detail::put32(take(4), v);
    return *this;
  }
  settings_writer& u64(std::uint64_t v) {
    rdx::wire::detail::put64(take(8), v);
    return *this;
  }
  //! Bytes written so far.
  [[nodiscard]] std::size_t size() const noexcept { return at_; }

private:
  std::byte* take(std::size_t n) {
    if (n > out_.size() - at_) {
      throw std::length_error("settings block: a field past its end");
    }
    std::byte* p = out_.data() + at_;
    at_ += n;
    return p;
  }

  std::span<std::byte> out_;
  std::size_t at_ = 0;
};

//! Reads a settings block field after field, in the order it was written.
class settings_reader {
public:
  explicit settings_reader(std::span<const std::byte> in) noexcept : in_(in) {}

  //! True when the block starts with the four-letter magic `m`; consumes it.
  [[nodiscard]] bool magic(std::string_view m) {
    if (in_.size() - at_ < settings_magic_size) {
      return false;
    }
    const bool same = std::memcmp(in_.data() + at_, m.data(), settings_magic_size) == 0;
    at_ += settings_magic_size;
    return same;
  }
  [[nodiscard]] std::uint32_t u32() { return rdx::wire::detail::get32(take(4)); }
  [[nodiscard]] std::uint64_t u64() { return rdx::wire::detail::get64(take(8)); }

private:
  const std::byte* take(std::size_t n) {
    if (n > in_.size() - at_) {
      throw std::length_error("settings block: a field past its end");
    }
    const std::byte* p = in_.data() + at_;
    at_ += n;
    return p;
  }

  std::span<const std::byte> in_;
  std::size_t at_ = 0;
};

//! What a program says of a peer whose block does not start with its magic.
inline std::string not_a_peer(const std::string& who, std::string_view program) {
  return "the peer at " + who + " is not " + std::string(program);
}

//! Sends this side's block and receives the peer's block of the same size,
//! both within `deadline`, and checks that the peer's starts with our magic.
//! @throws rdx::error when the socket fails or the deadline passes
//! @throws Failure (the program's failure type) naming `program` when the
//!         peer's magic is not ours
template <class Failure>
void exchange_settings(const rdx::tcp::socket& s, std::span<const std::byte> mine, std::span<std::byte> peer,
                       std::chrono::steady_clock::time_point deadline, std::string_view program) {
  s.send_all(mine, deadline, "send settings");
  s.recv_exact(peer, deadline, "receive settings");
  if (peer.size() < settings_magic_size || std::memcmp(peer.data(), mine.data(), settings_magic_size) != 0) {
    throw Failure(not_a_peer(s.peer(), program));
  }
}

}  // namespace app
