// rdx: page-aligned, zeroed memory that can ask for 2 MiB pages, and a
// registered buffer over it.
#pragma once

#include <rdx/detail/handle.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include <sys/mman.h>
#include <unistd.h>

namespace rdx {

//! The pages an allocation got.
enum class page_kind {
  small,             //!< the base page size (4 KiB on x86-64)
  huge,              //!< 2 MiB pages from the hugetlbfs pool (vm.nr_hugepages)
  transparent_huge,  //!< a 2 MiB-aligned range advised MADV_HUGEPAGE (THP)
};

//! What to ask for. The fallback order of prefer_huge is hugetlbfs 2 MiB pages,
//! then transparent huge pages, then 4 KiB pages; huge_only never falls back.
enum class page_policy {
  small,             //!< 4 KiB pages only
  transparent_huge,  //!< THP, else 4 KiB pages (when THP is disabled)
  prefer_huge,       //!< hugetlbfs, else THP, else 4 KiB pages
  huge_only,         //!< hugetlbfs or throw errc::unsupported with the fix
};

//! "4 KiB pages", "2 MiB huge pages" or "transparent huge pages".
[[nodiscard]] constexpr const char* to_string(page_kind k) noexcept {
  switch (k) {
    case page_kind::small: return "4 KiB pages";
    case page_kind::huge: return "2 MiB huge pages";
    case page_kind::transparent_huge: return "transparent huge pages";
  }
  return "unknown pages";
}

namespace detail {
inline constexpr std::size_t huge_page_size = std::size_t{2} << 20;

//! A number from a one-line sysfs/procfs file, or -1.
[[nodiscard]] inline std::int64_t read_number_file(const char* path) {
  std::ifstream in(path);
  std::int64_t v = -1;
  if (!(in >> v)) {
    v = -1;
  }
  return v;
}

//! The 2 MiB pool: pages reserved (vm.nr_hugepages) and free, -1 when unknown.
struct huge_pool {
  std::int64_t total = -1;
  std::int64_t free = -1;
};
[[nodiscard]] inline huge_pool read_huge_pool() {
  return {read_number_file("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
          read_number_file("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")};
}

//! THP's mode, the bracketed word of .../transparent_hugepage/enabled ("always",
//! "madvise", "never"), or "" when the kernel has no THP.
[[nodiscard]] inline std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  auto open = line.find('[');
  auto close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) {
    return {};
  }
  return line.substr(open + 1, close - open - 1);
}

[[nodiscard]] inline std::size_t round_up(std::size_t n, std::size_t to) noexcept {
  return (n + to - 1) / to * to;
}

[[nodiscard]] inline std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g MiB", static_cast<double>(bytes) / static_cast<double>(1 << 20));
  return buf;
}
}  // namespace detail

//! An owning mapping of page-aligned, zeroed, resident memory, on 4 KiB or
//! 2 MiB pages. Move-only; munmap in the destructor.
class page_allocation : detail::move_only {
public:
  page_allocation() = default;
  page_allocation(const page_allocation&) = delete;
  page_allocation& operator=(const page_allocation&) = delete;

  //! Maps at least bytes (rounded up to the page size it got) under a policy;
  //! the memory is faulted in, so registering it pays no page faults.
  //! @throws rdx::error errc::unsupported under huge_only when no 2 MiB pages are
  //! free (the message says how many to reserve), errc::invalid_argument for 0
  //! bytes, or the mmap errno when even 4 KiB pages cannot be mapped.
  //! @post kind() says what it got and why() says why, for every policy.
  [[nodiscard]] static page_allocation make(std::size_t bytes,
                                            page_policy policy = page_policy::prefer_huge) {
    if (bytes == 0) {
      detail::throw_rdx(errc::invalid_argument, "page_allocation: zero bytes");
    }
    if (bytes > SIZE_MAX - 2 * detail::huge_page_size) {
      detail::throw_rdx(errc::limit_exceeded,
                        "page_allocation: " + std::to_string(bytes) + " bytes overflow");
    }
    std::string why;
    if (policy == page_policy::prefer_huge || policy == page_policy::huge_only) {
      std::string fix;
      page_allocation a = map_hugetlb(bytes, why, fix);
      if (a) {
        return a;
      }
      if (policy == page_policy::huge_only) {
        detail::throw_rdx(errc::unsupported, "page_allocation: " + why + fix);
      }
    }
    if (policy != page_policy::small) {
      page_allocation a = map_thp(bytes, why);
      if (a) {
        return a;
      }
    }
    return map_small(bytes, policy == page_policy::small ? std::string("4 KiB pages as asked") : why);
  }

