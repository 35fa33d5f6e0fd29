// The device's object counts and registered bytes as the kernel reports
// them, through iproute2's `rdma resource show` (one line per device:
// "0: rxe0: pd 1 cq 2 qp 64 cm_id 0 mr 257 ctx 0 srq 0") and `rdma resource
// show mr` (one line per memory region, its length after "mrlen").
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace device_count {

struct counts {
  long cq = -1, qp = -1, mr = -1, srq = -1;
  long long mr_bytes = -1;  // the lengths of every memory region of the device, summed
  [[nodiscard]] bool known() const noexcept { return cq >= 0 && mr >= 0 && mr_bytes >= 0; }
};

inline counts read() {
  counts c;
  char line[1024];
  if (std::FILE* f = ::popen("rdma resource show 2>/dev/null", "r")) {
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::strstr(line, "rxe") == nullptr && std::strstr(line, "mlx") == nullptr) continue;
      auto field = [&](const char* name) -> long {
        const std::string key = std::string(" ") + name + " ";
        const char* at = std::strstr(line, key.c_str());
        return at != nullptr ? std::strtol(at + key.size(), nullptr, 10) : -1;
      };
      c.cq = field("cq");
      c.qp = field("qp");
      c.mr = field("mr");
      c.srq = field("srq");
      break;
    }
    ::pclose(f);
  }
  if (std::FILE* f = ::popen("rdma resource show mr 2>/dev/null", "r")) {
    long long sum = 0;
    bool any = false;
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (const char* at = std::strstr(line, " mrlen ")) {
        sum += std::strtoll(at + 7, nullptr, 10);
        any = true;
      }
    }
    ::pclose(f);
    if (any || c.mr == 0) c.mr_bytes = sum;
  }
  return c;
}

}  // namespace device_count
