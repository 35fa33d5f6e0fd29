// rdx test support: faults forced from inside a test program, at the verbs
// level and on the local link. Not part of the library (nothing under
// include/rdx/ includes it): it reaches a connection's queue pairs through
// connection::qp(i) and moves them behind the engine's back, as a broken NIC
// or a peer's bug would.
//
//   force_error(conn, i)       queue pair i of conn to ERR: posted work flushes
//                              and the connection fails on the first error
//                              completion; the peer's work to it is never
//                              acknowledged and ends with retry exceeded.
//   freeze_sends(conn, i)      queue pair i of conn to SQD (send queue drained):
//                              requests posted after it are neither executed
//                              nor failed, as a NIC that stopped answering.
//   set_link(ifname, up)       the interface up or down at once (SIOCSIFFLAGS,
//                              no program started: exact timing under TCG).
//   kill_at                    SIGKILL to this process when an operation count
//                              reaches a chosen value.
//   rxe_counters(device)       the device's hw_counters (Soft-RoCE: rxe0),
//                              for deltas of retransmissions and sequence errors.
#pragma once

#include <rdx/channel/connection.hpp>

#include <infiniband/verbs.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <system_error>

#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

namespace rdx_test {

//! Moves queue pair i of c to the error state with ibv_modify_qp, without
//! the connection knowing. @throws std::system_error when the verb fails.
inline void force_error(rdx::connection& c, std::size_t i) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (int rc = ::ibv_modify_qp(c.qp(i).native_handle(), &a, IBV_QP_STATE); rc != 0) {
    throw std::system_error(rc, std::generic_category(), "force_error: ibv_modify_qp(ERR)");
  }
}

//! Moves queue pair i of c to SQD, without the connection knowing: the NIC
//! finishes what it had started and leaves later requests posted, never
//! completing or failing them. @throws std::system_error when the verb fails
//! (a provider without SQD).
inline void freeze_sends(rdx::connection& c, std::size_t i) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_SQD;
  if (int rc = ::ibv_modify_qp(c.qp(i).native_handle(), &a, IBV_QP_STATE); rc != 0) {
    throw std::system_error(rc, std::generic_category(), "freeze_sends: ibv_modify_qp(SQD)");
  }
}

//! Takes interface ifname up or down (needs CAP_NET_ADMIN: root in the VMs).
//! @throws std::system_error when the ioctl fails.
inline void set_link(const std::string& ifname, bool up) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "set_link: socket");
  ifreq r{};
  std::strncpy(r.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  int rc = ::ioctl(fd, SIOCGIFFLAGS, &r);
  if (rc == 0) {
    if (up) {
      r.ifr_flags = static_cast<short>(r.ifr_flags | IFF_UP);
    } else {
      r.ifr_flags = static_cast<short>(r.ifr_flags & ~IFF_UP);
    }
    rc = ::ioctl(fd, SIOCSIFFLAGS, &r);
  }
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw std::system_error(err, std::generic_category(), "set_link " + ifname);
}

//! Kills this process (SIGKILL: no destructor, no teardown, as a crash) when
//! tick() has been called `at` times; at == 0 never does.
class kill_at {
public:
  explicit kill_at(std::uint64_t at) noexcept : at_(at) {}
  //! Counts one operation; the at-th call does not return.
  void tick() noexcept {
    if (at_ != 0 && ++count_ == at_) ::raise(SIGKILL);
  }
  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }

private:
  std::uint64_t at_;
  std::uint64_t count_ = 0;
};

//! The hw_counters of port 1 of an RDMA device, by name (empty when the
//! device has none, as on hardware whose driver keeps them elsewhere).
inline std::map<std::string, std::uint64_t> rxe_counters(const std::string& device) {
  std::map<std::string, std::uint64_t> out;
  const std::filesystem::path dir = "/sys/class/infiniband/" + device + "/ports/1/hw_counters";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::ifstream f(e.path());
    std::uint64_t v = 0;
    if (f >> v) out[e.path().filename().string()] = v;
  }
  return out;
}

}  // namespace rdx_test
