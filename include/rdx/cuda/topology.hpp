// rdx::cuda: which RDMA device is nearest to a GPU, read from sysfs.
//
// The sysfs part needs no CUDA and takes the sysfs root as a parameter, so it
// runs over fake trees in tests; the overloads taking a CUDA device ordinal
// exist where the toolkit is (RDX_HAS_CUDA()).
#pragma once

#include <rdx/cuda/config.hpp>
#include <rdx/error.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#if RDX_HAS_CUDA()
#include <rdx/cuda/check.hpp>
#endif

namespace rdx::cuda {

//! How far apart two PCI devices are, nearest first.
enum class pci_distance {
  same_switch,        //!< below one PCIe switch or bridge, not through the host bridge
  same_root_complex,  //!< through the host bridge of one root complex
  same_numa_node,     //!< different root complexes of one NUMA node
  across_numa,        //!< different NUMA nodes (or a node unknown): across the CPU interconnect
};

//! "same PCIe switch", "same root complex", "same NUMA node" or "across NUMA nodes".
[[nodiscard]] constexpr std::string_view to_string(pci_distance d) noexcept {
  switch (d) {
    case pci_distance::same_switch: return "same PCIe switch";
    case pci_distance::same_root_complex: return "same root complex";
    case pci_distance::same_numa_node: return "same NUMA node";
    case pci_distance::across_numa: return "across NUMA nodes";
  }
  return "unknown";
}

//! One RDMA device as seen from a GPU.
struct rdma_device_location {
  std::string name;                   //!< e.g. "mlx5_0"
  std::string pci_address;            //!< e.g. "0000:18:00.0"; empty for a device without PCI parent
  std::filesystem::path device_path;  //!< resolved path under \<sysfs\>/devices
  int numa_node = -1;                 //!< -1 when sysfs does not say
  //! From the GPU; across_numa when the device has no sysfs path.
  pci_distance distance = pci_distance::across_numa;
  bool active = false;  //!< some port reports ACTIVE
};

//! Where a GPU sits, and its RDMA devices, nearest first.
struct gpu_topology {
  std::string gpu_pci_address;     //!< normalized, e.g. "0000:3b:00.0"
  std::filesystem::path gpu_path;  //!< resolved path under \<sysfs\>/devices
  int gpu_numa_node = -1;          //!< -1 when sysfs does not say
  std::vector<rdma_device_location>
      rdma_devices;  //!< sorted: distance, PCI devices before others, active first, then name

