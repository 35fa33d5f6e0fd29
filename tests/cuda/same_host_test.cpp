// Same-host GPU peers between two processes of one host: each case starts
// this program again as its peer (two_process.hpp), fills GPU memory with a
// kernel on one side and checks every byte with a kernel on the other.
//
//   cuda_same_host_test vmm            shareable allocations both ways: write, write_with_notify, read
//   cuda_same_host_test legacy         cudaMalloc memory through legacy CUDA IPC, both ways
//   cuda_same_host_test exporter_exit  the exporter exits while the importer holds its mapping
//   cuda_same_host_test grant_refused  grants beyond the buffer or exposing too much refused, nothing sent
//   cuda_same_host_test same_process   both ends in one process: refused, with the reason
//
// Exits 0 when every check passed, 1 when one failed, 77 (skipped) with the
// reason where no GPU is usable.
#include <rdx/cuda/same_host.hpp>

#include <coroutine>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "patterns.hpp"
#include "two_process.hpp"

namespace {

int failures = 0;
const char* who = "parent";

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: [%s] CHECK failed: %s\n", __FILE__, __LINE__, who, #cond); \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)
#define CHECK_EC(expr, want)                                                                        \
  do {                                                                                              \
    const std::error_code ec_ = (expr);                                                             \
    if (ec_ != (want)) {                                                                            \
      std::fprintf(stderr, "%s:%d: [%s] %s gave '%s', want '%s'\n", __FILE__, __LINE__, who, #expr, \
                   ec_.message().c_str(), std::error_code(want).message().c_str());                 \
      ++failures;                                                                                   \
    }                                                                                               \
  } while (0)

using rdx::cuda::same_host_peer;
namespace cu = rdx::cuda;
const std::error_code ok{};
constexpr auto rw = rdx::rights::read | rdx::rights::write;

void sync() {
  RDX_CUDA_TRY(cudaDeviceSynchronize());
}

// Every byte of [p, p + n) is the pattern of seed at offsets [off, off + n).
bool verify(const void* p, std::size_t n, std::uint64_t seed, std::uint64_t off = 0) {
  sync();
  const auto r = rdx_test::gpu_check(p, n, seed, off);
  if (!r.ok()) {
    std::fprintf(stderr, "[%s] %llu bad words, first at %llu\n", who,
                 static_cast<unsigned long long>(r.mismatches),
                 static_cast<unsigned long long>(r.first_bad_offset));
  }
  return r.ok();
}

std::uint32_t receive(same_host_peer& p) {
  auto n = p.receive_notification();
  const std::error_code ec = n.wait(std::chrono::seconds(60));
  CHECK_EC(ec, ok);
  return n.tag();
}

// A coroutine that runs eagerly and keeps its result: enough to co_await a peer operation.
struct task {
  struct promise_type {
    task get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};
task await_write(cu::same_host_window<std::uint8_t>& w, std::span<const std::uint8_t> src,
                 std::error_code& out, bool& done) {
  auto op = w.write(src, 0);
  out = co_await op.within(std::chrono::seconds(30));
  done = true;
}
task await_notification(same_host_peer& p, std::error_code& out, bool& done) {
  auto op = p.receive_notification();
  out = co_await op.within(std::chrono::milliseconds(20));
  done = true;
}

// Both ways: each side grants a buffer, the other writes it (write_with_notify), the owner
// checks every byte, then the other reads it back and checks what it read.
template <class Buffer>
void both_ways(same_host_peer& p, bool first, std::size_t n) {
  const auto choice = p.choice();
  std::printf("[%s] choice: %s (%s)\n", who, std::string(cu::to_string(choice.path)).c_str(),
              choice.reason.c_str());
  CHECK(choice.path == cu::transport::same_host);
  Buffer mine(n);
  cu::device_buffer<std::uint8_t> src(n);
  cu::device_buffer<std::uint8_t> back(n);
  const std::uint64_t my_seed = first ? 11 : 22;
  const std::uint64_t their_seed = first ? 22 : 11;
  rdx_test::gpu_fill(mine.data(), n, 99);  // not what the peer will write
  rdx_test::gpu_fill(src.data(), n, their_seed);
  sync();
  auto g = p.grant(mine, 0, n, rw);
  CHECK(g.size_bytes() == n);
  auto w = p.accept_window<std::uint8_t>();
  CHECK(w.size() == n);
  std::printf("[%s] window of %zu bytes by %s, %s\n", who, w.size(), w.sharing(), w.route_text().c_str());
  // Both processes use CUDA device 0 (same_host_options::device) here.
  CHECK(w.route() == cu::gpu_route::same_gpu);
  // the peer's buffer gets their_seed: write all but the first 4 KiB, then those (both ways of ending).
  auto big = w.write_with_notify(std::span<const std::uint8_t>(src.data() + 4096, n - 4096), 4096, 1);
  CHECK_EC(big.wait(), ok);
  std::error_code co_ec = make_error_code(rdx::errc::not_ready);
  bool co_done = false;
  await_write(w, std::span<const std::uint8_t>(src.data(), 4096), co_ec, co_done);
  while (!co_done) {
    (void)p.progress();
  }
  CHECK_EC(co_ec, ok);
  auto tell = p.notify(2);
  CHECK_EC(tell.wait(), ok);
  // mine was written by the peer: every byte of their pattern for me is mine now.
  CHECK(receive(p) == 1);
  CHECK(receive(p) == 2);
  CHECK(verify(mine.data(), n, my_seed));
  // read back what I wrote into the peer's buffer.
  auto rd = w.read(std::span<std::uint8_t>(back.data(), n), 0);
  CHECK_EC(rd.wait(), ok);
  CHECK(verify(back.data(), n, their_seed));
  // bad ranges end at once, with nothing copied.
  auto past = w.write(std::span<const std::uint8_t>(src.data(), 2), n - 1);
  CHECK(past.done());
  CHECK_EC(past.error(), rdx::errc::out_of_range);
  auto bye = p.notify(3);
  CHECK_EC(bye.wait(), ok);
  CHECK(receive(p) == 3);  // both are done with the other's memory
  // A notification that never comes ends at its deadline (co_await with within()): each side
  // tries it while the other waits for it, so that nothing arrives meanwhile.
  auto timeout_test = [&] {
    co_done = false;
    await_notification(p, co_ec, co_done);
    while (!co_done) {
      (void)p.progress();
    }
    CHECK_EC(co_ec, rdx::errc::timed_out);
  };
  if (first) {
    timeout_test();
    auto four = p.notify(4);
    CHECK_EC(four.wait(), ok);
    CHECK(receive(p) == 5);
  } else {
    CHECK(receive(p) == 4);
    timeout_test();
    auto five = p.notify(5);
    CHECK_EC(five.wait(), ok);
    CHECK(receive(p) == 6);  // the first side's goodbye: it has read 5
  }
  if (first) {
    auto six = p.notify(6);
    CHECK_EC(six.wait(), ok);
  }
}

int child(std::string_view role) {
  who = "child";
  auto p = same_host_peer::from_socket(rdx_test::child_socket_fd);
  if (role == "vmm") {
    both_ways<cu::shareable_buffer<std::uint8_t>>(p, false, (std::size_t{6} << 20) + 12345);
  } else if (role == "legacy") {
    both_ways<cu::device_buffer<std::uint8_t>>(p, false, std::size_t{8} << 20);
  } else if (role == "exporter_exit") {
    cu::shareable_buffer<std::uint8_t> b(std::size_t{4} << 20);
    rdx_test::gpu_fill(b.data(), b.size(), 5);
    sync();
    auto g = p.grant(b, 0, b.size(), rw);
    CHECK(receive(p) == 1);  // the parent mapped it
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(failures == 0 ? 0 : 1);  // gone, as a crash would be: no revoke, no goodbye
  } else if (role == "grant_refused") {
    auto w = p.accept_window<std::uint8_t>();  // only the one allowed grant arrives
    CHECK(w.size() == (std::size_t{1} << 20));
    bool timed_out = false;
    try {
      (void)p.accept_window<std::uint8_t>(std::chrono::milliseconds(300));
    } catch (const rdx::error& e) {
      timed_out = e.code() == rdx::errc::timed_out;
    }
    CHECK(timed_out);
    auto done = p.notify(1);
    CHECK_EC(done.wait(), ok);
    CHECK(receive(p) == 2);
  }
  return failures == 0 ? 0 : 1;
}

template <class F>
std::string error_of(F&& f, std::error_code& code) {
  try {
    f();
  } catch (const rdx::error& e) {
    code = e.code();
    return e.what();
  }
  return {};
}

int parent(std::string_view name) {
  if (name == "same_process") {
    auto [a, b] = rdx::cuda::detail::seqpacket_pair();
    same_host_peer other;
    std::thread t([&, fd = b.release()] { other = same_host_peer::from_socket(fd); });
    auto p = same_host_peer::from_socket(a.release());
    t.join();
    CHECK(p.choice().path == cu::transport::same_process);
    std::printf("choice: %s (%s)\n", std::string(cu::to_string(p.choice().path)).c_str(),
                p.choice().reason.c_str());
    cu::device_buffer<std::uint8_t> buf(std::size_t{2} << 20);
    std::error_code code;
    const std::string what = error_of([&] { (void)p.grant(buf, 0, buf.size(), rw); }, code);
    std::printf("refused: %s\n", what.c_str());
    CHECK(code == rdx::errc::unsupported);
    CHECK(what.find("CUDA refuses to open a process's own IPC handles") != std::string::npos);
    CHECK(what.find("device pointer directly") != std::string::npos);
    return failures == 0 ? 0 : 1;
  }
  const auto c = rdx_test::spawn_child(std::string(name).c_str());
  int child_status = 0;
  {
    auto p = same_host_peer::from_socket(c.socket);
    if (name == "vmm") {
      both_ways<cu::shareable_buffer<std::uint8_t>>(p, true, (std::size_t{6} << 20) + 12345);
    } else if (name == "legacy") {
      both_ways<cu::device_buffer<std::uint8_t>>(p, true, std::size_t{8} << 20);
    } else if (name == "exporter_exit") {
      auto w = p.accept_window<std::uint8_t>();
      cu::device_buffer<std::uint8_t> dst(w.size());
      auto rd = w.read(std::span<std::uint8_t>(dst.data(), dst.size()), 0);
      CHECK_EC(rd.wait(), ok);
      CHECK(verify(dst.data(), dst.size(), 5));
      auto tell = p.notify(1);
      CHECK_EC(tell.wait(), ok);
      child_status = rdx_test::wait_child(c.pid);
      CHECK(child_status == 0);
      // The exporter is gone; its memory stays mapped here until the window goes.
      auto wr = w.write(std::span<const std::uint8_t>(dst.data(), dst.size()), 0);
      const std::error_code e1 = wr.wait();
      std::printf("write after the exporter exited: %s\n", e1.message().c_str());
      CHECK_EC(e1, rdx::errc::peer_disconnected);
      auto rd2 = w.read(std::span<std::uint8_t>(dst.data(), dst.size()), 0);
      CHECK_EC(rd2.wait(), rdx::errc::peer_disconnected);
      auto n = p.receive_notification();
      CHECK_EC(n.wait(), rdx::errc::peer_disconnected);
      CHECK_EC(p.status(), rdx::errc::peer_disconnected);
      return failures == 0 ? 0 : 1;
    } else if (name == "grant_refused") {
      cu::shareable_buffer<std::uint8_t> big(std::size_t{64} << 20);
      std::error_code code;
      std::string what = error_of([&] { (void)p.grant(big, (std::size_t{64} << 20) - 10, 11, rw); }, code);
      std::printf("beyond the buffer: %s\n", what.c_str());
      CHECK(code == rdx::errc::out_of_range);
      code = {};
      what = error_of([&] { (void)p.grant(big, 0, std::size_t{1} << 20, rw); }, code);
      std::printf("exposing too much: %s\n", what.c_str());
      CHECK(code == rdx::errc::invalid_argument);
      CHECK(what.find("would expose the whole allocation") != std::string::npos);
      code = {};
      what = error_of([&] { (void)p.grant(big, 0, 16, rdx::rights::atomic); }, code);
      CHECK(code == rdx::errc::invalid_argument);
      code = {};
      what = error_of([&] { (void)p.grant(big, 0, 0, rw); }, code);
      CHECK(code == rdx::errc::invalid_argument);
      // The caller may allow the whole allocation: this one goes through.
      auto g = p.grant(big, 0, std::size_t{1} << 20, rw, big.allocation_bytes());
      CHECK(g.exposed_bytes() == (std::size_t{64} << 20));
      CHECK(receive(p) == 1);
      auto bye = p.notify(2);
      CHECK_EC(bye.wait(), ok);
    } else {
      std::fprintf(stderr, "unknown case %.*s\n", static_cast<int>(name.size()), name.data());
      return 2;
    }
  }
  child_status = rdx_test::wait_child(c.pid);
  CHECK(child_status == 0);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc == 3 && std::string_view(argv[1]) == "--child") {
    return child(argv[2]);
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s vmm|legacy|exporter_exit|grant_refused|same_process\n", argv[0]);
    return 2;
  }
  if (const std::string why = cu::no_device_reason(); !why.empty()) {
    std::fprintf(stderr, "cuda_same_host_test: SKIP: needs a CUDA GPU: %s\n", why.c_str());
    return 77;
  }
  const int r = parent(argv[1]);
  std::printf("%s: %s\n", argv[1], r == 0 ? "passed" : "FAILED");
  return r;
} catch (const std::exception& e) {
  std::fprintf(stderr, "[%s] exception: %s\n", who, e.what());
  return 1;
}
