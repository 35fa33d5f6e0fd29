// rdx: the connection-settings block each side sends after its endpoint
// messages, so both sides can check that they built matching connections.
//
// All integers are big-endian (network byte order). A block is
//
//   header, 20 bytes
//     0  u32  magic 0x52445843 ("RDXC")
//     4  u32  queue pairs
//     8  u32  recv_depth
//    12  u32  message_size
//    16  u16  flags (bit 0: messages sealed, connection_attr::encrypt;
//             the others zero)
//    18  u16  number of windows
//   per window, 8 bytes
//     0  u32  rights (read 1, write 2, atomic 4)
//     4  u32  element size in bytes
//
// The codec is pure: no socket, no allocation beyond the result. A stream
// reader reads the header, asks settings_window_count() how many windows
// follow (which checks the magic and bounds the count, so a foreign peer
// cannot make it wait or allocate), reads the rest, and hands the whole block
// to decode_settings().
#pragma once

#include <rdx/connect/wire.hpp>
#include <rdx/error.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace rdx::wire {

inline constexpr std::uint32_t settings_magic = 0x52445843;  //!< "RDXC", the first word of a settings block
//! Bytes of the fixed part of a settings block.
inline constexpr std::size_t settings_header_size = 20;
//! Bytes each window adds.
inline constexpr std::size_t settings_window_size = 8;
//! Most windows one block may list: the first endpoint message carries one
//! descriptor per window besides the credit word.
inline constexpr std::size_t max_settings_windows = max_descriptors - 1;
//! Every right a window may carry (read 1 | write 2 | atomic 4).
inline constexpr std::uint32_t settings_known_rights = 7;
//! Flag: the side seals its messages (connection_attr::encrypt).
inline constexpr std::uint16_t settings_flag_encrypt = 1;
//! Every flag a block may carry.
inline constexpr std::uint16_t settings_known_flags = settings_flag_encrypt;

//! What one side says about one of its window grants.
struct window_setting {
  std::uint32_t rights = 0;        //!< read 1, write 2, atomic 4, or'ed
  std::uint32_t element_size = 0;  //!< bytes per element, never zero
  //! Field-wise equality.
  friend bool operator==(const window_setting&, const window_setting&) noexcept = default;
};

//! One side's connection settings, as they travel.
struct settings {
  std::uint32_t queue_pairs = 0;        //!< queue pairs of the connection
  std::uint32_t recv_depth = 0;         //!< receive buffers of the message ring
  std::uint32_t message_size = 0;       //!< bytes of one message buffer
  std::vector<window_setting> windows;  //!< one per window grant, in order
  bool encrypt = false;                 //!< messages sealed (connection_attr::encrypt)
  //! Field-wise equality.
  friend bool operator==(const settings&, const settings&) = default;
};

//! Bytes a block with `windows` windows occupies.
[[nodiscard]] constexpr std::size_t settings_size(std::size_t windows) noexcept {
  return settings_header_size + windows * settings_window_size;
}

namespace detail {

[[noreturn]] inline void settings_fail(errc e, const std::string& what) {
  throw error(e, "connection settings: " + what);
}

// One check for both directions: encode refuses (invalid_argument) exactly
// what decode refuses (wire_format), so whatever encodes also decodes.
inline void check_settings_counts(std::uint32_t queue_pairs, std::uint32_t recv_depth,
                                  std::uint32_t message_size, errc code) {
  if (queue_pairs == 0) {
    settings_fail(code, "0 queue pairs (a connection has at least 1)");
  }
  if (recv_depth == 0) {
    settings_fail(code, "recv_depth 0 (a connection posts at least 1 receive)");
  }
  if (message_size == 0) {
    settings_fail(code, "message_size 0 (messages hold at least 1 byte)");
  }
}

inline void check_window_count(std::size_t windows, errc code) {
  if (windows > max_settings_windows) {
    settings_fail(code,
                  std::to_string(windows) + " windows, at most " + std::to_string(max_settings_windows));
  }
}

inline void check_window(const window_setting& w, std::size_t i, errc code) {
  if (w.rights > settings_known_rights) {
    settings_fail(code, "window " + std::to_string(i) + " has rights " + std::to_string(w.rights) +
                            " (known: read 1, write 2, atomic 4)");
  }
  if (w.element_size == 0) {
    settings_fail(code, "window " + std::to_string(i) + " has element size 0");
  }
}

}  // namespace detail

