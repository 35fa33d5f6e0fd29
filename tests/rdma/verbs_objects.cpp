// rdma tests: each verbs object and state transition on one device, and every
// bad input rejected with a clear error and nothing leaked.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "rdma_support.hpp"
#include <net/if.h>

using rdx_test::leak_guard;
using rdx_test::open_device;

static_assert(!std::is_copy_constructible_v<rdx::context>);
static_assert(!std::is_copy_constructible_v<rdx::protection_domain>);
static_assert(!std::is_copy_constructible_v<rdx::memory_region>);
static_assert(!std::is_copy_constructible_v<rdx::completion_queue>);
static_assert(!std::is_copy_constructible_v<rdx::queue_pair>);
static_assert(std::is_nothrow_move_constructible_v<rdx::queue_pair>);
static_assert(std::is_nothrow_destructible_v<rdx::queue_pair>);

namespace {
int destroy_failures = 0;
void count_failures(std::string_view) noexcept {
  ++destroy_failures;
}

template <class F>
rdx::error expect_error(F&& f) {
  try {
    f();
  } catch (const rdx::error& e) {
    return e;
  }
  FAIL("expected rdx::error");
  throw;  // unreachable
}
}  // namespace

TEST_CASE("devices open by name, by netdev and by default") {
  rdx_test::require_device();
  rdx::device_list list;
  REQUIRE(list.size() >= 1);
  rdx::context def = rdx::context::open_default();
  std::string name = def.name();
  INFO("default device " << name);
  CHECK(list.find(name) != nullptr);
  CHECK(rdx::context::open(name).name() == name);

  // Without RDX_DEVICE: the first device with an ACTIVE port.
  const char* env = std::getenv("RDX_DEVICE");
  std::string saved = env != nullptr ? env : "";
  ::unsetenv("RDX_DEVICE");
  auto first = rdx::context::open_default();
  CHECK(first.first_active_port() != 0);
  if (env != nullptr) ::setenv("RDX_DEVICE", saved.c_str(), 1);

  // The netdev of the chosen GID entry opens the same device.
  auto table = rdx::gid_table(def, def.default_port());
  std::string netdev;
  for (auto& e : table) {
    char buf[IF_NAMESIZE] = {};
    if (e.ndev_ifindex != 0 && ::if_indextoname(e.ndev_ifindex, buf) != nullptr) {
      netdev = buf;
      break;
    }
  }
  if (!netdev.empty()) {
    INFO("netdev " << netdev);
    CHECK(rdx::context::open_netdev(netdev).name() == name);
  } else {
    WARN("no GID entry bound to a netdev: open_netdev not exercised");
  }
}

TEST_CASE("a bad device name is rejected, listing the devices present") {
  rdx_test::require_device();
  std::string dev = open_device().name();
  leak_guard guard(dev);
  auto e = expect_error([] { (void)rdx::context::open("no_such_dev9"); });
  CHECK(e.code() == rdx::errc::no_device);
  CHECK_THAT(e.what(), Catch::Contains("no_such_dev9") && Catch::Contains("devices present") &&
                           Catch::Contains("rdx-doctor --check devices"));
  auto n = expect_error([] { (void)rdx::context::open_netdev("nonet9"); });
  CHECK(n.code() == rdx::errc::no_device);
  CHECK_THAT(n.what(), Catch::Contains("nonet9"));

  const char* old = std::getenv("RDX_DEVICE");
  std::string saved = old != nullptr ? old : "";
  ::setenv("RDX_DEVICE", "no_such_dev9", 1);
  auto d = expect_error([] { (void)rdx::context::open_default(); });
  CHECK_THAT(d.what(), Catch::Contains("no_such_dev9"));
  if (old != nullptr)
    ::setenv("RDX_DEVICE", saved.c_str(), 1);
  else
    ::unsetenv("RDX_DEVICE");
  guard.check();
}

TEST_CASE("device and port attributes are typed") {
  auto ctx = open_device();
  auto d = ctx.query_device();
  CHECK(d.max_qp_wr > 0);
  CHECK(d.max_cqe > 0);
  CHECK(d.max_sge > 0);
  CHECK(d.phys_port_cnt >= 1);
  CHECK(ctx.port_count() == d.phys_port_cnt);
  auto p = ctx.query_port(ctx.default_port());
  CHECK(p.active());
  CHECK(rdx::mtu_bytes(p.active_mtu) >= 256);
  CHECK(p.gid_table_len > 0);
  auto bad = expect_error([&] { (void)ctx.query_port(77); });
  CHECK_THAT(bad.what(), Catch::Contains("port 77"));
}

