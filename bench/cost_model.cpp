// rdx_cost_model: user-space instructions per operation, rdx against plain
// verbs on the same device, counted by valgrind's callgrind (bench/cost_model.sh
// runs it and prints the table). Timings on a shared or emulated host move by
// tens of percent between runs; an instruction count does not, so a ratio of
// counts can be held under a threshold in CI (ctest -R cost_model).
//
// Each operation runs `--iterations` times after a warm-up, in a loop where
// callgrind collects only the operation's own calls: posting, and taking its
// completion once it is in the completion queue. The wait between the two (a
// short sleep, for the kernel to run the loopback transfer) is not counted,
// so spinning never enters a count. A completion that was not there after
// the sleep would add empty polls: such a pass is counted as late, thrown
// away and run again with a longer sleep. Each pass ends with a callgrind
// dump named "<api>/<operation>/<iterations>"; cost_model.sh divides.
//
// Without valgrind the program runs the same passes, checks every result and
// prints what it did (a functional check of the twins).
#include <rdx/channel/channel.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/post.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/work_request.hpp>

#include <infiniband/verbs.h>

#if RDX_COST_UCX
#include "ucx_twin.hpp"
#endif

#if RDX_COST_SEALED
#include <rdx/auth/aes_gcm.hpp>

#include <openssl/evp.h>
#endif

#include <arpa/inet.h>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define RDX_COST_HAVE_CALLGRIND 1
#else
#define CALLGRIND_TOGGLE_COLLECT
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(name) ((void)(name))
#define RUNNING_ON_VALGRIND 0
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what);
}

// Keeps the compiler from dropping a result it cannot see used.
template <class T>
void keep(T& v) noexcept {
  asm volatile("" : : "r"(&v) : "memory");
}

// The operations measured, in the order they run (--only names them).
constexpr const char* operations[] = {"build",         "post",
                                      "post_extended", "poll",
                                      "window_write",  "window_read",
                                      "fetch_add",     "compare_swap",
                                      "channel_64",    "channel_64_handler",
                                      "channel_4k",    "channel_4k_zero_copy"};

// Then those on encrypted connections (connection_attr::encrypt): only in a
// build with OpenSSL (rdx::auth, RDX_COST_SEALED), and not with --peers
// (their pair has connections of its own, on no worker).
constexpr const char* sealed_operations[] = {"channel_64_sealed", "channel_4k_sealed"};
#if RDX_COST_SEALED
constexpr bool built_sealed = true;
#else
constexpr bool built_sealed = false;
#endif

bool is_sealed(const std::string& op) {
  return std::find(std::begin(sealed_operations), std::end(sealed_operations), op) !=
         std::end(sealed_operations);
}

// --help's words on them, in a build that has them.
#if RDX_COST_SEALED
constexpr const char* sealed_help =
    ",\n"
    "                   channel_64_sealed, channel_4k_sealed (connection_attr::encrypt;\n"
    "                   the raw twin seals and opens with OpenSSL's AES-256-GCM; not\n"
    "                   with --peers)";
#else
constexpr const char* sealed_help = "";
#endif

struct options {
  unsigned iterations = 256;
  unsigned warmup = 32;
  unsigned peers = 0;  // 0: rdx's connections own their queues; N: on two workers with N - 1 other pairs
  bool pool = false;   // the workers' connections on a receive pool (with --peers)
  bool ucx = false;    // the UCX twins of window_write and channel_64 too
  std::vector<std::string> only;
};

