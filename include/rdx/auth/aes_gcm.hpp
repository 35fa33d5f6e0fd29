// rdx: AES-256-GCM sealing of a connection's messages (target rdx::auth,
// OpenSSL's libcrypto), under one key per direction that both sides derive
// with HKDF-SHA256 from the pre-shared key and the whole authenticated
// set-up, so the keys are fresh for every set-up. rdx writes no cryptography
// of its own. The protocol: rdx's design notes (share/doc/rdx/design.md),
// "Wire protocols", "Authenticated set-up".
//
// A sealed message, integers big-endian:
//   0      u64  sequence number: 0, 1, 2... per direction (also the
//               additional authenticated data)
//   8      n    ciphertext of the n-byte payload
//   8 + n  16   GCM tag
// Its 12-byte IV is u32 direction || u64 sequence; the side whose hello sorts
// first sends as direction 1, the other as direction 2.
#pragma once

#include <rdx/auth/detail/cipher.hpp>
#include <rdx/connect/message_seal.hpp>
#include <rdx/error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <system_error>
#include <vector>

#include <openssl/crypto.h>
#include <openssl/evp.h>

namespace rdx::auth {

//! The salt of the session keys' HKDF: these 25 bytes, no terminating NUL.
inline constexpr char session_keys_label[] = "rdx crypt v1 session keys";

//! One side's keys for sealing (send) and opening (receive), each with the
//! direction its IVs carry; wiped when destroyed.
struct session_keys {
  std::array<std::byte, detail::gcm_key_size> send{};     //!< AES-256 key of what this side seals
  std::array<std::byte, detail::gcm_key_size> receive{};  //!< AES-256 key of what this side opens
  std::uint32_t send_direction = 0;                       //!< IV prefix of what this side seals
  std::uint32_t receive_direction = 0;                    //!< IV prefix of what this side opens

  session_keys() = default;
  //! Copies are wiped in turn when destroyed.
  session_keys(const session_keys&) = default;
  //! Copies are wiped in turn when destroyed.
  session_keys& operator=(const session_keys&) = default;
  //! Copies (an array has nothing to steal); the source wipes its own.
  session_keys(session_keys&&) = default;
  //! Copies (an array has nothing to steal); the source wipes its own.
  session_keys& operator=(session_keys&&) = default;
  ~session_keys() {
    ::OPENSSL_cleanse(send.data(), send.size());
    ::OPENSSL_cleanse(receive.data(), receive.size());
  }
};

//! Derives one side's session keys. 64 bytes = HKDF-SHA256(key `secret`,
//! salt session_keys_label, info lo hello || hi hello || lo_to_hi_digest ||
//! hi_to_lo_digest), where "lo" is the side whose hello sorts first
//! bytewise. The lo side seals with bytes [0, 32) as direction 1 and opens
//! with [32, 64) as direction 2; the hi side the other way round, so both
//! sides compute the same 64 bytes and matching keys.
//! @param secret the pre-shared key
//! @param own_hello, peer_hello the whole hello messages this side sent and received
//! @param lo_to_hi_digest, hi_to_lo_digest SHA-256 of each direction's set-up bytes
//! @throws rdx::error: errc::invalid_argument for equal hellos;
//!         errc::operation_failed when OpenSSL fails.
[[nodiscard]] inline session_keys derive_session_keys(std::span<const std::byte> secret,
                                                      std::span<const std::byte> own_hello,
                                                      std::span<const std::byte> peer_hello,
                                                      std::span<const std::byte> lo_to_hi_digest,
                                                      std::span<const std::byte> hi_to_lo_digest) {
  const bool lo = detail::sorts_first(own_hello, peer_hello);
  const auto lo_hello = lo ? own_hello : peer_hello;
  const auto hi_hello = lo ? peer_hello : own_hello;
  std::vector<std::byte> info;
  info.reserve(lo_hello.size() + hi_hello.size() + lo_to_hi_digest.size() + hi_to_lo_digest.size());
  for (const auto part : {lo_hello, hi_hello, lo_to_hi_digest, hi_to_lo_digest}) {
    info.insert(info.end(), part.begin(), part.end());
  }
  std::array<std::byte, 2 * detail::gcm_key_size> okm{};
  detail::hkdf_sha256(
      secret, std::as_bytes(std::span(session_keys_label).first(sizeof session_keys_label - 1)), info, okm);
  const auto first = std::span(okm).first<detail::gcm_key_size>();
  const auto second = std::span(okm).last<detail::gcm_key_size>();
  session_keys k;
  std::memcpy(k.send.data(), (lo ? first : second).data(), detail::gcm_key_size);
  std::memcpy(k.receive.data(), (lo ? second : first).data(), detail::gcm_key_size);
  k.send_direction = lo ? 1 : 2;
  k.receive_direction = lo ? 2 : 1;
  ::OPENSSL_cleanse(okm.data(), okm.size());
  ::OPENSSL_cleanse(info.data(), info.size());
  return k;
}

//! Which of a connection's two sealed streams a seal serves: its messages
//! (connection_attr::encrypt) or its sealed window writes and reads
//! (rdx/channel/sealed_window.hpp, sealed_fetch.hpp). Each has its own sequence
//! from 0 under the same keys, so their IVs differ in the direction word:
//! messages carry 1 and 2, windows 3 and 4, and no nonce serves both.
enum class seal_lane : std::uint8_t { messages, windows };

//! Seals one connection's messages with AES-256-GCM under session_keys:
//! sequence numbers 0, 1, 2... in each direction, opened strictly in order.
//! Both contexts are keyed once, when constructed; a message sets only its
//! IV, so sealing and opening allocate nothing and never throw. Keeps no
//! copy of the keys: OpenSSL's contexts hold their schedules and wipe them
//! when freed.
class aes_gcm_seal final : public message_seal {
public:
  //! @throws rdx::error (errc::operation_failed) when OpenSSL fails.
  explicit aes_gcm_seal(const session_keys& keys, seal_lane lane = seal_lane::messages)
      : encrypt_(detail::gcm_context(keys.send, true)),
        decrypt_(detail::gcm_context(keys.receive, false)),
        send_direction_(keys.send_direction + (lane == seal_lane::windows ? 2U : 0U)),
        receive_direction_(keys.receive_direction + (lane == seal_lane::windows ? 2U : 0U)),
        send_key_id_(detail::key_id(keys.send)),
        receive_key_id_(detail::key_id(keys.receive)) {}
  aes_gcm_seal(const aes_gcm_seal&) = delete;
  aes_gcm_seal& operator=(const aes_gcm_seal&) = delete;
  aes_gcm_seal(aes_gcm_seal&&) = delete;
  aes_gcm_seal& operator=(aes_gcm_seal&&) = delete;
  ~aes_gcm_seal() override = default;

