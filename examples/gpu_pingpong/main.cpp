// gpu_pingpong: a GPU buffer filled by a kernel travels to the peer node's
// GPU, is checked there by a kernel and comes back, checked again. Direct
// (GPUDirect RDMA: dma-buf or peermem) where the probe finds a path, staged
// through pinned host buffers otherwise; --path forces either. Prints the
// path taken, latency and bandwidth; any wrong byte fails the run.
//
// Where this machine has no RDMA device, the network half cannot run: the
// program says so and runs the GPU halves alone (fill, stage out, stage in,
// check, both ways) with a host copy standing in for the RDMA write.
#include <rdx/cuda/check.hpp>
#include <rdx/cuda/gpu_region.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/probe.hpp>
#include <rdx/cuda/register.hpp>
#include <rdx/cuda/staged_rdma.hpp>
#include <rdx/cuda/staging.hpp>
#include <rdx/cuda/topology.hpp>
#include <rdx/rdx.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../common.hpp"
#include "kernels.hpp"
#include "same_host.hpp"

namespace {

struct options {
  std::string path = "auto";  // auto | direct | staged
  std::size_t size = std::size_t{64} << 20;
  int iters = 10;
  int warmup = 2;
  int gpu = 0;
  std::size_t chunk = std::size_t{16} << 20;
  std::size_t depth = 2;
  std::string connect;  // peer host (client); empty: server
  unsigned port = 18515;
  bool local = false;  // GPU halves only, even where an RDMA device exists
  int timeout_s = 30;
  std::string same_host;  // Unix socket path: the same-host mode
  bool sm_copy = false;
};

void usage(std::FILE* f) {
  std::fprintf(
      f,
      "usage: gpu_pingpong [options]            (server, node 1)\n"
      "       gpu_pingpong [options] --connect HOST (client, node 0)\n"
      "  --path auto|direct|staged  how GPU memory meets the NIC (default auto: direct if the probe finds a "
      "path)\n"
      "  --size N[K|M|G]            bytes per message (default 64M)\n"
      "  --iters N                  timed round trips (default 10), --warmup N (default 2)\n"
      "  --gpu N                    CUDA device (default 0); the RDMA device is RDX_DEVICE or the nearest\n"
      "  --chunk N[K|M]             largest staging chunk, a multiple of 4K (default 16M); --depth N bounce "
      "buffers "
      "(default 2)\n"
      "  --port N                   TCP port of the bootstrap (default 18515); --timeout S per step (default "
      "30)\n"
      "  --local                    run the GPU halves on this machine only, no network\n"
      "  --same-host PATH           two processes of this host, no NIC: the server listens on the Unix\n"
      "                             socket PATH ('@name': abstract), `--same-host PATH --connect local`\n"
      "                             connects; prints the path chosen and why; --sm-copy copies by kernel\n");
}

// The examples' one argument parser (examples/common.hpp): -x V, --name V, --name=V;
// sizes take K, M and G.
options parse(int argc, char** argv) {
  using examples::parse_number;
  options o;
  examples::arg_reader r(argc, argv);
  while (!r.done()) {
    std::string v;
    if (r.match({"-h", "--help"})) {
      usage(stdout);
      std::exit(0);
    } else if (r.match({"--path"}, &v)) {
      if (v != "auto" && v != "direct" && v != "staged")
        throw examples::usage_error("--path: auto, direct or staged, not " + v);
      o.path = v;
    } else if (r.match({"--size"}, &v)) {
      o.size = parse_number("--size", v, 1, std::uint64_t{1} << 40, true);
    } else if (r.match({"--iters"}, &v)) {
      o.iters = static_cast<int>(parse_number("--iters", v, 1, 1u << 30));
    } else if (r.match({"--warmup"}, &v)) {
      o.warmup = static_cast<int>(parse_number("--warmup", v, 0, 1u << 30));
    } else if (r.match({"--gpu"}, &v)) {
      o.gpu = static_cast<int>(parse_number("--gpu", v, 0, 1023));
    } else if (r.match({"--chunk"}, &v)) {
      o.chunk = parse_number("--chunk", v, 1, std::uint64_t{1} << 32, true);
    } else if (r.match({"--depth"}, &v)) {
      o.depth = parse_number("--depth (bounce buffers)", v, 2, 64);
    } else if (r.match({"--connect"}, &v)) {
      o.connect = v;
    } else if (r.match({"--port"}, &v)) {
      o.port = static_cast<unsigned>(parse_number("--port", v, 1, 65535));
    } else if (r.match({"--timeout"}, &v)) {
      o.timeout_s = static_cast<int>(parse_number("--timeout", v, 1, 3600));
    } else if (r.match({"--local"})) {
      o.local = true;
    } else if (r.match({"--same-host"}, &v)) {
      o.same_host = v;
    } else if (r.match({"--sm-copy"})) {
      o.sm_copy = true;
    } else {
      throw examples::usage_error("unknown option " + std::string(r.peek()));
    }
  }
  return o;
}

int rdma_device_count() {
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  if (l != nullptr) {
    ibv_free_device_list(l);
  }
  return l == nullptr ? 0 : n;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

bool report_check(const char* where, const rdx::cuda::pattern_result& r, int iter) {
  if (r.ok()) {
    return true;
  }
  std::fprintf(stderr, "gpu_pingpong: FAIL: %s, iteration %d: %llu wrong 8-byte words, first at byte %llu\n",
               where, iter, static_cast<unsigned long long>(r.mismatches),
               static_cast<unsigned long long>(r.first_bad_offset));
  return false;
}

// The GPU halves on one machine: A --stage out--> wire --stage in--> B, B checks;
// then back to A, which checks. The host memcpy into and out of `wire`
// stands in for the RDMA write of each chunk.
int run_local(const options& o) {
  rdx::cuda::device_guard g(o.gpu);
  rdx::cuda::staging_pipeline pipe({.chunk_bytes = o.chunk, .depth = o.depth, .device = o.gpu});
  rdx::cuda::device_buffer<std::byte> a(o.size);
  rdx::cuda::device_buffer<std::byte> b(o.size);
  rdx::cuda::pinned_buffer<std::byte> wire(o.size);
  rdx::cuda::stream s;
  std::vector<double> one_way;
  double out_s = 0;
  double in_s = 0;
  for (int it = -o.warmup; it < o.iters; ++it) {
    const auto seed = static_cast<std::uint64_t>(it + 1000);
    gpu_pingpong::fill(a.data(), o.size, seed, s.native_handle());
    RDX_CUDA_TRY(cudaMemsetAsync(b.data(), 0, o.size, s.native_handle()));
    s.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    const auto ping_out = pipe.send(a.data(), o.size, [&](const rdx::cuda::staged_chunk& c) {
      std::memcpy(wire.data() + c.offset, c.host.data(), c.host.size());
    });
    const auto ping_in = pipe.receive(b.data(), o.size, [&](const rdx::cuda::staged_chunk& c) {
      std::memcpy(c.host.data(), wire.data() + c.offset, c.host.size());
    });
    const auto t1 = std::chrono::steady_clock::now();
    if (!report_check("peer's check of the ping",
                      gpu_pingpong::check(b.data(), o.size, seed, s.native_handle()), it)) {
      return 1;
    }
    RDX_CUDA_TRY(cudaMemsetAsync(a.data(), 0, o.size, s.native_handle()));
    s.synchronize();
    const auto t2 = std::chrono::steady_clock::now();
    (void)pipe.send(b.data(), o.size, [&](const rdx::cuda::staged_chunk& c) {
      std::memcpy(wire.data() + c.offset, c.host.data(), c.host.size());
    });
    (void)pipe.receive(a.data(), o.size, [&](const rdx::cuda::staged_chunk& c) {
      std::memcpy(c.host.data(), wire.data() + c.offset, c.host.size());
    });
    const auto t3 = std::chrono::steady_clock::now();
    if (!report_check("check of the pong", gpu_pingpong::check(a.data(), o.size, seed, s.native_handle()),
                      it)) {
      return 1;
    }
    if (it >= 0) {
      one_way.push_back(std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count() / 2);
      out_s += ping_out.seconds;
      in_s += ping_in.seconds;
    }
  }
  const double m = median(one_way);
  std::printf(
      "gpu_pingpong: path staged (GPU halves only), %zu bytes, chunk %zu KiB, depth %zu, %d round trips: all "
      "bytes right\n",
      o.size, o.chunk >> 10, o.depth, o.iters);
  std::printf(
      "gpu_pingpong: one-way latency median %.1f us, bandwidth %.2f GB/s (stage out %.2f GB/s, stage in %.2f "
      "GB/s,"
      " each with a host memcpy standing in for the RDMA write)\n",
      m * 1e6, static_cast<double>(o.size) / m / 1e9, static_cast<double>(o.size) * o.iters / out_s / 1e9,
      static_cast<double>(o.size) * o.iters / in_s / 1e9);
  return 0;
}

// --- the network half: two nodes, one RC queue pair ----------------------------

struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What both sides must agree on; the server takes the client's numbers.
struct settings {
  std::uint32_t path = 0;  // 1 direct, 2 staged: what this side can or must do
  std::uint32_t forced = 0;
  std::uint64_t size = 0;
  std::uint32_t iters = 0;
  std::uint32_t warmup = 0;
  std::uint64_t chunk = 0;
  std::uint32_t depth = 0;
};
constexpr std::size_t settings_bytes = 40;

void put_be(std::byte* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) {
    p[i] = std::byte(v >> (8 * (n - 1 - i)));
  }
}
std::uint64_t get_be(const std::byte* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) {
    v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  }
  return v;
}

