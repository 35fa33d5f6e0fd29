// rdx-doctor --peer HOST / --serve: both sides' settings compared, then a
// real connection with a checked transfer in each direction. Each step is a
// finding; the first failure names the step, what it tried and the likely
// cause, and the remaining steps are not run.
#pragma once

#include <rdx/rdx.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "netdev.hpp"
#include "report.hpp"
#include <arpa/inet.h>
#include <sys/utsname.h>

namespace doctor {

//! How the peer check runs.
struct peer_scope {
  std::string host;  //!< client: the peer running --serve
  std::uint16_t tcp_port = 18520;
  std::chrono::milliseconds timeout{10000};
  std::size_t bytes = 64 * 1024;  //!< checked transfer each way
};

using facts_map = std::map<std::string, std::string>;

//! This side's settings, as the hello carries them.
inline facts_map local_settings(const rdx::context& ctx, std::uint8_t port, const report& local) {
  facts_map m;
  utsname u{};
  ::uname(&u);
  m["host"] = u.nodename;
  m["kernel"] = u.release;
  m["device"] = ctx.name();
  m["port"] = std::to_string(port);
  rdx::port_attributes pa = ctx.query_port(port);
  m["link_layer"] = pa.is_ethernet() ? "ethernet" : "infiniband";
  m["active_mtu"] = std::to_string(rdx::mtu_bytes(pa.active_mtu));
  const auto table = rdx::gid_table(ctx, port);
  m["netdev_mtu"] = std::to_string(netdev_mtu(netdev_of(table)));
  try {
    rdx::gid_choice c = rdx::select_gid(ctx, port);
    m["gid_index"] = std::to_string(c.index);
    m["gid"] = rdx::to_string(c.gid);
    m["gid_type"] = std::string(rdx::to_string(c.type));
    m["gid_link_local"] = rdx::gid_is_link_local(c.gid) ? "yes" : "no";
    m["subnet"] = pa.is_ethernet() ? gid_subnet(c.gid) : "lid";
  } catch (const rdx::error& e) {
    m["gid_error"] = e.what();
  }
  const rdx::connect_options o{};
  m["timeout"] = std::to_string(o.timeout);
  m["retry_cnt"] = std::to_string(o.retry_cnt);
  m["rnr_retry"] = std::to_string(o.rnr_retry);
  m["min_rnr_timer"] = std::to_string(o.min_rnr_timer);
  m["psn"] = "random 24-bit per queue pair";
  m["local_errors"] = std::to_string(local.count(level::error));
  m["local_warnings"] = std::to_string(local.count(level::warning));
  return m;
}

namespace detail {
constexpr std::uint32_t hello_magic = 0x52445844;  // "RDXD"

inline void send_hello(const rdx::tcp::socket& s, const facts_map& m, rdx::tcp::clock::time_point deadline) {
  std::string text;
  for (const auto& [k, v] : m) text += k + "=" + v + "\n";
  const std::uint32_t head[2] = {htonl(hello_magic), htonl(static_cast<std::uint32_t>(text.size()))};
  s.send_all(std::as_bytes(std::span(head)), deadline, "send the doctor's hello");
  s.send_all(std::as_bytes(std::span(text.data(), text.size())), deadline, "send the doctor's hello");
}

inline facts_map receive_hello(const rdx::tcp::socket& s, rdx::tcp::clock::time_point deadline) {
  std::uint32_t head[2] = {};
  s.recv_exact(std::as_writable_bytes(std::span(head)), deadline, "receive the peer doctor's hello");
  if (ntohl(head[0]) != hello_magic || ntohl(head[1]) > 65536)
    rdx::detail::throw_rdx(rdx::errc::wire_format, "the peer did not answer as rdx-doctor --serve does");
  std::string text(ntohl(head[1]), '\0');
  s.recv_exact(std::as_writable_bytes(std::span(text.data(), text.size())), deadline,
               "receive the peer doctor's hello");
  facts_map m;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(at, nl - at);
    if (auto eq = line.find('='); eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
    at = nl + 1;
  }
  return m;
}

inline std::uint8_t pattern(std::uint64_t seed, std::size_t i) {
  return static_cast<std::uint8_t>((seed * 131 + i * 7 + (i >> 8)) & 0xff);
}
inline void fill(std::span<std::byte> b, std::uint64_t seed) {
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::byte{pattern(seed, i)};
}
inline std::uint64_t mismatches(std::span<const std::byte> b, std::uint64_t seed) {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < b.size(); ++i) n += b[i] != std::byte{pattern(seed, i)} ? 1 : 0;
  return n;
}

inline std::string get(const facts_map& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? std::string("?") : it->second;
}
}  // namespace detail