TEST_CASE("GID selection prefers RoCE v2 IPv4-mapped and explains itself") {
  auto ctx = open_device();
  std::uint8_t port = ctx.default_port();
  auto pa = ctx.query_port(port);
  auto table = rdx::gid_table(ctx, port);
  REQUIRE(!table.empty());
  for (auto& e : table) CHECK_FALSE(e.zero());
  ::unsetenv("RDX_GID_INDEX");
  auto c = rdx::select_gid(ctx, port);
  INFO(c.reason);
  CHECK(!c.reason.empty());
  if (pa.is_ethernet()) {
    CHECK(c.type == rdx::gid_type::roce_v2);
    CHECK_FALSE(rdx::gid_is_link_local(c.gid));
    CHECK_FALSE(rdx::gid_is_zero(c.gid));
    bool has_v4 = false;
    for (auto& e : table) has_v4 = has_v4 || (e.type == rdx::gid_type::roce_v2 && e.ipv4_mapped());
    if (has_v4) {
      CHECK(rdx::gid_is_ipv4_mapped(c.gid));
      CHECK_THAT(c.reason, Catch::Contains("IPv4"));
    }
  } else {
    CHECK(c.use_lid);
    CHECK_THAT(c.reason, Catch::Contains("LID"));
  }

  // RDX_GID_INDEX overrides, and says so.
  ::setenv("RDX_GID_INDEX", std::to_string(table.front().index).c_str(), 1);
  auto o = rdx::select_gid(ctx, port);
  CHECK(o.index == table.front().index);
  CHECK_THAT(o.reason, Catch::Contains("RDX_GID_INDEX"));
  ::unsetenv("RDX_GID_INDEX");
}

TEST_CASE("a bad GID index is rejected with the table size, and leaks nothing") {
  auto ctx = open_device();
  leak_guard guard(ctx.name());
  std::uint8_t port = ctx.default_port();
  auto pa = ctx.query_port(port);
  auto past = static_cast<std::uint32_t>(pa.gid_table_len) + 5;
  auto e = expect_error([&] { (void)rdx::use_gid_index(ctx, port, past); });
  CHECK(e.code() == rdx::errc::out_of_range);
  CHECK_THAT(e.what(), Catch::Contains("GID index " + std::to_string(past)) &&
                           Catch::Contains("has " + std::to_string(pa.gid_table_len) + " entries"));
  // An empty slot inside the table is refused too.
  auto table = rdx::gid_table(ctx, port);
  std::uint32_t empty = 0;
  while (std::any_of(table.begin(), table.end(), [&](auto& g) { return g.index == empty; })) ++empty;
  if (empty < static_cast<std::uint32_t>(pa.gid_table_len)) {
    auto em = expect_error([&] { (void)rdx::use_gid_index(ctx, port, empty); });
    CHECK_THAT(em.what(), Catch::Contains("empty table entry"));
  }

  ::setenv("RDX_GID_INDEX", "250", 1);
  if (250 < pa.gid_table_len &&
      std::none_of(table.begin(), table.end(), [](auto& g) { return g.index == 250; })) {
    auto env = expect_error([&] { (void)rdx::select_gid(ctx, port); });
    CHECK_THAT(env.what(), Catch::Contains("GID index 250"));
  }
  ::setenv("RDX_GID_INDEX", "bogus", 1);
  CHECK_THROWS_WITH(rdx::select_gid(ctx, port), Catch::Contains("RDX_GID_INDEX=bogus"));
  ::unsetenv("RDX_GID_INDEX");

  // A queue pair asked to use a bad index fails before creating anything.
  {
    rdx::protection_domain pd(ctx);
    rdx::completion_queue cq(ctx, 16);
    std::uint8_t idx = static_cast<std::uint8_t>(empty < 256 ? empty : 255);
    auto q = expect_error([&] { rdx::queue_pair qp(pd, cq, cq, {.gid_index = idx}); });
    CHECK_THAT(q.what(), Catch::Contains("GID index " + std::to_string(idx)));
  }
  guard.check();
}

