// rdma tests: the device's asynchronous events (rdx/verbs/async_event.hpp)
// name the cause of a failed connection. A write outside a grant breaks the
// granting side's queue pair: its failure says why (the device's
// QP_ACCESS_ERR where it reports one; Soft-RoCE reports none, and the
// failure says what a flush with no failed request of its own means). The
// link taken down: the device's PORT_ERR is named. A queue pair drained into
// SQD: the device's SQ_DRAINED for that queue pair is named by the stall
// watchdog's failure. Each on a worker and on a connection with its own
// queue. The log itself: events go to the owners of their queue pairs, and
// those nobody takes never hold more than its capacity.
#include <infiniband/verbs.h>

#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "../support/faults.hpp"
#include "channel_support.hpp"

using namespace std::chrono_literals;
using namespace channel_test::trust_case;
using clk = std::chrono::steady_clock;

namespace {

// Two connections, each on a worker of its own or each with its own queue,
// and a 1 MiB region to grant 64 bytes of.
struct duo {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
  rdx::registered_buffer<std::byte> region = rdx::make_window_buffer<std::byte>(pd, region_bytes);
  rdx::registered_buffer<std::byte> src{pd, 4096};
  std::optional<rdx::worker> wa, wb;
  std::unique_ptr<rdx::connection> a, b;
  duo(bool on_worker, const rdx::connection_attr& attr, const rdx::connect_options& opt = {}) {
    if (on_worker) {
      wa.emplace(pd);
      wb.emplace(pd);
      a = std::make_unique<rdx::connection>(*wa, pd, attr);
      b = std::make_unique<rdx::connection>(*wb, pd, attr);
    } else {
      a = std::make_unique<rdx::connection>(pd, attr);
      b = std::make_unique<rdx::connection>(pd, attr);
    }
    rdx::connect_pair(*a, *b, opt);
  }
  // The 64 bytes at grant_at, granted to c's peer.
  rdx::grant<std::byte, rw> grant_on(rdx::connection& c) {
    return {c, region.region(), std::span<std::byte>(region.data() + grant_at, grant_bytes)};
  }
  // The first n bytes of src.
  rdx::local_span<const std::byte> first(std::size_t n) {
    return rdx::local_span<const std::byte>(src).subspan(0, n);
  }
  // Drives both until c has failed (or the deadline passes).
  bool until_failed(rdx::connection& c, std::chrono::milliseconds d = 10s) {
    const auto end = clk::now() + d;
    while (!c.failed() && clk::now() < end) {
      (void)a->progress();
      (void)b->progress();
    }
    return c.failed();
  }
  // Drives both for a while: an event that comes after the failure fills in its cause.
  void settle(std::chrono::milliseconds d = 200ms) {
    const auto end = clk::now() + d;
    while (clk::now() < end) {
      (void)a->progress();
      (void)b->progress();
    }
  }
};

bool contains(const std::string& s, const char* what) {
  return s.find(what) != std::string::npos;
}

// The network interface under the device's port 1 (Soft-RoCE: eth0).
std::string netdev_of(const rdx::context& ctx) {
  std::ifstream f("/sys/class/infiniband/" + ctx.name() + "/ports/1/gid_attrs/ndevs/0");
  std::string n;
  if (f && std::getline(f, n) && !n.empty()) return n;
  return "eth0";
}

// Takes the link down for the test's scope; back up (and the port ACTIVE again) after.
struct link_down {
  const rdx::context& ctx;
  std::string ifname;
  link_down(const rdx::context& c, std::string name) : ctx(c), ifname(std::move(name)) {
    rdx_test::set_link(ifname, false);
  }
  link_down(const link_down&) = delete;
  link_down& operator=(const link_down&) = delete;
  ~link_down() {
    try {
      rdx_test::set_link(ifname, true);
      const auto end = clk::now() + 20s;
      while (!ctx.query_port(1).active() && clk::now() < end) std::this_thread::sleep_for(20ms);
    } catch (...) {
      std::fprintf(stderr, "could not take %s up again\n", ifname.c_str());
    }
  }
};

}  // namespace

