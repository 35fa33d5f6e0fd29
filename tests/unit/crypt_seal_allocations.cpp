// Sealing and opening allocate nothing (rdx/auth/aes_gcm.hpp): OpenSSL's
// allocator is replaced (CRYPTO_set_mem_functions, which must come before
// OpenSSL's first allocation, hence a program of its own rather than a Catch
// case), and its calls are counted while seals and opens of every size run,
// a failed open included. Exits 1 naming what allocated.
#include <rdx/auth/aes_gcm.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <system_error>
#include <vector>

#include <openssl/crypto.h>

namespace {

std::atomic<bool> counting{false};
std::atomic<std::uint64_t> calls{0};

void* counted_malloc(std::size_t n, const char* /*file*/, int /*line*/) {
  if (counting.load(std::memory_order_relaxed)) {
    calls.fetch_add(1, std::memory_order_relaxed);
  }
  return std::malloc(n);  // NOLINT(cppcoreguidelines-no-malloc): OpenSSL's allocator is malloc's shape
}
void* counted_realloc(void* p, std::size_t n, const char* /*file*/, int /*line*/) {
  if (counting.load(std::memory_order_relaxed)) {
    calls.fetch_add(1, std::memory_order_relaxed);
  }
  return std::realloc(p, n);  // NOLINT(cppcoreguidelines-no-malloc)
}
void counted_free(void* p, const char* /*file*/, int /*line*/) {
  std::free(p);  // NOLINT(cppcoreguidelines-no-malloc)
}

// OpenSSL's allocations (malloc and realloc) while `f` runs.
template <typename F>
std::uint64_t allocations(F&& f) {
  calls = 0;
  counting = true;
  f();
  counting = false;
  return calls.load();
}

rdx::auth::session_keys keys(bool first) {
  std::array<std::byte, 32> secret{};
  std::array<std::byte, 40> h1{};
  std::array<std::byte, 40> h2{};
  h2[39] = std::byte{1};
  const std::array<std::byte, 32> d{};
  return first ? rdx::auth::derive_session_keys(secret, h1, h2, d, d)
               : rdx::auth::derive_session_keys(secret, h2, h1, d, d);
}

}  // namespace

int main() {
  if (::CRYPTO_set_mem_functions(counted_malloc, counted_realloc, counted_free) != 1) {
    std::puts("crypt_seal_allocations: CRYPTO_set_mem_functions refused (OpenSSL allocated already)");
    return 1;
  }
  rdx::auth::aes_gcm_seal tx(keys(true));
  rdx::auth::aes_gcm_seal rx(keys(false));
  const std::size_t sizes[] = {0, 1, 64, 4096, std::size_t{1} << 20};
  std::vector<std::byte> plain(sizes[4]);
  std::vector<std::byte> sealed(sizes[4] + rdx::sealed_message_overhead);
  std::vector<std::byte> out(sizes[4]);
  int failures = 0;
  // One round first: anything OpenSSL sets up lazily on first use is not per message.
  std::uint64_t first = allocations([&] {
    (void)tx.seal(std::span(plain).first(64), sealed.data());
    (void)rx.open(std::span(sealed).first(64 + rdx::sealed_message_overhead), out.data());
  });
  std::printf("first seal and open: %llu allocations\n", static_cast<unsigned long long>(first));
  for (const std::size_t n : sizes) {
    bool ok = true;
    const std::uint64_t a = allocations([&] {
      for (int i = 0; i < 100; ++i) {
        ok = ok && !tx.seal(std::span(plain).first(n), sealed.data());
        ok = ok && !rx.open(std::span(sealed).first(n + rdx::sealed_message_overhead), out.data());
        ok = ok && !tx.seal(std::span(plain).first(n), sealed.data());
        ok = ok && !rx.open(std::span(sealed).first(n + rdx::sealed_message_overhead), nullptr);
      }
    });
    std::printf("%zu-byte payload, 200 seals and opens: %llu allocations%s\n", n,
                static_cast<unsigned long long>(a), ok ? "" : " (a seal or open FAILED)");
    failures += (a != 0 || !ok) ? 1 : 0;
  }
  std::error_code ec;
  const std::uint64_t a = allocations([&] {
    (void)tx.seal(std::span(plain).first(64), sealed.data());
    sealed[20] ^= std::byte{1};
    ec = rx.open(std::span(sealed).first(64 + rdx::sealed_message_overhead), out.data());
  });
  std::printf("a failed open (tag): %llu allocations, \"%s\"\n", static_cast<unsigned long long>(a),
              rx.failure());
  failures += (a != 0 || ec != rdx::errc::integrity_failed) ? 1 : 0;
  std::puts(failures == 0 ? "crypt_seal_allocations: none" : "crypt_seal_allocations: FAILED");
  return failures == 0 ? 0 : 1;
}