  //! Seals `plain` into out[0, plain.size() + sealed_message_overhead).
  //! `plain` may lie at out + sealed_payload_offset (sealed in place);
  //! otherwise it must not overlap the output. A sequence number is spent
  //! even when the cipher fails, so no IV is ever used twice.
  //! @return errc::limit_exceeded when 2^64 - 1 messages were sealed;
  //!         errc::operation_failed when the cipher fails.
  std::error_code seal(std::span<const std::byte> plain, std::byte* out) noexcept override {
    if (sent_ == std::numeric_limits<std::uint64_t>::max()) {
      return make_error_code(errc::limit_exceeded);
    }
    const std::uint64_t sequence = sent_++;
    std::array<unsigned char, detail::gcm_iv_size> iv{};
    detail::gcm_iv(iv.data(), send_direction_, sequence);
    put64(out, sequence);
    std::byte* const cipher = out + sealed_payload_offset;
    EVP_CIPHER_CTX* const ctx = encrypt_.get();
    int len = 0;
    std::array<unsigned char, detail::gcm_tag_size> last{};
    if (::EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv.data()) != 1 ||
        ::EVP_EncryptUpdate(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(out),
                            sealed_payload_offset) != 1 ||
        !detail::gcm_update(ctx, true, plain.data(), cipher, plain.size()) ||
        ::EVP_EncryptFinal_ex(ctx, last.data(), &len) != 1 ||
        ::EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(detail::gcm_tag_size),
                              cipher + plain.size()) != 1) {
      return make_error_code(errc::operation_failed);
    }
    return {};
  }

  //! Opens one sealed message: checks its sequence number, then decrypts it
  //! in place and checks its tag. Only then, when `out` is given (and is not
  //! sealed.data() + sealed_payload_offset), is the payload copied there, so
  //! `out` never holds a byte that failed its check. A message that fails
  //! its tag has its payload bytes in `sealed` zeroed.
  //! @return errc::integrity_failed (failure() says why); every later open
  //!         fails the same way. errc::operation_failed when the cipher fails.
  std::error_code open(std::span<std::byte> sealed, std::byte* out) noexcept override {
    if (failed_) {
      return make_error_code(failed_code_);
    }
    if (sealed.size() < sealed_message_overhead) {
      std::snprintf(failure_.data(), failure_.size(), "%zu bytes, shorter than the %u a sealed message takes",
                    sealed.size(), static_cast<unsigned>(sealed_message_overhead));
      return fail(errc::integrity_failed);
    }
    const std::uint64_t sequence = get64(sealed.data());
    const auto expected = static_cast<unsigned long long>(opened_);
    if (sequence < opened_) {
      std::snprintf(failure_.data(), failure_.size(),
                    "sequence %llu arrived again: %llu was expected (a replayed message)",
                    static_cast<unsigned long long>(sequence), expected);
      return fail(errc::integrity_failed);
    }
    if (sequence > opened_) {
      std::snprintf(failure_.data(), failure_.size(),
                    "sequence %llu arrived where %llu was expected (a message reordered, dropped or forged)",
                    static_cast<unsigned long long>(sequence), expected);
      return fail(errc::integrity_failed);
    }
    const std::size_t n = sealed.size() - sealed_message_overhead;
    std::byte* const payload = sealed.data() + sealed_payload_offset;
    std::array<unsigned char, detail::gcm_iv_size> iv{};
    detail::gcm_iv(iv.data(), receive_direction_, sequence);
    EVP_CIPHER_CTX* const ctx = decrypt_.get();
    int len = 0;
    std::array<unsigned char, detail::gcm_tag_size> last{};
    if (::EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, iv.data()) != 1 ||
        ::EVP_DecryptUpdate(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(sealed.data()),
                            sealed_payload_offset) != 1 ||
        !detail::gcm_update(ctx, false, payload, payload, n) ||
        ::EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, static_cast<int>(detail::gcm_tag_size),
                              payload + n) != 1) {
      ::OPENSSL_cleanse(payload, n);
      std::snprintf(failure_.data(), failure_.size(), "message %llu: OpenSSL's AES-256-GCM failed", expected);
      return fail(errc::operation_failed);
    }
    if (::EVP_DecryptFinal_ex(ctx, last.data(), &len) != 1) {
      // The bytes decrypted in place are unauthenticated: none is left behind.
      ::OPENSSL_cleanse(payload, n);
      std::snprintf(
          failure_.data(), failure_.size(),
          "message %llu failed its authentication tag (changed on the wire, or sealed with another key)",
          expected);
      return fail(errc::integrity_failed);
    }
    ++opened_;
    if (out != nullptr && out != payload && n != 0) {
      std::memmove(out, payload, n);
    }
    return {};
  }

  [[nodiscard]] const char* failure() const noexcept override { return failure_.data(); }

  //! Messages sealed so far: the next send sequence number.
  [[nodiscard]] std::uint64_t sent() const noexcept { return sent_; }
  //! Messages opened so far: the next sequence number expected.
  [[nodiscard]] std::uint64_t opened() const noexcept { return opened_; }
  //! The send key's public name: the first 8 bytes of its SHA-256 as a
  //! big-endian number; equals the peer's receive_key_id(), and differs
  //! between set-ups. The key itself is never exposed.
  [[nodiscard]] std::uint64_t send_key_id() const noexcept { return send_key_id_; }
  //! The receive key's public name (as send_key_id()).
  [[nodiscard]] std::uint64_t receive_key_id() const noexcept { return receive_key_id_; }

private:
  static void put64(std::byte* p, std::uint64_t v) noexcept {
    for (std::size_t i = 0; i < 8; ++i) {
      p[i] = static_cast<std::byte>(v >> (56 - 8 * i));
    }
  }
  static std::uint64_t get64(const std::byte* p) noexcept {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < 8; ++i) {
      v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
    }
    return v;
  }

  // Makes the first failure sticky; its reason is already in failure_ (a
  // fixed buffer, so a failure allocates nothing).
  std::error_code fail(errc code) noexcept {
    failed_ = true;
    failed_code_ = code;
    return make_error_code(code);
  }

  detail::cipher_ctx encrypt_;
  detail::cipher_ctx decrypt_;
  std::uint32_t send_direction_;
  std::uint32_t receive_direction_;
  std::uint64_t send_key_id_;
  std::uint64_t receive_key_id_;
  std::uint64_t sent_ = 0;
  std::uint64_t opened_ = 0;
  bool failed_ = false;
  errc failed_code_ = errc::integrity_failed;
  std::array<char, 160> failure_{};
};

}  // namespace rdx::auth
