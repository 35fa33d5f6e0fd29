// rdx::detail: socket addresses in words, shared by the TCP bootstrap and
// rdma_cm, so both name a peer the same way in their errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace rdx::detail {

//! "10.77.0.2:7471", "[fe80::1]:7471"; an IPv4 client of a dual-stack socket as plain IPv4.
inline std::string address_text(const sockaddr* sa) {
  if (sa == nullptr) {
    return "?";
  }
  char host[INET6_ADDRSTRLEN] = "?";
  unsigned port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    // An IPv4 client of a dual-stack listener: show it as plain IPv4.
    std::string h = host;
    if (h.rfind("::ffff:", 0) == 0 && h.find('.') != std::string::npos) {
      h = h.substr(7);
    } else {
      h = "[" + h + "]";
    }
    return h + ":" + std::to_string(port);
  }
  return "?";
}

//! host and port as one would type them ("[::1]:7471").
inline std::string host_port(std::string_view host, std::uint16_t port) {
  std::string h(host);
  if (h.find(':') != std::string::npos) {
    h = "[" + h + "]";
  }
  return h + ":" + std::to_string(port);
}

}  // namespace rdx::detail