TEST_CASE("a write outside a grant: the granting side's failure says why", "[async_events]") {
  for (const bool on_worker : {false, true}) {
    INFO((on_worker ? "on a worker" : "with its own queue"));
    duo d(on_worker, rdx::connection_attr{.recv_depth = 4});
    // A grants 64 bytes; B, told the grant is 1 MiB, writes one byte past it.
    auto g = d.grant_on(*d.a);
    auto forced =
        rdx::remote_window<std::byte, rw>::unchecked_for_testing(*d.b, g.descriptor(), region_bytes);
    auto op = forced.write(d.first(1), grant_bytes);
    const std::error_code ec = op.wait(30s);
    INFO("B's write: " << ec.message());
    CHECK(ec.category() == rdx::wc_category());
    CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
    REQUIRE(d.until_failed(*d.a));
    d.settle();
    const std::string msg = d.a->failure_message();
    INFO("A's failure: " << msg);
    std::printf("async_events (%s): A's failure_message(): \"%s\"\n", on_worker ? "worker" : "own queue",
                msg.c_str());
    const std::string qpn = "number " + std::to_string(d.a->local_info().endpoints[0].qpn);
    const std::string qpn_event =
        "QP_ACCESS_ERR on queue pair " + std::to_string(d.a->local_info().endpoints[0].qpn);
    // The device's event where it reports one (a hardware NIC); else (Soft-RoCE) what the flush means.
    const bool device_said = contains(msg, qpn_event.c_str());
    const bool inferred =
        contains(msg, "went to error with no request of this side failed") && contains(msg, qpn.c_str());
    CHECK((device_said || inferred));
    if (device_said) {
      CHECK(contains(msg, "outside what was granted"));
    } else {
      CHECK(d.a->failure_reason() == rdx::make_wc_error_code(IBV_WC_WR_FLUSH_ERR));
      CHECK(contains(msg, "a write or read outside what was granted, a revoked key"));
    }
  }
}

TEST_CASE("the link goes down: the failure names the device's PORT_ERR", "[async_events]") {
  if (std::getenv("RDX_VM") == nullptr) {
    WARN("not in a Soft-RoCE VM (RDX_VM unset): the test would take a real link down; skipped");
    return;
  }
  for (const bool on_worker : {false, true}) {
    INFO((on_worker ? "on a worker" : "with its own queue"));
    duo d(on_worker, rdx::connection_attr{.recv_depth = 4});
    auto g = d.grant_on(*d.b);
    rdx::remote_window<std::byte, rw> w(*d.a, g.descriptor());
    REQUIRE(w.write(d.first(8), 0).wait(20s) == std::error_code{});
    std::error_code ec;
    {
      link_down down(d.ctx, netdev_of(d.ctx));
      ec = w.write(d.first(8), 0).wait(30s);
      REQUIRE(d.until_failed(*d.a));
    }
    const std::string msg = d.a->failure_message();
    INFO("the write: " << ec.message() << "; A's failure: " << msg);
    std::printf("async_events (%s): link down: \"%s\"\n", on_worker ? "worker" : "own queue", msg.c_str());
    CHECK(ec);
    CHECK(contains(msg, "the device reported PORT_ERR on port 1"));
    CHECK(contains(msg, "its link went down"));
    // Its port is back: the log's latest event of it says so.
    const auto last = d.ctx.async_events()->last_port_event(1);
    (void)d.ctx.async_events()->read();
    const auto now_last = d.ctx.async_events()->last_port_event(1);
    REQUIRE(now_last.has_value());
    CHECK((last.has_value() && last->sequence <= now_last->sequence));
    CHECK(now_last->type == IBV_EVENT_PORT_ACTIVE);
  }
}

TEST_CASE("a queue pair drained into SQD: the stall watchdog's failure names the device's SQ_DRAINED",
          "[async_events]") {
  for (const bool on_worker : {false, true}) {
    INFO((on_worker ? "on a worker" : "with its own queue"));
    rdx::connection_attr attr{.recv_depth = 4, .keepalive = 200ms, .stall_timeout = 500ms};
    duo d(on_worker, attr, rdx::connect_options{.timeout = 10, .retry_cnt = 2});
    auto g = d.grant_on(*d.b);
    rdx::remote_window<std::byte, rw> w(*d.a, g.descriptor());
    REQUIRE(w.write(d.first(8), 0).wait(20s) == std::error_code{});
    rdx_test::freeze_sends(*d.a, 0);
    auto op = w.write(d.first(8), 0);
    const std::error_code ec = op.wait(20s);
    REQUIRE(d.a->failed());
    const std::string msg = d.a->failure_message();
    INFO("the write: " << ec.message() << "; A's failure: " << msg);
    std::printf("async_events (%s): SQD: \"%s\"\n", on_worker ? "worker" : "own queue", msg.c_str());
    CHECK(d.a->failure_reason() == rdx::errc::no_progress);
    const std::string named =
        "the device reported SQ_DRAINED on queue pair " + std::to_string(d.a->local_info().endpoints[0].qpn);
    CHECK(contains(msg, named.c_str()));
  }
}

