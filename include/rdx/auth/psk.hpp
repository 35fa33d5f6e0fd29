// rdx: pre-shared-key authentication of connection set-up (target rdx::auth,
// which links OpenSSL's libcrypto). Both sides send fresh nonces, prove the
// key by an HMAC-SHA256 over both, and finish with an HMAC over every byte
// of the exchange, before any queue pair is connected; the steps are in
// rdx/connect/authenticator.hpp, the messages in rdx/auth/detail/message.hpp.
// A successful set-up also keys sealed messages (make_seal(), aes_gcm.hpp).
// The protocol: rdx's design notes (share/doc/rdx/design.md),
// "Wire protocols", "Authenticated set-up".
#pragma once

#include <rdx/auth/aes_gcm.hpp>
#include <rdx/auth/detail/cipher.hpp>
#include <rdx/auth/detail/message.hpp>
#include <rdx/auth/detail/support.hpp>
#include <rdx/connect/authenticator.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/wire.hpp>
#include <rdx/error.hpp>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

//! Authentication of set-up with a pre-shared key (target rdx::auth, OpenSSL's libcrypto).
namespace rdx::auth {

//! Shortest key accepted, in bytes.
inline constexpr std::size_t min_key_size = 16;
//! Bytes of the random nonce each side sends, fresh every set-up.
inline constexpr std::size_t nonce_size = detail::body_size;

//! A pre-shared key, wiped when destroyed. One key may serve many set-ups at
//! once (thread-safe); it remembers the last nonces it issued and accepted,
//! so a replayed set-up, or one reflected from another set-up of the same
//! key, is refused by name. The two ends of one set-up inside one process
//! need two psk_key objects (made from the same bytes).
class psk_key final : public keyed_mac {
public:
  //! @throws rdx::error (errc::invalid_argument) when `key` is shorter than
  //!         min_key_size bytes.
  explicit psk_key(std::span<const std::byte> key) : key_(key.begin(), key.end()) {
    if (key.size() < min_key_size) {
      ::OPENSSL_cleanse(key_.data(), key_.size());
      detail::fail_key(std::to_string(key.size()) + " bytes, at least " + std::to_string(min_key_size) +
                       " are needed (32 random bytes are best)");
    }
    mac_.reset(::EVP_MAC_fetch(nullptr, "HMAC", nullptr));
    if (!mac_) {
      ::OPENSSL_cleanse(key_.data(), key_.size());
      detail::fail_openssl("EVP_MAC_fetch(HMAC)");
    }
  }
  psk_key(const psk_key&) = delete;
  psk_key& operator=(const psk_key&) = delete;
  psk_key(psk_key&&) = delete;
  psk_key& operator=(psk_key&&) = delete;
  ~psk_key() override { ::OPENSSL_cleanse(key_.data(), key_.size()); }

  //! A key written as hex digits (white space between them is ignored), as
  //! `openssl rand -hex 32` prints one.
  //! @throws rdx::error (errc::invalid_argument) naming what is wrong.
  [[nodiscard]] static std::shared_ptr<psk_key> from_hex(std::string_view text) {
    detail::secret_bytes buf(text.size() / 2 + 1);
    buf.use(detail::decode_hex(text, buf.span(), "hex key"));
    return std::make_shared<psk_key>(buf.used());
  }

  //! A key read from a file of hex digits (from_hex). The file must be a
  //! regular file that neither group nor others can read or write.
  //! @throws rdx::error: errc::invalid_argument naming the file and the
  //!         problem; the errno of a failed open or read.
  [[nodiscard]] static std::shared_ptr<psk_key> from_file(const std::string& path) {
    const detail::file_descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    const int fd = file.fd;
    if (fd < 0) {
      rdx::detail::throw_errno("open", "key file " + path, errno);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      rdx::detail::throw_errno("fstat", "key file " + path, errno);
    }
    if (!S_ISREG(st.st_mode)) {
      detail::fail_key("key file " + path + " is not a regular file");
    }
    if ((st.st_mode & 077) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      detail::fail_key("key file " + path + " has mode " + mode +
                       ": group or others may reach it (chmod 600 it)");
    }
    constexpr std::size_t max_file = 4096;
    if (static_cast<std::uint64_t>(st.st_size) > max_file) {
      detail::fail_key("key file " + path + " has " + std::to_string(st.st_size) + " bytes, at most " +
                       std::to_string(max_file));
    }
    detail::secret_bytes text(max_file);
    std::size_t got = 0;
    while (got < max_file) {
      const ssize_t n = ::read(fd, text.span().data() + got, max_file - got);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0) {
        rdx::detail::throw_errno("read", "key file " + path, errno);
      }
      if (n == 0) {
        break;
      }
      got += static_cast<std::size_t>(n);
    }
    const std::string_view chars(reinterpret_cast<const char*>(text.span().data()), got);
    detail::secret_bytes buf(got / 2 + 1);
    buf.use(detail::decode_hex(chars, buf.span(), "key file " + path));
    return std::make_shared<psk_key>(buf.used());
  }

