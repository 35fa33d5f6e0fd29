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
#include <rdx/cuda/probe.hpp>
#include <rdx/rdx.hpp>

#include <infiniband/verbs.h>

#include <cstdio>
#include <exception>
#include <string>

#include "cli.hpp"
#include "options.hpp"
#include "runs.hpp"
#include "same_host.hpp"

namespace {

int rdma_device_count() {
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  if (l != nullptr) {
    ibv_free_device_list(l);
  }
  return l == nullptr ? 0 : n;
}

}  // namespace

int main(int argc, char** argv) try {
  const gpu_pingpong::options o = gpu_pingpong::parse(argc, argv);
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
    return gpu_pingpong::run_local(o);
  }
  return gpu_pingpong::run_network(o);
} catch (const app::usage_error& e) {
  std::fprintf(stderr, "gpu_pingpong: %s (see --help)\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpu_pingpong: error: %s\n", e.what());
  return 1;
}
