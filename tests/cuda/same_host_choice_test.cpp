// Same-host peers without a GPU: the choice between the same-host path and
// RDMA from both ends' facts, the checks every arriving frame passes, and a
// descriptor crossing a Unix socket beside a frame.
#include <rdx/cuda/detail/unix_socket.hpp>
#include <rdx/cuda/same_host_types.hpp>

#include <catch2/catch.hpp>

#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

namespace cu = rdx::cuda;

namespace {
cu::host_facts facts(std::string boot, std::int64_t pid, std::uint64_t token, std::uint8_t gpu) {
  cu::host_facts f;
  f.boot_id = std::move(boot);
  f.pid = pid;
  f.process_token = token;
  cu::gpu_uuid u{};
  u[0] = gpu;
  f.gpus.push_back(u);
  return f;
}
const std::string boot_a = "0f5c4d8e-1111-4222-8333-944455556666";
const std::string boot_b = "0f5c4d8e-1111-4222-8333-944455557777";
}  // namespace

TEST_CASE("same host, GPU visible, another process: the same-host path", "[unit][same_host]") {
  const auto c = cu::choose_transport(facts(boot_a, 10, 1, 7), facts(boot_a, 20, 2, 7), cu::memory_kind::gpu);
  CHECK(c.path == cu::transport::same_host);
  CHECK(c.reason.find("one host") != std::string::npos);
  CHECK(c.reason.find("CUDA device 0") != std::string::npos);
  CHECK(cu::to_string(c.path) == "same-host");
}

TEST_CASE("other host, hidden GPU, unknown boot id or host memory: RDMA, with the reason",
          "[unit][same_host]") {
  auto c = cu::choose_transport(facts(boot_a, 10, 1, 7), facts(boot_b, 20, 2, 7), cu::memory_kind::gpu);
  CHECK(c.path == cu::transport::rdma);
  CHECK(c.reason.find("different hosts") != std::string::npos);
  c = cu::choose_transport(facts(boot_a, 10, 1, 7), facts(boot_a, 20, 2, 8), cu::memory_kind::gpu);
  CHECK(c.path == cu::transport::rdma);
  CHECK(c.reason.find("not visible here") != std::string::npos);
  c = cu::choose_transport(facts("", 10, 1, 7), facts(boot_a, 20, 2, 7), cu::memory_kind::gpu);
  CHECK(c.path == cu::transport::rdma);
  CHECK(c.reason.find("boot id unknown") != std::string::npos);
  c = cu::choose_transport(facts(boot_a, 10, 1, 7), facts(boot_a, 20, 2, 7), cu::memory_kind::host);
  CHECK(c.path == cu::transport::rdma);
  CHECK(c.reason.find("host memory") != std::string::npos);
  c = cu::choose_transport(facts(boot_a, 10, 1, 7), facts(boot_a, 20, 2, 7), cu::memory_kind::gpu, 3);
  CHECK(c.path == cu::transport::rdma);
}

TEST_CASE("one process: the device pointer; one pid in two PID namespaces is two processes",
          "[unit][same_host]") {
  auto c = cu::choose_transport(facts(boot_a, 10, 1, 7), facts(boot_a, 10, 1, 7), cu::memory_kind::gpu);
  CHECK(c.path == cu::transport::same_process);
  CHECK(c.reason.find("device pointer directly") != std::string::npos);
  c = cu::choose_transport(facts(boot_a, 10, 1, 7), facts(boot_a, 10, 2, 7), cu::memory_kind::gpu);
  CHECK(c.path == cu::transport::same_host);
}

TEST_CASE("this process's facts: a boot id, a token", "[unit][same_host]") {
  CHECK(cu::read_boot_id().size() == 36);
  CHECK(cu::process_token() == cu::process_token());
}

TEST_CASE("frames are checked before use", "[unit][same_host]") {
  namespace d = cu::detail;
  const d::frame hello = d::hello_frame(facts(boot_a, 10, 1, 7));
  CHECK(d::frame_problem(hello, sizeof hello).empty());
  CHECK(d::facts_of(hello) == [] {
    auto f = facts(boot_a, 10, 1, 7);
    return f;
  }());
  CHECK(d::frame_problem(hello, sizeof hello - 1).find("bytes") != std::string::npos);
  d::frame bad = hello;
  bad.magic = 1;
  CHECK(!d::frame_problem(bad, sizeof bad).empty());
  bad = hello;
  bad.gpu_count = 17;
  CHECK(!d::frame_problem(bad, sizeof bad).empty());
  bad = hello;
  bad.device = 1;  // one GPU listed
  CHECK(!d::frame_problem(bad, sizeof bad).empty());
  d::frame g;
  g.type = d::frame_type::grant;
  g.alloc_bytes = 2 << 20;
  g.offset = 4096;
  g.length = (2 << 20) - 4096;
  g.element_size = 4;
  g.rights = 3;
  CHECK(d::frame_problem(g, sizeof g).empty());
  g.length += 1;  // past the allocation
  CHECK(d::frame_problem(g, sizeof g).find("outside its allocation") != std::string::npos);
  g.length = 4096;
  g.offset = ~std::uint64_t{0} - 100;  // no wrap-around
  CHECK(!d::frame_problem(g, sizeof g).empty());
  g.offset = 0;
  g.rights = 8;
  CHECK(!d::frame_problem(g, sizeof g).empty());
  g.rights = 3;
  g.element_size = 3;  // 4096 is not a multiple
  CHECK(!d::frame_problem(g, sizeof g).empty());
  g.element_size = 4;
  g.kind = static_cast<d::share_kind>(9);
  CHECK(!d::frame_problem(g, sizeof g).empty());
}

