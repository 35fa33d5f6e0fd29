// rdx::cm: what an rdx connection says in rdma_cm's private data (the
// connect request, the reply and the reject), versioned and checked like
// the TCP wire format (rdx/connect/wire.hpp).
//
// The transport bounds each message (IB CM, also for RoCE, with the rdma_cm
// header taken out): a request carries 56 bytes, a reply 196, a reject 148,
// and a receiver sees the whole field, zero-padded. All integers are
// big-endian. Every message starts with
//
//    0  u32  magic 0x5244584D ("RDXM")
//    4  u8   version (1)
//    5  u8   kind: 1 request, 2 reply, 3 reject
//    6  u8   queue-pair index i (reject: reason)
//    7  u8   queue-pair count K, 1 to 64 (reject: text length)
//    8  u32  tag: random, the same in the K requests of one connection and
//            echoed by the replies (reject: the text follows here)
//
// The request and reply for queue pair 0 go on with the connection settings
// and the full window table; those for queue pair i > 0 only with the key
// of each window on queue pair i:
//
//   i = 0                                 i > 0
//   12 u32  recv_depth                    12 u8  windows n
//   16 u32  message_size                  13 u32 key, n times
//   20 u32  credit word key
//   24 u64  credit word address (8 bytes, 8-aligned)
//   32 u8   windows n
//   33      n times 23 bytes: u64 address, u64 length, u32 key,
//           u8 rights (read 1, write 2, atomic 4), u16 element size
//
// So a request holds one window (33 + 23 = 56) and a reply seven (194 of
// 196); every byte after the content must be zero. The codec is pure: no socket, no verbs.
#pragma once

#include <rdx/connect/wire.hpp>
#include <rdx/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdx::cm {

inline constexpr std::uint32_t private_magic = 0x5244584D;  //!< "RDXM", the first 4 bytes of every message
inline constexpr std::uint8_t private_version = 1;          //!< the version this side speaks and accepts
//! Private-data bytes of a connect request (IB CM, RDMA_PS_TCP).
inline constexpr std::size_t request_capacity = 56;
inline constexpr std::size_t reply_capacity = 196;    //!< private-data bytes of a connect reply
inline constexpr std::size_t reject_capacity = 148;   //!< private-data bytes of a reject
inline constexpr std::size_t hello_header_size = 12;  //!< the header every message starts with
inline constexpr std::size_t hello_first_size = 33;   //!< queue pair 0: through the window count
inline constexpr std::size_t window_entry_size = 23;  //!< one window of the table
inline constexpr std::uint32_t max_queue_pairs = 64;  //!< most queue pairs one connection sets up

//! The kind byte: a connect request, a connect reply, a reject.
enum class message_kind : std::uint8_t { request = 1, reply = 2, reject = 3 };

//! Why a server refused (the reason byte of a reject).
enum class reject_reason : std::uint8_t {
  malformed = 1,   //!< the request's private data is not an rdx request
  version = 2,     //!< a version this side does not speak
  settings = 3,    //!< queue pairs, recv_depth or message_size differ
  incomplete = 4,  //!< not all K requests of the connection arrived in time
  refused = 5,     //!< the application declined (listener::reject)
  failed = 6,      //!< setting up this side failed
};

//! One window as it travels: the memory, its key on this queue pair, what
//! the peer may do and the element size.
struct window_entry {
  std::uint64_t addr = 0;          //!< first byte of the window in the offering side's address space
  std::uint64_t length = 0;        //!< bytes, a whole number of elements
  std::uint32_t key = 0;           //!< the rkey on this queue pair
  std::uint8_t rights = 0;         //!< read 1, write 2, atomic 4, or a sum of them
  std::uint16_t element_size = 0;  //!< bytes of one element, not 0
  //! Field-wise equality.
  friend bool operator==(const window_entry&, const window_entry&) = default;
};

