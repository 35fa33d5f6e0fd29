// rdx alltoall: every rank of a job writes a distinct block into every other
// rank's window (the dispatch of a mixture-of-experts layer), then checks
// every byte it received. Start it with a launcher; it reads its rank from
// torchrun's, Open MPI's or Slurm's variables (rdx::group::from_environment)
// and meets the others at MASTER_ADDR:MASTER_PORT, or, built with rdx::pmix
// and started by a PMIx server with no MASTER_ADDR, takes both from the
// server (rdx::group::pmix_session):
//
//   torchrun --nproc-per-node 4 --no-python alltoall -s 64K
//   MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 mpirun -np 8 -x MASTER_ADDR -x MASTER_PORT alltoall
//   mpirun -np 8 alltoall    (or srun --mpi=pmix -n 8 alltoall: PMIx)
//   alltoall --rank 0 --world 2 --master 10.0.0.1:29500    (and --rank 1 elsewhere)
#include <rdx/group/environment.hpp>
#include <rdx/group/mesh.hpp>
#include <rdx/rdx.hpp>
#if RDX_EXAMPLES_PMIX
#include <rdx/group/pmix.hpp>
#endif
#if RDX_EXAMPLES_AUTH
#include <rdx/auth/psk.hpp>
#endif
#if RDX_EXAMPLES_CUDA
#include <rdx/cuda/topology.hpp>

#include "gpu_memory.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "blocks.hpp"
#include "cli.hpp"

