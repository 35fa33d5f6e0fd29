// Helpers for rdma-labelled tests: skip without a device, count verbs objects,
// and a loopback pair of connected queue pairs on one device.
#pragma once

#include <rdx/rdx.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace rdx_test {

//! Exits 77 (ctest: skipped) with a reason when the host has no RDMA device.
inline void require_device() {
  rdx::device_list list;
  if (list.empty()) {
    std::fprintf(stderr, "SKIP: no RDMA device on this host (run inside cmake/softroce/rdx-vm)\n");
    std::exit(77);
  }
}

inline rdx::context open_device() {
  require_device();
  return rdx::context::open_default();
}

//! Verbs objects the kernel holds for a device ("rdma resource show"), or
//! nullopt where the tool is missing. Used to prove failures leak nothing.
inline std::optional<std::map<std::string, long>> resource_counts(const std::string& dev) {
  std::string cmd = "rdma resource show " + dev + " 2>/dev/null";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return std::nullopt;
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, f) != nullptr) out += buf;
  if (::pclose(f) != 0 || out.empty()) return std::nullopt;
  std::map<std::string, long> m;
  std::istringstream in(out);
  std::string tok, key;
  while (in >> tok) {
    if (!key.empty()) {
      char* end = nullptr;
      long v = std::strtol(tok.c_str(), &end, 10);
      if (end != tok.c_str() && *end == '\0') m[key] = v;
      key.clear();
      continue;
    }
    if (tok == "pd" || tok == "cq" || tok == "qp" || tok == "mr" || tok == "ctx" || tok == "srq") key = tok;
  }
  return m;
}

//! Records resource counts and checks later that they are unchanged.
class leak_guard {
public:
  explicit leak_guard(const std::string& dev) : dev_(dev), before_(resource_counts(dev)) {
    if (!before_) WARN("rdma resource show unavailable: leak check skipped");
  }
  void check() const {
    if (!before_) return;
    auto now = resource_counts(dev_);
    REQUIRE(now);
    for (auto& [k, v] : *before_) {
      INFO("resource " << k);
      CHECK(now->at(k) == v);
    }
  }

private:
  std::string dev_;
  std::optional<std::map<std::string, long>> before_;
};

//! Busy-polls one completion with a generous timeout for TCG VMs.
inline rdx::completion wait_one(rdx::completion_queue& cq,
                                std::chrono::seconds timeout = std::chrono::seconds(20)) {
  rdx::completion c{};
  std::error_code ec = rdx::poll_one(cq, c, timeout);
  INFO("poll: " << ec.message());
  REQUIRE(!ec);
  return c;
}

//! The post API the raw verbs tests ask for: RDX_TEST_POST_API=classic runs
//! them by ibv_post_send (a second ctest entry), otherwise automatic.
[[nodiscard]] inline rdx::post_api test_post_api() {
  const char* v = std::getenv("RDX_TEST_POST_API");
  return v != nullptr && std::string_view(v) == "classic" ? rdx::post_api::classic : rdx::post_api::automatic;
}

[[nodiscard]] inline rdx::queue_pair_attr all_rights(rdx::queue_pair_attr a) {
  if (a.post == rdx::post_api::automatic) a.post = test_post_api();
  if (a.remote_access == rdx::access::none)
    a.remote_access = rdx::access::remote_write | rdx::access::remote_read | rdx::access::remote_atomic;
  return a;
}

//! Two RC queue pairs of one device, connected to each other.
struct loopback {
  rdx::context ctx = open_device();
  rdx::protection_domain pd{ctx};
  rdx::completion_queue cq_a{ctx, 64};
  rdx::completion_queue cq_b{ctx, 64};
  rdx::queue_pair a;
  rdx::queue_pair b;

  //! Raw verbs tests: unless attr asks for some, the queue pairs allow every remote right.
  explicit loopback(rdx::queue_pair_attr attr = {}, rdx::connect_options opt = {})
      : a(pd, cq_a, cq_a, all_rights(attr)), b(pd, cq_b, cq_b, all_rights(attr)) {
    a.connect(b.local_endpoint(), opt);
    b.connect(a.local_endpoint(), opt);
  }
};

}  // namespace rdx_test
