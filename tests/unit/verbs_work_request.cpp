// Unit tests (no device): typed work-request builders, batches, and the
// setup checks that reject bad sizes and settings before the device sees them.
#include <rdx/verbs/post.hpp>
#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/work_request.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

namespace {
ibv_sge sge(std::uint64_t addr, std::uint32_t len, std::uint32_t lkey = 0x11) {
  return {addr, len, lkey};
}
struct op_state {
  int n = 0;
};
}  // namespace

TEST_CASE("send and recv builders carry the SGL and the operation's pointer") {
  op_state st;
  auto s = rdx::wr::send(sge(0x1000, 64), &st);
  CHECK(s.opcode() == IBV_WR_SEND);
  CHECK(s.wr_id() == rdx::to_wr_id(&st));
  REQUIRE(s.sgl().size() == 1);
  CHECK(s.sgl()[0].addr == 0x1000);
  CHECK(s.sgl()[0].length == 64);
  CHECK((s.flags() & IBV_SEND_SIGNALED) != 0);
  CHECK(s.inline_candidate());

  auto r = rdx::wr::recv(sge(0x2000, 128), &st);
  CHECK(r.wr_id() == rdx::to_wr_id(&st));
  REQUIRE(r.sgl().size() == 1);
  CHECK(r.sgl()[0].addr == 0x2000);

  auto si = rdx::wr::send_imm(sge(0x1000, 8), 0xdeadbeef);
  CHECK(si.opcode() == IBV_WR_SEND_WITH_IMM);
  CHECK(si.native().imm_data == htonl(0xdeadbeefu));
}

TEST_CASE("copies of a request point at their own single SGE") {
  auto a = rdx::wr::write(sge(0x1000, 64), {0x9000, 0x77});
  auto b = a;
  CHECK(b.native().sg_list != a.native().sg_list);
  CHECK(b.sgl()[0].addr == 0x1000);
  rdx::send_wr c;
  c = a;
  CHECK(c.native().sg_list != a.native().sg_list);
  CHECK(c.sgl()[0].length == 64);
}

TEST_CASE("a moved request points at its own single SGE") {
  auto a = rdx::wr::send(sge(0x4000, 32));
  rdx::send_wr m = std::move(a);
  CHECK(m.native().sg_list != a.native().sg_list);
  CHECK(m.sgl()[0].addr == 0x4000);
  auto r = rdx::wr::recv(sge(0x5000, 16));
  rdx::recv_wr rm;
  rm = std::move(r);
  CHECK(rm.native().sg_list != r.native().sg_list);
  CHECK(rm.sgl()[0].addr == 0x5000);
}

TEST_CASE("a multi-entry SGL is referenced, not copied") {
  std::array<ibv_sge, 3> sgl{sge(0x1000, 16), sge(0x2000, 32), sge(0x3000, 48)};
  auto w = rdx::wr::write(sgl, {0x9000, 0x55});
  CHECK(w.native().sg_list == sgl.data());
  CHECK(w.native().num_sge == 3);
  CHECK(w.total_length() == 96);
  auto copy = w;
  CHECK(copy.native().sg_list == sgl.data());
  auto r = rdx::wr::recv(std::span<const ibv_sge>(sgl));
  CHECK(r.native().num_sge == 3);
}

TEST_CASE("one-sided builders fill the remote side and never an lkey") {
  rdx::remote_ptr dst{0xabc000, 0x1234};
  auto w = rdx::wr::write(sge(0x1000, 64), dst);
  CHECK(w.opcode() == IBV_WR_RDMA_WRITE);
  CHECK(w.native().wr.rdma.remote_addr == 0xabc000);
  CHECK(w.native().wr.rdma.rkey == 0x1234);
  CHECK(w.sgl()[0].lkey == 0x11);

  auto wi = rdx::wr::write_imm(sge(0x1000, 64), dst + 64, 42);
  CHECK(wi.opcode() == IBV_WR_RDMA_WRITE_WITH_IMM);
  CHECK(wi.native().wr.rdma.remote_addr == 0xabc040);
  CHECK(ntohl(wi.native().imm_data) == 42);

  auto rd = rdx::wr::read(sge(0x1000, 64), dst);
  CHECK(rd.opcode() == IBV_WR_RDMA_READ);
  CHECK_FALSE(rd.inline_candidate());

  auto fa = rdx::wr::fetch_add(sge(0x1000, 8), dst, 5);
  CHECK(fa.opcode() == IBV_WR_ATOMIC_FETCH_AND_ADD);
  CHECK(fa.native().wr.atomic.remote_addr == 0xabc000);
  CHECK(fa.native().wr.atomic.compare_add == 5);
  CHECK_FALSE(fa.inline_candidate());

  auto cs = rdx::wr::compare_swap(sge(0x1000, 8), dst, 1, 2);
  CHECK(cs.opcode() == IBV_WR_ATOMIC_CMP_AND_SWP);
  CHECK(cs.native().wr.atomic.compare_add == 1);
  CHECK(cs.native().wr.atomic.swap == 2);
}

