// rdx_rendezvous_scale: the rendezvous of rdx::group alone, at scale, on the
// host's loopback TCP: N ranks as threads of one process (rank 0 serves from
// its one thread), each handing in B bytes; prints the time until every rank
// holds every rank's bytes, checked. No RDMA device is needed.
#include <rdx/group/rendezvous.hpp>
#if RDX_BENCH_AUTH
#include <rdx/auth/psk.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

namespace {
void usage(const char* argv0, std::FILE* f) {
  std::fprintf(f,
               "Usage: %s [--ranks N] [--bytes B] [--port P] [--timeout S] [--repeat R] [--key]\n"
               "Runs the rendezvous of rdx::group with N ranks as threads of this process on\n"
               "127.0.0.1 (rank 0 serves from one thread), each rank handing in B bytes, and\n"
               "prints the time from the start until every rank holds every rank's bytes (each\n"
               "checked), R times.\n"
               "  --ranks N     ranks (default 1024)\n"
               "  --bytes B     bytes each rank hands in (default 64: a queue pair's endpoint and a grant)\n"
               "  --port P      rank 0's port (default 24200)\n"
               "  --timeout S   the rendezvous's deadline (default 60)\n"
               "  --repeat R    runs (default 3), each on port P + run\n"
               "  --key         every rank holds one pre-shared key (rendezvous_options::key,\n"
               "                an rdx::auth::psk_key): each proves it, and checks the table's MAC\n"
               "Needs 2 x N descriptors: the soft limit is raised to the hard one.\n",
               argv0);
}

std::byte pattern(std::uint32_t rank, std::size_t i) {
  return static_cast<std::byte>(rank * 131 + i * 7);
}
}  // namespace

int main(int argc, char** argv) {
  std::uint32_t ranks = 1024, bytes = 64, repeat = 3;
  unsigned port = 24200, timeout_s = 60;
  std::shared_ptr<const rdx::keyed_mac> key;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> unsigned long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value (see --help)\n", argv[0], a.c_str());
        std::exit(2);
      }
      char* end = nullptr;
      const unsigned long v = std::strtoul(argv[++i], &end, 10);
      if (*end != '\0') {
        std::fprintf(stderr, "%s: %s %s is not a number (see --help)\n", argv[0], a.c_str(), argv[i]);
        std::exit(2);
      }
      return v;
    };
    if (a == "-h" || a == "--help") {
      usage(argv[0], stdout);
      return 0;
    } else if (a == "--key") {
#if RDX_BENCH_AUTH
      key = rdx::auth::psk_key::from_hex(std::string(64, '7'));
#else
      std::fprintf(stderr, "%s: --key: built without rdx::auth (install libssl-dev and reconfigure)\n",
                   argv[0]);
      return 2;
#endif
    } else if (a == "--ranks") {
      ranks = static_cast<std::uint32_t>(next());
    } else if (a == "--bytes") {
      bytes = static_cast<std::uint32_t>(next());
    } else if (a == "--port") {
      port = static_cast<unsigned>(next());
    } else if (a == "--timeout") {
      timeout_s = static_cast<unsigned>(next());
    } else if (a == "--repeat") {
      repeat = static_cast<std::uint32_t>(next());
    } else {
      std::fprintf(stderr, "%s: unknown argument %s (see --help)\n", argv[0], a.c_str());
      return 2;
    }
  }
  if (ranks < 2 || ranks > 65536 || bytes > 65536 || port == 0 || port + repeat > 65535 || repeat == 0) {
    std::fprintf(stderr, "%s: --ranks 2..65536, --bytes up to 65536, --port 1..65535 (see --help)\n",
                 argv[0]);
    return 2;
  }
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 2ull * ranks + 64) {
    std::fprintf(stderr, "%s: %u ranks need %u descriptors, the limit is %llu (ulimit -n)\n", argv[0], ranks,
                 2 * ranks + 64, static_cast<unsigned long long>(rl.rlim_cur));
    return 1;
  }
  int failed_runs = 0;
  for (std::uint32_t run = 0; run < repeat; ++run) {
    const auto p = static_cast<std::uint16_t>(port + run);
    std::atomic<std::uint32_t> bad{0};
    std::string first_error;
    std::atomic<bool> have_error{false};
    const auto t0 = std::chrono::steady_clock::now();
    // The latest moment a rank held the whole table, in ns after t0: the
    // figure (the byte checks after it are not the rendezvous's time).
    std::atomic<std::int64_t> last_held{0};
    std::vector<std::thread> ts;
    ts.reserve(ranks);
    for (std::uint32_t r = 0; r < ranks; ++r) {
      ts.emplace_back([&, r] {
        try {
          std::vector<std::byte> mine(bytes);
          for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = pattern(r, i);
          const auto me = rdx::group::given(r, ranks, 0, 1, "127.0.0.1", p);
          const auto table = rdx::group::rendezvous(
              me, mine, {.timeout = std::chrono::seconds(timeout_s), .max_bytes = 65536, .key = key});
          const std::int64_t held =
              std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
                  .count();
          std::int64_t seen = last_held.load();
          while (held > seen && !last_held.compare_exchange_weak(seen, held)) {}
          for (std::uint32_t k = 0; k < ranks; ++k) {
            if (table[k].size() != bytes) {
              ++bad;
              return;
            }
            for (std::size_t i = 0; i < bytes; ++i) {
              if (table[k][i] != pattern(k, i)) {
                ++bad;
                return;
              }
            }
          }
        } catch (const std::exception& e) {
          ++bad;
          if (!have_error.exchange(true)) first_error = e.what();
        }
      });
    }
    for (auto& t : ts) t.join();
    const double s = static_cast<double>(last_held.load()) / 1e9;
    std::printf(
        "rendezvous of %u ranks, %u bytes each%s, on 127.0.0.1:%u: %.3f s until every rank held every "
        "rank's bytes; %u ranks failed%s%s\n",
        ranks, bytes, key ? ", with a key" : "", static_cast<unsigned>(p), s, bad.load(),
        bad.load() != 0 ? ": " : "", bad.load() != 0 ? first_error.c_str() : "");
    std::fflush(stdout);
    if (bad.load() != 0) ++failed_runs;
  }
  return failed_runs == 0 ? 0 : 1;
}