TEST_CASE("protection domains and memory regions") {
  auto ctx = open_device();
  rdx::protection_domain pd(ctx);
  REQUIRE(pd.native_handle() != nullptr);
  CHECK(pd.context_handle() == ctx.native_handle());

  std::vector<std::uint64_t> mem(512, 7);
  rdx::memory_region mr(pd, std::span<std::uint64_t>(mem));
  CHECK(mr.addr() == mem.data());
  CHECK(mr.length() == mem.size() * 8);
  CHECK(mr.rights() == rdx::access::local_write);
  auto s = mr.sge(std::span<std::uint64_t>(mem).subspan(4, 2));
  CHECK(s.addr == reinterpret_cast<std::uint64_t>(mem.data() + 4));
  CHECK(s.length == 16);
  CHECK(s.lkey == mr.lkey());
  auto r = mr.remote();
  CHECK(r.addr == reinterpret_cast<std::uint64_t>(mem.data()));
  CHECK(r.rkey == mr.rkey());
  CHECK(r.length == mem.size() * 8);

  rdx::registered_buffer<std::uint32_t> buf(pd, 1000, rdx::access::remote_read);
  CHECK(buf.size() == 1000);
  CHECK(reinterpret_cast<std::uintptr_t>(buf.data()) % 4096 == 0);
  CHECK(buf[999] == 0);
  CHECK(rdx::has(buf.region().rights(), rdx::access::remote_read | rdx::access::local_write) == false);
  CHECK(rdx::has(buf.region().rights(), rdx::access::remote_read));

  // Remote write implies local write (verbs requires it).
  rdx::memory_region rw(pd, std::span<std::uint64_t>(mem), rdx::access::remote_write);
  CHECK(rdx::has(rw.rights(), rdx::access::remote_write | rdx::access::local_write));

  // adopt takes ownership of a raw ibv_mr of the same PD.
  ibv_mr* raw = ::ibv_reg_mr(pd.native_handle(), mem.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(raw != nullptr);
  auto adopted = rdx::memory_region::adopt(pd, raw);
  CHECK(adopted.native_handle() == raw);
  CHECK(adopted.lkey() == raw->lkey);
  CHECK_THROWS_AS(rdx::memory_region::adopt(pd, nullptr), rdx::error);
}

TEST_CASE("adopting a region of another protection domain is refused and leaks nothing") {
  auto ctx = open_device();
  leak_guard guard(ctx.name());
  {
    rdx::protection_domain pd1(ctx), pd2(ctx);
    std::vector<char> mem(64);
    ibv_mr* raw = ::ibv_reg_mr(pd1.native_handle(), mem.data(), mem.size(), IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(raw != nullptr);
    auto e = expect_error([&] { (void)rdx::memory_region::adopt(pd2, raw); });
    CHECK(e.code() == rdx::errc::invalid_argument);
    // Refused: the caller still owns it.
    auto ok = rdx::memory_region::adopt(pd1, raw);
  }
  guard.check();
}

TEST_CASE("a registration that fails names the verb and leaks nothing") {
  auto ctx = open_device();
  leak_guard guard(ctx.name());
  {
    rdx::protection_domain pd(ctx);
    auto e = expect_error([&] { rdx::memory_region mr(pd, nullptr, 4096); });
    CHECK_THAT(e.what(), Catch::Contains("ibv_reg_mr"));
  }
  guard.check();
}

TEST_CASE("children keep their parents alive; destruction order cannot fail") {
  destroy_failures = 0;
  auto old = rdx::set_log_hook(&count_failures);
  {
    std::vector<char> mem(4096);
    std::optional<rdx::queue_pair> qp;
    std::optional<rdx::memory_region> mr;
    {
      auto ctx = open_device();
      rdx::protection_domain pd(ctx);
      rdx::completion_queue cq(ctx, 16);
      qp.emplace(pd, cq, cq);
      mr.emplace(pd, std::span<char>(mem));
      // ctx, pd and cq go out of scope first.
    }
    qp->to_init();
    CHECK(qp->query_state() == rdx::qp_state::init);
    CHECK(mr->lkey() != 0);
    qp.reset();
    mr.reset();
  }
  rdx::set_log_hook(old);
  CHECK(destroy_failures == 0);
}

TEST_CASE("release() is refused while children are alive, then hands the handle over") {
  auto ctx = open_device();
  rdx::protection_domain pd(ctx);
  auto e = expect_error([&] { (void)ctx.release(); });
  CHECK(e.code() == rdx::errc::not_ready);
  ibv_pd* raw = pd.release();
  REQUIRE(raw != nullptr);
  CHECK(pd.native_handle() == nullptr);
  CHECK(::ibv_dealloc_pd(raw) == 0);

  // A raw CQ round-trips through from_native_handle() and release().
  ibv_cq* cq_raw = ::ibv_create_cq(ctx.native_handle(), 8, nullptr, nullptr, 0);
  REQUIRE(cq_raw != nullptr);
  auto cq = rdx::completion_queue::from_native_handle(ctx, cq_raw);
  CHECK(cq.native_handle() == cq_raw);
  CHECK(cq.release() == cq_raw);
  CHECK(::ibv_destroy_cq(cq_raw) == 0);
  CHECK_THROWS_AS(rdx::completion_queue::from_native_handle(ctx, nullptr), rdx::error);
}

TEST_CASE("completion queues: depth checked against the device") {
  auto ctx = open_device();
  leak_guard guard(ctx.name());
  auto d = ctx.query_device();
  {
    rdx::completion_queue cq(ctx, 100);
    CHECK(cq.depth() >= 100);
    std::array<rdx::completion, 4> out{};
    std::size_t n = 9;
    CHECK(!cq.poll(out, n));
    CHECK(n == 0);
    std::array<ibv_wc, 4> raw{};
    n = 9;
    CHECK(!cq.poll(std::span<ibv_wc>(raw), n));
    CHECK(n == 0);
    CHECK(cq.arm() == rdx::errc::not_ready);  // no channel
    CHECK(cq.wait_event(std::chrono::milliseconds(1)) == rdx::errc::not_ready);

    rdx::completion_channel ch(ctx);
    CHECK(ch.fd() >= 0);
    rdx::completion_queue ecq(ctx, {.depth = 16, .channel = &ch});
    CHECK(!ecq.arm());
    CHECK(ecq.wait_event(std::chrono::milliseconds(10)) == rdx::errc::timed_out);
  }
  auto e = expect_error([&] { rdx::completion_queue cq(ctx, d.max_cqe + 1); });
  CHECK(e.code() == rdx::errc::limit_exceeded);
  CHECK_THAT(e.what(), Catch::Contains("depth = " + std::to_string(d.max_cqe + 1)) &&
                           Catch::Contains(std::to_string(d.max_cqe)));
  CHECK_THROWS_WITH(rdx::completion_queue(ctx, 0), Catch::Contains("depth = 0"));
  guard.check();
}

TEST_CASE("queue pair depths above the device limit are refused, naming field, value and limit") {
  auto ctx = open_device();
  leak_guard guard(ctx.name());
  auto d = ctx.query_device();
  {
    rdx::protection_domain pd(ctx);
    rdx::completion_queue cq(ctx, 16);
    auto big = static_cast<std::uint32_t>(d.max_qp_wr) + 1;
    auto e = expect_error([&] { rdx::queue_pair qp(pd, cq, cq, {.max_send_wr = big}); });
    CHECK(e.code() == rdx::errc::limit_exceeded);
    CHECK_THAT(e.what(), Catch::Contains("max_send_wr = " + std::to_string(big)) &&
                             Catch::Contains(std::to_string(d.max_qp_wr)));
    auto r = expect_error([&] { rdx::queue_pair qp(pd, cq, cq, {.max_recv_wr = big}); });
    CHECK_THAT(r.what(), Catch::Contains("max_recv_wr"));
    auto in = expect_error([&] { rdx::queue_pair qp(pd, cq, cq, {.max_inline_data = 1u << 20}); });
    CHECK(in.code() == rdx::errc::limit_exceeded);
    CHECK_THAT(in.what(), Catch::Contains("max_inline_data = 1048576") && Catch::Contains("device limit"));
    auto s = expect_error(
        [&] { rdx::queue_pair qp(pd, cq, cq, {.max_send_sge = static_cast<std::uint32_t>(d.max_sge) + 1}); });
    CHECK_THAT(s.what(), Catch::Contains("max_send_sge"));
  }
  guard.check();
}

TEST_CASE("shared receive queue depth above the device limit is refused") {
  auto ctx = open_device();
  leak_guard guard(ctx.name());
  auto d = ctx.query_device();
  {
    rdx::protection_domain pd(ctx);
    auto big = static_cast<std::uint32_t>(d.max_srq_wr) + 1;
    auto e = expect_error([&] { rdx::shared_receive_queue srq(pd, {.max_wr = big}); });
    CHECK(e.code() == rdx::errc::limit_exceeded);
    CHECK_THAT(e.what(), Catch::Contains("max_wr = " + std::to_string(big)) &&
                             Catch::Contains(std::to_string(d.max_srq_wr)));
  }
  guard.check();
}

TEST_CASE("queue pair state transitions: reset, init, rtr, rts, error, reset") {
  auto ctx = open_device();
  rdx::protection_domain pd(ctx);
  rdx::completion_queue cq(ctx, 16);
  rdx::queue_pair a(pd, cq, cq), b(pd, cq, cq);
  CHECK(a.type() == rdx::qp_type::rc);
  CHECK(a.query_state() == rdx::qp_state::reset);
  CHECK(a.psn() <= 0xffffffu);
  CHECK(a.psn() != b.psn());  // 1 in 16M chance of a false failure
  CHECK(a.max_inline_data() >= 64);
  auto ep = a.local_endpoint();
  CHECK(ep.qpn == a.qp_num());
  CHECK(ep.psn == a.psn());
  CHECK(ep.gid_index == a.gid_index());

  a.to_init();
  CHECK(a.query_state() == rdx::qp_state::init);
  a.to_rtr(b.local_endpoint());
  CHECK(a.query_state() == rdx::qp_state::rtr);
  a.to_rts();
  CHECK(a.query_state() == rdx::qp_state::rts);
  CHECK(a.state() == rdx::qp_state::rts);
  a.to_error();
  CHECK(a.query_state() == rdx::qp_state::error);
  a.to_reset();
  CHECK(a.query_state() == rdx::qp_state::reset);
  // connect() does all of it in one call, again.
  a.connect(b.local_endpoint());
  CHECK(a.query_state() == rdx::qp_state::rts);
  // connect() on a connected QP is refused.
  auto e = expect_error([&] { a.connect(b.local_endpoint()); });
  CHECK(e.code() == rdx::errc::not_ready);
}

TEST_CASE("an invalid transition names the verb, the target state and the QP") {
  auto ctx = open_device();
  rdx::protection_domain pd(ctx);
  rdx::completion_queue cq(ctx, 16);
  rdx::queue_pair a(pd, cq, cq);
  // RESET -> RTS skips INIT and RTR.
  auto e = expect_error([&] { a.to_rts(); });
  CHECK_THAT(e.what(), Catch::Contains("ibv_modify_qp(RTS)") && Catch::Contains(a.name()));
  CHECK(a.query_state() == rdx::qp_state::reset);
}

TEST_CASE("timeout 0 is refused before the QP changes state") {
  auto ctx = open_device();
  rdx::protection_domain pd(ctx);
  rdx::completion_queue cq(ctx, 16);
  rdx::queue_pair a(pd, cq, cq), b(pd, cq, cq);
  auto e = expect_error([&] { a.connect(b.local_endpoint(), {.timeout = 0}); });
  CHECK(e.code() == rdx::errc::invalid_argument);
  CHECK_THAT(e.what(), Catch::Contains("timeout = 0"));
  CHECK(a.query_state() == rdx::qp_state::reset);
  auto bad_ep = b.local_endpoint();
  bad_ep.gid = ibv_gid{};
  bad_ep.lid = 0;
  CHECK_THROWS_AS(a.connect(bad_ep), rdx::error);
  CHECK(a.query_state() == rdx::qp_state::reset);
}

TEST_CASE("posting on a queue pair that is not ready is refused without reaching the device") {
  auto ctx = open_device();
  rdx::protection_domain pd(ctx);
  rdx::completion_queue cq(ctx, 16);
  rdx::registered_buffer<char> buf(pd, 64);
  rdx::queue_pair a(pd, cq, cq), b(pd, cq, cq);
  CHECK(a.post_send(rdx::wr::send(buf.sge())) == rdx::errc::not_ready);
  CHECK(a.post_recv(rdx::wr::recv(buf.sge())) == rdx::errc::not_ready);
  a.to_init();
  CHECK(a.post_send(rdx::wr::send(buf.sge())) == rdx::errc::not_ready);
  CHECK(!a.post_recv(rdx::wr::recv(buf.sge())));  // receives may be posted from INIT
  a.to_rtr(b.local_endpoint());
  auto ec = a.post_send(rdx::wr::send(buf.sge()));
  CHECK(ec == rdx::errc::not_ready);
  CHECK_THAT(ec.message(), Catch::Contains("not ready"));
  std::array<rdx::send_wr, 2> two{rdx::wr::send(buf.sge()), rdx::wr::send(buf.sge())};
  std::size_t posted = 5;
  CHECK(a.post_send(std::span<rdx::send_wr>(two), posted) == rdx::errc::not_ready);
  CHECK(posted == 0);
  std::array<rdx::completion, 4> out{};
  std::size_t n = 9;
  CHECK(!cq.poll(out, n));
  CHECK(n == 0);  // nothing reached the device
}

TEST_CASE("UD queue pairs activate without a peer and connect() is refused") {
  auto ctx = open_device();
  rdx::protection_domain pd(ctx);
  rdx::completion_queue cq(ctx, 16);
  rdx::queue_pair u(pd, cq, cq, {.type = rdx::qp_type::ud});
  CHECK_THROWS_AS(u.connect(u.local_endpoint()), rdx::error);
  u.activate();
  CHECK(u.query_state() == rdx::qp_state::rts);
  rdx::address_handle ah(pd, u.local_endpoint(), u.port(), u.gid_index());
  CHECK(ah.native_handle() != nullptr);
}
