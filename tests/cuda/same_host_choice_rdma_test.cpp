// The automatic choice's RDMA side: two ends of one host sharing host memory
// take the RDMA path (the same-host path shares GPU memory only), and a window
// write over a loopback pair of connections of one RDMA device (natively, or
// in a Soft-RoCE VM) delivers every byte. Needs no GPU.
#include <rdx/cuda/same_host_types.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>

#include "../rdma/channel_support.hpp"

using namespace std::chrono_literals;
using rdx::rights;

TEST_CASE("host memory on one host: the choice is RDMA, and the write arrives over it", "[rdma][same_host]") {
  namespace cu = rdx::cuda;
  cu::host_facts here;
  here.boot_id = cu::read_boot_id();
  here.pid = ::getpid();
  here.process_token = cu::process_token();
  here.gpus.push_back(cu::gpu_uuid{1});
  cu::host_facts peer = here;  // another process of this host, seeing the same GPU
  peer.pid += 1;
  peer.process_token ^= 1;
  REQUIRE(cu::choose_transport(here, peer, cu::memory_kind::gpu).path == cu::transport::same_host);
  const cu::transport_choice c = cu::choose_transport(here, peer, cu::memory_kind::host);
  INFO(c.reason);
  REQUIRE(c.path == cu::transport::rdma);

  channel_test::pair p;
  auto target = rdx::make_window_buffer<std::uint8_t, rights::write>(p.pd, 1 << 16);
  rdx::grant<std::uint8_t, rights::write> g(p.b, target);
  rdx::remote_window<std::uint8_t, rights::write> w(p.a, g.descriptor());
  rdx::registered_buffer<std::uint8_t> src(p.pd, 1 << 16);
  for (std::size_t i = 0; i < src.size(); ++i) {
    src.data()[i] = static_cast<std::uint8_t>(i * 131 + 7);
  }
  auto op = w.write(src, 0);
  REQUIRE(op.wait(20s) == std::error_code{});
  CHECK(std::memcmp(target.data(), src.data(), src.size()) == 0);
}