  //! The key's length in bytes.
  [[nodiscard]] std::size_t size() const noexcept { return key_.size(); }

  //! HMAC-SHA256 with this key over the concatenation of `parts`.
  //! @throws rdx::error (errc::operation_failed) when OpenSSL fails.
  [[nodiscard]] detail::digest mac(std::initializer_list<std::span<const std::byte>> parts) const override {
    const std::unique_ptr<EVP_MAC_CTX, detail::mac_ctx_deleter> ctx(::EVP_MAC_CTX_new(mac_.get()));
    if (!ctx) {
      detail::fail_openssl("EVP_MAC_CTX_new");
    }
    char sha256[] = "SHA256";
    const OSSL_PARAM params[] = {::OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, sha256, 0),
                                 ::OSSL_PARAM_construct_end()};
    if (::EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(key_.data()), key_.size(), params) !=
        1) {
      detail::fail_openssl("EVP_MAC_init(HMAC-SHA256)");
    }
    for (const auto& p : parts) {
      if (::EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(p.data()), p.size()) != 1) {
        detail::fail_openssl("EVP_MAC_update");
      }
    }
    detail::digest out{};
    std::size_t len = 0;
    if (::EVP_MAC_final(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &len, out.size()) != 1 ||
        len != out.size()) {
      detail::fail_openssl("EVP_MAC_final");
    }
    return out;
  }

private:
  friend class psk_authenticator;

  std::vector<std::byte> key_;
  std::unique_ptr<EVP_MAC, detail::mac_deleter> mac_;
  mutable detail::nonce_history history_;
};

//! Authenticates one set-up with a pre-shared key: a challenge and response
//! with fresh nonces from both sides in begin(), then HMAC-SHA256 over the
//! whole transcript in finish(). Both sides run the same code.
class psk_authenticator final : public authenticator {
public:
  //! @throws rdx::error (errc::invalid_argument) for a key shorter than min_key_size.
  explicit psk_authenticator(std::span<const std::byte> key)
      : psk_authenticator(std::make_shared<psk_key>(key)) {}
  //! Shares `key` (and its memory of nonces) with other set-ups.
  explicit psk_authenticator(std::shared_ptr<const psk_key> key) : key_(std::move(key)) {
    if (!key_) {
      throw error(errc::invalid_argument, "psk_authenticator: no key");
    }
  }
  psk_authenticator(const psk_authenticator&) = delete;
  psk_authenticator& operator=(const psk_authenticator&) = delete;
  psk_authenticator(psk_authenticator&&) = delete;
  psk_authenticator& operator=(psk_authenticator&&) = delete;
  ~psk_authenticator() override = default;

