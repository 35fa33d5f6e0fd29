// Registration of memory the caller does not allocate with malloc: a dma-buf
// from another exporter (DRM's vgem in the Soft-RoCE VM: Debian's kernel
// builds neither udmabuf nor dma-buf heaps) and the locked-memory limit.
//   [dmabuf]  the dma-buf memory_region: on a device that cannot import
//             dma-buf (Soft-RoCE) the error says so and what works; ranges
//             checked before the device sees them; owned descriptors closed
//             once, borrowed ones left open, also when registration fails.
//   [memlock] a child process without CAP_IPC_LOCK and a 64 KiB
//             RLIMIT_MEMLOCK: the registration error names the limit and the fix.
#include <rdx/verbs/dma_buf.hpp>

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "channel_support.hpp"
#include <fcntl.h>
#include <linux/capability.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

// DRM's UAPI for a dumb buffer and its PRIME export (<drm/drm.h>, <drm/drm_mode.h>;
// the structures are stable kernel ABI, declared here since Debian ships those
// headers only in libdrm-dev).
struct drm_mode_create_dumb {
  std::uint32_t height, width, bpp, flags;
  std::uint32_t handle, pitch;
  std::uint64_t size;
};
struct drm_prime_handle {
  std::uint32_t handle, flags;
  std::int32_t fd;
};
constexpr unsigned long drm_ioctl_mode_create_dumb = _IOWR('d', 0xB2, drm_mode_create_dumb);
constexpr unsigned long drm_ioctl_prime_handle_to_fd = _IOWR('d', 0x2d, drm_prime_handle);

// A dma-buf of at least `bytes` exported by a DRM device's dumb buffer (vgem
// in the VM), or -1 with the reason when there is none.
int export_dumb_dma_buf(std::size_t bytes, std::string& why) {
  for (int i = 0; i < 8; ++i) {
    const std::string dev = "/dev/dri/card" + std::to_string(i);
    const int card = ::open(dev.c_str(), O_RDWR | O_CLOEXEC);
    if (card < 0) continue;
    drm_mode_create_dumb c{};
    c.width = 1024;
    c.bpp = 32;
    c.height = static_cast<std::uint32_t>((bytes + 4095) / 4096);
    drm_prime_handle p{};
    if (::ioctl(card, drm_ioctl_mode_create_dumb, &c) == 0) {
      p.handle = c.handle;
      p.flags = O_RDWR | O_CLOEXEC;
      if (::ioctl(card, drm_ioctl_prime_handle_to_fd, &p) != 0) p.fd = -1;
    } else {
      p.fd = -1;
    }
    ::close(card);  // the dma-buf keeps the buffer
    if (p.fd >= 0) return p.fd;
    why += dev + ": " + std::strerror(errno) + "; ";
  }
  why += "no DRM device exports dumb buffers (the Soft-RoCE VM loads vgem)";
  return -1;
}

int dma_buf_or_skip(std::size_t bytes) {
  std::string why;
  const int fd = export_dumb_dma_buf(bytes, why);
  if (fd < 0) {
    std::fprintf(stderr, "SKIP: no dma-buf exporter: %s\n", why.c_str());
    std::exit(77);
  }
  return fd;
}

bool fd_open(int fd) {
  return ::fcntl(fd, F_GETFD) != -1;
}

}  // namespace

TEST_CASE("a dma-buf from another exporter registers through memory_region, or says why not", "[dmabuf]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  const int fd = dma_buf_or_skip(64 * 1024);
  const rdx::dma_buf buf = rdx::dma_buf::borrow(fd);
  REQUIRE(buf.size() >= 64 * 1024);
  std::string what;
  const std::error_code ec = channel_test::code_of(
      [&] {
        const rdx::memory_region mr(pd, buf, 0, 64 * 1024, 0x10000, rdx::access::local_write);
        // A device that imports dma-buf: the region covers the iova.
        CHECK(mr.length() == 64 * 1024);
        CHECK(reinterpret_cast<std::uintptr_t>(mr.addr()) == 0x10000);
      },
      &what);
  std::printf("dmabuf: %s registering 64 KiB of a dumb-buffer dma-buf: %s\n", ctx.name().c_str(),
              ec ? what.c_str() : "registered");
  if (ctx.name().rfind("rxe", 0) == 0) {
    CHECK(ec == rdx::errc::unsupported);
    CHECK(what.find(ctx.name() + " cannot register dma-buf") != std::string::npos);
    CHECK(what.find("register host memory instead") != std::string::npos);
  }
  CHECK(fd_open(fd));  // borrowed: left open, whatever happened
  ::close(fd);
}