//! A request (client to server) or reply (server to client) for one queue pair.
struct hello {
  message_kind kind = message_kind::request;  //!< request or reply
  std::uint8_t qp_index = 0;                  //!< which of the connection's queue pairs, below qp_count
  std::uint8_t qp_count = 1;                  //!< the connection's queue pairs, 1 to max_queue_pairs
  std::uint32_t tag = 0;           //!< random, the same in all requests of one connection; echoed by replies
  std::uint32_t recv_depth = 0;    //!< queue pair 0 only (0 on the others): buffers in the message ring
  std::uint32_t message_size = 0;  //!< queue pair 0 only: bytes of one message buffer
  std::uint32_t credit_key = 0;    //!< queue pair 0 only: rkey of the credit word
  std::uint64_t credit_addr = 0;   //!< queue pair 0 only: address of the credit word, 8-aligned
  std::vector<window_entry> windows;  //!< queue pair 0: the whole table
  std::vector<std::uint32_t> keys;    //!< queue pair i > 0: each window's key on it
  //! Field-wise equality.
  friend bool operator==(const hello&, const hello&) = default;
};

//! A reject as rdx sends it.
struct rejection {
  std::uint8_t version = private_version;         //!< what the rejecting side speaks
  reject_reason reason = reject_reason::refused;  //!< why the peer refused
  std::string text;  //!< why, in words: cut to what fits; decoded as printable ASCII, '?' for other bytes
};

//! Private-data bytes of a message of kind k: request_capacity, reply_capacity or reject_capacity.
[[nodiscard]] constexpr std::size_t capacity_of(message_kind k) noexcept {
  return k == message_kind::request ? request_capacity
         : k == message_kind::reply ? reply_capacity
                                    : reject_capacity;
}
//! Most windows one side can offer over rdma_cm (a request's or a reply's room).
[[nodiscard]] constexpr std::size_t max_windows(message_kind k) noexcept {
  return (capacity_of(k) - hello_first_size) / window_entry_size;
}

namespace detail {

[[noreturn]] inline void pd_fail(errc e, std::string_view kind, const std::string& what) {
  throw error(e, "rdma_cm private data (" + std::string(kind) + "): " + what);
}
inline const char* kind_name(message_kind k) noexcept {
  return k == message_kind::request ? "connect request"
         : k == message_kind::reply ? "connect reply"
                                    : "reject";
}

// One check for both directions: encode refuses what decode refuses.
inline void check_hello(const hello& h, errc code) {
  const char* k = kind_name(h.kind);
  if (h.kind != message_kind::request && h.kind != message_kind::reply) {
    pd_fail(code, k, "not a request or reply");
  }
  if (h.qp_count < 1 || h.qp_count > max_queue_pairs) {
    pd_fail(code, k,
            std::to_string(h.qp_count) + " queue pairs, need 1 to " + std::to_string(max_queue_pairs));
  }
  if (h.qp_index >= h.qp_count) {
    pd_fail(code, k, "queue pair index " + std::to_string(h.qp_index) + " of " + std::to_string(h.qp_count));
  }
  const std::size_t cap = capacity_of(h.kind);
  if (h.qp_index == 0) {
    if (h.recv_depth == 0) {
      pd_fail(code, k, "recv_depth 0");
    }
    if (h.message_size == 0) {
      pd_fail(code, k, "message_size 0");
    }
    if (h.credit_addr % 8 != 0) {
      pd_fail(code, k, "the credit word is not 8-aligned");
    }
    if (!h.keys.empty()) {
      pd_fail(code, k, "queue pair 0 carries the window table, not a key list");
    }
    if (h.windows.size() > max_windows(h.kind)) {
      pd_fail(code, k,
              std::to_string(h.windows.size()) + " windows, at most " + std::to_string(max_windows(h.kind)) +
                  " fit in its " + std::to_string(cap) + " bytes (the TCP bootstrap carries more)");
    }
    for (std::size_t i = 0; i < h.windows.size(); ++i) {
      const window_entry& w = h.windows[i];
      if (w.rights == 0 || w.rights > 7) {
        pd_fail(code, k,
                "window " + std::to_string(i) + " has rights " + std::to_string(w.rights) +
                    " (known: read 1, write 2, atomic 4)");
      }
      if (w.element_size == 0) {
        pd_fail(code, k, "window " + std::to_string(i) + " has element size 0");
      }
      if (w.length % w.element_size != 0) {
        pd_fail(code, k,
                "window " + std::to_string(i) + " is " + std::to_string(w.length) +
                    " bytes, not a whole number of " + std::to_string(w.element_size) + "-byte elements");
      }
    }
  } else {
    if (!h.windows.empty()) {
      pd_fail(code, k, "queue pair " + std::to_string(h.qp_index) + " carries a window table");
    }
    if (h.recv_depth != 0 || h.message_size != 0 || h.credit_key != 0 || h.credit_addr != 0) {
      pd_fail(code, k, "queue pair " + std::to_string(h.qp_index) + " carries settings (queue pair 0 does)");
    }
    if (hello_header_size + 1 + 4 * h.keys.size() > cap) {
      pd_fail(code, k,
              std::to_string(h.keys.size()) + " keys do not fit in " + std::to_string(cap) + " bytes");
    }
  }
}

}  // namespace detail

