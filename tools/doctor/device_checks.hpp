// rdx-doctor: the devices check: RDMA devices present and opening, and when
// none is, which layer is missing (driver, /dev/infiniband, provider).
#pragma once

#include <rdx/rdx.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "report.hpp"
#include "scope.hpp"
#include <dirent.h>
#include <sys/stat.h>

namespace doctor {

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

}  // namespace doctor