//! Both sides' settings compared; returns false when a difference makes a
//! connection impossible (so it is not tried).
inline bool compare_settings(report& r, const facts_map& here, const facts_map& there) {
  using detail::get;
  const std::string peer = get(there, "host");
  auto both = [&](const std::string& k) {
    return "here " + get(here, k) + ", on " + peer + " " + get(there, k);
  };
  bool possible = true;
  if (get(here, "link_layer") != get(there, "link_layer")) {
    r.add("peer.link_layer", peer, level::error, "link layers differ: " + both("link_layer"),
          "InfiniBand and Ethernet (RoCE) ports cannot connect: use ports of one kind on both hosts");
    possible = false;
  } else {
    r.add("peer.link_layer", peer, level::ok, "both " + get(here, "link_layer"));
  }
  if (there.count("gid_error") != 0) {
    r.add("peer.gid", peer, level::error, "the peer has no usable GID: " + get(there, "gid_error"),
          "run rdx-doctor on " + peer + " and fix its gid check");
    possible = false;
  } else if (get(here, "gid_type") != get(there, "gid_type")) {
    r.add("peer.gid", peer, level::error, "GID types differ: " + both("gid_type"),
          "use RoCE v2 on both sides (unset RDX_GID_INDEX: rdx chooses RoCE v2)");
  } else if (get(here, "gid_link_local") != get(there, "gid_link_local")) {
    const bool mine = get(here, "gid_link_local") == "yes";
    r.add("peer.gid", peer, level::error,
          std::string(mine ? "this side's" : "the peer's") + " GID is link-local and the other's is not: " +
              both("gid") + "; they are on different subnets and packets between them are not routed",
          "unset RDX_GID_INDEX on " + (mine ? get(here, "host") : peer) +
              " so that rdx chooses its IPv4-mapped RoCE v2 GID");
  } else if (get(here, "subnet") != get(there, "subnet")) {
    r.add("peer.subnet", peer, level::warning,
          "different subnets: " + both("subnet") + "; RoCE v2 packets must be routed between them",
          "check that a route exists both ways (ping the peer's address) and that UDP port 4791 passes");
  } else {
    r.add("peer.gid", peer, level::ok,
          get(here, "gid_type") + " GIDs on one subnet (" + get(here, "subnet") + "): " + both("gid"));
  }
  if (get(here, "active_mtu") != get(there, "active_mtu")) {
    r.add(
        "peer.mtu", peer, level::warning,
        "active MTUs differ: " + both("active_mtu") + " (netdev MTU " + both("netdev_mtu") +
            "); rdx uses the smaller on this path, but a program that takes its own port's MTU sends packets "
            "the other side drops, and sees IBV_WC_RETRY_EXC_ERR",
        "set one MTU on every host's interface (ip link set dev <netdev> mtu " +
            std::to_string(std::max(std::atoi(get(here, "netdev_mtu").c_str()),
                                    std::atoi(get(there, "netdev_mtu").c_str()))) +
            ")");
  } else {
    r.add("peer.mtu", peer, level::ok, "both " + get(here, "active_mtu") + " bytes");
  }
  bool same = true;
  std::string diff;
  for (const char* k : {"timeout", "retry_cnt", "rnr_retry", "min_rnr_timer"}) {
    if (get(here, k) != get(there, k)) {
      same = false;
      diff += std::string(diff.empty() ? "" : "; ") + k + " " + both(k);
    }
  }
  if (same)
    r.add("peer.settings", peer, level::ok,
          "the same retry settings: timeout " + get(here, "timeout") + ", retry_cnt " +
              get(here, "retry_cnt") + ", rnr_retry " + get(here, "rnr_retry") + ", PSN " + get(here, "psn"));
  else
    r.add("peer.settings", peer, level::warning,
          "retry settings differ (" + diff + "): each side detects a dead peer on its own clock",
          "build both sides with one rdx version, or pass the same connect_options");
  const int pe = std::atoi(get(there, "local_errors").c_str());
  const int pw = std::atoi(get(there, "local_warnings").c_str());
  r.add("peer.host", peer,
        pe > 0   ? level::error
        : pw > 0 ? level::warning
                 : level::ok,
        "the peer's own checks: " + std::to_string(pe) + " error" + (pe == 1 ? "" : "s") + ", " +
            std::to_string(pw) + " warning" + (pw == 1 ? "" : "s"),
        pe + pw > 0 ? "see rdx-doctor's output on " + peer : std::string());
  return possible;
}

