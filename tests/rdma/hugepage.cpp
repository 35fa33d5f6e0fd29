// rdma tests: page_allocation and huge_buffer (include/rdx/verbs/page_allocation.hpp):
// an RDMA write from 2 MiB pages over a loopback pair, the fallback order when no
// huge pages are configured, and ([timing], hidden) registration times by page kind.
#include <rdx/verbs/page_allocation.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rdma_support.hpp"
#include <unistd.h>

using rdx_test::loopback;
using rdx_test::wait_one;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr const char* nr_hugepages = "/proc/sys/vm/nr_hugepages";
constexpr const char* thp_enabled = "/sys/kernel/mm/transparent_hugepage/enabled";

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

bool write_text(const char* path, const std::string& v) {
  std::ofstream out(path);
  out << v << '\n';
  out.flush();
  return static_cast<bool>(out);
}

//! Only where a test owns the machine (the Soft-RoCE VM, as root) does it change
//! sysctls: on a shared host other processes may count on the huge page pool.
bool may_tune() {
  return std::getenv("RDX_VM") != nullptr && ::geteuid() == 0;
}

//! Sets a sysctl-style file for a scope and restores its old value after.
class setting_guard {
public:
  setting_guard(const char* path, const std::string& value, std::string old)
      : path_(path), old_(std::move(old)) {
    ok_ = write_text(path, value);
  }
  ~setting_guard() { write_text(path_, old_); }
  setting_guard(const setting_guard&) = delete;
  setting_guard& operator=(const setting_guard&) = delete;
  [[nodiscard]] bool ok() const { return ok_; }

private:
  const char* path_;
  std::string old_;
  bool ok_ = false;
};

//! The THP mode word of the enabled file ("always [madvise] never" -> "madvise").
std::string thp_mode() {
  return rdx::detail::thp_mode();
}

//! Sets vm.nr_hugepages to n for a scope (restoring the old value) and says
//! whether the kernel reserved them all.
struct hugepages_scope {
  setting_guard g;
  explicit hugepages_scope(std::int64_t n) : g(nr_hugepages, std::to_string(n), read_line(nr_hugepages)) {}
  [[nodiscard]] std::int64_t reserved() const { return rdx::detail::read_number_file(nr_hugepages); }
};

//! Bytes of AnonHugePages in the mapping that holds p (from /proc/self/smaps).
std::size_t thp_bytes(const void* p) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  auto a = reinterpret_cast<std::uintptr_t>(p);
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = a >= lo && a < hi;
      continue;
    }
    unsigned long kb = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kb) == 1) {
      return kb * 1024;
    }
  }
  return 0;
}

void fill(std::span<char> s, char seed) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    s[i] = static_cast<char>(seed + static_cast<char>(i % 251));
  }
}

bool all_zero(const char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != 0) {
      return false;
    }
  }
  return true;
}

//! Writes 3 MiB (across a 2 MiB page boundary) from src to dst at 1 MiB + 100
//! over a loopback pair and checks the bytes and the untouched edges.
template <class Src, class Dst>
void write_and_check(loopback& lb, Src& src, Dst& dst) {
  constexpr std::size_t len = 3 * mib, at = mib + 100;
  fill(src.span(), 'h');
  REQUIRE(!lb.a.post_send(rdx::wr::write(src.sge(512 * 1024, len), rdx::at(dst.remote(), at))));
  auto c = wait_one(lb.cq_a, std::chrono::seconds(60));
  INFO(c.error().message());
  REQUIRE(c.ok());
  CHECK(c.opcode() == IBV_WC_RDMA_WRITE);
  CHECK(std::memcmp(dst.data() + at, src.data() + 512 * 1024, len) == 0);
  CHECK(all_zero(dst.data(), at));
  CHECK(all_zero(dst.data() + at + len, dst.size() - at - len));
}

//! What huge_only throws for bytes (checked to be errc::unsupported).
std::string huge_only_refusal(std::size_t bytes) {
  try {
    (void)rdx::page_allocation::make(bytes, rdx::page_policy::huge_only);
  } catch (const rdx::error& e) {
    INFO(e.what());
    CHECK(e.code() == rdx::errc::unsupported);
    return e.what();
  }
  FAIL("huge_only did not throw");
  return {};
}

}  // namespace