  //! Takes o's mapping; o is left empty (false).
  page_allocation(page_allocation&& o) noexcept
      : addr_(std::exchange(o.addr_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        mapped_(std::exchange(o.mapped_, 0)),
        kind_(o.kind_),
        why_(std::move(o.why_)) {}
  //! Unmaps this mapping, then takes o's; o is left empty.
  page_allocation& operator=(page_allocation&& o) noexcept {
    if (this != &o) {
      unmap();
      addr_ = std::exchange(o.addr_, nullptr);
      size_ = std::exchange(o.size_, 0);
      mapped_ = std::exchange(o.mapped_, 0);
      kind_ = o.kind_;
      why_ = std::move(o.why_);
    }
    return *this;
  }
  ~page_allocation() { unmap(); }

  //! The first byte, page-aligned (2 MiB-aligned on huge and transparent huge pages).
  [[nodiscard]] void* data() const noexcept { return addr_; }
  //! The bytes asked for.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! The bytes mapped: size() rounded up to the page size.
  [[nodiscard]] std::size_t mapped_size() const noexcept { return mapped_; }
  //! The size() bytes asked for.
  [[nodiscard]] std::span<std::byte> bytes() const noexcept {
    return {static_cast<std::byte*>(addr_), size_};
  }
  //! The pages it got.
  [[nodiscard]] page_kind kind() const noexcept { return kind_; }
  //! Why it got kind(): what it asked for and what refused, in words.
  [[nodiscard]] const std::string& why() const noexcept { return why_; }
  //! True when it owns a mapping (not default-constructed or moved from).
  explicit operator bool() const noexcept { return addr_ != nullptr; }

private:
  page_allocation(void* addr, std::size_t size, std::size_t mapped, page_kind kind, std::string why)
      : addr_(addr), size_(size), mapped_(mapped), kind_(kind), why_(std::move(why)) {}

  void unmap() noexcept {
    if (addr_ != nullptr && ::munmap(addr_, mapped_) != 0) {
      detail::report_destroy_failure("munmap", errno);
    }
    addr_ = nullptr;
  }

  static page_allocation map_hugetlb(std::size_t bytes, std::string& why, std::string& fix) {
#if defined(MAP_HUGETLB) && defined(MAP_HUGE_SHIFT)
    std::size_t len = detail::round_up(bytes, detail::huge_page_size);
    // The pages are reserved at mmap (no MAP_NORESERVE), so a short pool fails here
    // rather than with SIGBUS on first touch.
    void* p =
        ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | (21 << MAP_HUGE_SHIFT) | MAP_POPULATE, -1, 0);
    if (p != MAP_FAILED) {
      return {p, bytes, len, page_kind::huge, "2 MiB huge pages from the hugetlbfs pool"};
    }
    int err = errno;
    auto pool = detail::read_huge_pool();
    auto need = static_cast<std::int64_t>(len / detail::huge_page_size);
    if (err == ENOMEM && pool.total == 0) {
      why = "no 2 MiB huge pages configured (vm.nr_hugepages = 0)";
    } else if (err == ENOMEM && pool.free >= 0) {
      why = "only " + std::to_string(pool.free) + " of " + std::to_string(pool.total) +
            " 2 MiB huge pages free, " + std::to_string(need) + " needed";
    } else {
      why = std::string("mmap(MAP_HUGETLB) failed: ") + std::generic_category().message(err);
    }
    if (err == ENOMEM && pool.total >= 0) {
      std::int64_t want = pool.total + need - (pool.free > 0 ? pool.free : 0);
      fix = " for " + detail::mib(bytes) + "; reserve them with: echo " + std::to_string(want) +
            " > /proc/sys/vm/nr_hugepages (as root), or use page_policy::prefer_huge to fall back";
    }
#else
    (void)bytes;
    (void)fix;
    why = "this build has no MAP_HUGETLB";
#endif
    return {};
  }

  static page_allocation map_thp(std::size_t bytes, std::string& why) {
    std::string mode = detail::thp_mode();
    std::string sep = why.empty() ? "" : ": ";
    if (mode.empty() || mode == "never") {
      why += sep + (mode.empty() ? std::string("the kernel has no transparent huge pages")
                                 : std::string("transparent huge pages are disabled "
                                               "(/sys/kernel/mm/transparent_hugepage/enabled = never)"));
      return {};
    }
    std::size_t len = detail::round_up(bytes, detail::huge_page_size);
    // Over-map by one huge page and trim, so the range starts on a 2 MiB boundary
    // and every 2 MiB of it can be one huge page.
    std::size_t over = len + detail::huge_page_size;
    void* raw = ::mmap(nullptr, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      why += sep + "mmap for transparent huge pages failed: " + std::generic_category().message(errno);
      return {};
    }
    auto base = reinterpret_cast<std::uintptr_t>(raw);
    std::size_t head = detail::round_up(base, detail::huge_page_size) - base;
    std::size_t tail = over - head - len;
    void* p = static_cast<char*>(raw) + head;
    if (head != 0) {
      ::munmap(raw, head);
    }
    if (tail != 0) {
      ::munmap(static_cast<char*>(p) + len, tail);
    }
    if (::madvise(p, len, MADV_HUGEPAGE) != 0) {
      int err = errno;
      ::munmap(p, len);
      why += sep + "madvise(MADV_HUGEPAGE) failed: " + std::generic_category().message(err);
      return {};
    }
    populate(p, len);
    why += sep + "using transparent huge pages (THP " + mode +
           "; the kernel may still back parts with 4 KiB pages)";
    return {p, bytes, len, page_kind::transparent_huge, std::move(why)};
  }

  static page_allocation map_small(std::size_t bytes, std::string why) {
    auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::size_t len = detail::round_up(bytes, page);
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      detail::throw_errno("mmap", detail::mib(len), errno);
    }
    // With THP "always" the kernel would back an anonymous range with huge pages
    // anyway; small means small (and is what 4 KiB registration times measure).
    (void)::madvise(p, len, MADV_NOHUGEPAGE);
    populate(p, len);
    if (why != "4 KiB pages as asked") {
      why += ": using 4 KiB pages";
    }
    return {p, bytes, len, page_kind::small, std::move(why)};
  }

