// rdx-doctor: the checks of one host. Each adds findings with their fixes;
// none throws (a failed query is itself a finding).
#pragma once

#include <rdx/rdx.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "report.hpp"
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

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

//! What the local checks look at.
struct scope {
  std::string device;                        //!< -d: only this device
  int port = 0;                              //!< -i: only this port
  std::uint64_t memlock_need = 64ull << 20;  //!< a typical registration, bytes
};

inline std::string mib(std::uint64_t b) {
  return rdx::detail::bytes_text(b);
}

//! The network interface a port's GIDs are bound to ("" when none).
inline std::string netdev_of(const std::vector<rdx::gid_entry>& table) {
  for (const auto& e : table) {
    char name[IF_NAMESIZE] = {};
    if (e.ndev_ifindex != 0 && ::if_indextoname(e.ndev_ifindex, name) != nullptr) return name;
  }
  return {};
}

//! The IPv4 subnet ("10.77.0.0/24") of the interface holding addr, or "".
inline std::string ipv4_subnet(const in_addr& addr) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_netmask == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const auto* ip = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    const auto* mask = reinterpret_cast<const sockaddr_in*>(a->ifa_netmask);
    if (ip->sin_addr.s_addr != addr.s_addr) continue;
    in_addr net{ip->sin_addr.s_addr & mask->sin_addr.s_addr};
    char b[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &net, b, sizeof b);
    out = std::string(b) + "/" + std::to_string(__builtin_popcount(mask->sin_addr.s_addr));
    break;
  }
  ::freeifaddrs(list);
  return out;
}

//! The subnet a GID is on: IPv4 from the interface, else the IPv6 /64 prefix.
inline std::string gid_subnet(const ibv_gid& g) {
  if (rdx::gid_is_ipv4_mapped(g)) {
    in_addr a{};
    std::memcpy(&a, g.raw + 12, 4);
    return ipv4_subnet(a);
  }
  char b[INET6_ADDRSTRLEN] = {};
  unsigned char prefix[16] = {};
  std::memcpy(prefix, g.raw, 8);
  ::inet_ntop(AF_INET6, prefix, b, sizeof b);
  return std::string(b) + "/64";
}

//! The devices this run looks at (all, or -d's).
inline std::vector<std::string> devices_in_scope(const scope& s, const rdx::device_list& list) {
  std::vector<std::string> out;
  for (ibv_device* d : list) {
    std::string n(rdx::device_name(d));
    if (s.device.empty() || s.device == n) out.push_back(n);
  }
  return out;
}

inline void check_devices(report& r, const scope& s) {
  std::optional<rdx::device_list> list;
  try {
    list.emplace();
  } catch (const rdx::error& e) {
    r.add("devices", "libibverbs", level::error, e.what(),
          "install rdma-core's providers (apt-get install ibverbs-providers) and check the kernel's RDMA "
          "modules");
    return;
  }
  if (list->empty()) {
    struct stat st {};
    const bool sys = ::stat("/sys/class/infiniband", &st) == 0;
    const bool dev = ::stat("/dev/infiniband", &st) == 0;
    bool registered = false;
    if (DIR* d = sys ? ::opendir("/sys/class/infiniband") : nullptr) {
      while (dirent* e = ::readdir(d)) registered = registered || e->d_name[0] != '.';
      ::closedir(d);
    }
    const bool rxe = ::stat("/sys/module/rdma_rxe", &st) == 0;
    const std::string soft = "for Soft-RoCE: " + std::string(rxe ? "" : "modprobe rdma_rxe && ") +
                             "rdma link add rxe0 type rxe netdev eth0 (your interface)";
    std::string why, fix;
    if (!sys) {
      why = "no kernel RDMA driver is loaded (/sys/class/infiniband is absent)";
      fix = "load your NIC's RDMA driver (modprobe mlx5_ib, irdma, bnxt_re ...), or " + soft;
    } else if (!registered) {
      why = std::string("the RDMA core is loaded but no device is registered with it") +
            (rxe ? " (rdma_rxe is loaded, with no rxe link)" : "");
      fix = "load the NIC's RDMA driver (modprobe mlx5_ib, irdma, bnxt_re ...), or " + soft;
    } else if (!dev) {
      why =
          "the kernel has devices but /dev/infiniband is absent (a container without the devices passed in?)";
      fix =
          "pass the devices into the container (docker run --device /dev/infiniband ...) or load ib_uverbs "
          "(modprobe ib_uverbs)";
    } else {
      why = "the kernel lists devices but libibverbs has no provider for them";
      fix = "install the provider library (apt-get install ibverbs-providers)";
    }
    r.add("devices", "host", level::error, "no RDMA device: " + why, fix);
    return;
  }
  std::vector<std::string> names = devices_in_scope(s, *list);
  if (names.empty()) {
    r.add("devices", s.device, level::error,
          "no RDMA device called " + s.device + " (present: " + list->names() + ")",
          "name one of the devices present with -d");
    return;
  }
  for (const std::string& n : names) {
    try {
      rdx::context ctx = rdx::context::open(n);
      rdx::device_attributes a = ctx.query_device();
      char vendor[32];
      std::snprintf(vendor, sizeof vendor, "0x%x:0x%x", a.vendor_id, a.vendor_part_id);
      r.add("devices", n, level::ok,
            "opened; firmware " + (a.fw_ver.empty() ? std::string("-") : a.fw_ver) + ", vendor " + vendor +
                ", " + std::to_string(a.phys_port_cnt) + " port" + (a.phys_port_cnt == 1 ? "" : "s") +
                ", largest registration " +
                (a.max_mr_size >= (1ull << 60) ? std::string("unlimited") : mib(a.max_mr_size)),
            {},
            {{"firmware", a.fw_ver},
             {"vendor", vendor},
             {"ports", std::to_string(a.phys_port_cnt)},
             {"max_qp", std::to_string(a.max_qp)},
             {"max_mr_size", std::to_string(a.max_mr_size)}});
    } catch (const rdx::error& e) {
      r.add("devices", n, level::error, e.what(),
            "check that the driver is loaded (rdma link show) and /dev/infiniband/uverbs* is readable");
    }
  }
}