[[noreturn]] void usage(int rc) {
  std::FILE* f = rc == 0 ? stdout : stderr;
  std::fprintf(
      f,
      "usage: rdx_cost_model [--iterations N] [--warmup N] [--peers N [--pool]] [--only OP[,OP...]]\n"
      "User-space instructions per operation, rdx against plain verbs, on the\n"
      "first RDMA device (loopback: both ends in this process). Run it under\n"
      "callgrind through bench/cost_model.sh, which prints the table; alone it\n"
      "runs the same operations and checks their results.\n"
      "  --iterations N   measured operations per pass (default 256)\n"
      "  --warmup N       unmeasured operations before each pass (default 32)\n"
      "  --ucx            also UCX's twins of window_write (ucp_put_nbx and its flush)\n"
      "                   and channel_64 (ucp_am_send_nbx and its handler); with\n"
      "                   --peers N, UCX's two workers hold N - 1 other endpoint\n"
      "                   pairs too, wired up and idle\n"
      "  --peers N        rdx's connections on two workers (rdx::worker), each with\n"
      "                   N - 1 other connections attached, idle; the operations are\n"
      "                   named OP@N (default: connections of their own, no worker)\n"
      "  --pool           with --peers: each worker has a receive pool and every\n"
      "                   connection's receives and send staging are on it (OP@Npool)\n"
      "  --only OPS       these operations only: build, post, post_extended, poll,\n"
      "                   window_write, window_read, fetch_add, compare_swap,\n"
      "                   channel_64, channel_64_handler, channel_4k, channel_4k_zero_copy%s\n"
      "  -h, --help       this text\n",
      sealed_help);
  std::exit(rc);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "rdx_cost_model: %s needs a value\n", a.c_str());
        usage(2);
      }
      return argv[++i];
    };
    auto number = [&](const std::string& v) -> unsigned {
      char* end = nullptr;
      const unsigned long n = std::strtoul(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n == 0 || n > 1000000) {
        std::fprintf(stderr, "rdx_cost_model: %s %s: expected a number from 1 to 1000000\n", a.c_str(),
                     v.c_str());
        usage(2);
      }
      return static_cast<unsigned>(n);
    };
    if (a == "-h" || a == "--help") usage(0);
    if (a == "--iterations") {
      o.iterations = number(val());
    } else if (a == "--warmup") {
      o.warmup = number(val());
    } else if (a == "--peers") {
      o.peers = number(val());
    } else if (a == "--pool") {
      o.pool = true;
    } else if (a == "--ucx") {
#if RDX_COST_UCX
      o.ucx = true;
#else
      std::fprintf(
          stderr,
          "rdx_cost_model: --ucx: built without UCX (apt-get install libucx-dev, then reconfigure)\n");
      std::exit(2);
#endif
    } else if (a == "--only") {
      const std::string v = val();
      std::size_t at = 0;
      while (at <= v.size()) {
        const std::size_t comma = std::min(v.find(',', at), v.size());
        const std::string name = v.substr(at, comma - at);
        if (!built_sealed && is_sealed(name)) {
          std::fprintf(stderr,
                       "rdx_cost_model: --only %s: built without OpenSSL, so no \"%s\" (apt-get install "
                       "libssl-dev, then reconfigure)\n",
                       v.c_str(), name.c_str());
          std::exit(2);
        }
        if (std::find(std::begin(operations), std::end(operations), name) == std::end(operations) &&
            !is_sealed(name)) {
          std::fprintf(stderr, "rdx_cost_model: --only %s: no operation \"%s\" (see --help)\n", v.c_str(),
                       name.c_str());
          usage(2);
        }
        o.only.push_back(name);
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "rdx_cost_model: unknown option %s\n", a.c_str());
      usage(2);
    }
  }
  if (o.pool && o.peers == 0) {
    std::fprintf(stderr, "rdx_cost_model: --pool needs --peers N (the pool is a worker's)\n");
    usage(2);
  }
  if (o.peers != 0) {
    for (const auto& name : o.only) {
      if (is_sealed(name)) {
        std::fprintf(stderr,
                     "rdx_cost_model: --only %s: not with --peers (the encrypted pair is on no worker)\n",
                     name.c_str());
        usage(2);
      }
    }
  }
  return o;
}

constexpr std::size_t region = 64 * 1024;
// The largest message: 4096 bytes of payload, sealed (a sequence number
// before it, a tag after it) on the encrypted pair.
constexpr std::uint32_t largest_message = 4096 + rdx::sealed_message_overhead;
constexpr rdx::rights win_rights = rdx::rights::read | rdx::rights::write;
constexpr rdx::rights atomic_rights = rdx::rights::read | rdx::rights::write | rdx::rights::atomic;

// The plain-verbs twin: two RC queue pairs on one device, connected to each
// other, each with a send and a receive completion queue and a registered
// buffer that the other may write, read and run atomics on. The twin posts
// by ibv_post_send (post_api::classic); a second pair, created with the
// extended post API, serves post_extended.
struct raw_end {
  raw_end(const rdx::protection_domain& pd, rdx::post_api api = rdx::post_api::classic)
      : mem(region),
        mr(pd, mem.data(), mem.size(),
           rdx::access::local_write | rdx::access::remote_write | rdx::access::remote_read |
               rdx::access::remote_atomic),
        scq(pd.device_context(), 64),
        rcq(pd.device_context(), 64),
        qp(pd, scq, rcq,
           rdx::queue_pair_attr{.max_send_wr = 64,
                                .max_recv_wr = 64,
                                .remote_access = rdx::access::remote_write | rdx::access::remote_read |
                                                 rdx::access::remote_atomic,
                                .post = api}) {}
  std::vector<std::byte> mem;
  rdx::memory_region mr;
  rdx::completion_queue scq, rcq;
  rdx::queue_pair qp;
};

// Both twins, set up once.
struct fixture {
  fixture(unsigned peers, bool pool)
      : ctx(rdx::context::open_default()),
        pd(ctx),
        a(pd),
        b(pd),
        xa(pd, rdx::post_api::extended),
        xb(pd, rdx::post_api::extended),
        wa(peers != 0 ? std::optional<rdx::worker>(std::in_place, pd, worker_attr(peers, pool))
                      : std::nullopt),
        wb(peers != 0 ? std::optional<rdx::worker>(std::in_place, pd, worker_attr(peers, pool))
                      : std::nullopt),
        pca(wa ? std::make_unique<rdx::connection>(*wa, pd, attr())
               : std::make_unique<rdx::connection>(pd, attr())),
        pcb(wb ? std::make_unique<rdx::connection>(*wb, pd, attr())
               : std::make_unique<rdx::connection>(pd, attr())),
        ca(*pca),
        cb(*pcb),
        win(rdx::make_window_buffer<std::byte, win_rights>(pd, region)),
        words(rdx::make_window_buffer<std::uint64_t, atomic_rights>(pd, 8)),
        local(pd, region, rdx::access::local_write),
        g(cb, win),
        gw(cb, words) {
    a.qp.connect(b.qp.local_endpoint());
    b.qp.connect(a.qp.local_endpoint());
    xa.qp.connect(xb.qp.local_endpoint());
    xb.qp.connect(xa.qp.local_endpoint());
    rdx::connect_pair(ca, cb);
    // The other peers: connected, idle, each with its receives posted.
    for (unsigned i = 1; i < peers; ++i) {
      others.push_back(std::make_unique<rdx::connection>(*wa, pd, idle_attr()));
      others.push_back(std::make_unique<rdx::connection>(*wb, pd, idle_attr()));
      rdx::connect_pair(*others[others.size() - 2], *others.back());
    }
    w.emplace(ca, g.descriptor());
    ww.emplace(ca, gw.descriptor());
    cha.emplace(ca);
    chb.emplace(cb);
  }
  // Timers off: a keepalive probe or the stall watchdog's clock would add
  // work that depends on time, not on the operation.
  static rdx::connection_attr attr() {
    return rdx::connection_attr{
        .recv_depth = 64, .message_size = 4096, .keepalive = 0ms, .stall_timeout = 0ms};
  }

