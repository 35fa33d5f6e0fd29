// rdx: the interface through which a connection seals its messages
// (connection_attr::encrypt). The core needs no cryptography itself:
// rdx::auth (rdx/auth/aes_gcm.hpp) implements it with AES-256-GCM and
// session keys derived in the authenticated set-up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>

namespace rdx {

//! Bytes a sealed message takes in its buffer beyond the payload: an 8-byte
//! sequence number before it and a 16-byte authentication tag after it. A
//! connection with connection_attr::encrypt carries message_size - 24 bytes
//! of payload per message (connection::message_size() says so).
inline constexpr std::uint32_t sealed_message_overhead = 24;
//! Where the payload starts in a sealed message: after its sequence number.
inline constexpr std::uint32_t sealed_payload_offset = 8;

//! Seals the messages of one connection in one direction and opens those of
//! the other. One object serves one connection: its sequence numbers start
//! at 0 and never repeat, and it must refuse a message whose sequence is not
//! the next one expected. Called on the data path: no allocation, no
//! exception. Not thread-safe (a connection is used by one thread at a time).
class message_seal {
public:
  message_seal() = default;
  message_seal(const message_seal&) = delete;
  message_seal& operator=(const message_seal&) = delete;
  message_seal(message_seal&&) = delete;
  message_seal& operator=(message_seal&&) = delete;
  virtual ~message_seal() = default;

  //! Seals `plain` into out[0, plain.size() + sealed_message_overhead): the
  //! next send sequence number, the ciphertext, the tag. `plain` may lie
  //! exactly at out + sealed_payload_offset (sealed in place, as a
  //! connection does in its staging buffer when the message is posted).
  //! @return errc::limit_exceeded when the sequence numbers are spent,
  //!         errc::operation_failed when the cipher fails.
  virtual std::error_code seal(std::span<const std::byte> plain, std::byte* out) noexcept = 0;

  //! Opens one sealed message in place: checks its sequence number against
  //! the next expected and its tag, and leaves the payload
  //! (sealed.size() - sealed_message_overhead bytes) at
  //! sealed.data() + sealed_payload_offset, or at `out` when given.
  //! After the first failure every later open fails too.
  //! @return errc::integrity_failed (failure() says why).
  virtual std::error_code open(std::span<std::byte> sealed, std::byte* out) noexcept = 0;

  //! Why the first failed open failed, in words; "" before any.
  [[nodiscard]] virtual const char* failure() const noexcept = 0;
};

}  // namespace rdx
