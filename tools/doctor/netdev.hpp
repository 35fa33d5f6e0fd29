// rdx-doctor: what the network interfaces say about a port: the interface
// its GIDs are bound to, its subnet and its MTU.
#pragma once

#include <rdx/rdx.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

namespace doctor {

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

inline int netdev_mtu(const std::string& nd) {
  if (nd.empty()) return 0;
  const std::int64_t v = rdx::detail::read_number_file(("/sys/class/net/" + nd + "/mtu").c_str());
  return v < 0 ? 0 : static_cast<int>(v);
}

}  // namespace doctor