  // With a pool: room for the measured connection's ring (recv_depth 64),
  // each idle peer's (4), and the pool's reserve for joining peers (a
  // quarter); buffers of the measured pair's message size.
  static rdx::worker_attr worker_attr(unsigned peers, bool pool) {
    rdx::worker_attr w;
    if (pool) w.pool = {.buffers = 2 * 64 + 8 * peers, .buffer_size = 4096};
    return w;
  }

  // An idle peer: small rings, timers off as for the measured pair.
  static rdx::connection_attr idle_attr() {
    return rdx::connection_attr{.send_depth = 8,
                                .signal_interval = 4,
                                .recv_depth = 4,
                                .message_size = 64,
                                .keepalive = 0ms,
                                .stall_timeout = 0ms};
  }

  rdx::context ctx;
  rdx::protection_domain pd;
  raw_end a, b;    // ibv_post_send
  raw_end xa, xb;  // the extended post API
  std::optional<rdx::worker> wa, wb;
  std::unique_ptr<rdx::connection> pca, pcb;
  rdx::connection& ca;
  rdx::connection& cb;
  std::vector<std::unique_ptr<rdx::connection>> others;
  rdx::registered_buffer<std::byte> win;
  rdx::registered_buffer<std::uint64_t> words;
  rdx::registered_buffer<std::byte> local;
  rdx::grant<std::byte, win_rights> g;
  rdx::grant<std::uint64_t, atomic_rights> gw;
  std::optional<rdx::remote_window<std::byte, win_rights>> w;
  std::optional<rdx::remote_window<std::uint64_t, atomic_rights>> ww;
  std::optional<rdx::channel<std::byte>> cha, chb;
};

// Turns callgrind's collection on or off around the counted calls of a
// measured pass (m); the toggle itself costs the same few instructions in
// every pass, rdx or raw.
[[gnu::always_inline]] inline void collect(bool m) noexcept {
  if (m) CALLGRIND_TOGGLE_COLLECT;
}

// One pass: `step(measure)` runs one operation; it returns false when its
// completion was not there yet (late), and a pass with a late one is rerun.
class runner {
public:
  explicit runner(const options& o)
      : o_(o), suffix_(o.peers != 0 ? "@" + std::to_string(o.peers) + (o.pool ? "pool" : "") : "") {}

  bool wanted(const std::string& op) const {
    if (o_.peers != 0 && is_sealed(op)) return false;
    if (o_.only.empty()) return true;
    for (const auto& s : o_.only)
      if (s == op) return true;
    return false;
  }

  // step(bool) -> bool: one operation, its counted parts between collect()
  // calls when the argument is true.
  void pass(const std::string& api, const std::string& op, const std::function<bool(bool)>& step) {
    for (unsigned i = 0; i < o_.warmup; ++i) (void)step(false);
    for (int attempt = 0;; ++attempt) {
      CALLGRIND_ZERO_STATS;
      unsigned late = 0;
      for (unsigned i = 0; i < o_.iterations; ++i) late += step(true) ? 0 : 1;
      if (late == 0) {
        const std::string name = api + "/" + op + suffix_ + "/" + std::to_string(o_.iterations);
        CALLGRIND_DUMP_STATS_AT(name.c_str());
        std::printf("cost_model: %-4s %-14s %u operations%s\n", api.c_str(), op.c_str(), o_.iterations,
                    attempt ? " (after a longer sleep)" : "");
        std::fflush(stdout);
        return;
      }
      if (attempt == 3)
        fail(api + "/" + op + ": " + std::to_string(late) + " of " + std::to_string(o_.iterations) +
             " completions were not in the queue after a sleep of " + std::to_string(sleep_.count()) +
             " us (is the device this busy?)");
      sleep_ *= 4;
    }
  }

  // The unmeasured wait for the kernel's loopback transfer.
  void settle() const { std::this_thread::sleep_for(sleep_); }

private:
  const options& o_;
  std::string suffix_;  // "@N" with --peers N
  std::chrono::microseconds sleep_{500};
};

// Plain verbs: one signaled request (add_or_compare is a send's immediate).
int raw_post(raw_end& e, ibv_wr_opcode opcode, const ibv_sge& sge, std::uint64_t raddr, std::uint32_t rkey,
             std::uint64_t add_or_compare = 0, std::uint64_t swap = 0) noexcept {
  ibv_sge s = sge;
  ibv_send_wr w{};
  w.wr_id = 1;
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = opcode;
  w.send_flags = IBV_SEND_SIGNALED;
  if (opcode == IBV_WR_SEND_WITH_IMM) {
    w.imm_data = htonl(static_cast<std::uint32_t>(add_or_compare));
    if (sge.length <= e.qp.max_inline_data()) w.send_flags |= IBV_SEND_INLINE;
  } else if (opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
    w.wr.atomic.remote_addr = raddr;
    w.wr.atomic.rkey = rkey;
    w.wr.atomic.compare_add = add_or_compare;
    w.wr.atomic.swap = swap;
  } else {
    if (opcode != IBV_WR_RDMA_READ && sge.length <= e.qp.max_inline_data()) w.send_flags |= IBV_SEND_INLINE;
    w.wr.rdma.remote_addr = raddr;
    w.wr.rdma.rkey = rkey;
  }
  ibv_send_wr* bad = nullptr;
  return ::ibv_post_send(e.qp.native_handle(), &w, &bad);
}