settings exchange_settings(const rdx::tcp::socket& sock, const settings& mine, std::chrono::seconds timeout) {
  std::byte out[settings_bytes] = {};
  std::memcpy(out, "RDXG", 4);
  put_be(out + 4, mine.path, 4);
  put_be(out + 8, mine.forced, 4);
  put_be(out + 12, mine.size, 8);
  put_be(out + 20, mine.iters, 4);
  put_be(out + 24, mine.warmup, 4);
  put_be(out + 28, mine.chunk, 8);
  put_be(out + 36, mine.depth, 4);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  sock.send_all(out, deadline, "send settings");
  std::byte in[settings_bytes] = {};
  sock.recv_exact(in, deadline, "receive settings");
  if (std::memcmp(in, "RDXG", 4) != 0) {
    throw failure("the peer at " + sock.peer() + " is not a gpu_pingpong");
  }
  settings p;
  p.path = static_cast<std::uint32_t>(get_be(in + 4, 4));
  p.forced = static_cast<std::uint32_t>(get_be(in + 8, 4));
  p.size = get_be(in + 12, 8);
  p.iters = static_cast<std::uint32_t>(get_be(in + 20, 4));
  p.warmup = static_cast<std::uint32_t>(get_be(in + 24, 4));
  p.chunk = get_be(in + 28, 8);
  p.depth = static_cast<std::uint32_t>(get_be(in + 36, 4));
  return p;
}