  void begin(const tcp::socket& s, std::chrono::steady_clock::time_point deadline) override {
    if (state_ != state::fresh) {
      throw error(errc::not_ready,
                  "psk_authenticator::begin: called twice (one authenticator serves one set-up)");
    }
    state_ = state::failed;
    detail::digest nonce{};
    if (::RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
      detail::fail_openssl("RAND_bytes");
    }
    key_->history_.add(nonce, detail::nonce_history::seen::issued);
    detail::encode_message(detail::message_type::hello, nonce, own_hello_);
    s.send_all(own_hello_, deadline, "authentication: send hello");

    // The first word alone tells an unauthenticated rdx peer (its endpoint
    // message) from a hello, before waiting for bytes such a peer may not send.
    s.recv_exact(std::span(peer_hello_).first(4), deadline, "authentication: receive the peer's hello");
    if (wire::detail::get32(peer_hello_.data()) == wire::magic) {
      fail(s, "no authentication from peer: the peer sent no authentication: it has no pre-shared key");
    }
    s.recv_exact(std::span(peer_hello_).subspan(4), deadline, "authentication: receive the peer's hello");
    const detail::digest peer_nonce = expect(peer_hello_, detail::message_type::hello);
    if (peer_nonce == nonce) {
      fail(s, "replayed or reflected nonce (the peer sent this side's own nonce back)");
    }
    switch (key_->history_.find(peer_nonce)) {
      case detail::nonce_history::seen::issued:
        fail(s,
             "replayed or reflected nonce (the peer's nonce was issued by this key for another set-up: a "
             "reflection, or both ends share one psk_key object)");
      case detail::nonce_history::seen::accepted:
        fail(s,
             "replayed or reflected nonce (this key accepted the peer's nonce in an earlier set-up: a "
             "replay)");
      case detail::nonce_history::seen::no: break;
    }

    send(s, detail::message_type::proof, key_->mac({proof_label(), own_hello_, peer_hello_}), deadline,
         "authentication: send proof");
    const detail::digest proof =
        receive(s, detail::message_type::proof, deadline, "authentication: receive the peer's proof");
    if (!same(proof, key_->mac({proof_label(), peer_hello_, own_hello_}))) {
      fail(s, "wrong key (the peer's proof does not match)");
    }
    key_->history_.add(peer_nonce, detail::nonce_history::seen::accepted);

    sent_.reset(new_sha256());
    received_.reset(new_sha256());
    state_ = state::recording;
  }

  void record(std::span<const std::byte> bytes, bool sent) noexcept override {
    if (state_ != state::recording) {
      return;
    }
    EVP_MD_CTX* ctx = sent ? sent_.get() : received_.get();
    if (::EVP_DigestUpdate(ctx, bytes.data(), bytes.size()) != 1) {
      digest_failed_ = true;
    }
    (sent ? sent_bytes_ : received_bytes_) += bytes.size();
  }

  void finish(const tcp::socket& s, std::chrono::steady_clock::time_point deadline) override {
    if (state_ != state::recording) {
      throw error(errc::not_ready,
                  "psk_authenticator::finish: begin() did not succeed on this authenticator");
    }
    state_ = state::failed;
    if (digest_failed_) {
      detail::fail_openssl("EVP_DigestUpdate");
    }
    const detail::digest sent = final_sha256(sent_);
    const detail::digest received = final_sha256(received_);
    std::array<std::byte, 8> sent_len{};
    std::array<std::byte, 8> received_len{};
    wire::detail::put64(sent_len.data(), sent_bytes_);
    wire::detail::put64(received_len.data(), received_bytes_);
    // Each side MACs its own stream first: the peer's MAC, reflected back,
    // never matches what this side expects.
    send(s, detail::message_type::transcript_mac,
         key_->mac({transcript_label(), own_hello_, peer_hello_, sent, received, sent_len, received_len}),
         deadline, "authentication: send transcript MAC");
    const detail::digest theirs = receive(s, detail::message_type::transcript_mac, deadline,
                                          "authentication: receive the peer's transcript MAC");
    if (!same(theirs, key_->mac({transcript_label(), peer_hello_, own_hello_, received, sent, received_len,
                                 sent_len}))) {
      fail(s, "transcript MAC mismatch (a byte was changed in transit)");
    }
    // Both sides order the two streams alike: the sorting-first side's first.
    const bool lo = detail::sorts_first(own_hello_, peer_hello_);
    keys_.emplace(
        derive_session_keys(key_->key_, own_hello_, peer_hello_, lo ? sent : received, lo ? received : sent));
    send_id_ = detail::key_id(keys_->send);
    receive_id_ = detail::key_id(keys_->receive);
    state_ = state::done;
  }