// One poll of cq; false when it found nothing (late).
bool raw_take(ibv_cq* cq) {
  ibv_wc wc{};
  const int n = ::ibv_poll_cq(cq, 1, &wc);
  if (n < 0) fail("ibv_poll_cq failed");
  if (n == 1 && wc.status != IBV_WC_SUCCESS)
    fail(std::string("raw completion: ") + ::ibv_wc_status_str(wc.status));
  return n == 1;
}

void drain(ibv_cq* cq) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!raw_take(cq))
    if (std::chrono::steady_clock::now() > deadline) fail("a completion did not come within 5 s");
}

void check(std::error_code ec, const char* what) {
  if (ec) fail(std::string(what) + ": " + ec.message());
}

#if RDX_COST_SEALED
// One side's session keys of a set-up with secret seed s, from fixed test
// bytes (as tests/rdma/channel_crypt.cpp makes them): both sides agree.
rdx::auth::session_keys keys_for(unsigned char s, bool first) {
  std::array<std::byte, 32> secret{};
  for (std::size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<std::byte>(s + i);
  std::array<std::byte, 40> h1{}, h2{};
  for (std::size_t i = 0; i < h1.size(); ++i) {
    h1[i] = static_cast<std::byte>(7 + i);
    h2[i] = static_cast<std::byte>(14 + i);
  }
  std::array<std::byte, 32> d1{}, d2{};
  d1.fill(std::byte{0x11});
  d2.fill(std::byte{0x22});
  return first ? rdx::auth::derive_session_keys(secret, h1, h2, d1, d2)
               : rdx::auth::derive_session_keys(secret, h2, h1, d1, d2);
}

// The raw twin's cryptography, by hand with OpenSSL's EVP: AES-256-GCM
// contexts keyed once; a message sets its IV (u32 direction, u64 sequence,
// big-endian), runs its sequence number through as additional data, then
// its payload, and ends with the tag. The layout is rdx's: sequence,
// ciphertext, 16-byte tag.
class raw_gcm {
public:
  raw_gcm(const rdx::auth::session_keys& sender, const rdx::auth::session_keys& receiver)
      : enc_(keyed(sender.send.data(), true)),
        dec_(keyed(receiver.receive.data(), false)),
        send_direction_(sender.send_direction),
        receive_direction_(receiver.receive_direction) {}
  raw_gcm(const raw_gcm&) = delete;
  raw_gcm& operator=(const raw_gcm&) = delete;
  ~raw_gcm() {
    ::EVP_CIPHER_CTX_free(enc_);
    ::EVP_CIPHER_CTX_free(dec_);
  }

  // Seals n bytes of `plain` into out[0, n + 24); false when a call failed.
  bool seal(const unsigned char* plain, int n, unsigned char* out) noexcept {
    const std::uint64_t sequence = sent_++;
    unsigned char iv[12];
    put32(iv, send_direction_);
    put64(iv + 4, sequence);
    put64(out, sequence);
    unsigned char last[16];
    int len = 0;
    return ::EVP_EncryptInit_ex(enc_, nullptr, nullptr, nullptr, iv) == 1 &&
           ::EVP_EncryptUpdate(enc_, nullptr, &len, out, 8) == 1 &&
           ::EVP_EncryptUpdate(enc_, out + 8, &len, plain, n) == 1 &&
           ::EVP_EncryptFinal_ex(enc_, last, &len) == 1 &&
           ::EVP_CIPHER_CTX_ctrl(enc_, EVP_CTRL_GCM_GET_TAG, 16, out + 8 + n) == 1;
  }

  // Opens the sealed message `in` (an n-byte payload) in place and copies
  // the payload to dst; false when a call failed or the tag did not match.
  // The IV carries the sequence number expected next, so a message with
  // another fails its tag.
  bool open(unsigned char* in, int n, unsigned char* dst) noexcept {
    unsigned char iv[12];
    put32(iv, receive_direction_);
    put64(iv + 4, opened_);
    unsigned char last[16];
    int len = 0;
    if (::EVP_DecryptInit_ex(dec_, nullptr, nullptr, nullptr, iv) != 1 ||
        ::EVP_DecryptUpdate(dec_, nullptr, &len, in, 8) != 1 ||
        ::EVP_DecryptUpdate(dec_, in + 8, &len, in + 8, n) != 1 ||
        ::EVP_CIPHER_CTX_ctrl(dec_, EVP_CTRL_GCM_SET_TAG, 16, in + 8 + n) != 1 ||
        ::EVP_DecryptFinal_ex(dec_, last, &len) != 1)
      return false;
    ++opened_;
    std::memcpy(dst, in + 8, static_cast<std::size_t>(n));
    return true;
  }

private:
  static EVP_CIPHER_CTX* keyed(const std::byte* key, bool encrypt) {
    EVP_CIPHER_CTX* c = ::EVP_CIPHER_CTX_new();
    if (c == nullptr) fail("EVP_CIPHER_CTX_new failed");
    const auto init = encrypt ? ::EVP_EncryptInit_ex : ::EVP_DecryptInit_ex;
    if (init(c, ::EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
        ::EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, 12, nullptr) != 1 ||
        init(c, nullptr, nullptr, reinterpret_cast<const unsigned char*>(key), nullptr) != 1) {
      ::EVP_CIPHER_CTX_free(c);
      fail("AES-256-GCM context: OpenSSL failed");
    }
    return c;
  }
  static void put32(unsigned char* p, std::uint32_t v) noexcept {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (24 - 8 * i));
  }
  static void put64(unsigned char* p, std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (56 - 8 * i));
  }

  EVP_CIPHER_CTX* enc_;
  EVP_CIPHER_CTX* dec_;
  std::uint32_t send_direction_;
  std::uint32_t receive_direction_;
  std::uint64_t sent_ = 0;
  std::uint64_t opened_ = 0;
};

