// rdx-doctor: the GPU checks: per GPU, GPUDirect RDMA's paths and the NIC it
// would use; per pair of GPUs, what same-host peers can do.
#pragma once

#include <rdx/rdx.hpp>

#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "report.hpp"
#include "scope.hpp"

#if __has_include(<rdx/cuda/config.hpp>)
#include <rdx/cuda/config.hpp>
#endif
#if defined(RDX_HAS_CUDA) && RDX_HAS_CUDA()
#include <rdx/cuda/peer_access.hpp>
#include <rdx/cuda/probe.hpp>
#include <rdx/cuda/shareable_buffer.hpp>
#include <rdx/cuda/topology.hpp>
#define RDX_DOCTOR_GPUS 1
#else
#define RDX_DOCTOR_GPUS 0
#endif

namespace doctor {

#if RDX_DOCTOR_GPUS
// Same-host peers: what each ordered pair of GPUs can do for the other, and whether processes
// of one GPU can share memory (shareable POSIX-fd allocations).
inline void check_gpu_pairs(report& r, int n) {
  if (n == 1) {
    const auto fd = rdx::cuda::shareable_supported(0);
    r.add("gpu.peers", "same-host peers", fd == rdx::cuda::support::yes ? level::ok : level::note,
          std::string("one GPU: no GPU pairs; processes on it share memory through shareable POSIX-fd "
                      "allocations: ") +
              std::string(rdx::cuda::to_string(fd)),
          {}, {{"gpu_pairs", "0"}, {"shareable_posix_fd", std::string(rdx::cuda::to_string(fd))}});
    return;
  }
  try {
    for (const auto& p : rdx::cuda::probe_gpu_pairs()) {
      const std::string who = "GPU " + std::to_string(p.a) + " -> GPU " + std::to_string(p.b);
      r.add(
          "gpu.peers", who, p.p2p_access ? level::ok : level::warning,
          std::string("P2P access ") + (p.p2p_access ? "yes" : "no") + ", native atomics " +
              (p.native_atomics ? "yes" : "no") + ", performance rank " + std::to_string(p.performance_rank) +
              ", link " + p.link,
          p.p2p_access ? std::string{} : std::string("same-host copies between them go through host memory"),
          {{"p2p_access", p.p2p_access ? "yes" : "no"},
           {"native_atomics", p.native_atomics ? "yes" : "no"},
           {"performance_rank", std::to_string(p.performance_rank)},
           {"link", p.link}});
    }
  } catch (const std::exception& e) {
    r.add("gpu.peers", "GPU pairs", level::error, std::string("P2P probe failed: ") + e.what(),
          "check the NVIDIA driver (nvidia-smi)");
  }
}
#endif

inline void check_gpu(report& r, const scope& s) {
#if RDX_DOCTOR_GPUS
  const int n = rdx::cuda::device_count();
  if (n <= 0) {
    r.add("gpu", "host", level::note,
          "no CUDA GPU visible (no NVIDIA driver, or no GPU): GPU checks not run");
    return;
  }
  std::vector<std::string> chosen(static_cast<std::size_t>(n));
  for (int d = 0; d < n; ++d) {
    const std::string who = "GPU " + std::to_string(d);
    try {
      std::optional<rdx::context> ctx;
      rdx::cuda::gpu_topology topo = rdx::cuda::locate_gpu(d);
      std::optional<std::string> nic = rdx::cuda::rdma_device_for_gpu(d);
      if (!s.device.empty()) nic = s.device;
      if (nic) {
        try {
          ctx.emplace(rdx::context::open(*nic));
        } catch (const rdx::error&) {}
      }
      rdx::cuda::gpudirect_report g =
          ctx ? rdx::cuda::probe_gpudirect(d, ctx->native_handle()) : rdx::cuda::probe_gpudirect(d, nullptr);
      const rdx::cuda::rdma_device_location* near = topo.nearest();
      std::string distance = "-";
      for (const auto& loc : topo.rdma_devices)
        if (nic && loc.name == *nic) distance = std::string(rdx::cuda::to_string(loc.distance));
      chosen[static_cast<std::size_t>(d)] = nic.value_or("");
      std::vector<std::pair<std::string, std::string>> facts = {
          {"name", g.gpu_name},
          {"pci", g.gpu_pci_address},
          {"numa_node", std::to_string(topo.gpu_numa_node)},
          {"dma_buf_attribute", g.dma_buf_attribute ? "yes" : "no"},
          {"dma_buf_export", std::string(rdx::cuda::to_string(g.dma_buf_export))},
          {"kernel_dmabuf_mr", std::string(rdx::cuda::to_string(g.kernel_dmabuf_mr))},
          {"peermem", g.peermem_loaded() ? "loaded" : "absent"},
          {"gpu_direct_rdma_attribute", g.gpu_direct_rdma_supported ? "yes" : "no"},
          {"nic", nic.value_or("")},
          {"nic_distance", distance},
          {"best_path", std::string(rdx::cuda::to_string(g.best_path()))},
          {"shareable_posix_fd", std::string(rdx::cuda::to_string(rdx::cuda::shareable_supported(d)))}};
      const std::string base = g.gpu_name + " at " + g.gpu_pci_address + ": dma-buf export " +
                               std::string(rdx::cuda::to_string(g.dma_buf_export)) + ", peermem " +
                               (g.peermem_loaded() ? "loaded" : "absent") + ", NIC " +
                               (nic ? *nic + " (" + distance + ")" : std::string("none")) + ", path " +
                               std::string(rdx::cuda::to_string(g.best_path()));
      if (!nic) {
        r.add(
            "gpu", who, level::warning,
            base +
                ": no RDMA device on this host, so GPU memory cannot be registered; rdx stages through host "
                "memory where a device exists",
            "install a NIC with an RDMA driver near the GPU (the same PCIe switch is best)", facts);
        continue;
      }
      if (g.best_path() == rdx::cuda::gpu_path::staged) {
        r.add("gpu", who, level::warning,
              base + ": neither dma-buf (" + g.kernel_dmabuf_detail +
                  ") nor peermem works, so transfers are "
                  "staged through host memory",
              "for dma-buf: kernel 5.12+, rdma-core 34+, a NIC driver that imports dma-buf (mlx5) and the "
              "NVIDIA "
              "open kernel modules; for peermem: modprobe nvidia_peermem",
              facts);
        continue;
      }
      if (near != nullptr && near->distance == rdx::cuda::pci_distance::across_numa)
        r.add("gpu", who, level::warning,
              base + ": the nearest NIC is across NUMA nodes (slow for GPUDirect)",
              "place a NIC on the GPU's NUMA node, or set RDX_DEVICE to a nearer one", facts);
      else
        r.add("gpu", who, level::ok, base, {}, facts);
    } catch (const std::exception& e) {
      r.add("gpu", who, level::error, std::string("probe failed: ") + e.what(),
            "check the NVIDIA driver (nvidia-smi) and that the CUDA runtime matches it");
    }
  }
  check_gpu_pairs(r, n);
  // Two GPUs on one NIC while another active NIC is free.
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      if (!chosen[a].empty() && chosen[a] == chosen[b] && std::getenv("RDX_DEVICE") == nullptr)
        r.add("gpu", "GPU " + std::to_string(a) + " and GPU " + std::to_string(b), level::note,
              "both use " + chosen[a] + ": they share its bandwidth",
              "where each GPU has a NIC of its own nearby, give each process its own with RDX_DEVICE");
#else
  (void)s;
  r.add("gpu", "host", level::note,
        "this rdx-doctor was built without rdx::cuda: GPU checks not run (build rdx with the CUDA Toolkit)");
#endif
}

}  // namespace doctor