//! Walks the active ports in scope: f(ctx, port attributes, GID table).
template <class F>
void for_each_port(report& r, const scope& s, const char* check, F&& f) {
  std::optional<rdx::device_list> list;
  try {
    list.emplace();
  } catch (const rdx::error&) {
    return;
  }
  for (const std::string& n : devices_in_scope(s, *list)) {
    try {
      rdx::context ctx = rdx::context::open(n);
      for (std::uint8_t p = 1; p <= ctx.port_count(); ++p) {
        if (s.port != 0 && p != s.port) continue;
        rdx::port_attributes pa = ctx.query_port(p);
        f(ctx, pa, rdx::gid_table(ctx, p));
      }
    } catch (const rdx::error& e) {
      r.add(check, n, level::error, e.what(), "see the devices check");
    }
  }
}

inline std::string port_name(const rdx::context& ctx, const rdx::port_attributes& pa) {
  return ctx.name() + " port " + std::to_string(pa.port);
}

inline void check_ports(report& r, const scope& s) {
  for_each_port(
      r, s, "ports", [&](const rdx::context& ctx, const rdx::port_attributes& pa, const auto& table) {
        const std::string nd = netdev_of(table);
        const std::string ll = pa.is_ethernet() ? "Ethernet (RoCE)" : "InfiniBand";
        std::vector<std::pair<std::string, std::string>> facts = {
            {"state", std::string(rdx::to_string(pa.state))},
            {"link_layer", pa.is_ethernet() ? "ethernet" : "infiniband"},
            {"netdev", nd},
            {"lid", std::to_string(pa.lid)}};
        std::string what =
            std::string(rdx::to_string(pa.state)) + ", " + ll + (nd.empty() ? "" : " on " + nd);
        if (pa.active()) {
          if (!pa.is_ethernet() && pa.lid == 0) {
            r.add("ports", port_name(ctx, pa), level::error,
                  what + ", but LID 0: no subnet manager has configured it",
                  "run a subnet manager on the fabric (opensm, or the switch's)", facts);
            return;
          }
          r.add("ports", port_name(ctx, pa), level::ok, what, {}, facts);
          return;
        }
        std::string fix = pa.is_ethernet()
                              ? "bring the link up: ip link set dev " +
                                    (nd.empty() ? std::string("<netdev>") : nd) +
                                    " up; check the cable and the switch port"
                              : "check the cable, the switch port and that a subnet manager runs (opensm)";
        r.add("ports", port_name(ctx, pa), level::error, what + ": queue pairs on it cannot connect", fix,
              facts);
      });
}