TEST_CASE("a dma-buf range outside the buffer is refused before the device sees it", "[dmabuf]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  const int fd = dma_buf_or_skip(64 * 1024);
  const rdx::dma_buf buf = rdx::dma_buf::own(fd);
  const std::size_t size = buf.size();
  std::string what;
  CHECK(channel_test::code_of([&] { (void)rdx::memory_region(pd, buf, 0, size + 1, 0); }, &what) ==
        rdx::errc::invalid_argument);
  CHECK(what.find("reaches past its end") != std::string::npos);
  CHECK(channel_test::code_of([&] { (void)rdx::memory_region(pd, buf, size, 1, 0); }) ==
        rdx::errc::invalid_argument);
  CHECK(channel_test::code_of([&] { (void)rdx::memory_region(pd, buf, 4096, 0, 0); }) ==
        rdx::errc::invalid_argument);
  CHECK(channel_test::code_of([] { (void)rdx::dma_buf::own(-1); }) == rdx::errc::invalid_argument);
  CHECK(channel_test::code_of([] { (void)rdx::dma_buf::borrow(-3); }) == rdx::errc::invalid_argument);
}

TEST_CASE("an owned dma-buf descriptor is closed once, a borrowed one never", "[dmabuf]") {
  const int a = dma_buf_or_skip(4096);
  const int b = dma_buf_or_skip(4096);
  {
    rdx::dma_buf owner = rdx::dma_buf::own(a);
    CHECK(owner.owned());
    rdx::dma_buf moved = std::move(owner);
    {
      const rdx::dma_buf gone = std::move(owner);  // moved-from: owns nothing
      CHECK(gone.fd() == -1);
    }
    CHECK(fd_open(a));
    const rdx::dma_buf borrowed = rdx::dma_buf::borrow(b);
    CHECK_FALSE(borrowed.owned());
  }
  CHECK_FALSE(fd_open(a));  // closed by the last owner
  CHECK(fd_open(b));        // borrowed: still the caller's
  {
    rdx::dma_buf r = rdx::dma_buf::own(b);
    const int taken = r.release();
    CHECK(taken == b);
  }
  CHECK(fd_open(b));  // released: the caller closes it
  ::close(b);
}

TEST_CASE("a registration over the locked-memory limit names the limit and the fix", "[memlock]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  int pipe_fd[2];
  REQUIRE(::pipe(pipe_fd) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(pipe_fd[0]);
    auto report = [&](const std::string& s, int status) {
      (void)!::write(pipe_fd[1], s.data(), s.size());
      ::_exit(status);
    };
    // No CAP_IPC_LOCK (root has it and would not be limited), 64 KiB of locked memory.
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct d[2]{};
    if (::syscall(SYS_capget, &h, d) != 0) report("capget failed", 2);
    d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    d[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    if (::syscall(SYS_capset, &h, d) != 0) report("capset failed", 2);
    const rlimit l{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_MEMLOCK, &l) != 0) report("setrlimit failed", 2);
    try {
      rdx::registered_buffer<std::byte> big(pd, 1 << 20);
      report("registered 1 MiB under a 64 KiB limit", 1);
    } catch (const rdx::error& e) {
      report(std::to_string(e.code().value()) + " " + e.what(), 0);
    }
  }
  ::close(pipe_fd[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fd[0], buf, sizeof buf)) > 0;)
    got.append(buf, static_cast<std::size_t>(n));
  ::close(pipe_fd[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  std::printf("memlock: %s\n", got.c_str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(got.rfind(std::to_string(ENOMEM) + " ", 0) == 0);
  CHECK(got.find("RLIMIT_MEMLOCK, ulimit -l) is 64 KiB") != std::string::npos);
  CHECK(got.find("1 MiB here") != std::string::npos);
  CHECK(got.find("ulimit -l unlimited") != std::string::npos);
  CHECK(got.find("rdx-doctor --check memlock") != std::string::npos);
}