// Both twins of the sealed rows, set up only when one is measured. rdx: two
// connections of their own with connection_attr::encrypt, each sealed by
// rdx::auth::aes_gcm_seal under session keys from fixed test bytes (seed 5),
// and a channel on each. Raw: raw_gcm under keys of another seed (6), so no
// IV is used twice under one key; its messages go over the raw pair.
struct sealed_twin {
  explicit sealed_twin(const rdx::protection_domain& pd)
      : ca(pd, attr()), cb(pd, attr()), raw(keys_for(6, true), keys_for(6, false)) {
    ca.seal_with(std::make_unique<rdx::auth::aes_gcm_seal>(keys_for(5, true)));
    cb.seal_with(std::make_unique<rdx::auth::aes_gcm_seal>(keys_for(5, false)));
    rdx::connect_pair(ca, cb);
    cha.emplace(ca);
    chb.emplace(cb);
  }
  // As fixture::attr(), sealed: message_size carries a 4096-byte payload.
  static rdx::connection_attr attr() {
    return rdx::connection_attr{.recv_depth = 64,
                                .message_size = largest_message,
                                .keepalive = 0ms,
                                .stall_timeout = 0ms,
                                .encrypt = true};
  }

  rdx::connection ca, cb;
  std::optional<rdx::channel<std::byte>> cha, chb;
  raw_gcm raw;
};
#endif

