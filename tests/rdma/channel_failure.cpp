// rdma tests: failures. A write forced past the local checks (a window that
// believes it is larger than the grant, or a grant whose region was
// deregistered) fails at the NIC; that operation reports the completion
// status with its hint, every operation pending on the connection completes
// with an error, none stays pending, and later operations fail at once.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>

#include "channel_support.hpp"

using namespace std::chrono_literals;
using channel_test::pair;
using rdx::rights;

TEST_CASE("a write past the grant fails; every pending operation completes with an error") {
  pair p(rdx::connection_attr{.send_depth = 64, .signal_interval = 16, .recv_depth = 4});
  auto target = rdx::make_window_buffer<std::uint64_t, rights::write>(p.pd, 64);
  rdx::grant<std::uint64_t, rights::write> g(p.b, target);
  const auto d = g.descriptor();
  // The local check would refuse offset 100000: this window is told it is larger.
  auto w = rdx::remote_window<std::uint64_t, rights::write>::unchecked_for_testing(p.a, d, 1 << 20);
  rdx::remote_window<std::uint64_t, rights::write> checked(p.a, d);
  CHECK(checked.check(100000, 8) == rdx::errc::out_of_range);
  rdx::registered_buffer<std::uint64_t> src(p.pd, 64);
  rdx::local_span<const std::uint64_t> s(src);
  rdx::channel<std::uint64_t> ch(p.a);

  auto ops = std::make_unique<std::array<std::optional<rdx::operation>, 30>>();
  auto pending_receive = ch.receive();  // nothing will ever arrive
  for (std::size_t i = 0; i < 30; ++i) {
    (*ops)[i] = w.write(s.subspan(0, 8), i == 5 ? 100000 : i * 2);
  }
  // Wait for every one: each completes, none times out.
  for (std::size_t i = 0; i < 30; ++i) {
    INFO("operation " << i);
    REQUIRE((*ops)[i]->wait(30s) != rdx::errc::timed_out);
    CHECK((*ops)[i]->done());
  }
  for (std::size_t i = 0; i < 5; ++i) CHECK((*ops)[i]->ok());
  const std::error_code bad = (*ops)[5]->error();
  INFO("the failed write: " << bad.message());
  CHECK(bad.category() == rdx::wc_category());
  CHECK(bad.value() == IBV_WC_REM_ACCESS_ERR);
  CHECK(bad.message().find("remote key, bounds or permission") != std::string::npos);
  for (std::size_t i = 6; i < 30; ++i) {
    INFO("operation " << i << ": " << (*ops)[i]->error().message());
    CHECK((*ops)[i]->error());
  }
  CHECK(p.a.failed());
  CHECK(p.a.failure_reason() == bad);
  // A receive that was waiting ends with the connection's failure itself.
  REQUIRE(pending_receive.wait(10s) == bad);
  // Later operations fail fast, before posting.
  const auto posted = p.a.posted_count();
  auto late = w.write(s.subspan(0, 8), 0);
  CHECK(late.done());
  CHECK(late.error() == rdx::errc::operation_failed);
  auto late_send = ch.send(1);
  CHECK(late_send.error() == rdx::errc::operation_failed);
  CHECK(p.a.posted_count() == posted);
  // Drain what is left so that nothing refers to the operations.
  for (int i = 0; i < 100; ++i) p.a.progress();
}

TEST_CASE("a write to a revoked grant fails with the NIC's status; the connection reports it") {
  pair p(rdx::connection_attr{.recv_depth = 4});
  std::optional<rdx::registered_buffer<std::uint64_t>> target;
  target.emplace(rdx::make_window_buffer<std::uint64_t, rights::write>(p.pd, 512));
  rdx::grant<std::uint64_t, rights::write> w_grant(p.b, *target);
  rdx::remote_window<std::uint64_t, rights::write> w(p.a, w_grant.descriptor());
  rdx::registered_buffer<std::uint64_t> src(p.pd, 512);
  auto first = w.write(src, 0);
  REQUIRE(first.wait(20s) == std::error_code{});
  w_grant.revoke();  // the memory window is deallocated: its key is invalid
  auto op = w.write(src, 0);
  const std::error_code ec = op.wait(30s);
  INFO(ec.message());
  CHECK(ec.category() == rdx::wc_category());
  CHECK(ec.value() == IBV_WC_REM_ACCESS_ERR);
  CHECK(p.a.failed());
  auto after = w.write(src, 0);
  CHECK(after.error() == rdx::errc::operation_failed);
}