//! Why a step failed, in the words a user acts on.
inline std::string likely_cause(const std::string& step, const std::error_code& ec, const peer_scope& ps) {
  const std::string port = std::to_string(ps.tcp_port);
  if (step == "peer.tcp") {
    if (ec == std::errc::connection_refused)
      return "nothing listens on " + ps.host + ":" + port + ": start `rdx-doctor --serve` there (with -p " +
             port + " if you changed it)";
    if (ec == rdx::errc::timed_out)
      return ps.host + " does not answer on TCP port " + port +
             ": a wrong address, a host that is down, or a "
             "firewall dropping the port";
    return "check the host name or address";
  }
  if (step == "peer.hello") return "the program on that port is not rdx-doctor --serve, or it stopped";
  if (step == "peer.connect" && ec == std::errc::invalid_argument)
    return "the device refused the peer's address or path at RTR: the two GIDs are of different kinds or on "
           "different subnets (see peer.gid above), or a path MTU above this port's";
  if (ec == rdx::errc::timed_out)
    return "the peer's queue pair did not answer in time: RoCE v2 packets (UDP port 4791) are dropped on the "
           "path, the GIDs are on different subnets, or the peer stopped";
  if (ec.category() == rdx::wc_category() && ec.value() == IBV_WC_RETRY_EXC_ERR)
    return "packets are lost between the hosts: an MTU that a link does not carry, UDP port 4791 filtered, "
           "or "
           "a GID the peer cannot reach";
  if (ec == rdx::errc::peer_disconnected || ec == rdx::errc::wire_format)
    return "the peer went away during the check";
  return "see the message; rdx-doctor on both hosts shows each side's own problems";
}

//! The connection and transfers; `client` writes first. Returns false when a step failed.
inline bool run_transfer(report& r, const rdx::tcp::socket& sock, rdx::context& ctx, bool client,
                         const std::string& peer, const peer_scope& ps) {
  std::string step = "peer.connect";
  try {
    rdx::protection_domain pd(ctx);
    rdx::connection conn(pd, {.queue_pairs = 1, .recv_depth = 8, .message_size = 64});
    rdx::channel<std::uint64_t> ctl(conn);
    auto mine = rdx::make_window_buffer<std::byte>(pd, ps.bytes);
    rdx::registered_buffer<std::byte> src(pd, ps.bytes);
    const rdx::grant<std::byte, rdx::rights::write | rdx::rights::read> g(conn, mine);
    const rdx::window_descriptor grants[] = {g.descriptor()};
    r.progress("connecting a queue pair to " + peer);
    const auto t0 = std::chrono::steady_clock::now();
    rdx::peer_offer offer = rdx::exchange_and_connect(sock, conn, grants, {.timeout = ps.timeout});
    const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (offer.windows.empty())
      rdx::detail::throw_rdx(rdx::errc::wire_format, "the peer granted no window to check the transfer with");
    rdx::remote_window<std::byte, rdx::rights::write | rdx::rights::read> theirs(conn, offer.windows[0]);
    const rdx::connection_info li = conn.local_info();
    const auto& ep = li.endpoints.at(0);
    r.add("peer.connect", peer, level::ok,
          "queue pair 0x" +
              [&] {
                char b[16];
                std::snprintf(b, sizeof b, "%x", ep.qpn);
                return std::string(b);
              }() +
              " reached RTS in " + std::to_string(static_cast<int>(ms)) + " ms (path MTU " +
              std::to_string(rdx::mtu_bytes(std::min(ep.mtu, offer.info.endpoints.at(0).mtu))) + ")",
          {}, {{"connect_ms", std::to_string(ms)}});

    auto wait = [&](rdx::operation& op, const char* what) {
      if (auto ec = op.wait(ps.timeout))
        throw rdx::error(ec, std::string(what) + ": " + conn.failure_message());
    };
    auto write_then_tell = [&](std::uint64_t seed) {
      detail::fill(std::span<std::byte>(src.data(), src.size()), seed);
      auto w = theirs.write(src, 0);
      wait(w, "RDMA write into the peer's window");
      auto m = ctl.send(std::uint64_t{seed});
      wait(m, "send the written notice");
      auto v = ctl.receive();
      wait(v, "receive the peer's verdict");
      return v.value();
    };
    auto check_then_answer = [&]() {
      auto m = ctl.receive();
      wait(m, "receive the peer's written notice");
      const std::uint64_t bad =
          detail::mismatches(std::span<const std::byte>(mine.data(), mine.size()), m.value());
      auto v = ctl.send(bad);
      wait(v, "send the verdict");
      return bad;
    };
    const std::string size = rdx::detail::bytes_text(ps.bytes);
    for (int round = 0; round < 2; ++round) {
      const bool writer = (round == 0) == client;
      step = writer ? "peer.write" : "peer.receive";
      r.progress(writer ? "RDMA write of " + size + " to " + peer + ", checked there"
                        : "waiting for " + peer + "'s RDMA write of " + size);
      const std::uint64_t bad = writer ? write_then_tell(client ? 11 : 22) : check_then_answer();
      const std::string intact = writer ? " written here arrived intact (every byte checked by the peer)"
                                        : " written by the peer arrived intact (every byte checked here)";
      r.add(step, peer, bad == 0 ? level::ok : level::error,
            bad == 0 ? size + intact
                     : std::to_string(bad) + " of " + std::to_string(ps.bytes) + " bytes arrived wrong",
            bad == 0 ? std::string()
                     : "data corrupted on the path: check the NIC firmware and PCIe errors (dmesg)");
      if (bad != 0) return false;
    }
    // Round trips of small messages.
    step = "peer.latency";
    std::vector<double> us;
    for (std::uint64_t i = 0; i < 20; ++i) {
      const auto t = std::chrono::steady_clock::now();
      if (client) {
        auto s = ctl.send(i);
        wait(s, "send a ping");
        auto p = ctl.receive();
        wait(p, "receive a pong");
        if (p.value() != i) rdx::detail::throw_rdx(rdx::errc::wire_format, "a pong out of order");
      } else {
        auto p = ctl.receive();
        wait(p, "receive a ping");
        auto s = ctl.send(p.value());
        wait(s, "send a pong");
      }
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
    }
    std::sort(us.begin(), us.end());
    if (client)
      r.add(step, peer, level::ok,
            "20 message round trips, median " + std::to_string(static_cast<int>(us[us.size() / 2])) + " us",
            {}, {{"median_us", std::to_string(us[us.size() / 2])}});
    step = "peer.close";
    rdx::tcp::barrier(sock, ps.timeout);
    return true;
  } catch (const rdx::error& e) {
    r.add(step, peer, level::error, e.what(), likely_cause(step, e.code(), ps));
    return false;
  }
}