TEST_CASE("a descriptor crosses the socket beside its frame; a closed peer is seen", "[unit][same_host]") {
  namespace d = cu::detail;
  auto [a, b] = d::seqpacket_pair();
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const d::unique_fd r(pipe_fds[0]);
  d::unique_fd wfd(pipe_fds[1]);
  d::frame f;
  f.type = d::frame_type::notify;
  f.tag = 42;
  REQUIRE(d::send_frame(a.get(), &f, sizeof f, wfd.get()) == 0);
  wfd.reset();  // the receiver's copy keeps the pipe open
  d::frame got;
  d::frame_in in = d::receive_frame(b.get(), &got, sizeof got);
  REQUIRE(in.bytes == sizeof got);
  REQUIRE(in.fd);
  CHECK(got.tag == 42);
  REQUIRE(::write(in.fd.get(), "x", 1) == 1);
  char c = 0;
  REQUIRE(::read(r.get(), &c, 1) == 1);
  CHECK(c == 'x');
  // nothing waiting: no bytes, not closed
  in = d::receive_frame(b.get(), &got, sizeof got);
  CHECK(in.bytes == 0);
  CHECK(!in.closed);
  // an oversized frame is reported as more than the buffer holds
  char big[sizeof(d::frame) + 8] = {};
  REQUIRE(d::send_frame(a.get(), big, sizeof big) == 0);
  in = d::receive_frame(b.get(), &got, sizeof got);
  CHECK(in.bytes == sizeof got + 1);
  a.reset();
  in = d::receive_frame(b.get(), &got, sizeof got);
  CHECK(in.closed);
  CHECK(!d::frame_problem(got, sizeof got + 1).empty());
}

TEST_CASE("bad socket paths are refused before anything is opened", "[unit][same_host]") {
  sockaddr_un a{};
  CHECK_THROWS_AS(cu::detail::unix_address("", a), rdx::error);
  CHECK_THROWS_AS(cu::detail::unix_address(std::string(200, 'x'), a), rdx::error);
  CHECK(cu::detail::unix_address("@rdx-test", a) > 0);
}

TEST_CASE("a GPU's ordinal found by its UUID in a process's list", "[unit][same_host]") {
  std::vector<cu::gpu_uuid> gpus(3);
  for (std::size_t d = 0; d < gpus.size(); ++d) gpus[d].fill(static_cast<std::uint8_t>(0x10 + d));
  CHECK(cu::ordinal_in(gpus, gpus[0]) == 0);
  CHECK(cu::ordinal_in(gpus, gpus[2]) == 2);
  cu::gpu_uuid other{};
  other.fill(0x7f);
  CHECK(cu::ordinal_in(gpus, other) == -1);
  CHECK(cu::ordinal_in({}, gpus[1]) == -1);
}

TEST_CASE("a GPU's UUID read back from its text, as nvidia-smi -L prints it", "[unit][same_host]") {
  cu::gpu_uuid u{};
  for (std::size_t i = 0; i < u.size(); ++i) u[i] = static_cast<std::uint8_t>(0x8f - 7 * i);
  const std::string text = cu::to_string(u);
  CHECK(text.size() == 40);
  CHECK(cu::parse_gpu_uuid(text) == u);
  std::string upper = text;
  for (std::size_t i = 4; i < upper.size(); ++i) upper[i] = static_cast<char>(std::toupper(upper[i]));
  CHECK(cu::parse_gpu_uuid(upper) == u);
  CHECK(cu::parse_gpu_uuid("GPU-8f6c1d2e-0b3a-4c5d-9e8f-0123456789ab").has_value());
  CHECK_FALSE(cu::parse_gpu_uuid("").has_value());
  CHECK_FALSE(cu::parse_gpu_uuid("0").has_value());
  CHECK_FALSE(cu::parse_gpu_uuid(text.substr(4)).has_value());                              // no GPU- prefix
  CHECK_FALSE(cu::parse_gpu_uuid("MIG-" + text.substr(4)).has_value());                     // a MIG instance
  CHECK_FALSE(cu::parse_gpu_uuid(text + "0").has_value());                                  // too long
  CHECK_FALSE(cu::parse_gpu_uuid("GPU-8f6c1d2e0-b3a-4c5d-9e8f-0123456789ab").has_value());  // a dash moved
  CHECK_FALSE(cu::parse_gpu_uuid("GPU-8f6c1d2e-0b3a-4c5d-9e8f-0123456789ag").has_value());  // not hex
}

TEST_CASE("a window's route to another GPU: mapped here by P2P, else staged on the memory's GPU",
          "[unit][same_host]") {
  const cu::gpu_route_choice same = cu::choose_gpu_route(1, 1, false);
  CHECK(same.route == cu::gpu_route::same_gpu);
  CHECK(same.map_on == 1);
  const cu::gpu_route_choice p2p = cu::choose_gpu_route(0, 1, true);
  CHECK(p2p.route == cu::gpu_route::peer_to_peer);
  CHECK(p2p.map_on == 0);  // mapped with access for this process's GPU
  CHECK(p2p.why == "P2P from GPU 0 to GPU 1");
  const cu::gpu_route_choice staged = cu::choose_gpu_route(0, 1, false);
  CHECK(staged.route == cu::gpu_route::staged);
  CHECK(staged.map_on == 1);  // mapped on the memory's own GPU, which needs no peer access
  CHECK(staged.why.find("staged through host memory") != std::string::npos);
  CHECK(staged.why.find("cudaDeviceCanAccessPeer") != std::string::npos);
}