TEST_CASE("page_allocation: aligned, zeroed, move-only, small pages when asked") {
  static_assert(!std::is_copy_constructible_v<rdx::page_allocation>);
  static_assert(std::is_nothrow_move_constructible_v<rdx::page_allocation>);
  static_assert(!std::is_copy_constructible_v<rdx::huge_buffer<char>>);
  CHECK_THROWS_AS(rdx::page_allocation::make(0), rdx::error);

  auto a = rdx::page_allocation::make(10000, rdx::page_policy::small);
  REQUIRE(a);
  CHECK(a.kind() == rdx::page_kind::small);
  CHECK(a.why() == "4 KiB pages as asked");
  CHECK(a.size() == 10000);
  CHECK(a.mapped_size() == 12288);
  CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 4096 == 0);
  CHECK(all_zero(static_cast<const char*>(a.data()), a.mapped_size()));

  void* p = a.data();
  rdx::page_allocation b = std::move(a);
  CHECK_FALSE(a);
  CHECK(b.data() == p);
  b = rdx::page_allocation::make(5, rdx::page_policy::transparent_huge);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % (2 * mib) == 0);
  CHECK(b.mapped_size() == 2 * mib);
  if (thp_mode() != "never" && !thp_mode().empty()) {
    CHECK(b.kind() == rdx::page_kind::transparent_huge);
  }
}

TEST_CASE("huge_buffer on 2 MiB pages: an RDMA write from it, bytes checked at the destination") {
  loopback lb;
  std::optional<hugepages_scope> pool;
  if (may_tune()) {
    // Two 6 MiB buffers: three 2 MiB pages each.
    pool.emplace(rdx::detail::read_huge_pool().total + 6);
    REQUIRE(pool->g.ok());
  }
  if (rdx::detail::read_huge_pool().free < 6) {
    WARN("fewer than 6 free 2 MiB huge pages and not in the VM: huge-page write skipped");
    return;
  }
  rdx::huge_buffer<char> src(lb.pd, 6 * mib, rdx::access::local_write, rdx::page_policy::huge_only);
  rdx::huge_buffer<char> dst(lb.pd, 6 * mib, rdx::access::remote_write, rdx::page_policy::huge_only);
  INFO(src.why());
  CHECK(src.kind() == rdx::page_kind::huge);
  CHECK(dst.kind() == rdx::page_kind::huge);
  CHECK(src.why() == "2 MiB huge pages from the hugetlbfs pool");
  CHECK(reinterpret_cast<std::uintptr_t>(src.data()) % (2 * mib) == 0);
  CHECK(src.region().length() == 6 * mib);
  CHECK(all_zero(dst.data(), dst.size()));
  write_and_check(lb, src, dst);

  // Moved, the buffer keeps its registration; assigned over, the old one goes first.
  auto key = dst.rkey();
  rdx::huge_buffer<char> moved = std::move(dst);
  CHECK(moved.rkey() == key);
  CHECK(moved.remote().length == 6 * mib);
  moved = std::move(src);
  CHECK(moved.kind() == rdx::page_kind::huge);
}

TEST_CASE("huge_buffer on transparent huge pages and on 4 KiB pages: RDMA write, bytes checked") {
  loopback lb;
  rdx::huge_buffer<char> thp(lb.pd, 6 * mib, rdx::access::local_write, rdx::page_policy::transparent_huge);
  rdx::huge_buffer<char> small(lb.pd, 6 * mib, rdx::access::remote_write, rdx::page_policy::small);
  INFO(thp.why());
  CHECK(small.kind() == rdx::page_kind::small);
  if (thp.kind() == rdx::page_kind::transparent_huge) {
    CHECK(reinterpret_cast<std::uintptr_t>(thp.data()) % (2 * mib) == 0);
    INFO("AnonHugePages of the THP buffer: " << thp_bytes(thp.data()));
    CHECK(thp_bytes(thp.data()) > 0);
  }
  CHECK(thp_bytes(small.data()) == 0);
  write_and_check(lb, thp, small);
}