  //! After a successful finish(): an aes_gcm_seal under session keys
  //! derived from the key, both hellos and the digests of both streams, for
  //! the connection's messages (exchange_and_connect makes it). One per
  //! set-up: a second seal would start its sequence at 0 again and repeat
  //! nonces; the keys are wiped once this and make_window_seal() are made.
  //! @throws rdx::error (errc::not_ready) before finish() has succeeded or
  //!         once a seal was made; errc::operation_failed when OpenSSL fails.
  [[nodiscard]] std::unique_ptr<message_seal> make_seal() override {
    return make_lane(seal_lane::messages, message_seal_made_, "make_seal");
  }
  //! After a successful finish(): the seal of the connection's sealed window
  //! writes and reads (rdx/channel/sealed_window.hpp, sealed_fetch.hpp),
  //! under the same session keys with IVs of its own (seal_lane::windows).
  //! One per set-up, as make_seal().
  //! @throws rdx::error as make_seal().
  [[nodiscard]] std::unique_ptr<aes_gcm_seal> make_window_seal() {
    return make_lane(seal_lane::windows, window_seal_made_, "make_window_seal");
  }
  //! After a successful finish(): names of this side's send and receive
  //! keys (the first 8 bytes of their SHA-256), for logs and tests: one
  //! side's send key is the other's receive key, and every set-up has new
  //! ones. 0 before finish() has succeeded.
  [[nodiscard]] std::uint64_t send_key_id() const noexcept { return send_id_; }
  //! See send_key_id().
  [[nodiscard]] std::uint64_t receive_key_id() const noexcept { return receive_id_; }

private:
  enum class state { fresh, recording, done, failed };
  using message_bytes = std::array<std::byte, detail::message_size>;

  static std::span<const std::byte> proof_label() noexcept {
    return std::as_bytes(std::span("rdx auth v1 proof"));
  }
  static std::span<const std::byte> transcript_label() noexcept {
    return std::as_bytes(std::span("rdx auth v1 transcript"));
  }

  [[noreturn]] static void fail(const tcp::socket& s, const std::string& what) {
    throw error(errc::authentication_failed, "rdx authentication with " + s.peer() + ": " + what);
  }

  static bool same(const detail::digest& a, const detail::digest& b) noexcept {
    return ::CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
  }

  static detail::digest expect(std::span<const std::byte> bytes, detail::message_type t) {
    const detail::message m = detail::parse_message(bytes);
    if (m.type != t) {
      throw error(errc::wire_format, std::string("rdx authentication message: expected a ") +
                                         detail::type_name(t) + ", received a " + detail::type_name(m.type) +
                                         " (the peer is out of step)");
    }
    return m.body;
  }

  static void send(const tcp::socket& s, detail::message_type t, const detail::digest& body,
                   std::chrono::steady_clock::time_point deadline, std::string_view what) {
    message_bytes out{};
    detail::encode_message(t, body, out);
    s.send_all(out, deadline, what);
  }

  static detail::digest receive(const tcp::socket& s, detail::message_type t,
                                std::chrono::steady_clock::time_point deadline, std::string_view what) {
    message_bytes in{};
    s.recv_exact(in, deadline, what);
    return expect(in, t);
  }

  static EVP_MD_CTX* new_sha256() {
    detail::md_ctx ctx(::EVP_MD_CTX_new());
    if (!ctx || ::EVP_DigestInit_ex(ctx.get(), ::EVP_sha256(), nullptr) != 1) {
      detail::fail_openssl("EVP_DigestInit_ex(SHA256)");
    }
    return ctx.release();
  }

  static detail::digest final_sha256(const detail::md_ctx& ctx) {
    detail::digest out{};
    unsigned len = 0;
    if (::EVP_DigestFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &len) != 1 ||
        len != out.size()) {
      detail::fail_openssl("EVP_DigestFinal_ex");
    }
    return out;
  }

  std::shared_ptr<const psk_key> key_;
  state state_ = state::fresh;
  message_bytes own_hello_{};
  message_bytes peer_hello_{};
  detail::md_ctx sent_;
  detail::md_ctx received_;
  std::uint64_t sent_bytes_ = 0;
  std::uint64_t received_bytes_ = 0;
  bool digest_failed_ = false;
  std::optional<session_keys> keys_;
  bool message_seal_made_ = false;
  bool window_seal_made_ = false;

  std::unique_ptr<aes_gcm_seal> make_lane(seal_lane lane, bool& made, const char* what) {
    if (state_ != state::done || !keys_ || made) {
      throw error(errc::not_ready, std::string("psk_authenticator::") + what +
                                       (made ? ": a seal was made already (one per set-up: a second would "
                                               "repeat nonces)"
                                             : ": finish() has not succeeded"));
    }
    auto seal = std::make_unique<aes_gcm_seal>(*keys_, lane);
    made = true;
    if (message_seal_made_ && window_seal_made_) {
      keys_.reset();
    }
    return seal;
  }
  std::uint64_t send_id_ = 0;
  std::uint64_t receive_id_ = 0;
};

}  // namespace rdx::auth