void run(const options& o) {
  fixture f(o.peers, o.pool);
  runner r(o);
  raw_end& a = f.a;
  raw_end& b = f.b;
  const ibv_sge sge64 = a.mr.sge(0, 64);
  const ibv_sge sge8 = a.mr.sge(0, 8);
  const rdx::remote_ptr peer = rdx::at(b.mr.remote());
  const rdx::local_span<std::byte> local(f.local);

  // Building a work request (nothing posted): an RDMA write of one SGE, into
  // an array (raw) or a send_batch's storage (rdx, emplace).
  if (r.wanted("build")) {
    static ibv_send_wr raw[16];
    static rdx::send_batch<16> built;
    unsigned at = 0;
    r.pass("raw", "build", [&](bool m) {
      collect(m);
      ibv_send_wr& w = raw[at++ % 16];
      w = ibv_send_wr{};
      w.wr_id = at;
      w.sg_list = const_cast<ibv_sge*>(&sge64);
      w.num_sge = 1;
      w.opcode = IBV_WR_RDMA_WRITE;
      w.send_flags = IBV_SEND_SIGNALED;
      w.wr.rdma.remote_addr = peer.addr;
      w.wr.rdma.rkey = peer.rkey;
      keep(w);
      collect(m);
      return true;
    });
    r.pass("rdx", "build", [&](bool m) {
      if (built.full()) built.clear();
      ++at;
      collect(m);
      (void)built.emplace([&]() noexcept {
        rdx::send_wr w = rdx::wr::write(sge64, peer);
        w.id(at);
        return w;
      });
      keep(built);
      collect(m);
      return true;
    });
  }

  // Posting one signaled 64-byte RDMA write (its completion taken uncounted).
  if (r.wanted("post")) {
    r.pass("raw", "post", [&](bool m) {
      collect(m);
      const int rc = raw_post(a, IBV_WR_RDMA_WRITE, sge64, peer.addr, peer.rkey);
      collect(m);
      if (rc != 0) fail("ibv_post_send failed");
      drain(a.scq.native_handle());
      return true;
    });
    r.pass("rdx", "post", [&](bool m) {
      collect(m);
      const std::error_code ec = a.qp.post_send(rdx::wr::write(sge64, peer));
      collect(m);
      check(ec, "queue_pair::post_send");
      drain(a.scq.native_handle());
      return true;
    });
  }

  // The same write by the extended post API: by hand (raw), and through
  // queue_pair::post_send of a flat_wr (the request by value, no
  // ibv_send_wr) on a queue pair created with it (rdx).
  if (r.wanted("post_extended")) {
    ibv_qp_ex* qx = ::ibv_qp_to_qp_ex(f.xa.qp.native_handle());
    const ibv_sge xsge = f.xa.mr.sge(0, 64);
    const rdx::remote_ptr xpeer = rdx::at(f.xb.mr.remote());
    if (qx == nullptr || !f.xa.qp.extended_post()) fail("post_extended: no extended post API on this device");
    r.pass("raw", "post_extended", [&](bool m) {
      collect(m);
      ::ibv_wr_start(qx);
      qx->wr_id = 1;
      qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
      ::ibv_wr_rdma_write(qx, xpeer.rkey, xpeer.addr);
      ::ibv_wr_set_inline_data(qx, reinterpret_cast<void*>(static_cast<std::uintptr_t>(xsge.addr)),
                               xsge.length);
      const int rc = ::ibv_wr_complete(qx);
      collect(m);
      if (rc != 0) fail("ibv_wr_complete failed");
      drain(f.xa.scq.native_handle());
      return true;
    });
    r.pass("rdx", "post_extended", [&](bool m) {
      collect(m);
      rdx::flat_wr w{.sge = xsge, .remote_addr = xpeer.addr, .rkey = xpeer.rkey};
      const std::error_code ec = f.xa.qp.post_send(w);
      collect(m);
      check(ec, "queue_pair::post_send");
      drain(f.xa.scq.native_handle());
      return true;
    });
  }

  // Plain verbs: one signaled request posted (counted when count_post) and,
  // after the sleep, its completion taken (counted).
  auto raw_request = [&](bool m, bool count_post, ibv_wr_opcode opcode, const ibv_sge& sge,
                         std::uint64_t raddr, std::uint32_t rkey) {
    collect(m && count_post);
    const int rc = raw_post(a, opcode, sge, raddr, rkey, 1, 2);
    collect(m && count_post);
    if (rc != 0) fail("ibv_post_send failed");
    r.settle();
    collect(m);
    const bool got = raw_take(a.scq.native_handle());
    collect(m);
    if (!got) drain(a.scq.native_handle());
    return got;
  };

  // Taking one completion that is in the queue.
  if (r.wanted("poll")) {
    r.pass("raw", "poll",
           [&](bool m) { return raw_request(m, false, IBV_WR_RDMA_WRITE, sge64, peer.addr, peer.rkey); });
    r.pass("rdx", "poll", [&](bool m) {
      if (raw_post(a, IBV_WR_RDMA_WRITE, sge64, peer.addr, peer.rkey) != 0) fail("ibv_post_send failed");
      r.settle();
      collect(m);
      rdx::completion wc[1];
      std::size_t n = 0;
      const bool one = !a.scq.poll(std::span<rdx::completion>(wc), n) && n == 1;
      const bool got = one && wc[0].ok();
      collect(m);
      if (one && !got) fail(std::string("rdx completion: ") + ::ibv_wc_status_str(wc[0].status()));
      if (!got) drain(a.scq.native_handle());
      return got;
    });
  }

  // A one-sided operation and its completion: plain verbs post a signaled
  // request and poll for it; rdx starts the window operation, tests it once
  // it has completed (test() covers first, as wait() does) and destroys it.
  auto one_sided = [&](const char* op, ibv_wr_opcode opcode, const ibv_sge& sge, std::uint64_t raddr,
                       std::uint32_t rkey, auto start) {
    if (!r.wanted(op)) return;
    r.pass("raw", op, [&](bool m) { return raw_request(m, true, opcode, sge, raddr, rkey); });
    r.pass("rdx", op, [&](bool m) {
      bool got = false;
      collect(m);
      {
        rdx::operation x = start();
        collect(m);
        r.settle();
        collect(m);
        got = x.test();
        if (!got) {
          collect(m);
          check(x.wait(5s), op);
          collect(m);
        }
        check(x.error(), op);
      }
      collect(m);
      return got;
    });
  };
  one_sided("window_write", IBV_WR_RDMA_WRITE, sge64, peer.addr, peer.rkey,
            [&] { return f.w->write(rdx::local_span<const std::byte>(local).subspan(0, 64), 0); });
  one_sided("window_read", IBV_WR_RDMA_READ, sge64, peer.addr, peer.rkey,
            [&] { return f.w->read(local.subspan(0, 64), 0); });
  one_sided("fetch_add", IBV_WR_ATOMIC_FETCH_AND_ADD, sge8, peer.addr, peer.rkey,
            [&] { return f.ww->fetch_add(0, 1); });
  one_sided("compare_swap", IBV_WR_ATOMIC_CMP_AND_SWP, sge8, peer.addr, peer.rkey,
            [&] { return f.ww->compare_swap(0, 1, 2); });

  // A message and its receipt. Plain verbs: a signaled send with immediate
  // data from registered memory, the receiver's completion and the repost of
  // its receive, the sender's completion. rdx: channel send (copied to
  // staging), the receive into the caller's buffer, the send's completion,
  // both operations destroyed; with zero_copy, send_registered (straight
  // from registered memory) and receive_view (read in the ring, the buffer
  // given back when the view is destroyed).
  bool receives_posted = false;
  // The plain-verbs pass of a message of size bytes, named op.
  auto raw_message = [&](const char* op, std::uint32_t size) {
    const ibv_sge src = a.mr.sge(0, size);
    // Receives of the largest size, so that one pass's leftovers fit the next.
    const ibv_sge rsge = b.mr.sge(0, largest_message);
    if (!receives_posted) {
      for (int i = 0; i < 16; ++i) check(b.qp.post_recv(rdx::wr::recv(rsge)), "post_recv (setup)");
      receives_posted = true;
    }
    r.pass("raw", op, [&](bool m) {
      collect(m);
      const int rc = raw_post(a, IBV_WR_SEND_WITH_IMM, src, 0, 0, 7);
      collect(m);
      if (rc != 0) fail("ibv_post_send failed");
      r.settle();
      bool received = false, sent = false;
      collect(m);
      received = raw_take(b.rcq.native_handle());
      if (received) {
        ibv_sge s = rsge;
        ibv_recv_wr w{};
        w.sg_list = &s;
        w.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        if (::ibv_post_recv(b.qp.native_handle(), &w, &bad) != 0) fail("ibv_post_recv failed");
        sent = raw_take(a.scq.native_handle());
      }
      collect(m);
      // Late: finish uncounted, and the pass runs again.
      if (!received) {
        drain(b.rcq.native_handle());
        check(b.qp.post_recv(rdx::wr::recv(rsge)), "post_recv");
      }
      if (!sent) drain(a.scq.native_handle());
      return received && sent;
    });
  };
  auto message = [&](const char* op, std::uint32_t size, bool zero_copy) {
    if (!r.wanted(op)) return;
    raw_message(op, size);
    const std::span<std::byte> dst(f.local.data(), size);
    const std::span<const std::byte> msg(f.local.data() + region / 2, size);
    const rdx::local_span<const std::byte> reg =
        rdx::local_span<const std::byte>(f.local).subspan(region / 2, size);
    // The receive: into the caller's buffer (copied out of the ring), or
    // with zero_copy a view of the ring buffer, given back when destroyed.
    auto exchange = [&](bool m, auto receive) {
      rdx::operation tx = zero_copy ? f.cha->send_registered(reg) : f.cha->send(msg);
      collect(m);
      r.settle();
      collect(m);
      auto rx = receive();
      const bool received = rx.test();
      const bool sent = tx.test();
      const bool got = received && sent;
      if (!got) {
        collect(m);
        check(rx.wait(5s), "channel receive");
        check(tx.wait(5s), "channel send");
        collect(m);
      }
      check(rx.error(), "channel receive");
      check(tx.error(), "channel send");
      if (rx.byte_count() != size) fail("channel receive: " + std::to_string(rx.byte_count()) + " bytes");
      return got;
    };
    r.pass("rdx", op, [&](bool m) {
      bool got = false;
      collect(m);
      got = zero_copy ? exchange(m, [&] { return f.chb->receive_view(); })
                      : exchange(m, [&] { return f.chb->receive(dst); });
      collect(m);
      return got;
    });
  };
  message("channel_64", 64, false);
  // A message done at posting and its handler (no operation on either side).
  // Plain verbs: channel_64's pass. rdx: channel post (inline), the
  // receiver's progress, whose handler copies the 64 bytes out of the ring,
  // and the sender's progress, which retires the send.
  if (r.wanted("channel_64_handler")) {
    raw_message("channel_64_handler", 64);
    const std::span<const std::byte> msg(f.local.data() + region / 2, 64);
    for (std::size_t i = 0; i < msg.size(); ++i) f.local.data()[region / 2 + i] = std::byte(i * 7 + 1);
    // The handler copies the message out as UCX's twin's does (bench/ucx_twin.hpp).
    static std::array<std::byte, 4096> got{};
    std::uint64_t arrivals = 0;
    std::size_t got_bytes = 0;
    check(f.chb->on_message([&](std::span<const std::byte> m) {
      if (m.size() <= got.size()) std::memcpy(got.data(), m.data(), m.size());
      got_bytes = m.size();
      ++arrivals;
    }),
          "channel on_message");
    r.pass("rdx", "channel_64_handler", [&](bool m) {
      const std::uint64_t before = arrivals;
      collect(m);
      const std::error_code ec = f.cha->post(msg);
      collect(m);
      check(ec, "channel post");
      r.settle();
      collect(m);
      (void)f.cb.progress();
      const bool arrived = arrivals != before;
      (void)f.ca.progress();
      collect(m);
      // Late: finish uncounted, and the pass runs again.
      for (int k = 0; arrivals == before; ++k) {
        (void)f.cb.progress();
        if (k > 10'000'000) fail("channel post: the handler never ran");
      }
      if (got_bytes != 64 || !std::equal(msg.begin(), msg.end(), got.begin()))
        fail("channel handler: " + std::to_string(got_bytes) + " bytes, or not those sent");
      return arrived;
    });
    f.chb->remove_handler();
  }
#if RDX_COST_UCX
  // UCX's twins, on the same device (bench/ucx_twin.hpp): only what the
  // initiator calls is counted for the put, as for rdx's window write; a
  // message counts the send, the receiver's progress that runs its handler
  // and the sender's progress that completes the send.
  if (o.ucx) {
    ucx_twin::pair u(o.peers);
    if (r.wanted("window_write")) {
      r.pass("ucx", "window_write", [&](bool m) {
        collect(m);
        ucs_status_ptr_t q = u.put();
        collect(m);
        r.settle();
        collect(m);
        bool got = false;
        for (int k = 0; k < 4 && !got; ++k) {
          (void)ucp_worker_progress(u.wa);
          got = ucx_twin::pair::done(q);
        }
        if (got) ucx_twin::pair::release(q);
        collect(m);
        if (!got) u.wait(q, true);
        return got;
      });
    }
    if (r.wanted("channel_64")) {
      r.pass("ucx", "channel_64", [&](bool m) {
        const std::uint64_t before = u.arrivals;
        collect(m);
        ucs_status_ptr_t q = u.send(64);
        collect(m);
        r.settle();
        collect(m);
        (void)ucp_worker_progress(u.wb);
        const bool arrived = u.arrivals != before;
        (void)ucp_worker_progress(u.wa);
        const bool sent = ucx_twin::pair::done(q);
        if (sent) ucx_twin::pair::release(q);
        collect(m);
        if (!arrived || !sent) {
          while (u.arrivals == before) u.progress_both();
          if (!sent) u.wait(q, true);
        }
        if (u.received_bytes != 64) fail("UCX message: " + std::to_string(u.received_bytes) + " bytes");
        return arrived && sent;
      });
    }
  }
#endif
  message("channel_4k", 4096, false);
  message("channel_4k_zero_copy", 4096, true);
#if RDX_COST_SEALED
  // A sealed message and its receipt (connection_attr::encrypt). Plain
  // verbs: AES-256-GCM sealing of the payload into the registered send
  // buffer (raw_gcm, by hand with EVP), the signaled send with immediate data
  // of the sealed bytes, the receiver's completion, the decryption in place
  // with its tag check and the copy of the payload into the destination, the
  // repost of the receive, the sender's completion. rdx: channel send (copied
  // to staging, sealed there when posted), the receive into the caller's
  // buffer (opened in the ring, then copied out), the send's completion, both
  // operations destroyed. Every pass checks the payload that arrived
  // (uncounted).
  std::optional<sealed_twin> sealed;
  auto sealed_message = [&](const char* op, std::uint32_t size) {
    if (!r.wanted(op)) return;
    if (!sealed) sealed.emplace(f.pd);
    sealed_twin& s = *sealed;
    const ibv_sge src = a.mr.sge(0, size + rdx::sealed_message_overhead);
    const ibv_sge rsge = b.mr.sge(0, largest_message);
    if (!receives_posted) {
      for (int i = 0; i < 16; ++i) check(b.qp.post_recv(rdx::wr::recv(rsge)), "post_recv (setup)");
      receives_posted = true;
    }
    const std::span<std::byte> dst(f.local.data(), size);
    const std::span<std::byte> payload(f.local.data() + region / 2, size);
    for (std::size_t i = 0; i < size; ++i) payload[i] = static_cast<std::byte>(i * 7 + 1);
    const std::span<const std::byte> msg(payload);
    auto arrived = [&](const char* api) {
      if (std::memcmp(dst.data(), msg.data(), size) != 0)
        fail(std::string(api) + "/" + op + ": the payload that arrived differs from the one sent");
    };
    auto* const sealed_out = reinterpret_cast<unsigned char*>(a.mem.data());
    auto* const sealed_in = reinterpret_cast<unsigned char*>(b.mem.data());
    const auto* const plain = reinterpret_cast<const unsigned char*>(msg.data());
    auto* const to = reinterpret_cast<unsigned char*>(dst.data());
    const int n = static_cast<int>(size);
    r.pass("raw", op, [&](bool m) {
      std::memset(dst.data(), 0, size);
      collect(m);
      const bool sealed_ok = s.raw.seal(plain, n, sealed_out);
      const int rc = sealed_ok ? raw_post(a, IBV_WR_SEND_WITH_IMM, src, 0, 0, 7) : -1;
      collect(m);
      if (!sealed_ok) fail("raw AES-256-GCM seal failed");
      if (rc != 0) fail("ibv_post_send failed");
      r.settle();
      bool received = false, opened = false, sent = false;
      collect(m);
      received = raw_take(b.rcq.native_handle());
      if (received) {
        opened = s.raw.open(sealed_in, n, to);
        ibv_sge sg = rsge;
        ibv_recv_wr w{};
        w.sg_list = &sg;
        w.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        if (::ibv_post_recv(b.qp.native_handle(), &w, &bad) != 0) fail("ibv_post_recv failed");
        sent = raw_take(a.scq.native_handle());
      }
      collect(m);
      // Late: finish uncounted, and the pass runs again.
      if (!received) {
        drain(b.rcq.native_handle());
        opened = s.raw.open(sealed_in, n, to);
        check(b.qp.post_recv(rdx::wr::recv(rsge)), "post_recv");
      }
      if (!opened) fail("raw AES-256-GCM open failed (the tag did not match)");
      if (!sent) drain(a.scq.native_handle());
      arrived("raw");
      return received && sent;
    });
    r.pass("rdx", op, [&](bool m) {
      std::memset(dst.data(), 0, size);
      bool got = false;
      collect(m);
      {
        rdx::operation tx = s.cha->send(msg);
        collect(m);
        r.settle();
        collect(m);
        auto rx = s.chb->receive(dst);
        const bool received = rx.test();
        const bool sent = tx.test();
        got = received && sent;
        if (!got) {
          collect(m);
          check(rx.wait(5s), "channel receive");
          check(tx.wait(5s), "channel send");
          collect(m);
        }
        check(rx.error(), "channel receive");
        check(tx.error(), "channel send");
        if (rx.byte_count() != size) fail("channel receive: " + std::to_string(rx.byte_count()) + " bytes");
      }
      collect(m);
      arrived("rdx");
      return got;
    });
  };
  sealed_message("channel_64_sealed", 64);
  sealed_message("channel_4k_sealed", 4096);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  try {
    std::printf("rdx_cost_model: %u operations per pass after %u unmeasured%s\n", o.iterations, o.warmup,
                RUNNING_ON_VALGRIND ? ", under valgrind" : " (not under callgrind: no counts)");
    run(o);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdx_cost_model: %s\n", e.what());
    return 1;
  }
}