TEST_CASE("fallback when no huge pages are configured: THP, then 4 KiB pages; huge_only throws the fix") {
  if (!may_tune()) {
    WARN("not in the Soft-RoCE VM as root: the fallback with vm.nr_hugepages = 0 is not exercised here");
    return;
  }
  hugepages_scope none(0);
  REQUIRE(none.g.ok());
  REQUIRE(none.reserved() == 0);

  SECTION("prefer_huge falls back to transparent huge pages and says why") {
    auto a = rdx::page_allocation::make(4 * mib);
    INFO(a.why());
    if (thp_mode() == "never" || thp_mode().empty()) {
      CHECK(a.kind() == rdx::page_kind::small);
    } else {
      CHECK(a.kind() == rdx::page_kind::transparent_huge);
      CHECK(a.why().find(
                "no 2 MiB huge pages configured (vm.nr_hugepages = 0): using transparent huge pages") == 0);
      CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % (2 * mib) == 0);
    }
    CHECK(all_zero(static_cast<const char*>(a.data()), a.size()));
  }
  SECTION("with THP disabled too, 4 KiB pages, and the reason names both") {
    setting_guard never(thp_enabled, "never", thp_mode());
    REQUIRE(never.ok());
    REQUIRE(thp_mode() == "never");
    auto a = rdx::page_allocation::make(4 * mib);
    INFO(a.why());
    CHECK(a.kind() == rdx::page_kind::small);
    CHECK(a.why() ==
          "no 2 MiB huge pages configured (vm.nr_hugepages = 0): transparent huge pages are disabled "
          "(/sys/kernel/mm/transparent_hugepage/enabled = never): using 4 KiB pages");
    loopback lb;
    rdx::huge_buffer<char> b(lb.pd, 64 * 1024);
    CHECK(b.kind() == rdx::page_kind::small);
    CHECK(b.why().find("using 4 KiB pages") != std::string::npos);
  }
  SECTION("huge_only throws errc::unsupported with the fix") {
    auto what = huge_only_refusal(4 * mib);
    CHECK(what.find("vm.nr_hugepages = 0") != std::string::npos);
    CHECK(what.find("echo 2 > /proc/sys/vm/nr_hugepages") != std::string::npos);
  }
  SECTION("a pool too small for the request: the count in the reason and in the fix") {
    hugepages_scope one(1);
    REQUIRE(one.reserved() == 1);
    auto a = rdx::page_allocation::make(5 * mib);
    INFO(a.why());
    CHECK(a.why().find("only 1 of 1 2 MiB huge pages free, 3 needed") == 0);
    CHECK(huge_only_refusal(5 * mib).find("echo 3 > /proc/sys/vm/nr_hugepages") != std::string::npos);
    auto fits = rdx::page_allocation::make(2 * mib, rdx::page_policy::huge_only);
    CHECK(fits.kind() == rdx::page_kind::huge);
  }
}

namespace {

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

//! Registers [addr, addr + len) as `threads` regions, one per thread, chunks on
//! 2 MiB boundaries (so no huge page is split between regions).
std::vector<rdx::memory_region> register_chunks(const rdx::protection_domain& pd, char* addr, std::size_t len,
                                                rdx::access rights, unsigned threads) {
  std::size_t chunk = rdx::detail::round_up((len + threads - 1) / threads, 2 * mib);
  std::vector<std::optional<rdx::memory_region>> slots(threads);
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) {
    std::size_t off = i * chunk;
    if (off >= len) {
      break;
    }
    std::size_t n = std::min(chunk, len - off);
    pool.emplace_back([&, i, off, n] { slots[i].emplace(pd, addr + off, n, rights); });
  }
  for (auto& t : pool) {
    t.join();
  }
  std::vector<rdx::memory_region> out;
  for (auto& s : slots) {
    if (s) {
      out.push_back(std::move(*s));
    }
  }
  return out;
}

struct timing {
  double serial_ms = -1, dereg_ms = -1, parallel_ms = -1;
};