constexpr std::uint32_t path_direct = 1;
constexpr std::uint32_t max_depth = 64;
constexpr std::uint32_t path_staged = 2;

// Both sides compute the same answer from the two settings.
std::uint32_t agree_path(const settings& client, const settings& server) {
  if (client.forced != 0 && server.forced != 0 && client.forced != server.forced) {
    throw failure("--path direct on one side and --path staged on the other");
  }
  const std::uint32_t forced = client.forced != 0 ? client.forced : server.forced;
  if (forced == path_direct && (client.path != path_direct || server.path != path_direct)) {
    throw failure(std::string("--path direct, but ") +
                  (client.path != path_direct ? "the client" : "the server") +
                  " cannot register its GPU memory (see its probe output)");
  }
  if (forced != 0) {
    return forced;
  }
  return client.path == path_direct && server.path == path_direct ? path_direct : path_staged;
}

struct link {
  rdx::context ctx;
  rdx::protection_domain pd;
  rdx::completion_queue send_cq;
  rdx::completion_queue recv_cq;
  rdx::queue_pair qp;
  std::chrono::seconds timeout;
  std::uint32_t recvs;

  link(rdx::context c, std::uint32_t recv_depth, std::chrono::seconds t)
      : ctx(std::move(c)),
        pd(ctx),
        send_cq(ctx, 32),
        recv_cq(ctx, static_cast<int>(recv_depth + 8)),
        qp(pd, send_cq, recv_cq,
           rdx::queue_pair_attr{
               .max_send_wr = 16, .max_recv_wr = recv_depth, .remote_access = rdx::access::remote_write}),
        timeout(t),
        recvs(recv_depth) {}

