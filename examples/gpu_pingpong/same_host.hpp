// gpu_pingpong --same-host PATH: two processes of one host, GPU memory to GPU
// memory through rdx::cuda::same_host_peer (no NIC). The server listens on the
// Unix socket PATH ('@' first: Linux's abstract namespace), the client
// (--connect) connects; each grants a buffer to the other, and a round trip is
// the client's write_with_notify into the server's buffer, then the server's
// into the client's. The first and last payloads are checked on the GPU.
#pragma once

#include <rdx/cuda/same_host.hpp>

#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "kernels.hpp"

namespace gpu_pingpong {

struct same_host_settings {
  std::string socket;
  bool client = false;
  std::size_t size = 0;
  int iters = 10;
  int warmup = 2;
  int gpu = 0;
  bool sm_copy = false;  // copies by a kernel instead of the copy engines
  int timeout_s = 30;
};

inline int run_same_host(const same_host_settings& o) {
  RDX_CUDA_TRY(cudaSetDevice(o.gpu));
  const rdx::cuda::same_host_options opt{.device = o.gpu, .setup_timeout = std::chrono::seconds(o.timeout_s)};
  auto peer = o.client ? rdx::cuda::same_host_peer::connect(o.socket, opt)
                       : rdx::cuda::same_host_peer::accept(o.socket, opt);
  const rdx::cuda::transport_choice c = peer.choice();
  std::printf("gpu_pingpong %s: path %s: %s\n", o.client ? "client" : "server",
              std::string(rdx::cuda::to_string(c.path)).c_str(), c.reason.c_str());
  if (c.path != rdx::cuda::transport::same_host) {
    std::fprintf(stderr, "gpu_pingpong: the same-host path does not apply (%s); run the RDMA mode instead\n",
                 c.reason.c_str());
    return 1;
  }
  if (o.sm_copy) {
    peer.set_copier(&gpu_pingpong::sm_copy);
  }
  rdx::cuda::shareable_buffer<std::byte> mine(o.size, o.gpu);
  rdx::cuda::device_buffer<std::byte> src(o.size);
  const std::uint64_t send_seed = o.client ? 1 : 2;
  const std::uint64_t recv_seed = o.client ? 2 : 1;
  fill(src.data(), o.size, send_seed, nullptr);
  RDX_CUDA_TRY(cudaDeviceSynchronize());
  const auto grant = peer.grant(mine, 0, o.size, rdx::rights::write);
  auto window = peer.accept_window<std::byte>(std::chrono::seconds(o.timeout_s));
  std::printf("gpu_pingpong %s: granted %zu bytes (%zu exposed, whole allocation), window by %s, %s\n",
              o.client ? "client" : "server", grant.size_bytes(), grant.exposed_bytes(), window.sharing(),
              window.route_text().c_str());
  const auto deadline = std::chrono::seconds(o.timeout_s);
  const auto expect = [&](int i) {
    auto n = peer.receive_notification();
    if (const std::error_code ec = n.wait(deadline)) {
      throw rdx::error(ec, "receive_notification");
    }
    if (n.tag() != static_cast<std::uint32_t>(i)) {
      throw rdx::error(make_error_code(rdx::errc::protocol_error), "notification " + std::to_string(n.tag()));
    }
    if (i == 0 || i == o.warmup + o.iters - 1) {  // every byte, the first and last time
      const auto r = check(mine.data(), o.size, recv_seed, nullptr);
      if (!r.ok()) {
        throw rdx::error(
            make_error_code(rdx::errc::protocol_error),
            "payload " + std::to_string(i) + ": " + std::to_string(r.mismatches) + " wrong words");
      }
    }
  };
  const auto send = [&](int i) {
    auto w = window.write_with_notify(std::span<const std::byte>(src.data(), o.size), 0,
                                      static_cast<std::uint32_t>(i));
    if (const std::error_code ec = w.wait(deadline)) {
      throw rdx::error(ec, "write_with_notify");
    }
  };
  std::vector<double> rtt;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (o.client) {
      send(i);
      expect(i);
    } else {
      expect(i);
      send(i);
    }
    if (i >= o.warmup) {
      rtt.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  if (o.client) {
    std::sort(rtt.begin(), rtt.end());
    const double m = rtt[rtt.size() / 2];
    std::printf(
        "gpu_pingpong client: same-host (%s copies), %zu bytes, %d round trips: half round trip "
        "latency %.2f us, %.2f GB/s (median); first and last payloads checked on the GPU\n",
        o.sm_copy ? "SM" : "copy-engine", o.size, o.iters, m / 2 * 1e6,
        static_cast<double>(o.size) / (m / 2) / 1e9);
  } else {
    std::printf("gpu_pingpong server: %d payloads of %zu bytes received and sent back\n", o.iters + o.warmup,
                o.size);
  }
  // Both sides are done with the other's memory before either leaves.
  auto bye = peer.notify(0xffffffffu);
  (void)bye.wait(deadline);
  auto last = peer.receive_notification();
  (void)last.wait(deadline);
  return 0;
}

}  // namespace gpu_pingpong
