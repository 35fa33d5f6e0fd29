// rdx-doctor: the checks of memory and process limits: locked memory, huge
// pages and fork safety of registered memory.
#pragma once

#include <rdx/rdx.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "report.hpp"
#include "scope.hpp"
#include <sys/resource.h>

namespace doctor {

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

}  // namespace doctor