//! Encodes a request or reply, zero-padded to its kind's capacity.
//! @throws rdx::error (errc::invalid_argument) for what decode_hello() refuses.
[[nodiscard]] inline std::vector<std::byte> encode_hello(const hello& h) {
  using rdx::wire::detail::put16;
  using rdx::wire::detail::put32;
  using rdx::wire::detail::put64;
  detail::check_hello(h, errc::invalid_argument);
  std::vector<std::byte> out(capacity_of(h.kind));
  std::byte* p = out.data();
  put32(p, private_magic);
  p[4] = std::byte{private_version};
  p[5] = std::byte{static_cast<std::uint8_t>(h.kind)};
  p[6] = std::byte{h.qp_index};
  p[7] = std::byte{h.qp_count};
  put32(p + 8, h.tag);
  if (h.qp_index == 0) {
    put32(p + 12, h.recv_depth);
    put32(p + 16, h.message_size);
    put32(p + 20, h.credit_key);
    put64(p + 24, h.credit_addr);
    p[32] = std::byte{static_cast<std::uint8_t>(h.windows.size())};
    std::byte* w = p + hello_first_size;
    for (const auto& e : h.windows) {
      put64(w, e.addr);
      put64(w + 8, e.length);
      put32(w + 16, e.key);
      w[20] = std::byte{e.rights};
      put16(w + 21, e.element_size);
      w += window_entry_size;
    }
  } else {
    p[12] = std::byte{static_cast<std::uint8_t>(h.keys.size())};
    for (std::size_t i = 0; i < h.keys.size(); ++i) {
      put32(p + 13 + 4 * i, h.keys[i]);
    }
  }
  return out;
}

//! True when the bytes start with rdx's magic (an rdx peer, whatever its version).
[[nodiscard]] inline bool is_rdx(std::span<const std::byte> b) noexcept {
  return b.size() >= 4 && rdx::wire::detail::get32(b.data()) == private_magic;
}