//! Encodes one settings block.
//! @throws rdx::error (errc::invalid_argument) for what decode_settings() would
//!         refuse: a zero count, more than max_settings_windows windows, unknown
//!         rights or a zero element size.
[[nodiscard]] inline std::vector<std::byte> encode_settings(const settings& s) {
  detail::check_settings_counts(s.queue_pairs, s.recv_depth, s.message_size, errc::invalid_argument);
  detail::check_window_count(s.windows.size(), errc::invalid_argument);
  for (std::size_t i = 0; i < s.windows.size(); ++i) {
    detail::check_window(s.windows[i], i, errc::invalid_argument);
  }
  std::vector<std::byte> out(settings_size(s.windows.size()));
  std::byte* p = out.data();
  detail::put32(p + 0, settings_magic);
  detail::put32(p + 4, s.queue_pairs);
  detail::put32(p + 8, s.recv_depth);
  detail::put32(p + 12, s.message_size);
  detail::put16(p + 16, s.encrypt ? settings_flag_encrypt : std::uint16_t{0});
  detail::put16(p + 18, static_cast<std::uint16_t>(s.windows.size()));
  p += settings_header_size;
  for (const auto& w : s.windows) {
    detail::put32(p + 0, w.rights);
    detail::put32(p + 4, w.element_size);
    p += settings_window_size;
  }
  return out;
}

//! Checks the fixed header at the start of `header` and returns how many
//! windows follow it, so a stream reader knows how many bytes remain
//! (settings_size(count) - settings_header_size) before reading them.
//! @throws rdx::error (errc::wire_format) for a short header, a wrong magic,
//!         unknown flags or more than max_settings_windows windows.
[[nodiscard]] inline std::uint32_t settings_window_count(std::span<const std::byte> header) {
  if (header.size() < settings_header_size) {
    detail::settings_fail(errc::wire_format, "truncated: " + std::to_string(header.size()) +
                                                 " bytes, the header alone needs " +
                                                 std::to_string(settings_header_size));
  }
  const std::uint32_t m = detail::get32(header.data());
  if (m != settings_magic) {
    std::string w =
        "wrong magic " + detail::hex(m) + " (expected " + detail::hex(settings_magic) + ", \"RDXC\")";
    if (m == magic) {
      w += ": an endpoint message came instead, so the peer has more queue pairs than this side";
    } else {
      w += ": the peer is not an rdx connection";
    }
    detail::settings_fail(errc::wire_format, w);
  }
  const std::uint16_t flags = detail::get16(header.data() + 16);
  if ((flags & ~settings_known_flags) != 0) {
    detail::settings_fail(errc::wire_format, "unknown flags " + detail::hex(flags) +
                                                 " (known: 1, messages sealed): the peer runs a newer rdx");
  }
  const std::uint32_t n = detail::get16(header.data() + 18);
  detail::check_window_count(n, errc::wire_format);
  return n;
}

//! Decodes exactly one settings block; `all` must hold it and nothing more.
//! @throws rdx::error (errc::wire_format) naming what arrived: truncated or
//!         oversized, a wrong magic, a zero count, too many windows, unknown
//!         rights or a zero element size.
[[nodiscard]] inline settings decode_settings(std::span<const std::byte> all) {
  const std::uint32_t n = settings_window_count(all);
  const std::size_t want = settings_size(n);
  if (all.size() < want) {
    detail::settings_fail(errc::wire_format, "truncated: " + std::to_string(all.size()) + " of " +
                                                 std::to_string(want) + " bytes (" + std::to_string(n) +
                                                 " windows)");
  }
  if (all.size() > want) {
    detail::settings_fail(errc::wire_format, "oversized: " + std::to_string(all.size()) + " bytes for " +
                                                 std::to_string(n) + " windows, which make " +
                                                 std::to_string(want));
  }
  const std::byte* p = all.data();
  settings s;
  s.queue_pairs = detail::get32(p + 4);
  s.recv_depth = detail::get32(p + 8);
  s.message_size = detail::get32(p + 12);
  s.encrypt = (detail::get16(p + 16) & settings_flag_encrypt) != 0;
  detail::check_settings_counts(s.queue_pairs, s.recv_depth, s.message_size, errc::wire_format);
  p += settings_header_size;
  s.windows.resize(n);
  for (std::size_t i = 0; i < n; ++i, p += settings_window_size) {
    s.windows[i] = {detail::get32(p + 0), detail::get32(p + 4)};
    detail::check_window(s.windows[i], i, errc::wire_format);
  }
  return s;
}

}  // namespace rdx::wire
