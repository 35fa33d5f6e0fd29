// gpu_pingpong's network half: two nodes, one RC queue pair. The GPU buffer
// goes to the peer's GPU direct (GPUDirect RDMA) or staged through pinned
// host buffers, is checked there and comes back, checked again.
#include <rdx/cuda/check.hpp>
#include <rdx/cuda/gpu_region.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/register.hpp>
#include <rdx/cuda/staged_rdma.hpp>
#include <rdx/cuda/staging.hpp>
#include <rdx/cuda/topology.hpp>
#include <rdx/rdx.hpp>

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "kernels.hpp"
#include "peer_settings.hpp"
#include "runs.hpp"

namespace gpu_pingpong {

namespace {

constexpr std::uint32_t max_depth = 64;

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

}  // namespace

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

}  // namespace gpu_pingpong