//! Best of reps: one region over the allocation, then `threads` regions at once.
timing time_registration(const rdx::protection_domain& pd, const rdx::page_allocation& a, unsigned threads,
                         int reps) {
  timing t;
  auto rights = rdx::access::local_write | rdx::access::remote_write | rdx::access::remote_read;
  for (int r = 0; r < reps; ++r) {
    auto t0 = clock_type::now();
    std::optional<rdx::memory_region> mr;
    mr.emplace(pd, a.data(), a.size(), rights);
    double reg = ms_since(t0);
    t0 = clock_type::now();
    mr.reset();
    double dereg = ms_since(t0);
    t0 = clock_type::now();
    auto parts = register_chunks(pd, static_cast<char*>(a.data()), a.size(), rights, threads);
    double par = ms_since(t0);
    REQUIRE(parts.size() == threads);
    parts.clear();
    if (t.serial_ms < 0 || reg < t.serial_ms) {
      t.serial_ms = reg;
    }
    if (t.dereg_ms < 0 || dereg < t.dereg_ms) {
      t.dereg_ms = dereg;
    }
    if (t.parallel_ms < 0 || par < t.parallel_ms) {
      t.parallel_ms = par;
    }
  }
  return t;
}

long mem_available_mib() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") {
      return kb / 1024;
    }
  }
  return 0;
}

}  // namespace

TEST_CASE("registration time by page kind, serial and parallel", "[.][timing]") {
  auto ctx = rdx_test::open_device();
  rdx::protection_domain pd{ctx};
  // 1 GiB where it fits next to the VM's own needs (--mem 2048), else 512 MiB
  // (the default 768 MB VM), else 256 MiB; RDX_REG_MIB overrides.
  long avail = mem_available_mib();
  std::size_t size_mib = avail >= 1024 + 160 ? 1024 : avail >= 512 + 64 ? 512 : 256;
  if (const char* e = std::getenv("RDX_REG_MIB")) {
    size_mib = std::strtoul(e, nullptr, 10);
  }
  const std::size_t bytes = size_mib * mib;
  const unsigned threads = 2;
  const int reps = 3;
  const unsigned cpus = std::thread::hardware_concurrency();
  std::printf("registration timing: %zu MiB, MemAvailable %ld MiB, %u CPU(s), device %s, best of %d\n",
              size_mib, avail, cpus, ctx.native_handle()->device->name, reps);

  timing small, huge, thp;
  std::size_t thp_resident = 0;
  {
    auto a = rdx::page_allocation::make(bytes, rdx::page_policy::small);
    small = time_registration(pd, a, threads, reps);
  }
  {
    std::optional<hugepages_scope> pool;
    if (may_tune()) {
      pool.emplace(rdx::detail::read_huge_pool().total + static_cast<std::int64_t>(bytes / (2 * mib)));
    }
    try {
      auto a = rdx::page_allocation::make(bytes, rdx::page_policy::huge_only);
      huge = time_registration(pd, a, threads, reps);
    } catch (const rdx::error& e) {
      WARN("no hugetlbfs figure: " << e.what());
    }
  }
  {
    auto a = rdx::page_allocation::make(bytes, rdx::page_policy::transparent_huge);
    INFO(a.why());
    if (a.kind() == rdx::page_kind::transparent_huge) {
      thp_resident = thp_bytes(a.data());
      thp = time_registration(pd, a, threads, reps);
    }
  }
  auto ratio = [&](const timing& t) { return t.serial_ms > 0 ? small.serial_ms / t.serial_ms : 0.0; };
  std::printf(
      "registration of %zu MiB: 4 KiB pages %.1f ms, 2 MiB huge pages %.1f ms (%.1f x), THP %.1f ms (%.1f x, "
      "%zu "
      "MiB of it on huge pages); parallel %u threads: 4 KiB %.1f ms, 2 MiB %.1f ms, THP %.1f ms (%u CPU%s)\n",
      size_mib, small.serial_ms, huge.serial_ms, ratio(huge), thp.serial_ms, ratio(thp), thp_resident / mib,
      threads, small.parallel_ms, huge.parallel_ms, thp.parallel_ms, cpus,
      cpus == 1 ? ": threads take turns" : "s");
  std::printf("deregistration of %zu MiB: 4 KiB pages %.1f ms, 2 MiB huge pages %.1f ms, THP %.1f ms\n",
              size_mib, small.dereg_ms, huge.dereg_ms, thp.dereg_ms);
  CHECK(small.serial_ms > 0);
}