TEST_CASE("a flat_wr converts to the same ibv_send_wr the builders make") {
  const rdx::remote_ptr to{0x5000, 0x77};
  // A write, flags and wr_id carried over.
  rdx::flat_wr fw{.wr_id = 9, .sge = sge(0x1000, 64), .remote_addr = to.addr, .rkey = to.rkey};
  fw.send_flags |= IBV_SEND_FENCE;
  rdx::send_wr w = rdx::send_wr::from(fw);
  const rdx::send_wr built = rdx::wr::write(sge(0x1000, 64), to);
  CHECK(w.opcode() == IBV_WR_RDMA_WRITE);
  CHECK(w.wr_id() == 9);
  CHECK(w.flags() == (IBV_SEND_SIGNALED | IBV_SEND_FENCE));
  REQUIRE(w.sgl().size() == 1);
  CHECK(w.sgl()[0].addr == 0x1000);
  CHECK(w.sgl()[0].length == 64);
  CHECK(w.native().wr.rdma.remote_addr == built.native().wr.rdma.remote_addr);
  CHECK(w.native().wr.rdma.rkey == built.native().wr.rdma.rkey);
  CHECK(w.native().sg_list == &w.sgl()[0]);  // its own SGE, not fw's
  CHECK(w.native().sg_list != &fw.sge);
  // Zero length: no SGE at all (a cover or probe write).
  CHECK(rdx::send_wr::from(rdx::flat_wr{}).sgl().empty());
  // Atomics fill the atomic fields.
  rdx::flat_wr fa{.sge = sge(0x2000, 8),
                  .remote_addr = 0x6008,
                  .compare_add = 5,
                  .swap = 6,
                  .rkey = 0x88,
                  .opcode = IBV_WR_ATOMIC_CMP_AND_SWP};
  const rdx::send_wr a = rdx::send_wr::from(fa);
  CHECK(a.opcode() == IBV_WR_ATOMIC_CMP_AND_SWP);
  CHECK(a.native().wr.atomic.remote_addr == 0x6008);
  CHECK(a.native().wr.atomic.rkey == 0x88);
  CHECK(a.native().wr.atomic.compare_add == 5);
  CHECK(a.native().wr.atomic.swap == 6);
  // The immediate goes as given (network order).
  const rdx::send_wr m = rdx::send_wr::from(
      rdx::flat_wr{.sge = sge(0x3000, 10), .imm_data = htonl(42), .opcode = IBV_WR_SEND_WITH_IMM});
  CHECK(m.native().imm_data == rdx::wr::send_imm(sge(0x3000, 10), 42).native().imm_data);
}

TEST_CASE("flags are set and cleared fluently") {
  auto w = rdx::wr::send(sge(0x1000, 8)).unsignaled().fence().solicited();
  CHECK((w.flags() & IBV_SEND_SIGNALED) == 0);
  CHECK((w.flags() & IBV_SEND_FENCE) != 0);
  CHECK((w.flags() & IBV_SEND_SOLICITED) != 0);
  w.no_inline();
  CHECK_FALSE(w.inline_candidate());
  w.id(99);
  CHECK(w.wr_id() == 99);
}

TEST_CASE("a batch holds a fixed number of requests") {
  rdx::send_batch<4> b;
  CHECK(b.empty());
  for (int i = 0; i < 4; ++i) CHECK(b.push(rdx::wr::send(sge(0x1000 + static_cast<unsigned>(i), 8))));
  CHECK(b.full());
  CHECK_FALSE(b.push(rdx::wr::send(sge(0x5000, 8))));
  REQUIRE(b.requests().size() == 4);
  // Each stored request owns its single SGE.
  CHECK(b[2].native().sg_list->addr == 0x1002);
  b.clear();
  CHECK(b.empty());
}