  //! Faults the range in after madvise (MAP_POPULATE would fault before the advice).
  static void populate(void* p, std::size_t len) noexcept {
#ifdef MADV_POPULATE_WRITE
    if (::madvise(p, len, MADV_POPULATE_WRITE) == 0) {
      return;
    }
#endif
    auto* c = static_cast<volatile char*>(p);
    for (std::size_t off = 0; off < len; off += 4096) {
      c[off] = 0;
    }
  }

  void* addr_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
  page_kind kind_ = page_kind::small;
  std::string why_;
};

//! An owning buffer of n T on page_allocation memory, registered on creation:
//! registered_buffer's interface, with the pages chosen by a page_policy.
//! One region, registered by one thread: splitting a range into regions
//! registered in parallel threads did not help on Soft-RoCE with 1 vCPU (512 MiB
//! of 4 KiB pages: 28-39 ms serial, 32-40 ms in 2 threads, in rdx's tests), and
//! it costs an lkey per part, so rdx has no register_parallel.
//!
//! As registered_buffer, it also has size_bytes(), span(), operator[], begin(),
//! end(), lkey(), rkey(), sge() and remote() (from an internal base).
template <registrable T>
class huge_buffer : public detail::registered_elements<huge_buffer<T>, T> {
public:
  //! @throws rdx::error when the pages cannot be had (see page_allocation::make)
  //! or registration fails.
  huge_buffer(const protection_domain& pd, std::size_t count, access rights = access::local_write,
              page_policy policy = page_policy::prefer_huge)
      : mem_(page_allocation::make(bytes(count), policy)),
        count_(count),
        mr_(pd, mem_.data(), mem_.size(), rights) {}

  huge_buffer(const huge_buffer&) = delete;
  huge_buffer& operator=(const huge_buffer&) = delete;
  //! Takes o's region and mapping; o is left without either.
  huge_buffer(huge_buffer&&) noexcept = default;
  //! Deregisters the old region before its memory is unmapped.
  huge_buffer& operator=(huge_buffer&& o) noexcept {
    mr_ = std::move(o.mr_);
    mem_ = std::move(o.mem_);
    count_ = std::exchange(o.count_, 0);
    return *this;
  }
  ~huge_buffer() = default;

  //! The first element.
  [[nodiscard]] T* data() const noexcept { return static_cast<T*>(mem_.data()); }
  //! Number of elements (the mapping may be larger: allocation().mapped_size()).
  [[nodiscard]] std::size_t size() const noexcept { return count_; }

  //! The pages it got.
  [[nodiscard]] page_kind kind() const noexcept { return mem_.kind(); }
  //! Why it got kind(), in words.
  [[nodiscard]] const std::string& why() const noexcept { return mem_.why(); }
  //! The mapping under the elements.
  [[nodiscard]] const page_allocation& allocation() const noexcept { return mem_; }

  //! The registration of the elements (lkey, rkey, sge()).
  [[nodiscard]] const memory_region& region() const noexcept { return mr_; }

private:
  static std::size_t bytes(std::size_t count) {
    if (count == 0) {
      detail::throw_rdx(errc::invalid_argument, "huge_buffer: zero elements");
    }
    if (count > (SIZE_MAX - 2 * detail::huge_page_size) / sizeof(T)) {
      detail::throw_rdx(errc::limit_exceeded, "huge_buffer: " + std::to_string(count) + " elements overflow");
    }
    return count * sizeof(T);
  }
  // Declared in this order: the region is deregistered before the memory is unmapped.
  page_allocation mem_;
  std::size_t count_;
  memory_region mr_;
};

}  // namespace rdx
