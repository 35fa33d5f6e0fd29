// rdx: what psk.hpp builds on: OpenSSL error reporting and owners, a buffer
// that wipes itself, hex decoding of keys, and a key's memory of nonces.
#pragma once

#include <rdx/auth/detail/message.hpp>
#include <rdx/detail/hex.hpp>
#include <rdx/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <unistd.h>

namespace rdx::auth::detail {

using digest = std::array<std::byte, 32>;

[[noreturn]] inline void fail_openssl(const char* call, errc code = errc::authentication_failed,
                                      std::string_view who = "rdx authentication") {
  const auto e = ::ERR_get_error();
  std::string w = std::string(who) + ": OpenSSL " + call + " failed";
  if (e != 0) {
    char buf[256];
    ::ERR_error_string_n(e, buf, sizeof buf);
    w += std::string(": ") + buf;
  }
  ::ERR_clear_error();
  throw error(code, w);
}

[[noreturn]] inline void fail_key(const std::string& what) {
  throw error(errc::invalid_argument, "rdx pre-shared key: " + what);
}

struct mac_deleter {
  void operator()(EVP_MAC* m) const noexcept { ::EVP_MAC_free(m); }
};
struct mac_ctx_deleter {
  void operator()(EVP_MAC_CTX* c) const noexcept { ::EVP_MAC_CTX_free(c); }
};
struct md_ctx_deleter {
  void operator()(EVP_MD_CTX* c) const noexcept { ::EVP_MD_CTX_free(c); }
};
using md_ctx = std::unique_ptr<EVP_MD_CTX, md_ctx_deleter>;

//! A byte buffer that is wiped when it dies, for key material in transit.
class secret_bytes {
public:
  explicit secret_bytes(std::size_t n) : bytes_(n) {}
  secret_bytes(const secret_bytes&) = delete;
  secret_bytes& operator=(const secret_bytes&) = delete;
  secret_bytes(secret_bytes&&) = delete;
  secret_bytes& operator=(secret_bytes&&) = delete;
  ~secret_bytes() { ::OPENSSL_cleanse(bytes_.data(), bytes_.size()); }
  [[nodiscard]] std::span<std::byte> span() noexcept { return bytes_; }
  //! Only the first `n` bytes hold the secret.
  void use(std::size_t n) noexcept { size_ = std::min(n, bytes_.size()); }
  [[nodiscard]] std::span<const std::byte> used() const noexcept {
    return std::span(bytes_).first(size_ == npos ? bytes_.size() : size_);
  }

private:
  static constexpr std::size_t npos = ~std::size_t{0};
  std::vector<std::byte> bytes_;
  std::size_t size_ = npos;
};

//! Closes a descriptor when it dies.
struct file_descriptor {
  int fd = -1;
  explicit file_descriptor(int f) noexcept : fd(f) {}
  file_descriptor(const file_descriptor&) = delete;
  file_descriptor& operator=(const file_descriptor&) = delete;
  file_descriptor(file_descriptor&&) = delete;
  file_descriptor& operator=(file_descriptor&&) = delete;
  ~file_descriptor() {
    if (fd >= 0) {
      ::close(fd);
    }
  }
};

inline bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

//! Decodes hex digits into `out`, skipping white space; returns the bytes written.
inline std::size_t decode_hex(std::string_view text, std::span<std::byte> out, const std::string& source) {
  std::size_t n = 0;
  int high = -1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (is_space(text[i])) {
      continue;
    }
    const int v = rdx::detail::hex_value(text[i]);
    // The character itself is not shown: it is part of a secret.
    if (v < 0) {
      fail_key(source + ": character " + std::to_string(i + 1) + " is not a hex digit");
    }
    if (high < 0) {
      high = v;
      continue;
    }
    out[n++] = static_cast<std::byte>((high << 4) | v);
    high = -1;
  }
  if (high >= 0) {
    fail_key(source + ": an odd number of hex digits");
  }
  return n;
}

//! Nonces a key has issued, and peers' nonces it has accepted, most recent
//! first out; thread-safe.
class nonce_history {
public:
  enum class seen { no, issued, accepted };

  void add(const digest& n, seen kind) {
    const std::lock_guard<std::mutex> lock(m_);
    ring& r = kind == seen::issued ? issued_ : accepted_;
    r.slots[r.next] = n;
    r.next = (r.next + 1) % r.slots.size();
    r.count = std::min(r.count + 1, r.slots.size());
  }

  [[nodiscard]] seen find(const digest& n) const {
    const std::lock_guard<std::mutex> lock(m_);
    if (issued_.holds(n)) {
      return seen::issued;
    }
    if (accepted_.holds(n)) {
      return seen::accepted;
    }
    return seen::no;
  }

private:
  struct ring {
    std::array<digest, 256> slots{};
    std::size_t next = 0;
    std::size_t count = 0;
    [[nodiscard]] bool holds(const digest& n) const noexcept {
      return std::any_of(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(count),
                         [&](const digest& s) { return s == n; });
    }
  };
  mutable std::mutex m_;
  ring issued_;
  ring accepted_;
};

}  // namespace rdx::auth::detail
