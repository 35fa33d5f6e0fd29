// rdx-doctor: the checks of each active port: its state and link layer, the
// GID rdx chooses on it, and its MTU against the interface's.
#pragma once

#include <rdx/rdx.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "netdev.hpp"
#include "report.hpp"
#include "scope.hpp"

namespace doctor {

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

}  // namespace doctor