namespace {

using steady = std::chrono::steady_clock;

// How the ranks learn their place and meet (--bootstrap).
enum class bootstrap { automatic, pmix, tcp };

#if RDX_EXAMPLES_PMIX
constexpr bool built_with_pmix = true;
#else
constexpr bool built_with_pmix = false;
#endif
#if RDX_EXAMPLES_AUTH
constexpr bool built_with_auth = true;
#else
constexpr bool built_with_auth = false;
#endif
#if RDX_EXAMPLES_CUDA
constexpr bool built_with_cuda = true;
#else
constexpr bool built_with_cuda = false;
#endif

struct options {
  std::string device;
  std::size_t block = 64 * 1024;  // bytes each rank writes to each other rank
  std::uint32_t iters = 20;
  std::uint32_t warmup = 2;
  std::chrono::seconds timeout{60};
  std::optional<std::uint32_t> rank, world;
  std::string master;  // host:port
  std::optional<std::chrono::milliseconds> ack_timeout;
  bool events = false;     // sleep on the worker's descriptor instead of polling
  bool on_demand = false;  // each pair connected on its first write
  bootstrap boot = bootstrap::automatic;
  bool quiet = false;
  std::string psk_file;  // the job's key: rendezvous and connections admit only its holders
  bool cuda = false;     // blocks and window in GPU memory (--memory cuda)
  std::optional<int> gpu;
  std::string path = "auto";  // how GPU memory meets the NIC: auto, direct or staged
};

void usage(const char* argv0) {
  std::printf(
      "Usage: %s [options]\n"
      "\n"
      "Every rank writes a block of -s bytes into every other rank's window, all\n"
      "ranks meet at a barrier, and each checks every byte it received (a pattern\n"
      "of the iteration, the writer and the reader). The ranks are connected in\n"
      "a full mesh on one rdx::worker each (rdx::group::mesh).\n"
      "\n"
      "Where the rank comes from (the first that is set):\n"
      "  torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT\n"
      "  Open MPI   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (pass\n"
      "             MASTER_ADDR and MASTER_PORT with mpirun -x)\n"
      "  Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (and MASTER_ADDR/PORT)\n"
      "  flags      --rank R --world N --master HOST:PORT\n"
      "  PMIx       the PMIx server of mpirun or srun --mpi=pmix gives the rank and\n"
      "             carries the ranks' addresses (see --bootstrap; this build: %s)\n"
      "\n"
      "Options:\n"
      "  -d, --ib-dev DEV        RDMA device (default: RDX_DEVICE, else the first ACTIVE one)\n"
      "  -s, --size BYTES        block per peer (default 64K; K, M suffixes)\n"
      "  -n, --iters N           timed iterations (default 20)\n"
      "  -w, --warmup N          untimed iterations first (default 2)\n"
      "  -t, --timeout SEC       set-up and every barrier (default 60)\n"
      "      --rank R            this rank (with --world and --master)\n"
      "      --world N           ranks in the job\n"
      "      --master HOST:PORT  where rank 0 serves the rendezvous\n"
      "      --bootstrap MODE    how the ranks meet: auto (default) takes PMIx when a\n"
      "                          PMIx server launched the ranks and neither --rank nor\n"
      "                          MASTER_ADDR is given, else rdx's TCP rendezvous; pmix\n"
      "                          requires the PMIx server (and a build with rdx::pmix);\n"
      "                          tcp always takes rdx's rendezvous (MASTER_ADDR and\n"
      "                          MASTER_PORT, or --master)\n"
      "      --ack-timeout MS    how long the NIC waits for an ACK before it resends\n"
      "                          (rounded up to what verbs can express; a loaded\n"
      "                          Soft-RoCE host needs hundreds of ms)\n"
      "  -e, --events            sleep on the worker's descriptor while waiting, instead\n"
      "                          of polling (ranks that outnumber the cores need it:\n"
      "                          polling ranks starve the kernel's Soft-RoCE work)\n"
      "      --psk-file FILE     the job's pre-shared key (hex, as `openssl rand -hex 32`\n"
      "                          writes it; mode 600): the rendezvous admits only ranks\n"
      "                          that hold it and each connection's preamble carries its\n"
      "                          MAC; every rank needs the same file (this build: %s)\n"
      "      --on-demand         connect each pair on its first write instead of all at\n"
      "                          set-up (the first all-to-all then connects them)\n"
      "      --memory host|cuda  where the blocks and the window live (default host);\n"
      "                          cuda: on a GPU (this build: %s)\n"
      "      --gpu N             the CUDA device (default: the local rank modulo the\n"
      "                          GPUs); the RDMA device is -d, else RDX_DEVICE, else\n"
      "                          the one nearest to the GPU\n"
      "      --path auto|direct|staged  how GPU memory meets the NIC, as gpu_pingpong:\n"
      "                          direct registers it (dma-buf, else peermem); staged\n"
      "                          copies through pinned host memory (before the writes\n"
      "                          and after the barrier, both timed); auto (default)\n"
      "                          takes direct where it registers and needs no RDMA read\n"
      "                          to flush the NIC's writes, else staged\n"
      "  -q, --quiet             only the summary lines\n"
      "  -h, --help              this text\n"
      "\n"
      "Each rank prints one line: its set-up steps and, over the timed iterations,\n"
      "the median and worst time of one all-to-all (writes posted until the\n"
      "barrier after them) and the bandwidth it sent, per peer and in all. Exit\n"
      "status 0 only when every byte on every rank was right.\n",
      argv0, built_with_pmix ? "with PMIx" : "without PMIx: libpmix-dev was not found",
      built_with_auth ? "with rdx::auth" : "without rdx::auth: libssl-dev was not found",
      built_with_cuda ? "with rdx::cuda" : "without rdx::cuda: the CUDA Toolkit was not found");
}

options parse(int argc, char** argv) {
  options o;
  app::arg_reader a(argc, argv);
  std::string v;
  while (!a.done()) {
    if (a.match({"-h", "--help"})) {
      usage(argv[0]);
      std::exit(0);
    } else if (a.match({"-d", "--ib-dev"}, &v)) {
      o.device = v;
    } else if (a.match({"-s", "--size"}, &v)) {
      o.block = app::parse_number("--size", v, 8, 1ull << 30, true);
    } else if (a.match({"-n", "--iters"}, &v)) {
      o.iters = static_cast<std::uint32_t>(app::parse_number("--iters", v, 1, 1000000));
    } else if (a.match({"-w", "--warmup"}, &v)) {
      o.warmup = static_cast<std::uint32_t>(app::parse_number("--warmup", v, 0, 1000000));
    } else if (a.match({"-t", "--timeout"}, &v)) {
      o.timeout = std::chrono::seconds(app::parse_number("--timeout", v, 1, 86400));
    } else if (a.match({"--rank"}, &v)) {
      o.rank = static_cast<std::uint32_t>(app::parse_number("--rank", v, 0, 1u << 24));
    } else if (a.match({"--world"}, &v)) {
      o.world = static_cast<std::uint32_t>(app::parse_number("--world", v, 1, 1u << 24));
    } else if (a.match({"--master"}, &v)) {
      o.master = v;
    } else if (a.match({"--ack-timeout"}, &v)) {
      o.ack_timeout = std::chrono::milliseconds(app::parse_number("--ack-timeout", v, 1, 3600000));
    } else if (a.match({"--bootstrap"}, &v)) {
      if (v == "auto") {
        o.boot = bootstrap::automatic;
      } else if (v == "pmix") {
        o.boot = bootstrap::pmix;
      } else if (v == "tcp") {
        o.boot = bootstrap::tcp;
      } else {
        throw app::usage_error("--bootstrap " + v + ": expected auto, pmix or tcp");
      }
    } else if (a.match({"-e", "--events"})) {
      o.events = true;
    } else if (a.match({"--psk-file"}, &v)) {
      if (!built_with_auth) {
        throw app::usage_error(
            "--psk-file: this alltoall was built without rdx::auth (install libssl-dev "
            "and reconfigure)");
      }
      o.psk_file = v;
    } else if (a.match({"--on-demand"})) {
      o.on_demand = true;
    } else if (a.match({"--memory"}, &v)) {
      if (v != "host" && v != "cuda") throw app::usage_error("--memory " + v + ": expected host or cuda");
      if (v == "cuda" && !built_with_cuda) {
        throw app::usage_error(
            "--memory cuda: this alltoall was built without rdx::cuda (install the CUDA Toolkit at "
            "/usr/local/cuda and reconfigure with -DRDX_CUDA=ON)");
      }
      o.cuda = v == "cuda";
    } else if (a.match({"--gpu"}, &v)) {
      o.gpu = static_cast<int>(app::parse_number("--gpu", v, 0, 1023));
    } else if (a.match({"--path"}, &v)) {
      if (v != "auto" && v != "direct" && v != "staged") {
        throw app::usage_error("--path " + v + ": expected auto, direct or staged");
      }
      o.path = v;
    } else if (a.match({"-q", "--quiet"})) {
      o.quiet = true;
    } else {
      throw app::usage_error("unknown argument " + std::string(a.peek()));
    }
  }
  if (o.rank.has_value() != o.world.has_value() || (o.rank && o.master.empty() && *o.world > 1)) {
    throw app::usage_error("--rank, --world and --master go together");
  }
  if (!o.cuda && (o.gpu || o.path != "auto")) {
    throw app::usage_error("--gpu and --path go with --memory cuda");
  }
  if (o.boot == bootstrap::pmix && o.rank) {
    throw app::usage_error("--bootstrap pmix takes the rank from the PMIx server: drop --rank");
  }
  if (o.boot == bootstrap::pmix && !built_with_pmix) {
    throw app::usage_error(
        "--bootstrap pmix: this alltoall was built without rdx::pmix (install libpmix-dev and reconfigure)");
  }
  return o;
}

rdx::group::rank_info place(const options& o) {
  if (!o.rank) return rdx::group::from_environment();
  std::string host;
  std::uint16_t port = 0;
  if (!o.master.empty()) {
    const auto colon = o.master.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      throw app::usage_error("--master " + o.master + ": expected HOST:PORT");
    }
    host = o.master.substr(0, colon);
    port =
        static_cast<std::uint16_t>(app::parse_number("--master port", o.master.substr(colon + 1), 1, 65535));
  }
  return rdx::group::given(*o.rank, *o.world, 0, 1, host, port);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

#if RDX_EXAMPLES_PMIX
// Whether the ranks meet through the PMIx server (--bootstrap): auto takes it
// only where the user named no other way (--rank, MASTER_ADDR).
bool use_pmix(const options& o) {
  switch (o.boot) {
    case bootstrap::pmix: return true;
    case bootstrap::tcp: return false;
    case bootstrap::automatic: break;
  }
  return !o.rank && std::getenv("MASTER_ADDR") == nullptr && rdx::group::pmix_session::launched_by_pmix();
}
#endif

// The CUDA device of this rank (alltoall::choose_gpu), before the RDMA device.
int gpu_of(const options& o, const rdx::group::rank_info& me) {
#if RDX_EXAMPLES_CUDA
  return alltoall::choose_gpu(o.gpu, me.local_rank);
#else
  (void)me;
  return o.gpu.value_or(0);
#endif
}

// The RDMA device for a GPU rank without -d: RDX_DEVICE, else the nearest.
std::string nic_for(int gpu) {
#if RDX_EXAMPLES_CUDA
  if (auto name = rdx::cuda::rdma_device_for_gpu(gpu)) return *name;
#else
  (void)gpu;
#endif
  return {};
}

std::unique_ptr<alltoall::memory> make_memory(const options& o, const rdx::protection_domain& pd,
                                              std::uint32_t n, int gpu) {
#if RDX_EXAMPLES_CUDA
  if (o.cuda) return alltoall::make_gpu_memory(pd, o.block, n, gpu, o.path);
#else
  (void)gpu;
#endif
  return std::make_unique<alltoall::host_memory>(pd, o.block, n);
}

int run(const options& o) {
#if RDX_EXAMPLES_PMIX
  // Before the mesh, so that it outlives it: the mesh's exchange calls it.
  std::optional<rdx::group::pmix_session> pmix;
  if (use_pmix(o)) pmix.emplace();
  const rdx::group::rank_info me = pmix ? pmix->info() : place(o);
#else
  const rdx::group::rank_info me = place(o);
#endif
  const std::uint32_t n = me.size, r = me.rank;
  rdx::group::mesh_options mo{};
#if RDX_EXAMPLES_AUTH
  if (!o.psk_file.empty()) mo.key = rdx::auth::psk_key::from_file(o.psk_file);  // before any socket
#endif
  const int gpu = o.cuda ? gpu_of(o, me) : -1;
  rdx::context ctx = app::open_device(o.device.empty() && o.cuda ? nic_for(gpu) : o.device);
  rdx::protection_domain pd(ctx);
  const std::unique_ptr<alltoall::memory> mem = make_memory(o, pd, n, gpu);
  if (!o.quiet && r == 0) {
    std::printf("alltoall: %u ranks (%s), a block of %zu bytes to each peer, %u iterations%s\n", n,
                std::string(rdx::group::to_string(me.from)).c_str(), o.block, o.iters,
                mo.key ? ", the job's key on the rendezvous and every connection" : "");
  }
  if (!o.quiet && (r == 0 || o.cuda)) {
    std::printf("rank %u: blocks in %s\n", r, mem->describe().c_str());
    std::fflush(stdout);
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(o.timeout);
  mo.timeout = ms;
  mo.attr.events = o.events;
  mo.on_demand = o.on_demand;
#if RDX_EXAMPLES_PMIX
  if (pmix) {
    mo.exchange = [&pmix, ms](std::span<const std::byte> mine) { return pmix->exchange(mine, ms); };
  }
#endif
  if (o.ack_timeout) {
    const auto chosen = mo.connect.set_ack_timeout(*o.ack_timeout);
    if (!o.quiet && r == 0) {
      std::printf("alltoall: ACK timeout %.1f ms\n",
                  std::chrono::duration<double, std::milli>(chosen).count());
    }
  }
  rdx::group::mesh m(me, pd, mem->window(), mo);
  const auto& t = m.timings();
  auto msf = [](std::chrono::microseconds d) { return static_cast<double>(d.count()) / 1000.0; };

  std::vector<double> times;
  double first = 0;  // the first all-to-all (with --on-demand, every pair connected in it)
  std::vector<rdx::operation> ops(n);
  std::uint64_t wrong = 0;
  std::string first_wrong;
  for (std::uint32_t it = 0; it < o.warmup + o.iters; ++it) {
    alltoall::fill(mem->host_fill(), o.block, it, r);
    mem->filled();
    const auto t0 = steady::now();
    mem->before_writes();
    // Peers in a rotation from this rank, so no rank is everyone's first.
    for (std::uint32_t k = 1; k < n; ++k) {
      const std::uint32_t p = (r + k) % n;
      ops[p] = m.block_of(p).write(mem->source(p), 0);
    }
    for (std::uint32_t p = 0; p < n; ++p) {
      if (p == r) continue;
      if (const auto ec = ops[p].wait(o.timeout, o.events ? rdx::wait_mode::events : rdx::wait_mode::poll);
          ec) {
        throw rdx::error(ec, "write of iteration " + std::to_string(it) + " to rank " + std::to_string(p) +
                                 (m.peer(p).failed() ? ": " + m.peer(p).failure_message() : ""));
      }
    }
    m.barrier(ms);
    mem->after_barrier();
    const double sec = std::chrono::duration<double>(steady::now() - t0).count();
    if (it >= o.warmup) times.push_back(sec);
    if (it == 0) first = sec;
    wrong += alltoall::check(mem->received(), o.block, it, r, first_wrong);
    m.barrier(ms);  // nobody overwrites a block before its reader has checked it
  }
  const double med = median(times);
  const double worst = times.empty() ? 0 : *std::max_element(times.begin(), times.end());
  const double sent = static_cast<double>(o.block) * (n - 1);
  std::printf(
      "rank %u/%u: set-up %.1f ms (rendezvous %.1f, connect %.1f, grants %.1f, barrier %.1f%s); first "
      "all-to-all %.1f ms; all-to-all median %.3f ms, worst %.3f ms; sent %.1f MB/s (%.1f MB/s per peer); "
      "%s\n",
      r, n, msf(t.total), msf(t.rendezvous), msf(t.connect), msf(t.grants), msf(t.barrier),
      o.on_demand ? "; pairs connected on first use" : "", first * 1e3, med * 1e3, worst * 1e3,
      med > 0 ? sent / med / 1e6 : 0.0, med > 0 ? static_cast<double>(o.block) / med / 1e6 : 0.0,
      wrong == 0 ? "every byte right"
                 : ("WRONG BYTES: " + std::to_string(wrong) + ", first at " + first_wrong).c_str());
  std::fflush(stdout);
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const app::usage_error& e) {
    std::fprintf(stderr, "alltoall: %s (see --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "alltoall: %s\n", e.what());
    return 1;
  }
}