inline void check_gid(report& r, const scope& s) {
  for_each_port(r, s, "gid", [&](const rdx::context& ctx, const rdx::port_attributes& pa, const auto& table) {
    if (!pa.active()) return;
    const std::string who = port_name(ctx, pa);
    std::string lines;
    std::vector<std::pair<std::string, std::string>> facts;
    for (const rdx::gid_entry& e : table) {
      lines += (lines.empty() ? "" : "; ") + std::to_string(e.index) + " " +
               std::string(rdx::to_string(e.type)) + " " + rdx::to_string(e.gid);
      facts.emplace_back("gid_" + std::to_string(e.index),
                         std::string(rdx::to_string(e.type)) + " " + rdx::to_string(e.gid));
    }
    if (!pa.is_ethernet()) {
      r.add("gid", who, level::ok, "InfiniBand: rdx addresses the port by LID " + std::to_string(pa.lid), {},
            facts);
      return;
    }
    const char* forced = std::getenv("RDX_GID_INDEX");
    try {
      rdx::gid_choice c = rdx::select_gid(ctx, pa.port);
      facts.emplace_back("chosen_index", std::to_string(c.index));
      facts.emplace_back("chosen_type", std::string(rdx::to_string(c.type)));
      facts.emplace_back("chosen_gid", rdx::to_string(c.gid));
      facts.emplace_back("table", lines);
      const bool link_local = rdx::gid_is_link_local(c.gid);
      if (forced != nullptr && (link_local || c.type != rdx::gid_type::roce_v2)) {
        // What rdx would choose without the override.
        std::string better;
        {
          const std::string keep = forced;
          ::unsetenv("RDX_GID_INDEX");
          try {
            better = rdx::select_gid(ctx, pa.port).reason;
          } catch (const rdx::error&) {}
          ::setenv("RDX_GID_INDEX", keep.c_str(), 1);
        }
        std::string why = link_local
                              ? "a link-local GID (fe80::/10): it is not routable, and a peer that uses "
                                "its IPv4 or global GID is on another subnet, so connections fail or "
                                "time out at RTR"
                              : "a RoCE v1 GID: RoCE v1 is not routable (one L2 segment only) and a "
                                "RoCE v2 peer cannot talk to it";
        r.add("gid", who, level::error,
              "RDX_GID_INDEX=" + std::string(forced) + " selects " + c.reason + "; " + why,
              "unset RDX_GID_INDEX" +
                  (better.empty() ? std::string() : " (rdx then chooses " + better + ")") +
                  ", or set it to a RoCE v2 IPv4-mapped entry",
              facts);
        return;
      }
      r.add("gid", who, level::ok, "rdx uses " + c.reason + " (table: " + lines + ")", {}, facts);
    } catch (const rdx::error& e) {
      r.add(
          "gid", who, level::error, e.what(),
          "give the interface an IPv4 or global IPv6 address (ip addr add 10.0.0.1/24 dev <netdev>): RoCE v2 "
          "GIDs follow the interface's addresses",
          facts);
    }
  });
}

inline int netdev_mtu(const std::string& nd) {
  if (nd.empty()) return 0;
  const std::int64_t v = rdx::detail::read_number_file(("/sys/class/net/" + nd + "/mtu").c_str());
  return v < 0 ? 0 : static_cast<int>(v);
}

inline void check_mtu(report& r, const scope& s) {
  for_each_port(r, s, "mtu", [&](const rdx::context& ctx, const rdx::port_attributes& pa, const auto& table) {
    if (!pa.active()) return;
    const int active = rdx::mtu_bytes(pa.active_mtu);
    const int max = rdx::mtu_bytes(pa.max_mtu);
    const std::string nd = netdev_of(table);
    const int ndm = netdev_mtu(nd);
    std::vector<std::pair<std::string, std::string>> facts = {{"active_mtu", std::to_string(active)},
                                                              {"max_mtu", std::to_string(max)},
                                                              {"netdev_mtu", std::to_string(ndm)}};
    std::string what = "active MTU " + std::to_string(active) + " (port maximum " + std::to_string(max) + ")";
    if (ndm > 0) what += ", from " + nd + "'s MTU " + std::to_string(ndm);
    if (active < 1024) {
      r.add("mtu", port_name(ctx, pa), level::warning,
            what + ": every message travels in packets of " + std::to_string(active) +
                " bytes, and a peer with a larger MTU uses this one (rdx takes the smaller of both)",
            "raise the interface's MTU on every host of the fabric (ip link set dev " +
                (nd.empty() ? std::string("<netdev>") : nd) + " mtu 1500, or 9000 for RoCE MTU 4096)",
            facts);
      return;
    }
    if (pa.is_ethernet() && active < max)
      what += "; a netdev MTU of 9000 on every host gives 4096 (fewer packets per message)";
    r.add("mtu", port_name(ctx, pa), level::ok, what, {}, facts);
  });
}

//! Whether this process holds CAP_IPC_LOCK (registrations are then not limited).
inline bool has_ipc_lock() {
  std::ifstream f("/proc/self/status");
  for (std::string l; std::getline(f, l);) {
    if (l.rfind("CapEff:", 0) == 0) {
      const unsigned long long caps = std::strtoull(l.c_str() + 7, nullptr, 16);
      return (caps >> 14) & 1;  // CAP_IPC_LOCK is capability 14
    }
  }
  return false;
}

