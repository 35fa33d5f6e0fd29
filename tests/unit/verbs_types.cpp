// Unit tests (no device): access flags, remote ranges, GID classification,
// completion records and error codes, PSNs, environment parsing.
#include <rdx/detail/env.hpp>
#include <rdx/detail/random.hpp>
#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/gid.hpp>
#include <rdx/verbs/memory_region.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>

TEST_CASE("access flags form a typed bitmask with local write as the region default") {
  using rdx::access;
  STATIC_REQUIRE(rdx::to_ibv(access::local_write) == IBV_ACCESS_LOCAL_WRITE);
  STATIC_REQUIRE(rdx::to_ibv(access::remote_write | access::remote_read) ==
                 (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
  constexpr access a = access::remote_read | access::remote_atomic;
  STATIC_REQUIRE(rdx::has(a, access::remote_read));
  STATIC_REQUIRE(!rdx::has(a, access::remote_write));
  STATIC_REQUIRE(rdx::has(a, access::none));
  access b = access::local_write;
  b |= access::remote_write;
  b &= ~access::local_write;
  CHECK(b == access::remote_write);
}

TEST_CASE("remote ranges check offset and length without overflow") {
  rdx::remote_descriptor r{0x1000, 0xabcd, 4096};
  CHECK(rdx::contains(r, 0, 4096));
  CHECK(rdx::contains(r, 4096, 0));
  CHECK(rdx::contains(r, 4000, 96));
  CHECK_FALSE(rdx::contains(r, 4000, 97));
  CHECK_FALSE(rdx::contains(r, 4097, 0));
  CHECK_FALSE(rdx::contains(r, 8, std::numeric_limits<std::uint64_t>::max()));
  CHECK_FALSE(rdx::contains(r, std::numeric_limits<std::uint64_t>::max(), 2));
  rdx::remote_ptr p = rdx::at(r, 16);
  CHECK(p.addr == 0x1010);
  CHECK(p.rkey == 0xabcd);
  CHECK((p + 8).addr == 0x1018);
}

TEST_CASE("GID entries are classified: zero, IPv4-mapped, link-local, global") {
  ibv_gid zero{};
  CHECK(rdx::gid_is_zero(zero));
  auto v4 = rdx::parse_gid("10.77.0.1");
  REQUIRE(v4);
  CHECK(rdx::gid_is_ipv4_mapped(*v4));
  CHECK_FALSE(rdx::gid_is_link_local(*v4));
  CHECK(rdx::to_string(*v4) == "::ffff:10.77.0.1");
  auto ll = rdx::parse_gid("fe80::5054:ff:fe12:3456");
  REQUIRE(ll);
  CHECK(rdx::gid_is_link_local(*ll));
  CHECK_FALSE(rdx::gid_is_ipv4_mapped(*ll));
  auto global = rdx::parse_gid("2001:db8::1");
  REQUIRE(global);
  CHECK_FALSE(rdx::gid_is_link_local(*global));
  CHECK_FALSE(rdx::gid_is_ipv4_mapped(*global));
  CHECK_FALSE(rdx::gid_is_zero(*global));
  CHECK_FALSE(rdx::parse_gid("not an address"));
  rdx::gid_entry e{*v4, 1, 1, rdx::gid_type::roce_v2, 2};
  CHECK(e.ipv4_mapped());
  CHECK(rdx::to_string(rdx::gid_type::roce_v2) == "RoCE v2");
}

TEST_CASE("a completion is an ibv_wc with typed accessors") {
  STATIC_REQUIRE(sizeof(rdx::completion) == sizeof(ibv_wc));
  int state = 0;
  rdx::completion c{};
  c.wc.wr_id = rdx::to_wr_id(&state);
  c.wc.status = IBV_WC_SUCCESS;
  c.wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
  c.wc.wc_flags = IBV_WC_WITH_IMM;
  c.wc.imm_data = htonl(0x01020304u);
  c.wc.byte_len = 77;
  CHECK(c.ok());
  CHECK(!c.error());
  CHECK(c.context<int>() == &state);
  CHECK(c.has_imm());
  CHECK(c.imm() == 0x01020304u);
  CHECK(c.byte_len() == 77);
  CHECK(c.is_recv());
}

TEST_CASE("completion errors carry the status text and a hint") {
  rdx::completion c{};
  c.wc.status = IBV_WC_REM_ACCESS_ERR;
  std::error_code ec = c.error();
  CHECK(ec.category() == rdx::wc_category());
  CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
  CHECK_THAT(ec.message(), Catch::Contains("remote access error") && Catch::Contains("remote key"));
  CHECK_THAT(rdx::make_wc_error_code(IBV_WC_RETRY_EXC_ERR).message(), Catch::Contains("GID"));
  CHECK_THAT(rdx::make_wc_error_code(IBV_WC_RNR_RETRY_EXC_ERR).message(), Catch::Contains("no receive"));
  CHECK(!rdx::make_wc_error_code(IBV_WC_SUCCESS));
}

TEST_CASE("starting PSNs are 24 random bits") {
  std::set<std::uint32_t> seen;
  for (int i = 0; i < 64; ++i) {
    std::uint32_t p = rdx::detail::random_psn();
    CHECK(p <= 0xffffffu);
    seen.insert(p);
  }
  // 64 draws of 24 bits: a repeat is possible, many are not.
  CHECK(seen.size() > 60);
}

TEST_CASE("window keys: consecutive grants' keys never step, whatever the index order") {
  // A type 2 window picks a key when allocated and another at each bind; a
  // grant allocates then binds once, so the key in use is two picks back.
  // One index for every window, the hardest case: any two key bytes one
  // apart would step.
  std::uint32_t prev_used = 0;
  constexpr std::uint32_t index = 0x1234;
  for (int i = 0; i < 5000; ++i) {
    const std::uint32_t allocated = index << 8;
    const std::uint32_t used = rdx::detail::fresh_window_key(allocated);  // at allocation
    const std::uint32_t after = rdx::detail::fresh_window_key(used);      // at the bind
    CHECK((used >> 8) == index);
    CHECK(after != used);
    if (i > 0) {
      REQUIRE(used - prev_used != 1);
      REQUIRE(prev_used - used != 1);
    }
    prev_used = used;
  }
}

TEST_CASE("environment overrides parse strictly") {
  using rdx::detail::parse_unsigned;
  CHECK(parse_unsigned("3", 255) == 3u);
  CHECK(parse_unsigned("255", 255) == 255u);
  CHECK_FALSE(parse_unsigned("256", 255));
  CHECK_FALSE(parse_unsigned("-1", 255));
  CHECK_FALSE(parse_unsigned("1x", 255));
  CHECK_FALSE(parse_unsigned("", 255));
  ::setenv("RDX_TEST_UNSIGNED", "abc", 1);
  CHECK_THROWS_WITH(rdx::detail::env_unsigned("RDX_TEST_UNSIGNED", 255),
                    Catch::Contains("RDX_TEST_UNSIGNED=abc") && Catch::Contains("0 to 255"));
  ::setenv("RDX_TEST_UNSIGNED", "7", 1);
  CHECK(rdx::detail::env_unsigned("RDX_TEST_UNSIGNED", 255) == 7u);
  ::unsetenv("RDX_TEST_UNSIGNED");
  CHECK_FALSE(rdx::detail::env_unsigned("RDX_TEST_UNSIGNED", 255));
}