TEST_CASE("queue sizes above the device limits are refused, naming field, value and limit") {
  rdx::device_attributes d;
  d.max_qp_wr = 1024;
  d.max_sge = 4;
  rdx::queue_pair_attr ok;
  CHECK_NOTHROW(rdx::detail::check_qp_attr(ok, d, "dev0"));
  rdx::queue_pair_attr deep{.max_send_wr = 4096};
  CHECK_THROWS_WITH(rdx::detail::check_qp_attr(deep, d, "dev0"), Catch::Contains("max_send_wr = 4096") &&
                                                                     Catch::Contains("1024") &&
                                                                     Catch::Contains("dev0"));
  rdx::queue_pair_attr rq{.max_recv_wr = 1025};
  CHECK_THROWS_WITH(rdx::detail::check_qp_attr(rq, d, "dev0"), Catch::Contains("max_recv_wr = 1025"));
  rdx::queue_pair_attr sges{.max_send_sge = 5};
  CHECK_THROWS_WITH(rdx::detail::check_qp_attr(sges, d, "dev0"), Catch::Contains("max_send_sge = 5"));
  try {
    rdx::detail::check_qp_attr(deep, d, "dev0");
  } catch (const rdx::error& e) {
    CHECK(e.code() == rdx::errc::limit_exceeded);
  }
}

TEST_CASE("connect settings are checked: timeout 0 is refused") {
  rdx::connect_options o;
  CHECK(o.timeout == 14);
  CHECK(o.retry_cnt == 6);
  CHECK(o.rnr_retry == 7);
  CHECK(o.min_rnr_timer == 12);
  CHECK_NOTHROW(rdx::detail::check_connect_options(o));
  CHECK_THROWS_WITH(rdx::detail::check_connect_options({.timeout = 0}),
                    Catch::Contains("timeout = 0") && Catch::Contains("retransmission"));
  CHECK_THROWS_WITH(rdx::detail::check_connect_options({.timeout = 32}), Catch::Contains("timeout = 32"));
  CHECK_THROWS_WITH(rdx::detail::check_connect_options({.retry_cnt = 8}), Catch::Contains("retry_cnt = 8"));
  CHECK_THROWS_WITH(rdx::detail::check_connect_options({.rnr_retry = 9}), Catch::Contains("rnr_retry = 9"));
}

TEST_CASE("retransmission timers are set in time and rounded up to the verbs' codes") {
  using namespace std::chrono_literals;
  // 4.096 us x 2^code: code 14 is 67.108864 ms, code 17 is 536.870912 ms.
  CHECK(rdx::ack_timeout_of(14) == 67108864ns);
  CHECK(rdx::ack_timeout_of(1) == 8192ns);
  CHECK(rdx::ack_timeout_of(0) == 0ns);
  CHECK(rdx::ack_timeout_code(67108864ns) == 14);
  CHECK(rdx::ack_timeout_code(67108865ns) == 15);  // never shorter than asked
  CHECK(rdx::ack_timeout_code(500ms) == 17);
  CHECK(rdx::ack_timeout_code(1ns) == 1);
  CHECK_THROWS_WITH(rdx::ack_timeout_code(0ns), Catch::Contains("retransmission off"));
  CHECK_THROWS_WITH(rdx::ack_timeout_code(3h), Catch::Contains("code 31"));
  // The RNR table: code 0 is the longest (655.36 ms), 1 the shortest (10 us).
  CHECK(rdx::rnr_timer_of(0) == 655360us);
  CHECK(rdx::rnr_timer_of(1) == 10us);
  CHECK(rdx::rnr_timer_of(12) == 640us);
  CHECK(rdx::rnr_timer_of(31) == 491520us);
  CHECK(rdx::rnr_timer_code(640us) == 12);
  CHECK(rdx::rnr_timer_code(641us) == 13);
  CHECK(rdx::rnr_timer_code(500ms) == 0);
  CHECK_THROWS_WITH(rdx::rnr_timer_code(700ms), Catch::Contains("655.36 ms"));
  CHECK_THROWS(rdx::rnr_timer_code(-1ms));
  for (std::uint8_t c = 1; c < 31; ++c) {
    CHECK(rdx::rnr_timer_of(c) < rdx::rnr_timer_of(static_cast<std::uint8_t>(c + 1)));
    CHECK(rdx::ack_timeout_code(rdx::ack_timeout_of(c)) == c);
    CHECK(rdx::rnr_timer_code(rdx::rnr_timer_of(c)) == c);
  }
  rdx::connect_options o;
  CHECK(o.ack_timeout() == 67108864ns);
  CHECK(o.set_ack_timeout(500ms) == 536870912ns);
  CHECK(o.timeout == 17);
  CHECK(o.set_rnr_timer(1ms) == 1280us);
  CHECK(o.min_rnr_timer == 14);
  CHECK(rdx::retry_window(o.timeout, o.retry_cnt) == 7 * 536870912ns);
  const std::string line = rdx::retransmission_summary(o);
  CHECK_THAT(line, Catch::Contains("ACK timeout 537 ms (code 17), 6 retries") &&
                       Catch::Contains("fails after 3.76 s to 15 s") &&
                       Catch::Contains("RNR timer 1.28 ms (code 14)"));
  o.retry_cnt = 7;
  o.min_rnr_timer = 0;
  CHECK_THAT(rdx::retransmission_summary(o),
             Catch::Contains("retries forever") && Catch::Contains("code 0 is the longest"));
}

