// rdx: what aes_gcm.hpp builds on: OpenSSL owners for HKDF and ciphers,
// HKDF-SHA256, a key's public name (a hash of it), the sides' order, and
// the AES-256-GCM contexts keyed once per direction.
#pragma once

#include <rdx/auth/detail/support.hpp>
#include <rdx/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

namespace rdx::auth::detail {

inline constexpr std::size_t gcm_key_size = 32;
inline constexpr std::size_t gcm_iv_size = 12;
inline constexpr std::size_t gcm_tag_size = 16;

struct kdf_deleter {
  void operator()(EVP_KDF* k) const noexcept { ::EVP_KDF_free(k); }
};
struct kdf_ctx_deleter {
  void operator()(EVP_KDF_CTX* c) const noexcept { ::EVP_KDF_CTX_free(c); }
};
// EVP_CIPHER_CTX_free wipes the key schedule it holds.
struct cipher_ctx_deleter {
  void operator()(EVP_CIPHER_CTX* c) const noexcept { ::EVP_CIPHER_CTX_free(c); }
};
using cipher_ctx = std::unique_ptr<EVP_CIPHER_CTX, cipher_ctx_deleter>;

[[noreturn]] inline void fail_crypt(const char* call) {
  fail_openssl(call, errc::operation_failed, "rdx message sealing");
}

//! Whether `own` sorts before `peer` bytewise (a shorter prefix first).
//! @throws rdx::error (errc::invalid_argument) when they are equal.
inline bool sorts_first(std::span<const std::byte> own, std::span<const std::byte> peer) {
  const int c = std::memcmp(own.data(), peer.data(), std::min(own.size(), peer.size()));
  if (c == 0 && own.size() == peer.size()) {
    throw error(
        errc::invalid_argument,
        "rdx session keys: both hellos are the same (the two sides of a set-up never send equal ones)");
  }
  return c < 0 || (c == 0 && own.size() < peer.size());
}

//! HKDF-SHA256 (extract, then expand) of `secret` into `out`.
inline void hkdf_sha256(std::span<const std::byte> secret, std::span<const std::byte> salt,
                        std::span<const std::byte> info, std::span<std::byte> out) {
  const std::unique_ptr<EVP_KDF, kdf_deleter> kdf(::EVP_KDF_fetch(nullptr, "HKDF", nullptr));
  if (!kdf) {
    fail_crypt("EVP_KDF_fetch(HKDF)");
  }
  const std::unique_ptr<EVP_KDF_CTX, kdf_ctx_deleter> ctx(::EVP_KDF_CTX_new(kdf.get()));
  if (!ctx) {
    fail_crypt("EVP_KDF_CTX_new(HKDF)");
  }
  char sha256[] = "SHA256";
  // OpenSSL's parameters are not const-qualified; it only reads these.
  const auto octets = [](const char* name, std::span<const std::byte> b) {
    return ::OSSL_PARAM_construct_octet_string(name, const_cast<std::byte*>(b.data()), b.size());
  };
  const OSSL_PARAM params[] = {::OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, sha256, 0),
                               octets(OSSL_KDF_PARAM_KEY, secret), octets(OSSL_KDF_PARAM_SALT, salt),
                               octets(OSSL_KDF_PARAM_INFO, info), ::OSSL_PARAM_construct_end()};
  if (::EVP_KDF_derive(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), out.size(), params) != 1) {
    ::OPENSSL_cleanse(out.data(), out.size());
    fail_crypt("EVP_KDF_derive(HKDF-SHA256)");
  }
}

//! A key's public name: the first 8 bytes of its SHA-256, big-endian.
inline std::uint64_t key_id(std::span<const std::byte> key) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned len = 0;
  if (::EVP_Digest(key.data(), key.size(), md.data(), &len, ::EVP_sha256(), nullptr) != 1 || len < 8) {
    fail_crypt("EVP_Digest(SHA256)");
  }
  std::uint64_t id = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    id = (id << 8) | md[i];
  }
  ::OPENSSL_cleanse(md.data(), md.size());
  return id;
}

//! An AES-256-GCM context keyed with `key` and a 12-byte IV length; each
//! message then sets only its IV, which allocates nothing.
inline cipher_ctx gcm_context(std::span<const std::byte, gcm_key_size> key, bool encrypt) {
  cipher_ctx ctx(::EVP_CIPHER_CTX_new());
  if (!ctx) {
    fail_crypt("EVP_CIPHER_CTX_new");
  }
  const auto init = encrypt ? ::EVP_EncryptInit_ex : ::EVP_DecryptInit_ex;
  if (init(ctx.get(), ::EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1) {
    fail_crypt("EVP_CipherInit_ex(AES-256-GCM)");
  }
  if (::EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(gcm_iv_size), nullptr) != 1) {
    fail_crypt("EVP_CIPHER_CTX_ctrl(EVP_CTRL_GCM_SET_IVLEN)");
  }
  if (init(ctx.get(), nullptr, nullptr, reinterpret_cast<const unsigned char*>(key.data()), nullptr) != 1) {
    fail_crypt("EVP_CipherInit_ex(key)");
  }
  return ctx;
}

//! The IV of one message: u32 direction, u64 sequence, both big-endian.
inline void gcm_iv(unsigned char* iv, std::uint32_t direction, std::uint64_t sequence) noexcept {
  for (std::size_t i = 0; i < 4; ++i) {
    iv[i] = static_cast<unsigned char>(direction >> (24 - 8 * i));
  }
  for (std::size_t i = 0; i < 8; ++i) {
    iv[4 + i] = static_cast<unsigned char>(sequence >> (56 - 8 * i));
  }
}

//! Runs `n` bytes through a GCM context begun for one message, in pieces
//! that fit EVP's int lengths; `out` may equal `in`.
inline bool gcm_update(EVP_CIPHER_CTX* ctx, bool encrypt, const std::byte* in, std::byte* out,
                       std::size_t n) noexcept {
  constexpr std::size_t piece = std::size_t{1} << 30;
  const auto update = encrypt ? ::EVP_EncryptUpdate : ::EVP_DecryptUpdate;
  for (std::size_t done = 0; done < n;) {
    const std::size_t step = std::min(piece, n - done);
    int len = 0;
    if (update(ctx, reinterpret_cast<unsigned char*>(out + done), &len,
               reinterpret_cast<const unsigned char*>(in + done), static_cast<int>(step)) != 1 ||
        static_cast<std::size_t>(len) != step) {
      return false;
    }
    done += step;
  }
  return true;
}

}  // namespace rdx::auth::detail