  //! The nearest device, preferring an active one at equal distance.
  [[nodiscard]] const rdma_device_location* nearest() const noexcept {
    return rdma_devices.empty() ? nullptr : &rdma_devices.front();
  }
  //! A few lines for logs and tools.
  [[nodiscard]] std::string to_string() const {
    std::string s = "GPU " + gpu_pci_address + " (NUMA node " + std::to_string(gpu_numa_node) + ")\n";
    if (rdma_devices.empty()) {
      s += "  no RDMA devices in sysfs\n";
    }
    for (const auto& d : rdma_devices) {
      s += "  " + d.name + "  " + (d.pci_address.empty() ? std::string("-") : d.pci_address) + "  NUMA " +
           std::to_string(d.numa_node) + "  " + std::string(rdx::cuda::to_string(d.distance)) +
           (d.active ? "  ACTIVE" : "  not active") + "\n";
    }
    return s;
  }
};

namespace detail {
inline bool is_hex(std::string_view s) noexcept {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
}

//! A PCI function address "dddd:bb:dd.f" (any domain width, any case) in
//! sysfs's form, lowercase with a 4-digit domain; nullopt if it is not one.
inline std::optional<std::string> normalize_pci_address(std::string_view a) {
  const auto c1 = a.find(':');
  const auto c2 = a.find(':', c1 == std::string_view::npos ? 0 : c1 + 1);
  const auto dot = a.find('.', c2 == std::string_view::npos ? 0 : c2 + 1);
  if (c1 == std::string_view::npos || c2 == std::string_view::npos || dot == std::string_view::npos) {
    return std::nullopt;
  }
  const auto dom = a.substr(0, c1);
  const auto bus = a.substr(c1 + 1, c2 - c1 - 1);
  const auto dev = a.substr(c2 + 1, dot - c2 - 1);
  const auto fn = a.substr(dot + 1);
  if (!is_hex(dom) || !is_hex(bus) || !is_hex(dev) || !is_hex(fn) || dom.size() > 8 || bus.size() > 2 ||
      dev.size() > 2 || fn.size() != 1) {
    return std::nullopt;
  }
  const auto num = [](std::string_view h) { return std::strtoul(std::string(h).c_str(), nullptr, 16); };
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04lx:%02lx:%02lx.%lx", num(dom), num(bus), num(dev), num(fn));
  return std::string(buf);
}

inline bool is_pci_address(std::string_view s) {
  auto n = normalize_pci_address(s);
  return n && *n == s;
}

inline std::string read_first_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  if (in) {
    std::getline(in, line);
  }
  return line;
}

inline int read_numa_node(const std::filesystem::path& device_dir) {
  const std::string s = read_first_line(device_dir / "numa_node");
  if (s.empty()) {
    return -1;
  }
  int v = -1;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc{} ? v : -1;
}

//! The chain of a resolved device path below \<sysfs\>/devices: the host bridge
//! ("pci0000:17") followed by each PCI function down to the device.
struct pci_chain {
  std::string host_bridge;
  std::vector<std::string> functions;
};

inline pci_chain chain_of(const std::filesystem::path& resolved, const std::filesystem::path& devices_root) {
  pci_chain c;
  const auto rel = resolved.lexically_relative(devices_root);
  bool first = true;
  for (const auto& part : rel) {
    const std::string p = part.string();
    if (first) {
      c.host_bridge = p;
      first = false;
    } else if (is_pci_address(p)) {
      c.functions.push_back(p);
    }
  }
  return c;
}

inline pci_distance classify(const pci_chain& a, int numa_a, const pci_chain& b, int numa_b) {
  if (!a.host_bridge.empty() && a.host_bridge == b.host_bridge) {
    // Below the host bridge, the last common function is a bridge (root port
    // or switch port) that both hang off: traffic turns there.
    const std::size_t n = std::min(a.functions.size(), b.functions.size());
    std::size_t common = 0;
    while (common < n && a.functions[common] == b.functions[common]) {
      ++common;
    }
    return common > 0 ? pci_distance::same_switch : pci_distance::same_root_complex;
  }
  if (numa_a >= 0 && numa_a == numa_b) {
    return pci_distance::same_numa_node;
  }
  return pci_distance::across_numa;
}

inline std::filesystem::path canonical_or_empty(const std::filesystem::path& p) {
  std::error_code ec;
  auto c = std::filesystem::canonical(p, ec);
  return ec ? std::filesystem::path{} : c;
}

inline bool any_port_active(const std::filesystem::path& ibdev_dir) {
  std::error_code ec;
  return std::ranges::any_of(
      std::filesystem::directory_iterator(ibdev_dir / "ports", ec), [](const auto& port) {
        return read_first_line(port.path() / "state").find("ACTIVE") != std::string::npos;
      });
}
}  // namespace detail