inline void check_memlock(report& r, const scope& s) {
  rlimit l{};
  if (::getrlimit(RLIMIT_MEMLOCK, &l) != 0) {
    r.add("memlock", "process", level::error,
          std::string("getrlimit(RLIMIT_MEMLOCK): ") + std::strerror(errno));
    return;
  }
  const bool unlimited = l.rlim_cur == RLIM_INFINITY;
  const bool cap = has_ipc_lock();
  const std::string lim = unlimited ? "unlimited" : mib(l.rlim_cur);
  std::vector<std::pair<std::string, std::string>> facts = {
      {"limit_bytes", unlimited ? "unlimited" : std::to_string(l.rlim_cur)},
      {"hard_limit_bytes", l.rlim_max == RLIM_INFINITY ? "unlimited" : std::to_string(l.rlim_max)},
      {"cap_ipc_lock", cap ? "yes" : "no"},
      {"typical_registration_bytes", std::to_string(s.memlock_need)}};
  if (unlimited || cap) {
    r.add("memlock", "process", level::ok,
          "locked-memory limit " + lim + (cap ? " and CAP_IPC_LOCK held: registrations are not limited" : ""),
          {}, facts);
    return;
  }
  const std::string fix =
      "raise the limit: ulimit -l unlimited (shell), LimitMEMLOCK=infinity (systemd unit), docker run "
      "--ulimit memlock=-1, or a memlock line in /etc/security/limits.conf; or grant CAP_IPC_LOCK";
  if (l.rlim_cur < s.memlock_need) {
    r.add("memlock", "process", level::error,
          "locked-memory limit (ulimit -l) is " + lim + " without CAP_IPC_LOCK: a registration of " +
              mib(s.memlock_need) +
              " fails with ENOMEM (\"Cannot allocate memory\"), since every registered byte "
              "is pinned",
          fix, facts);
    return;
  }
  r.add("memlock", "process", level::warning,
        "locked-memory limit is " + lim + ": registrations past it in all fail with ENOMEM", fix, facts);
}

// What rdx::page_allocation itself reads: the 2 MiB pool and THP's mode.
inline void check_hugepages(report& r, const scope&) {
  const rdx::detail::huge_pool pool = rdx::detail::read_huge_pool();
  const std::int64_t total = std::max<std::int64_t>(pool.total, 0),
                     free = std::max<std::int64_t>(pool.free, 0);
  const std::size_t size_kb = rdx::detail::huge_page_size / 1024;
  std::string mode = rdx::detail::thp_mode();
  if (mode.empty()) mode = "absent";
  std::vector<std::pair<std::string, std::string>> facts = {{"hugepages_total", std::to_string(total)},
                                                            {"hugepages_free", std::to_string(free)},
                                                            {"hugepage_kb", std::to_string(size_kb)},
                                                            {"thp", mode}};
  const std::string what = std::to_string(total) + " huge pages of " + std::to_string(size_kb) +
                           " KiB reserved (" + std::to_string(free) + " free), transparent huge pages " +
                           mode;
  if (total == 0 && mode == "never") {
    r.add("hugepages", "host", level::warning,
          what + ": registered buffers use 4 KiB pages, and registering them takes about twice as long",
          "reserve huge pages (echo 512 > /proc/sys/vm/nr_hugepages) or enable THP (echo madvise > "
          "/sys/kernel/mm/transparent_hugepage/enabled)",
          facts);
    return;
  }
  r.add("hugepages", "host", level::ok,
        what + (total > 0 ? ": rdx::page_allocation uses them" : ": rdx::page_allocation uses THP"), {},
        facts);
}

inline void check_fork(report& r, const scope&) {
  const ibv_fork_status st = ::ibv_is_fork_initialized();
  const char* env = std::getenv("RDMAV_FORK_SAFE");
  const char* env2 = std::getenv("IBV_FORK_SAFE");
  const std::string state = st == IBV_FORK_UNNEEDED  ? "unneeded"
                            : st == IBV_FORK_ENABLED ? "enabled"
                                                     : "disabled";
  std::vector<std::pair<std::string, std::string>> facts = {
      {"fork_support", state}, {"RDMAV_FORK_SAFE", env ? env : ""}, {"IBV_FORK_SAFE", env2 ? env2 : ""}};
  if (st == IBV_FORK_DISABLED) {
    r.add(
        "fork", "process", level::warning,
        "the kernel does not keep registered pages in the parent across fork() and fork protection is off: a "
        "child that touches registered memory corrupts what the NIC sees",
        "set RDMAV_FORK_SAFE=1 before the program starts, or avoid fork() after registering (use "
        "posix_spawn)",
        facts);
    return;
  }
  r.add("fork", "process", level::ok,
        st == IBV_FORK_UNNEEDED
            ? "the kernel copies registered pages safely on fork() (no fork protection needed)"
            : "fork protection is on (ibv_fork_init or RDMAV_FORK_SAFE)",
        {}, facts);
}

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