  void post_recv() {
    // Data arrives by RDMA write with immediate, credits as empty sends: the
    // receive itself never holds bytes.
    if (auto ec = qp.post_recv(rdx::wr::recv(std::span<const ibv_sge>{}))) {
      throw failure("post a receive: " + ec.message());
    }
  }
  rdx::completion wait(rdx::completion_queue& cq, const std::string& what) {
    rdx::completion c{};
    const std::error_code ec = rdx::poll_one(cq, c, timeout);
    if (ec == rdx::errc::timed_out) {
      throw failure("no " + what + " completion within " + std::to_string(timeout.count()) +
                    " s (has the peer stopped?)");
    }
    if (ec) {
      throw failure("polling for " + what + ": " + ec.message());
    }
    if (!c.ok()) {
      throw failure(what + " failed: " + c.error().message());
    }
    return c;
  }
  void send_done(const std::string& what) { (void)wait(send_cq, what); }
  // Waits for the next receive (a write with immediate or a credit), checks
  // its immediate, and reposts a receive.
  rdx::completion expect(std::uint32_t imm, const std::string& what) {
    rdx::completion c = wait(recv_cq, what);
    post_recv();
    if (!c.has_imm() || c.imm() != imm) {
      throw failure(what + ": immediate " + (c.has_imm() ? std::to_string(c.imm()) : std::string("none")) +
                    ", expected " + std::to_string(imm));
    }
    return c;
  }
  void post(rdx::send_wr&& w, const std::string& what) {
    if (auto ec = qp.post_send(w)) {
      throw failure("post " + what + ": " + ec.message());
    }
  }
};

