// rdx-doctor: the retransmission settings rdx connects with, in time, and the
// port counters that show loss and recovery (Soft-RoCE's and a NIC's
// hw_counters, the port's counters), each with what it means.
#pragma once

#include <rdx/channel/detail/liveness.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "scope.hpp"
#include <dirent.h>

namespace doctor {

//! What a loss or recovery counter counts; empty for a counter that says
//! nothing about loss (traffic totals, for instance).
inline std::string_view counter_meaning(std::string_view name) {
  struct entry {
    std::string_view name, meaning;
  };
  // Soft-RoCE (rxe) names first, then those of common NIC drivers.
  static constexpr entry known[] = {
      {"duplicate_request", "requests that arrived twice: the requester resent after a lost ACK"},
      {"out_of_seq_request", "requests after a gap in the sequence: a packet before them was lost"},
      {"rcvd_seq_err", "NAKs for a sequence error received: the peer saw a gap and the requester resent"},
      {"retry_exceeded_err", "requests that failed after every retry (transport retry counter exceeded)"},
      {"completer_retry_err", "retransmissions started by an ACK timeout or a sequence NAK"},
      {"rcvd_rnr_err", "RNR NAKs received: the peer had no receive posted"},
      {"send_rnr_err", "RNR NAKs sent: a message came with no receive posted"},
      {"retry_rnr_exceeded_err", "requests that failed after every RNR retry"},
      {"link_downed", "times the port's link went down"},
      {"out_of_sequence", "packets after a gap in the sequence (a packet lost or reordered)"},
      {"packet_seq_err", "NAKs for a sequence error received"},
      {"local_ack_timeout_err", "ACK timeouts: the requester waited a whole ACK timeout and resent"},
      {"implied_nak_seq_err", "reads or atomics answered out of order, read as a sequence NAK"},
      {"rnr_nak_retry_err", "requests that failed after every RNR retry"},
      {"req_transport_retries_exceeded", "requests that failed after every retry"},
      {"np_ecn_marked_roce_packets", "packets received with ECN congestion marks"},
      {"np_cnp_sent", "congestion notification packets sent (DCQCN)"},
      {"rp_cnp_handled", "congestion notification packets acted on (the sender slowed down)"},
      {"symbol_error", "bit errors on the link"},
      {"port_rcv_errors", "packets received with errors"},
      {"port_xmit_discards", "packets the port had to drop on sending"},
  };
  for (const entry& e : known) {
    if (e.name == name) return e.meaning;
  }
  return {};
}

//! The counter files of one folder, as (name, value); none when it is absent.
inline std::vector<std::pair<std::string, std::int64_t>> read_counters(const std::string& dir) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.empty() || n[0] == '.') continue;
    const std::int64_t v = rdx::detail::read_number_file((dir + "/" + n).c_str());
    if (v >= 0) out.emplace_back(n, v);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

//! "retrans": per active port, rdx's default retransmission settings in time
//! and the port's loss and recovery counters with what each means. A port
//! that has resent or failed requests gets a note, never an error: counters
//! only grow, so they tell of the port's whole past.
inline void check_retransmission(report& r, const scope& s) {
  for_each_port(r, s, "retrans", [&](const rdx::context& ctx, const rdx::port_attributes& pa, const auto&) {
    if (!pa.active()) return;
    const std::string base =
        "/sys/class/infiniband/" + ctx.name() + "/ports/" + std::to_string(pa.port) + "/";
    std::vector<std::pair<std::string, std::string>> facts;
    std::string seen;
    std::int64_t loss_signs = 0;
    std::size_t known_counters = 0;
    for (const char* sub : {"hw_counters", "counters"}) {
      for (const auto& [name, value] : read_counters(base + sub)) {
        const std::string_view meaning = counter_meaning(name);
        if (meaning.empty()) continue;
        ++known_counters;
        facts.emplace_back(name, std::to_string(value));
        if (value == 0) continue;
        loss_signs += value;
        seen += "; " + name + " " + std::to_string(value) + " (" + std::string(meaning) + ")";
      }
    }
    // What an rdx::connection connects with by default (connect() lowers
    // the "forever" 7 of both retry counts to 6).
    const std::string settings =
        "rdx's connections by default: " +
        rdx::retransmission_summary(rdx::detail::liveness::with_bounded_retries(rdx::connect_options{}));
    if (known_counters == 0) {
      r.add("retrans", port_name(ctx, pa), level::note,
            settings + "; the port exposes no loss or recovery counters under " + base +
                "{hw_counters,counters}",
            {}, facts);
      return;
    }
    if (loss_signs == 0) {
      r.add("retrans", port_name(ctx, pa), level::ok,
            settings + "; " + std::to_string(known_counters) +
                " loss and recovery counters, all 0: no packet lost or resent since the port came up",
            {}, facts);
      return;
    }
    r.add("retrans", port_name(ctx, pa), level::note, settings + "; since the port came up" + seen,
          "counters only grow: read them before and after a run (rdx-doctor --check retrans) to see "
          "what it cost; on Ethernet, loss that recurs wants PFC or ECN on every switch port of the "
          "path, and an ACK timeout well above the path's round trip",
          facts);
  });
}

}  // namespace doctor
