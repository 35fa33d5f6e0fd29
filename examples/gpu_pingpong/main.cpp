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
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/probe.hpp>
#include <rdx/cuda/staging.hpp>
#include <rdx/cuda/topology.hpp>

#include "kernels.hpp"

#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct options {
  std::string path = "auto";  // auto | direct | staged
  std::size_t size = std::size_t{64} << 20;
  int iters = 10;
  int warmup = 2;
  int gpu = 0;
  std::size_t chunk = std::size_t{4} << 20;
  std::size_t depth = 2;
  std::string connect;  // peer host (client); empty: server
  unsigned port = 18515;
  bool local = false;  // GPU halves only, even where an RDMA device exists
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: gpu_pingpong [options]            (server, node 1)\n"
               "       gpu_pingpong [options] --connect HOST (client, node 0)\n"
               "  --path auto|direct|staged  how GPU memory meets the NIC (default auto: direct if the probe finds a path)\n"
               "  --size N[K|M|G]            bytes per message (default 64M)\n"
               "  --iters N                  timed round trips (default 10), --warmup N (default 2)\n"
               "  --gpu N                    CUDA device (default 0); the RDMA device is RDX_DEVICE or the nearest\n"
               "  --chunk N[K|M]             staging chunk, a multiple of 4K (default 4M); --depth N bounce buffers (default 2)\n"
               "  --port N                   TCP port of the bootstrap (default 18515)\n"
               "  --local                    run the GPU halves on this machine only, no network\n");
}

std::size_t parse_size(std::string_view opt, std::string_view s) {
  std::size_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'k': case 'K': mult = std::size_t{1} << 10; s.remove_suffix(1); break;
      case 'm': case 'M': mult = std::size_t{1} << 20; s.remove_suffix(1); break;
      case 'g': case 'G': mult = std::size_t{1} << 30; s.remove_suffix(1); break;
      default: break;
    }
  }
  char* end = nullptr;
  const std::string t(s);
  const unsigned long long v = std::strtoull(t.c_str(), &end, 10);
  if (t.empty() || *end != '\0' || v == 0) throw std::invalid_argument(std::string(opt) + ": not a positive size: " + t);
  return static_cast<std::size_t>(v) * mult;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      std::exit(0);
    } else if (a == "--path") {
      o.path = value();
      if (o.path != "auto" && o.path != "direct" && o.path != "staged")
        throw std::invalid_argument("--path: auto, direct or staged, not " + o.path);
    } else if (a == "--size") {
      o.size = parse_size(a, value());
    } else if (a == "--iters") {
      o.iters = static_cast<int>(parse_size(a, value()));
    } else if (a == "--warmup") {
      o.warmup = std::atoi(std::string(value()).c_str());
    } else if (a == "--gpu") {
      o.gpu = std::atoi(std::string(value()).c_str());
    } else if (a == "--chunk") {
      o.chunk = parse_size(a, value());
    } else if (a == "--depth") {
      o.depth = parse_size(a, value());
    } else if (a == "--connect") {
      o.connect = value();
    } else if (a == "--port") {
      o.port = static_cast<unsigned>(parse_size(a, value()));
    } else if (a == "--local") {
      o.local = true;
    } else {
      throw std::invalid_argument("unknown option " + std::string(a));
    }
  }
  return o;
}

int rdma_device_count() {
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  if (l != nullptr) ibv_free_device_list(l);
  return l == nullptr ? 0 : n;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

bool report_check(const char* where, const rdx::cuda::pattern_result& r, int iter) {
  if (r.ok()) return true;
  std::fprintf(stderr, "gpu_pingpong: FAIL: %s, iteration %d: %llu wrong 8-byte words, first at byte %llu\n", where, iter,
               static_cast<unsigned long long>(r.mismatches), static_cast<unsigned long long>(r.first_bad_offset));
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
    if (!report_check("peer's check of the ping", gpu_pingpong::check(b.data(), o.size, seed, s.native_handle()), it)) return 1;
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
    if (!report_check("check of the pong", gpu_pingpong::check(a.data(), o.size, seed, s.native_handle()), it)) return 1;
    if (it >= 0) {
      one_way.push_back(std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count() / 2);
      out_s += ping_out.seconds;
      in_s += ping_in.seconds;
    }
  }
  const double m = median(one_way);
  std::printf("gpu_pingpong: path staged (GPU halves only), %zu bytes, chunk %zu KiB, depth %zu, %d round trips: all bytes right\n",
              o.size, o.chunk >> 10, o.depth, o.iters);
  std::printf("gpu_pingpong: one-way latency median %.1f us, bandwidth %.2f GB/s (stage out %.2f GB/s, stage in %.2f GB/s,"
              " each with a host memcpy standing in for the RDMA write)\n",
              m * 1e6, static_cast<double>(o.size) / m / 1e9,
              static_cast<double>(o.size) * o.iters / out_s / 1e9, static_cast<double>(o.size) * o.iters / in_s / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  if (rdx::cuda::device_count() == 0) {
    std::fprintf(stderr, "gpu_pingpong: SKIP: needs a CUDA GPU: %s\n", rdx::cuda::no_device_reason().c_str());
    return 77;
  }
  const auto report = rdx::cuda::probe_gpudirect(o.gpu);
  const rdx::cuda::gpu_path best = report.best_path();
  std::printf("gpu_pingpong: GPU %d %s at %s; RDMA device %s; probe's best path: %s; asked: %s\n", o.gpu,
              report.gpu_name.c_str(), report.gpu_pci_address.c_str(),
              report.rdma_device.empty() ? "none" : report.rdma_device.c_str(),
              std::string(rdx::cuda::to_string(best)).c_str(), o.path.c_str());
  if (o.path == "direct" && best == rdx::cuda::gpu_path::staged) {
    std::fprintf(stderr, "gpu_pingpong: --path direct, but no GPUDirect path works here:\n%s", report.to_string().c_str());
    return 1;
  }
  if (o.local || rdma_device_count() == 0) {
    if (!o.local) {
      std::printf("gpu_pingpong: the network half needs an RDMA device and ibv_get_device_list found none here;"
                  " running the GPU halves on this machine only (fill, stage out, stage in, check, both ways)."
                  " On two machines with a GPU and an RDMA device each: `gpu_pingpong` on one,"
                  " `gpu_pingpong --connect <first>` on the other.\n");
    }
    if (o.path == "direct") {
      std::fprintf(stderr, "gpu_pingpong: --path direct needs an RDMA device\n");
      return 1;
    }
    return run_local(o);
  }
  std::fprintf(stderr,
               "gpu_pingpong: the two-node exchange over rdx channels is not written yet; run with --local for the GPU "
               "halves\n");
  return 2;
} catch (const std::invalid_argument& e) {
  std::fprintf(stderr, "gpu_pingpong: %s (see --help)\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpu_pingpong: error: %s\n", e.what());
  return 1;
}