TEST_CASE("a remote endpoint is checked before it reaches the device") {
  rdx::endpoint r;
  r.qpn = 0x12;
  r.psn = 0x123456;
  r.mtu = IBV_MTU_1024;
  r.gid = *rdx::parse_gid("10.77.0.1");
  CHECK_NOTHROW(rdx::detail::check_remote_endpoint(r, true));
  auto bad = r;
  bad.qpn = 0x1000000;
  CHECK_THROWS_WITH(rdx::detail::check_remote_endpoint(bad, true), Catch::Contains("qpn"));
  bad = r;
  bad.psn = 0x1000000;
  CHECK_THROWS_WITH(rdx::detail::check_remote_endpoint(bad, true), Catch::Contains("psn"));
  bad = r;
  bad.gid = ibv_gid{};
  CHECK_THROWS_WITH(rdx::detail::check_remote_endpoint(bad, true), Catch::Contains("zero GID"));
  bad.lid = 3;
  CHECK_NOTHROW(rdx::detail::check_remote_endpoint(bad, false));
  bad = r;
  bad.mtu = static_cast<ibv_mtu>(0);  // within the enum's range, not an MTU
  CHECK_THROWS_WITH(rdx::detail::check_remote_endpoint(bad, true), Catch::Contains("mtu"));
}

TEST_CASE("emplace builds a request in the batch's own storage") {
  rdx::send_batch<3> b;
  int calls = 0;
  for (std::uint32_t i = 0; i < 3; ++i) {
    CHECK(b.emplace([&]() noexcept {
      ++calls;
      rdx::send_wr w = rdx::wr::write(sge(0x1000 + i, 8 + i), {0x9000 + i, 0x77});
      w.id(i).signaled(i == 2);
      return w;
    }));
  }
  CHECK(calls == 3);
  CHECK(b.full());
  // Full: refused, and make() is not called.
  CHECK_FALSE(b.emplace([&]() noexcept {
    ++calls;
    return rdx::wr::send(sge(0x5000, 8));
  }));
  CHECK(calls == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    const auto* lo = reinterpret_cast<const std::byte*>(&b[i]);
    const auto* sg = reinterpret_cast<const std::byte*>(b[i].native().sg_list);
    CHECK((sg >= lo && sg < lo + sizeof(rdx::send_wr)));  // its SGE is inside its own slot
    CHECK(b[i].sgl()[0].addr == 0x1000 + i);
    CHECK(b[i].sgl()[0].length == 8 + i);
    CHECK(b[i].native().wr.rdma.remote_addr == 0x9000 + i);
    CHECK(b[i].wr_id() == i);
    CHECK(((b[i].flags() & IBV_SEND_SIGNALED) != 0) == (i == 2));
  }
  // A slot used before is rebuilt in place after clear().
  b.clear();
  CHECK(b.emplace([]() noexcept { return rdx::wr::read(sge(0x7000, 64), {0xa000, 0x88}); }));
  CHECK(b[0].opcode() == IBV_WR_RDMA_READ);
  CHECK(b[0].sgl()[0].addr == 0x7000);
  CHECK(b[0].native().sg_list == &b[0].sgl()[0]);
  CHECK(b[0].wr_id() == 0);
}
