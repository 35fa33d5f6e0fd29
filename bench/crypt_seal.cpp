// Sealing and opening messages (rdx/auth/aes_gcm.hpp) against OpenSSL's own
// AES-256-GCM on one core, per payload size: what connection_attr::encrypt
// costs on the CPU. scripts/crypt-speed.sh puts these beside `openssl speed`.
//
//   seal/<bytes>       aes_gcm_seal::seal into another buffer
//   open/<bytes>       aes_gcm_seal::open in place (what a connection does)
//   open_copy/<bytes>  aes_gcm_seal::open into the caller's buffer
//   evp_seal/<bytes>   the twin: the same EVP calls written out, no rdx
#include <rdx/auth/aes_gcm.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <openssl/evp.h>

namespace {

constexpr std::size_t sizes[] = {64, 1024, 4096, 16384, 65536, std::size_t{1} << 20};

rdx::auth::session_keys keys(bool first) {
  std::array<std::byte, 32> secret{};
  secret.fill(std::byte{7});
  std::array<std::byte, 40> h1{};
  std::array<std::byte, 40> h2{};
  h2.back() = std::byte{1};
  const std::array<std::byte, 32> d{};
  return first ? rdx::auth::derive_session_keys(secret, h1, h2, d, d)
               : rdx::auth::derive_session_keys(secret, h2, h1, d, d);
}

void check(std::error_code ec, benchmark::State& state, const char* what) {
  if (ec) {
    state.SkipWithError((std::string(what) + ": " + ec.message()).c_str());
  }
}

void seal(benchmark::State& state, std::size_t n) {
  rdx::auth::aes_gcm_seal tx(keys(true));
  std::vector<std::byte> plain(n, std::byte{0x42});
  std::vector<std::byte> out(n + rdx::sealed_message_overhead);
  for (auto _ : state) {
    const std::error_code ec = tx.seal(plain, out.data());
    benchmark::DoNotOptimize(out.data());
    if (ec) {
      check(ec, state, "seal");
      break;
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
}

// Opens a batch sealed beforehand (outside the timing); in order, as the
// receiver must. `copy` opens into another buffer rather than in place.
void open_batch(benchmark::State& state, std::size_t n, bool copy) {
  const std::size_t stride = n + rdx::sealed_message_overhead;
  const std::size_t batch = std::clamp<std::size_t>((std::size_t{64} << 20) / stride, 1, 4096);
  rdx::auth::aes_gcm_seal tx(keys(true));
  rdx::auth::aes_gcm_seal rx(keys(false));
  std::vector<std::byte> plain(n, std::byte{0x42});
  std::vector<std::byte> ring(batch * stride);
  std::vector<std::byte> out(n);
  std::size_t next = batch;
  for (auto _ : state) {
    if (next == batch) {
      state.PauseTiming();
      for (std::size_t i = 0; i < batch; ++i) {
        check(tx.seal(plain, ring.data() + i * stride), state, "seal");
      }
      next = 0;
      state.ResumeTiming();
    }
    const std::error_code ec =
        rx.open(std::span(ring).subspan(next * stride, stride), copy ? out.data() : nullptr);
    ++next;
    benchmark::DoNotOptimize(ring.data());
    if (ec) {
      check(ec, state, rx.failure());
      break;
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
}

// The twin: one context keyed once, then per message exactly the EVP calls
// a seal makes, with no rdx code around them.
void evp_seal(benchmark::State& state, std::size_t n) {
  const rdx::auth::session_keys k = keys(true);
  const std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)> ctx(EVP_CIPHER_CTX_new(),
                                                                            &EVP_CIPHER_CTX_free);
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr,
                                 reinterpret_cast<const unsigned char*>(k.send.data()), nullptr) != 1) {
    state.SkipWithError("EVP_EncryptInit_ex");
    return;
  }
  std::vector<unsigned char> plain(n, 0x42);
  std::vector<unsigned char> out(n + rdx::sealed_message_overhead);
  std::array<unsigned char, 12> iv{};
  std::uint64_t sequence = 0;
  for (auto _ : state) {
    for (std::size_t i = 0; i < 8; ++i) {
      iv[4 + i] = static_cast<unsigned char>(sequence >> (56 - 8 * i));
      out[i] = iv[4 + i];
    }
    ++sequence;
    int len = 0;
    const bool ok =
        EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, nullptr, iv.data()) == 1 &&
        EVP_EncryptUpdate(ctx.get(), nullptr, &len, out.data(), 8) == 1 &&
        EVP_EncryptUpdate(ctx.get(), out.data() + 8, &len, plain.data(), static_cast<int>(n)) == 1 &&
        EVP_EncryptFinal_ex(ctx.get(), out.data() + 8 + n, &len) == 1 &&
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, 16, out.data() + 8 + n) == 1;
    benchmark::DoNotOptimize(out.data());
    if (!ok) {
      state.SkipWithError("EVP AES-256-GCM");
      break;
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
}

}  // namespace

int main(int argc, char** argv) {
  for (const std::size_t n : sizes) {
    const std::string size = "/" + std::to_string(n);
    benchmark::RegisterBenchmark(("seal" + size).c_str(), seal, n);
    benchmark::RegisterBenchmark(("open" + size).c_str(), open_batch, n, false);
    benchmark::RegisterBenchmark(("open_copy" + size).c_str(), open_batch, n, true);
    benchmark::RegisterBenchmark(("evp_seal" + size).c_str(), evp_seal, n);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 2;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