int run_network(const options& o) {
  const bool client = !o.connect.empty();
  const auto timeout = std::chrono::seconds(o.timeout_s);
  const auto name = rdx::cuda::rdma_device_for_gpu(o.gpu);
  rdx::context ctx = name ? rdx::context::open(*name) : rdx::context::open_default();
  std::printf("gpu_pingpong %s: RDMA device %s (%s)\n", client ? "client" : "server", ctx.name().c_str(),
              std::getenv("RDX_DEVICE") != nullptr ? "RDX_DEVICE" : "nearest to the GPU");

  rdx::tcp::socket sock;
  if (client) {
    sock = rdx::tcp::connect(o.connect, static_cast<std::uint16_t>(o.port), timeout);
  } else {
    auto l = rdx::tcp::listener::bind("", static_cast<std::uint16_t>(o.port));
    std::printf("gpu_pingpong server: waiting for a client on TCP port %u\n", l.port());
    std::fflush(stdout);
    sock = l.accept(timeout);
  }

  rdx::cuda::device_guard g(o.gpu);
  link l(std::move(ctx), 2 * max_depth + 8, timeout);
  l.qp.to_init();

  // Can this side register GPU memory? Try it on a small buffer, unless staged
  // is forced; the real buffers are registered once the sizes are agreed.
  rdx::cuda::gpu_path direct_path = rdx::cuda::gpu_path::staged;
  if (o.path != "staged") {
    try {
      rdx::cuda::device_buffer<std::byte> probe_buf(2u << 20);
      direct_path = rdx::cuda::register_memory(l.pd, probe_buf, rdx::access::local_write).path;
      std::printf("gpu_pingpong: GPU memory registers through %s\n",
                  std::string(rdx::cuda::to_string(direct_path)).c_str());
    } catch (const rdx::error& e) {
      std::printf("gpu_pingpong: GPU memory does not register here, so staged: %s\n", e.what());
    }
  }
  settings mine{};
  mine.forced = o.path == "direct" ? path_direct : o.path == "staged" ? path_staged : 0;
  mine.size = o.size;
  mine.iters = static_cast<std::uint32_t>(o.iters);
  mine.warmup = static_cast<std::uint32_t>(o.warmup);
  mine.chunk = o.chunk;
  mine.depth = static_cast<std::uint32_t>(o.depth);
  mine.path = direct_path != rdx::cuda::gpu_path::staged ? path_direct : path_staged;
  const settings peer = exchange_settings(sock, mine, timeout);
  const settings& lead = client ? mine : peer;
  const std::uint32_t path = agree_path(client ? mine : peer, client ? peer : mine);
  const std::size_t size = lead.size;
  const int iters = static_cast<int>(lead.iters);
  const int warmup = static_cast<int>(lead.warmup);

  rdx::cuda::device_buffer<std::byte> src(size);
  rdx::cuda::device_buffer<std::byte> dst(size);
  rdx::cuda::stream s;
  const std::uint32_t depth = lead.depth;

  // dst is what the peer writes to: the GPU memory itself (direct) or the
  // bounce buffers of its staging pipeline; gpu_region says which.
  const auto rights = rdx::access::local_write | rdx::access::remote_write;
  auto dst_region = rdx::cuda::make_gpu_region(
      l.pd, dst, rights, path == path_direct ? direct_path : rdx::cuda::gpu_path::staged,
      rdx::cuda::staging_options{.chunk_bytes = lead.chunk, .depth = depth, .device = o.gpu});
  // The direct path writes from src, registered the same way.
  std::optional<rdx::cuda::gpu_memory_region> src_mr;
  if (dst_region.direct()) {
    src_mr.emplace(rdx::cuda::register_memory(l.pd, src, rdx::access::local_write, direct_path));
  }
  rdx::cuda::staging_pipeline* pipe = dst_region.pipeline();
  const std::vector<rdx::remote_descriptor> mine_desc{dst_region.remote()};
  if (dst_region.direct()) {
    std::printf("gpu_pingpong: path direct (%s)\n",
                std::string(rdx::cuda::to_string(dst_region.path())).c_str());
  } else {
    std::printf("gpu_pingpong: path staged (%zu KiB chunks, %u bounce buffers)\n",
                static_cast<std::size_t>(lead.chunk >> 10), depth);
  }
  const rdx::wire::message remote = rdx::tcp::exchange(sock, l.qp.local_endpoint(), mine_desc, timeout);
  if (remote.descriptors.size() != 1 ||
      !rdx::contains(remote.descriptors[0], 0, path == path_direct ? size : lead.chunk * depth)) {
    throw failure("the peer's memory descriptor does not cover what this side will write");
  }
  const rdx::remote_descriptor peer_mem = remote.descriptors[0];
  // Receives go up before the barrier below, so nothing from the peer can
  // meet a queue pair without them.
  std::optional<rdx::cuda::staged_rdma> staged;
  if (dst_region.direct()) {
    for (std::uint32_t i = 0; i < l.recvs; ++i) {
      l.post_recv();
    }
  } else {
    staged.emplace(l.qp, l.send_cq, l.recv_cq, dst_region.region(), peer_mem, pipe->options(), timeout);
    staged->post_receives();
  }
  l.qp.connect(remote.ep);
  rdx::tcp::barrier(sock, timeout);

  const rdx::cuda::gpudirect_flush flush(o.gpu, rdx::cuda::flush_scope::owner);
  const auto one_way = [&](const void* from, void* to, bool sending, std::uint32_t k) {
    if (path == path_direct) {
      if (sending) {
        // The whole registered src goes out; GPU memory is never read by the
        // CPU, so no inline payload.
        (void)from;
        l.post(std::move(rdx::wr::write_imm(src_mr->region.sge(), rdx::at(peer_mem, 0), k).no_inline()),
               "write");
        l.send_done("write");
      } else {
        (void)l.expect(k, "write of round trip " + std::to_string(k));
        if (flush() == rdx::cuda::flush_method::rdma_read) {
          throw failure("this GPU needs an RDMA read to flush GPUDirect writes; use --path staged");
        }
      }
    } else if (sending) {
      (void)staged->send(*pipe, from, size);
    } else {
      (void)staged->receive(*pipe, to, size);
    }
  };

  std::vector<double> rtt;
  for (int it = -warmup; it < iters; ++it) {
    const auto k = static_cast<std::uint32_t>(it + warmup);
    const std::uint64_t seed = 0x5eed0000ull + k;
    RDX_CUDA_TRY(cudaMemsetAsync(dst.data(), 0, size, s.native_handle()));
    if (client) {
      gpu_pingpong::fill(src.data(), size, seed, s.native_handle());
    }
    s.synchronize();
    rdx::tcp::barrier(sock, timeout);  // the peer's dst is cleared too
    if (client) {
      const auto t0 = std::chrono::steady_clock::now();
      one_way(src.data(), nullptr, true, k);
      one_way(nullptr, dst.data(), false, k);
      const auto t1 = std::chrono::steady_clock::now();
      if (!report_check("the echo", gpu_pingpong::check(dst.data(), size, seed, s.native_handle()), it)) {
        return 1;
      }
      if (it >= 0) {
        rtt.push_back(std::chrono::duration<double>(t1 - t0).count());
      }
    } else {
      one_way(nullptr, dst.data(), false, k);
      if (!report_check("the ping", gpu_pingpong::check(dst.data(), size, seed, s.native_handle()), it)) {
        return 1;
      }
      // Echo: direct writes from src, so copy the checked bytes there first.
      if (path == path_direct) {
        RDX_CUDA_TRY(
            cudaMemcpyAsync(src.data(), dst.data(), size, cudaMemcpyDeviceToDevice, s.native_handle()));
        s.synchronize();
      }
      one_way(path == path_direct ? src.data() : dst.data(), nullptr, true, k);
    }
  }
  rdx::tcp::barrier(sock, timeout);
  if (client) {
    const double m = median(rtt);
    std::printf("gpu_pingpong: path %s, %zu bytes, %d round trips, every byte checked on both GPUs\n",
                path == path_direct ? "direct" : "staged", size, iters);
    std::printf("gpu_pingpong: one-way latency median %.1f us, bandwidth %.2f GB/s\n", m / 2 * 1e6,
                static_cast<double>(size) / (m / 2) / 1e9);
  } else {
    std::printf("gpu_pingpong server: %d payloads of %zu bytes checked and echoed\n", iters + warmup, size);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  if (rdx::cuda::device_count() == 0) {
    std::fprintf(stderr, "gpu_pingpong: SKIP: needs a CUDA GPU: %s\n", rdx::cuda::no_device_reason().c_str());
    return 77;
  }
  if (!o.same_host.empty()) {
    return gpu_pingpong::run_same_host({.socket = o.same_host,
                                        .client = !o.connect.empty(),
                                        .size = o.size,
                                        .iters = o.iters,
                                        .warmup = o.warmup,
                                        .gpu = o.gpu,
                                        .sm_copy = o.sm_copy,
                                        .timeout_s = o.timeout_s});
  }
  const auto report = rdx::cuda::probe_gpudirect(o.gpu);
  const rdx::cuda::gpu_path best = report.best_path();
  std::printf("gpu_pingpong: GPU %d %s at %s; RDMA device %s; probe's best path: %s; asked: %s\n", o.gpu,
              report.gpu_name.c_str(), report.gpu_pci_address.c_str(),
              report.rdma_device.empty() ? "none" : report.rdma_device.c_str(),
              std::string(rdx::cuda::to_string(best)).c_str(), o.path.c_str());
  if (o.local || rdma_device_count() == 0) {
    if (!o.local) {
      std::printf(
          "gpu_pingpong: the network half needs an RDMA device and ibv_get_device_list found none here;"
          " running the GPU halves on this machine only (fill, stage out, stage in, check, both ways)."
          " On two machines with a GPU and an RDMA device each: `gpu_pingpong` on one,"
          " `gpu_pingpong --connect <first>` on the other.\n");
    }
    if (o.path == "direct") {
      std::fprintf(stderr,
                   "gpu_pingpong: --path direct needs an RDMA device to register GPU memory with:\n%s",
                   report.to_string().c_str());
      return 1;
    }
    return run_local(o);
  }
  return run_network(o);
} catch (const examples::usage_error& e) {
  std::fprintf(stderr, "gpu_pingpong: %s (see --help)\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpu_pingpong: error: %s\n", e.what());
  return 1;
}