//! Decodes a request or reply of kind `want`, padding included.
//! @throws rdx::error (errc::wire_format) naming what arrived: not rdx, another
//!         version, another kind, a count or index out of range, too many
//!         windows, unknown rights, a zero element size, or non-zero padding.
[[nodiscard]] inline hello decode_hello(std::span<const std::byte> b, message_kind want) {
  using rdx::wire::detail::get16;
  using rdx::wire::detail::get32;
  using rdx::wire::detail::get64;
  const char* k = detail::kind_name(want);
  auto fail = [&](const std::string& what) { detail::pd_fail(errc::wire_format, k, what); };
  if (b.size() < hello_header_size) {
    fail(std::to_string(b.size()) + " bytes, the header alone needs " + std::to_string(hello_header_size) +
         (b.empty() ? " (the peer sent no private data: not an rdx peer)" : ""));
  }
  if (!is_rdx(b)) {
    fail("magic " + rdx::wire::detail::hex(get32(b.data())) + ", expected " +
         rdx::wire::detail::hex(private_magic) + " (\"RDXM\"): not an rdx peer");
  }
  const auto version = std::to_integer<unsigned>(b[4]);
  if (version != private_version) {
    fail("version " + std::to_string(version) + ", this side speaks " + std::to_string(private_version));
  }
  hello h;
  h.kind = static_cast<message_kind>(std::to_integer<std::uint8_t>(b[5]));
  if (h.kind != want) {
    fail("kind " + std::to_string(std::to_integer<unsigned>(b[5])) + " arrived instead");
  }
  h.qp_index = std::to_integer<std::uint8_t>(b[6]);
  h.qp_count = std::to_integer<std::uint8_t>(b[7]);
  h.tag = get32(b.data() + 8);
  std::size_t used = hello_header_size;
  if (h.qp_index == 0) {
    if (b.size() < hello_first_size) {
      fail("truncated: " + std::to_string(b.size()) + " bytes");
    }
    h.recv_depth = get32(b.data() + 12);
    h.message_size = get32(b.data() + 16);
    h.credit_key = get32(b.data() + 20);
    h.credit_addr = get64(b.data() + 24);
    const auto n = std::to_integer<std::size_t>(b[32]);
    used = hello_first_size + n * window_entry_size;
    if (n > max_windows(want) || used > b.size()) {
      fail(std::to_string(n) + " windows do not fit in " + std::to_string(b.size()) + " bytes");
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::byte* w = b.data() + hello_first_size + i * window_entry_size;
      h.windows.push_back(
          {get64(w), get64(w + 8), get32(w + 16), std::to_integer<std::uint8_t>(w[20]), get16(w + 21)});
    }
  } else {
    if (b.size() < hello_header_size + 1) {
      fail("truncated: " + std::to_string(b.size()) + " bytes");
    }
    const auto n = std::to_integer<std::size_t>(b[12]);
    used = hello_header_size + 1 + 4 * n;
    if (used > b.size()) {
      fail(std::to_string(n) + " keys do not fit in " + std::to_string(b.size()) + " bytes");
    }
    for (std::size_t i = 0; i < n; ++i) {
      h.keys.push_back(get32(b.data() + 13 + 4 * i));
    }
  }
  for (std::size_t i = used; i < b.size(); ++i) {
    if (b[i] != std::byte{0}) {
      fail("byte " + std::to_string(i) + " after the content is not zero");
    }
  }
  detail::check_hello(h, errc::wire_format);
  return h;
}

//! Encodes a reject; the text is cut to what fits.
[[nodiscard]] inline std::vector<std::byte> encode_rejection(reject_reason why, std::string_view text) {
  std::vector<std::byte> out(reject_capacity);
  rdx::wire::detail::put32(out.data(), private_magic);
  out[4] = std::byte{private_version};
  out[5] = std::byte{static_cast<std::uint8_t>(message_kind::reject)};
  out[6] = std::byte{static_cast<std::uint8_t>(why)};
  const std::size_t n = std::min(text.size(), reject_capacity - 8);
  out[7] = std::byte{static_cast<std::uint8_t>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    out[8 + i] = static_cast<std::byte>(text[i]);
  }
  return out;
}

//! An rdx reject's version, reason and text; nullopt for anything else
//! (a foreign peer's reject, or none). Never throws for any input.
[[nodiscard]] inline std::optional<rejection> decode_rejection(std::span<const std::byte> b) {
  if (b.size() < 8 || !is_rdx(b) ||
      std::to_integer<unsigned>(b[5]) != static_cast<unsigned>(message_kind::reject)) {
    return std::nullopt;
  }
  rejection r;
  r.version = std::to_integer<std::uint8_t>(b[4]);
  r.reason = static_cast<reject_reason>(std::to_integer<std::uint8_t>(b[6]));
  const std::size_t n = std::min({std::to_integer<std::size_t>(b[7]), b.size() - 8, reject_capacity - 8});
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = std::to_integer<unsigned char>(b[8 + i]);
    r.text.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?');  // a peer's bytes, printable only
  }
  return r;
}

}  // namespace rdx::cm
