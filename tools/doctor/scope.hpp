// rdx-doctor: what the local checks look at (-d, -i) and the walk over the
// devices and ports in that scope.
#pragma once

#include <rdx/rdx.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "report.hpp"

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

//! The devices this run looks at (all, or -d's).
inline std::vector<std::string> devices_in_scope(const scope& s, const rdx::device_list& list) {
  std::vector<std::string> out;
  for (ibv_device* d : list) {
    std::string n(rdx::device_name(d));
    if (s.device.empty() || s.device == n) out.push_back(n);
  }
  return out;
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

}  // namespace doctor