//! Locates a GPU (by PCI address) and ranks every RDMA device in
//! \<sysfs_root\>/class/infiniband by distance from it.
//! @param gpu_pci_address as cudaDeviceGetPCIBusId or nvidia-smi print it
//! @throws rdx::error (invalid_argument) for a malformed address, (no_device)
//!         when the GPU is not under \<sysfs_root\>/bus/pci/devices
[[nodiscard]] inline gpu_topology locate_gpu(std::string_view gpu_pci_address,
                                             const std::filesystem::path& sysfs_root = "/sys") {
  namespace fs = std::filesystem;
  const auto norm = detail::normalize_pci_address(gpu_pci_address);
  if (!norm) {
    rdx::detail::throw_rdx(errc::invalid_argument, "locate_gpu: '" + std::string(gpu_pci_address) +
                                                       "' is not a PCI address (dddd:bb:dd.f)");
  }
  const fs::path devices_root = detail::canonical_or_empty(sysfs_root / "devices");
  gpu_topology t;
  t.gpu_pci_address = *norm;
  t.gpu_path = detail::canonical_or_empty(sysfs_root / "bus" / "pci" / "devices" / *norm);
  if (t.gpu_path.empty()) {
    rdx::detail::throw_rdx(
        errc::no_device,
        "locate_gpu: " + (sysfs_root / "bus/pci/devices" / *norm).string() + " does not exist");
  }
  t.gpu_numa_node = detail::read_numa_node(t.gpu_path);
  const auto gpu_chain = detail::chain_of(t.gpu_path, devices_root);

  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(sysfs_root / "class" / "infiniband", ec)) {
    rdma_device_location d;
    d.name = entry.path().filename().string();
    d.active = detail::any_port_active(entry.path());
    d.device_path = detail::canonical_or_empty(entry.path() / "device");
    if (!d.device_path.empty()) {
      const auto name = d.device_path.filename().string();
      if (detail::is_pci_address(name)) {
        d.pci_address = name;
      }
      d.numa_node = detail::read_numa_node(d.device_path);
      d.distance = detail::classify(gpu_chain, t.gpu_numa_node, detail::chain_of(d.device_path, devices_root),
                                    d.numa_node);
    }
    t.rdma_devices.push_back(std::move(d));
  }
  std::sort(t.rdma_devices.begin(), t.rdma_devices.end(), [](const auto& a, const auto& b) {
    if (a.distance != b.distance) {
      return a.distance < b.distance;
    }
    if (a.pci_address.empty() != b.pci_address.empty()) {
      return b.pci_address.empty();
    }
    if (a.active != b.active) {
      return a.active;
    }
    return a.name < b.name;
  });
  return t;
}

//! The RDMA device to use with a GPU: RDX_DEVICE when set (the user's
//! override), else the nearest one; nullopt when sysfs lists none.
[[nodiscard]] inline std::optional<std::string> rdma_device_for_gpu(
    std::string_view gpu_pci_address, const std::filesystem::path& sysfs_root = "/sys") {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read at set-up; rdx never sets the environment
  if (const char* env = std::getenv("RDX_DEVICE"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  const auto t = locate_gpu(gpu_pci_address, sysfs_root);
  if (const auto* n = t.nearest()) {
    return n->name;
  }
  return std::nullopt;
}

#if RDX_HAS_CUDA()
//! The PCI address of a CUDA device, in sysfs's form ("0000:3b:00.0").
[[nodiscard]] inline std::string pci_address_of(int cuda_device) {
  char buf[64] = {};
  RDX_CUDA_TRY(cudaDeviceGetPCIBusId(buf, static_cast<int>(sizeof buf), cuda_device));
  const auto n = detail::normalize_pci_address(buf);
  if (!n) {
    rdx::detail::throw_rdx(errc::unsupported, std::string("cudaDeviceGetPCIBusId returned '") + buf + "'");
  }
  return *n;
}

//! locate_gpu for a CUDA device ordinal.
[[nodiscard]] inline gpu_topology locate_gpu(int cuda_device,
                                             const std::filesystem::path& sysfs_root = "/sys") {
  return locate_gpu(pci_address_of(cuda_device), sysfs_root);
}

//! rdma_device_for_gpu for a CUDA device ordinal.
[[nodiscard]] inline std::optional<std::string> rdma_device_for_gpu(
    int cuda_device, const std::filesystem::path& sysfs_root = "/sys") {
  return rdma_device_for_gpu(pci_address_of(cuda_device), sysfs_root);
}
#endif

}  // namespace rdx::cuda