//! The client side: connect, compare, transfer.
inline void check_peer(report& r, const peer_scope& ps, rdx::context& ctx, std::uint8_t port,
                       const report& local) {
  r.heading("peer " + ps.host + ":" + std::to_string(ps.tcp_port));
  std::string step = "peer.tcp";
  try {
    r.progress("connecting to rdx-doctor --serve on " + ps.host + ":" + std::to_string(ps.tcp_port));
    rdx::tcp::socket sock = rdx::tcp::connect(ps.host, ps.tcp_port, ps.timeout);
    r.add(step, ps.host, level::ok, "reached " + sock.peer());
    step = "peer.hello";
    const auto deadline = rdx::tcp::clock::now() + ps.timeout;
    const facts_map here = local_settings(ctx, port, local);
    detail::send_hello(sock, here, deadline);
    const facts_map there = detail::receive_hello(sock, deadline);
    r.add(step, ps.host, level::ok,
          "the peer is " + detail::get(there, "host") + " (" + detail::get(there, "device") + " port " +
              detail::get(there, "port") + ", kernel " + detail::get(there, "kernel") + ")");
    if (!compare_settings(r, here, there)) {
      r.add("peer.connect", ps.host, level::note,
            "not tried: the differences above make a connection impossible");
      return;
    }
    (void)run_transfer(r, sock, ctx, true, ps.host, ps);
  } catch (const rdx::error& e) {
    r.add(step, ps.host, level::error, e.what(), likely_cause(step, e.code(), ps));
  }
}

//! The server side: accept one doctor, answer its hello, transfer.
inline void serve_peer(report& r, const peer_scope& ps, rdx::context& ctx, std::uint8_t port,
                       const report& local) {
  std::string step = "peer.tcp";
  try {
    auto l = rdx::tcp::listener::bind("", ps.tcp_port);
    if (!r.json())
      std::printf("\nserving rdx-doctor --peer on TCP port %u (for %lld s)\n", l.port(),
                  static_cast<long long>(ps.timeout.count() / 1000));
    std::fflush(stdout);
    rdx::tcp::socket sock = l.accept(ps.timeout);
    const std::string peer = sock.peer();
    r.add(step, peer, level::ok, "a doctor connected from " + peer);
    step = "peer.hello";
    const auto deadline = rdx::tcp::clock::now() + ps.timeout;
    const facts_map here = local_settings(ctx, port, local);
    const facts_map there = detail::receive_hello(sock, deadline);
    detail::send_hello(sock, here, deadline);
    r.add(step, peer, level::ok, "the peer is " + detail::get(there, "host"));
    if (!compare_settings(r, here, there)) return;
    (void)run_transfer(r, sock, ctx, false, peer, ps);
  } catch (const rdx::error& e) {
    r.add(step, "server", level::error, e.what(),
          step == "peer.tcp"
              ? "no doctor connected in time: run rdx-doctor --peer <this host> on the other host"
              : likely_cause(step, e.code(), ps));
  }
}

}  // namespace doctor
