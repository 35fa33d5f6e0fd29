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
//   wire_cut                   every packet the interface sends dropped (netem
//                              loss 100%) for a while, timed from the program's
//                              own clock, and the packets the cut dropped.
#pragma once

#include <rdx/channel/connection.hpp>

#include <infiniband/verbs.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

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

//! A wire cut from inside the program: start(after, span) cuts the wire
//! `after` from the call, netem loss 100% on ifname's egress for `span`,
//! then removes the qdisc. One `tc -s -batch` process, started at
//! construction (construct before the traffic starts: under TCG a program
//! starting beside a busy one takes seconds), takes every command, so the
//! outage lasts span to within a few ms, and it is timed from when the
//! program's traffic runs, not from when a script started it. After join():
//! dropped(), the packets netem took off the wire (its qdisc's drop count,
//! -1 when tc failed or printed none), lasted() and tc_status(). Needs root
//! and sch_netem.
class wire_cut {
public:
  explicit wire_cut(std::string ifname) : ifname_(std::move(ifname)) {
    char path[] = "/tmp/rdx-wire-cut.XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "wire_cut: mkstemp");
    ::close(fd);
    out_ = path;
    const std::string cmd = "exec tc -s -force -batch - >" + out_ + " 2>&1";
    tc_ = ::popen(cmd.c_str(), "w");
    if (tc_ == nullptr) throw std::system_error(errno, std::generic_category(), "wire_cut: popen tc");
    // A first command, and its answer awaited: tc is loaded and reading
    // when this returns, so the cut's commands take effect when written.
    std::fprintf(tc_, "qdisc show dev %s\n", ifname_.c_str());
    std::fflush(tc_);
    if (!await_shows(1, std::chrono::seconds(60))) {
      (void)::pclose(std::exchange(tc_, nullptr));
      const std::string said = output();
      ::unlink(out_.c_str());
      throw std::runtime_error("wire_cut: tc did not answer within 60 s: " + said);
    }
  }
  //! Cuts the wire after `after`, for `span`, in a thread of its own; a
  //! cut that dropped no packet (it met no traffic: the peer or this VM was
  //! stalled) is made again `gap` later, up to `attempts` cuts in all, each
  //! of `span`, so that each stays as short as asked.
  void start(std::chrono::milliseconds after, std::chrono::milliseconds span, int attempts = 1,
             std::chrono::milliseconds gap = std::chrono::milliseconds(400)) {
    const std::string ifname = ifname_;
    thread_ = std::thread([this, ifname, after, span, attempts, gap] {
      // Each step is confirmed by a show whose answer is awaited: a busy
      // single-CPU guest can leave tc unscheduled for longer than the cut,
      // and commands it then ran back to back would cut nothing. So the
      // wire is cut for at least span, timed from the confirmed start.
      // Shows: one by the constructor, then three a cut (netem on; just
      // before it comes off, with its drop count; off).
      std::this_thread::sleep_for(after);
      for (int i = 0; i < attempts; ++i) {
        if (i > 0) std::this_thread::sleep_for(gap);
        const auto shown = static_cast<std::size_t>(1 + 3 * i);
        std::fprintf(tc_, "qdisc replace dev %s root netem loss 100%%\nqdisc show dev %s\n", ifname.c_str(),
                     ifname.c_str());
        std::fflush(tc_);
        (void)await_shows(shown + 1, std::chrono::seconds(30));
        start_ = std::chrono::steady_clock::now();
        std::this_thread::sleep_for(span);
        std::fprintf(tc_, "qdisc show dev %s\nqdisc del dev %s root\nqdisc show dev %s\n", ifname.c_str(),
                     ifname.c_str(), ifname.c_str());
        std::fflush(tc_);
        const bool answered = await_shows(shown + 3, std::chrono::seconds(30));
        end_ = std::chrono::steady_clock::now();
        cuts_ = i + 1;
        const std::vector<long long> counts = drop_counts();
        dropped_ = answered && counts.size() > shown + 1 ? counts[shown + 1] : -1;
        if (!answered || dropped_ != 0) {
          break;
        }
      }
      tc_status_ = ::pclose(std::exchange(tc_, nullptr));
      if (tc_status_ != 0) {
        dropped_ = -1;
      }
    });
  }
  wire_cut(const wire_cut&) = delete;
  wire_cut& operator=(const wire_cut&) = delete;
  ~wire_cut() {
    join();
    if (tc_ != nullptr) (void)::pclose(tc_);  // never started: tc ends at end of input
    ::unlink(out_.c_str());
  }
  //! Waits for the cut to end (the wire is clean again after it).
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  //! Cuts made, after join(): the last is the one reported.
  [[nodiscard]] int cuts() const noexcept { return cuts_; }
  //! Packets the last cut dropped, after join(); -1 when tc failed or printed no count.
  [[nodiscard]] long long dropped() const noexcept { return dropped_; }
  //! What tc printed: a show before the first cut, then for each cut one
  //! after netem went on, one before it came off and one after.
  [[nodiscard]] std::string output() const {
    std::ifstream in(out_);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  //! tc's exit status (pclose), after join().
  [[nodiscard]] int tc_status() const noexcept { return tc_status_; }
  //! How long the last cut lasted at most (from the confirmed start to the
  //! confirmed end; at least span), after join().
  [[nodiscard]] std::chrono::milliseconds lasted() const noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(end_ - start_);
  }

private:
  // The drop counts of every show tc answered so far, in order.
  [[nodiscard]] std::vector<long long> drop_counts() const {
    std::istringstream in(output());
    std::string line;
    std::vector<long long> n;
    while (std::getline(in, line)) {
      const auto at = line.find("(dropped ");
      if (at != std::string::npos) n.push_back(std::atoll(line.c_str() + at + 9));
    }
    return n;
  }
  // Waits until tc has answered n shows; false when it has not within limit.
  [[nodiscard]] bool await_shows(std::size_t n, std::chrono::seconds limit) const {
    const auto give_up = std::chrono::steady_clock::now() + limit;
    while (drop_counts().size() < n) {
      if (std::chrono::steady_clock::now() > give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }
  std::string ifname_;
  std::string out_;
  std::FILE* tc_ = nullptr;
  std::thread thread_;
  std::chrono::steady_clock::time_point start_{}, end_{};
  long long dropped_ = -1;  // written by the thread, read after join()
  int cuts_ = 0;
  int tc_status_ = 0;
};

}  // namespace rdx_test