TEST_CASE("the log: events go to the owners of their queue pairs; those nobody takes stay bounded",
          "[async_events]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd{ctx};
  rdx::connection c(pd, rdx::connection_attr{.recv_depth = 4});
  rdx::connection d(pd, rdx::connection_attr{.recv_depth = 4});
  rdx::connect_pair(c, d);
  rdx::async_event_log& log = *ctx.async_events();
  REQUIRE(&log == pd.device_context().async_events());  // one log per open device, shared
  // What earlier cases left unclaimed goes first.
  (void)log.read();
  std::array<rdx::async_event, rdx::async_event_log::capacity> all{};
  while (log.take_if(
             0, [](const rdx::async_event&) { return true; }, all) != 0) {}
  const std::uint64_t before = log.sequence();
  const std::uint64_t dropped_before = log.dropped();
  const std::uint32_t qc = c.local_info().endpoints[0].qpn, qd = d.local_info().endpoints[0].qpn;
  // Each move to SQD drains the send queue, and the device says so.
  auto drain = [](rdx::connection& x) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_SQD;
    a.en_sqd_async_notify = 1;
    REQUIRE(::ibv_modify_qp(x.qp(0).native_handle(), &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0);
    const auto end = clk::now() + 5s;
    while (clk::now() < end) {
      ibv_qp_attr q{};
      ibv_qp_init_attr init{};
      REQUIRE(::ibv_query_qp(x.qp(0).native_handle(), &q, IBV_QP_STATE, &init) == 0);
      if (q.sq_draining == 0) break;
      std::this_thread::sleep_for(1ms);
    }
    ibv_qp_attr back{};
    back.qp_state = IBV_QPS_RTS;
    REQUIRE(::ibv_modify_qp(x.qp(0).native_handle(), &back, IBV_QP_STATE) == 0);
  };
  drain(d);
  const std::size_t rounds = rdx::async_event_log::capacity + 6;
  for (std::size_t i = 0; i < rounds; ++i) {
    drain(c);
    (void)log.read();
  }
  const auto end = clk::now() + 5s;
  while (log.sequence() < before + rounds + 1 && clk::now() < end) {
    (void)log.read();
    std::this_thread::sleep_for(1ms);
  }
  INFO("events read: " << log.sequence() - before << ", held: " << log.size()
                       << ", dropped: " << log.dropped() - dropped_before);
  REQUIRE(log.sequence() - before == rounds + 1);
  CHECK(log.size() == rdx::async_event_log::capacity);
  CHECK(log.dropped() - dropped_before == rounds + 1 - rdx::async_event_log::capacity);
  // The oldest went first: d's one event among them, so none is left of it.
  std::array<rdx::async_event, 8> got{};
  const std::array<std::uint32_t, 1> of_d{qd};
  CHECK(log.take(before, of_d, got) == 0);
  // c's events, oldest first, all SQ_DRAINED of c's queue pair.
  const std::array<std::uint32_t, 1> of_c{qc};
  const std::size_t n = log.take(before, of_c, all);
  CHECK(n == rdx::async_event_log::capacity);
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(all[i].type == IBV_EVENT_SQ_DRAINED);
    CHECK(all[i].qp_num == qc);
    if (i > 0) CHECK(all[i].sequence == all[i - 1].sequence + 1);
  }
  CHECK(log.size() == 0);
  // Events of two owners: each takes only its own, the other's stays.
  drain(c);
  drain(d);
  const auto end2 = clk::now() + 5s;
  while (log.size() < 2 && clk::now() < end2) (void)log.read();
  REQUIRE(log.size() == 2);
  REQUIRE(log.take(0, of_c, got) == 1);
  CHECK(got[0].qp_num == qc);
  CHECK(log.size() == 1);
  REQUIRE(log.take(0, of_d, got) == 1);
  CHECK(got[0].qp_num == qd);
  char text[256];
  got[0].describe(text);
  INFO(text);
  CHECK(std::string(text).find("SQ_DRAINED on queue pair " + std::to_string(qd) +
                               ": its send queue was drained") == 0);
  // Both still carry traffic after SQD and back.
  rdx::channel<std::uint64_t> tx(c), rx(d);
  auto r = rx.receive();
  REQUIRE(tx.send(7).wait(10s) == std::error_code{});
  REQUIRE(r.wait(10s) == std::error_code{});
  CHECK(r.value() == 7);
}
