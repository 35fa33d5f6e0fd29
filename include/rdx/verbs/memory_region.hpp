// rdx: memory regions over caller memory or a dma-buf, and owning registered
// buffers. A registration refused for lack of locked memory says what the
// limit is and how to raise it.
#pragma once

#include <rdx/detail/handle.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/dma_buf.hpp>
#include <rdx/verbs/endpoint.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <infiniband/verbs.h>

#include <cassert>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include <sys/resource.h>

namespace rdx {

//! Access rights of a memory region (and of a queue pair's remote side).
//! Default for a region: local_write only; remote rights only when asked for.
enum class access : unsigned {
  none = 0,                                  //!< no rights
  local_write = IBV_ACCESS_LOCAL_WRITE,      //!< the NIC may write it locally (receives, read results)
  remote_write = IBV_ACCESS_REMOTE_WRITE,    //!< a peer may RDMA-write it (adds local_write)
  remote_read = IBV_ACCESS_REMOTE_READ,      //!< a peer may RDMA-read it
  remote_atomic = IBV_ACCESS_REMOTE_ATOMIC,  //!< a peer may run atomics on it (adds local_write)
  mw_bind = IBV_ACCESS_MW_BIND,              //!< memory windows may be bound to it
  zero_based = IBV_ACCESS_ZERO_BASED,        //!< remote addresses count from 0, not from its virtual address
  on_demand = IBV_ACCESS_ON_DEMAND,  //!< on-demand paging: pages follow the mapping (devices with ODP only)
  relaxed_ordering = IBV_ACCESS_RELAXED_ORDERING,  //!< PCIe relaxed ordering, where the device has it
};

//! The union of two sets of rights.
[[nodiscard]] constexpr access operator|(access a, access b) noexcept {
  return static_cast<access>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
//! The rights in both.
[[nodiscard]] constexpr access operator&(access a, access b) noexcept {
  return static_cast<access>(static_cast<unsigned>(a) & static_cast<unsigned>(b));
}
//! Every flag bit not in a (for masking with &).
[[nodiscard]] constexpr access operator~(access a) noexcept {
  return static_cast<access>(~static_cast<unsigned>(a));
}
//! Adds b's rights to a.
constexpr access& operator|=(access& a, access b) noexcept {
  return a = a | b;
}
//! Keeps only the rights of a that are in b.
constexpr access& operator&=(access& a, access b) noexcept {
  return a = a & b;
}
//! True when every right in want is in have.
[[nodiscard]] constexpr bool has(access have, access want) noexcept {
  return (have & want) == want;
}
//! The flags as ibv_access_flags bits.
[[nodiscard]] constexpr int to_ibv(access a) noexcept {
  return static_cast<int>(a);
}

//! Where a peer's memory is: address and rkey. A distinct type from local memory,
//! so an rkey can never be used as an lkey.
struct remote_ptr {
  std::uint64_t addr = 0;  //!< address in the peer's address space
  std::uint32_t rkey = 0;  //!< the peer's remote key for it
  //! The address offset bytes further, with the same rkey.
  [[nodiscard]] constexpr remote_ptr operator+(std::uint64_t offset) const noexcept {
    return {addr + offset, rkey};
  }
  //! Field-wise equality.
  friend constexpr bool operator==(const remote_ptr&, const remote_ptr&) = default;
};

//! True when [offset, offset + len) lies inside a peer's range, without overflow.
[[nodiscard]] constexpr bool contains(const remote_descriptor& r, std::uint64_t offset,
                                      std::uint64_t len) noexcept {
  return offset <= r.length && len <= r.length - offset;
}
//! The peer address at offset into a descriptor (unchecked: check with contains()).
[[nodiscard]] constexpr remote_ptr at(const remote_descriptor& r, std::uint64_t offset = 0) noexcept {
  return {r.addr + offset, r.rkey};
}

//! A registered memory region over caller memory. Move-only; keeps its
//! protection domain alive; the memory must outlive it.
namespace detail {

//! "64 KiB", "1.5 GiB".
inline std::string bytes_text(std::uint64_t n) {
  const char* unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  auto v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.4g %s", v, unit[u]);
  return buf;
}

//! Why a registration of `length` bytes failed with err, in words: for ENOMEM
//! and EPERM under a finite RLIMIT_MEMLOCK, the limit and how to raise it.
inline std::string registration_hint(int err, std::size_t length) {
  if (err != ENOMEM && err != EPERM) {
    return {};
  }
  rlimit l{};
  if (::getrlimit(RLIMIT_MEMLOCK, &l) != 0 || l.rlim_cur == RLIM_INFINITY) {
    return doctor_hint("memlock");
  }
  return "; the locked-memory limit (RLIMIT_MEMLOCK, ulimit -l) is " + bytes_text(l.rlim_cur) +
         " and a registration pins what it covers (" + bytes_text(length) +
         " here, plus what this process has registered already) unless the process has CAP_IPC_LOCK: raise "
         "it "
         "(ulimit -l unlimited; systemd LimitMEMLOCK=infinity; docker run --ulimit memlock=-1; "
         "/etc/security/limits.conf memlock)" +
         doctor_hint("memlock");
}

}  // namespace detail

//! A registration of memory (the caller's, or a dma-buf's) with a protection domain: an lkey
//! for local work requests, an rkey for a peer. Move-only; deregistered on destruction; keeps its
//! protection domain alive.
class memory_region : detail::move_only {
public:
  //! Registers the bytes of a span.
  //! @throws rdx::error naming address, length and rights when ibv_reg_mr fails.
  template <class T>
  memory_region(const protection_domain& pd, std::span<T> memory, access rights = access::local_write)
      : memory_region(pd, static_cast<void*>(const_cast<std::remove_cv_t<T>*>(memory.data())),
                      memory.size_bytes(), rights) {}

  //! Registers length bytes at addr.
  memory_region(const protection_domain& pd, void* addr, std::size_t length,
                access rights = access::local_write) {
    if (has(rights, access::remote_write) || has(rights, access::remote_atomic)) {
      // Verbs requires local write with remote write or atomic; grant it rather than fail.
      rights |= access::local_write;
    }
    ibv_mr* mr = ::ibv_reg_mr(pd.native_handle(), addr, length, to_ibv(rights));
    if (mr == nullptr) {
      const int err = errno ? errno : ENOMEM;
      char what[96];
      std::snprintf(what, sizeof what, "%zu bytes at %p, access 0x%x", length, addr, to_ibv(rights));
      detail::throw_errno("ibv_reg_mr", what + detail::registration_hint(err, length), err);
    }
    h_ = detail::make_shared_verbs(mr, &::ibv_dereg_mr, "ibv_dereg_mr", {pd.shared_handle()});
    rights_ = rights;
  }

  //! Registers length bytes of a dma-buf from offset; the NIC addresses them
  //! from iova (as ibv_reg_mr's address). The registration keeps its own
  //! reference to the dma-buf: buf may be closed afterwards.
  //! @throws rdx::error: errc::invalid_argument for zero bytes or a range
  //! outside the dma-buf (checked before the device sees it); errc::unsupported
  //! when the device's provider library or kernel driver cannot register
  //! dma-buf (Soft-RoCE and siw cannot), naming what works instead; the errno
  //! of ibv_reg_dmabuf_mr otherwise.
  memory_region(const protection_domain& pd, const dma_buf& buf, std::uint64_t offset, std::size_t length,
                std::uint64_t iova, access rights = access::local_write) {
    if (has(rights, access::remote_write) || has(rights, access::remote_atomic)) {
      rights |= access::local_write;
    }
    const std::string what = std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                             " of dma-buf fd " + std::to_string(buf.fd()) + ", iova " + std::to_string(iova);
    if (length == 0) {
      detail::throw_rdx(errc::invalid_argument, "memory_region(dma_buf): zero bytes");
    }
    const std::size_t size = buf.size();
    if (offset > size || length > size - offset) {
      detail::throw_rdx(
          errc::invalid_argument,
          "memory_region(dma_buf): " + what + " reaches past its end (" + std::to_string(size) + " bytes)");
    }
    errno = 0;
    ibv_mr* mr = ::ibv_reg_dmabuf_mr(pd.native_handle(), offset, length, iova, buf.fd(), to_ibv(rights));
    if (mr == nullptr) {
      const int err = errno ? errno : EINVAL;
      const std::string dev = ::ibv_get_device_name(pd.native_handle()->context->device);
      if (err == EOPNOTSUPP || err == ENOTSUP || err == EPROTONOSUPPORT || err == ENOSYS) {
        throw error(errc::unsupported,
                    "ibv_reg_dmabuf_mr on " + what + ": " + dev + " cannot register dma-buf (" +
                        std::generic_category().message(err) +
                        " from its provider library or kernel driver; rdma-core 34 and kernel 5.12 are "
                        "needed too, and Soft-RoCE and siw never can): register host memory instead and "
                        "stage through it (rdx::cuda::gpu_region does for GPU memory), or use a NIC whose "
                        "driver imports dma-buf (mlx5)" +
                        detail::doctor_hint("devices,gpu"));
      }
      detail::throw_errno("ibv_reg_dmabuf_mr", what + " on " + dev + detail::registration_hint(err, length),
                          err);
    }
    h_ = detail::make_shared_verbs(mr, &::ibv_dereg_mr, "ibv_dereg_mr", {pd.shared_handle()});
    rights_ = rights;
  }

  //! Takes ownership of a registered ibv_mr of pd.
  //! @throws rdx::error on nullptr or an mr from another protection domain.
  [[nodiscard]] static memory_region adopt(const protection_domain& pd, ibv_mr* mr) {
    detail::refuse_null(mr, "memory_region::adopt");
    if (mr->pd != pd.native_handle()) {
      detail::throw_rdx(errc::invalid_argument,
                        "memory_region::adopt: the ibv_mr belongs to another protection domain");
    }
    memory_region r;
    r.h_ = detail::make_shared_verbs(mr, &::ibv_dereg_mr, "ibv_dereg_mr", {pd.shared_handle()});
    r.rights_ = access::none;  // unknown: ibv_mr does not record its flags
    return r;
  }

  //! The ibv_mr, still owned (nullptr when empty).
  [[nodiscard]] ibv_mr* native_handle() const noexcept { return h_.get(); }
  //! Gives up ownership without deregistering (nullptr when empty); the caller calls ibv_dereg_mr
  //! and keeps the protection domain alive.
  //! @throws rdx::error (errc::not_ready) while another owner shares the region
  [[nodiscard]] ibv_mr* release() { return detail::release_verbs(h_, "memory_region"); }
  //! True when it owns a registration (not moved from or released).
  explicit operator bool() const noexcept { return h_ != nullptr; }

  //! The local key: what this side's work requests name the memory with.
  [[nodiscard]] std::uint32_t lkey() const noexcept { return h_->lkey; }
  //! The remote key: what a peer needs to reach the memory (with remote rights only).
  [[nodiscard]] std::uint32_t rkey() const noexcept { return h_->rkey; }
  //! The first registered byte (for a dma-buf: the iova).
  [[nodiscard]] void* addr() const noexcept { return h_->addr; }
  //! Bytes registered.
  [[nodiscard]] std::size_t length() const noexcept { return h_->length; }
  //! The rights asked for at registration (none when adopted).
  [[nodiscard]] access rights() const noexcept { return rights_; }

  //! A local scatter-gather entry for [offset, offset + len) (checked by assert only:
  //! this is on the data path).
  [[nodiscard]] ibv_sge sge(std::size_t offset, std::size_t len) const noexcept {
    assert(offset <= length() && len <= length() - offset && len <= UINT32_MAX);
    return {reinterpret_cast<std::uint64_t>(static_cast<char*>(h_->addr) + offset),
            static_cast<std::uint32_t>(len), h_->lkey};
  }
  //! A local scatter-gather entry for the whole region.
  [[nodiscard]] ibv_sge sge() const noexcept { return sge(0, length()); }
  //! A local scatter-gather entry for a sub-span of the registered memory.
  template <class T>
  [[nodiscard]] ibv_sge sge(std::span<T> part) const noexcept {
    auto off = static_cast<std::size_t>(reinterpret_cast<const char*>(part.data()) -
                                        static_cast<const char*>(h_->addr));
    return sge(off, part.size_bytes());
  }
  //! What a peer needs to reach this region: {addr, length, rkey}.
  [[nodiscard]] remote_descriptor remote() const noexcept {
    return {reinterpret_cast<std::uint64_t>(h_->addr), h_->rkey, h_->length};
  }

private:
  memory_region() = default;
  std::shared_ptr<ibv_mr> h_;
  access rights_ = access::none;
};

//! Element types that may live in registered memory: bytes the NIC copies.
template <class T>
concept registrable = std::is_trivially_copyable_v<T> && !std::is_const_v<T>;

namespace detail {

//! What every owning registered buffer (registered_buffer, huge_buffer) offers
//! over its elements and its region; B provides data(), size() and region().
template <class B, class T>
class registered_elements {
public:
  [[nodiscard]] std::size_t size_bytes() const noexcept { return self().size() * sizeof(T); }
  [[nodiscard]] std::span<T> span() const noexcept { return {self().data(), self().size()}; }
  [[nodiscard]] T& operator[](std::size_t i) const noexcept { return self().data()[i]; }
  [[nodiscard]] T* begin() const noexcept { return self().data(); }
  [[nodiscard]] T* end() const noexcept { return self().data() + self().size(); }
  [[nodiscard]] std::uint32_t lkey() const noexcept { return self().region().lkey(); }
  [[nodiscard]] std::uint32_t rkey() const noexcept { return self().region().rkey(); }
  //! A local scatter-gather entry for elements [first, first + n).
  [[nodiscard]] ibv_sge sge(std::size_t first, std::size_t n) const noexcept {
    return self().region().sge(first * sizeof(T), n * sizeof(T));
  }
  [[nodiscard]] ibv_sge sge() const noexcept { return self().region().sge(); }
  [[nodiscard]] remote_descriptor remote() const noexcept { return self().region().remote(); }

private:
  [[nodiscard]] const B& self() const noexcept { return static_cast<const B&>(*this); }
};

}  // namespace detail

//! An owning, page-aligned, zero-initialised buffer of n T, registered on creation.
//! Move-only; destruction deregisters the region before it frees the memory. From an
//! internal base it also has size_bytes(), span(), operator[], begin(), end(),
//! lkey(), rkey(), sge() (all, or elements [first, first + n)) and remote().
template <registrable T>
class registered_buffer : public detail::registered_elements<registered_buffer<T>, T> {
public:
  //! @throws rdx::error when registration fails; std::bad_alloc when memory is short.
  registered_buffer(const protection_domain& pd, std::size_t count, access rights = access::local_write)
      : mem_(allocate(count)), count_(count), mr_(pd, static_cast<void*>(mem_.get()), bytes(count), rights) {}

  registered_buffer(const registered_buffer&) = delete;
  registered_buffer& operator=(const registered_buffer&) = delete;
  //! Takes o's memory and region; o is left without either.
  registered_buffer(registered_buffer&&) noexcept = default;
  //! Deregisters the old region before its memory is freed (a defaulted
  //! assignment would free first: members are assigned in declaration order).
  registered_buffer& operator=(registered_buffer&& o) noexcept {
    mr_ = std::move(o.mr_);
    mem_ = std::move(o.mem_);
    count_ = std::exchange(o.count_, 0);
    return *this;
  }
  ~registered_buffer() = default;

  //! The first element.
  [[nodiscard]] T* data() const noexcept { return mem_.get(); }
  //! Number of elements.
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  //! The registration of the elements.
  [[nodiscard]] const memory_region& region() const noexcept { return mr_; }

private:
  struct free_deleter {
    void operator()(T* p) const noexcept { std::free(p); }
  };
  static constexpr std::size_t page = 4096;
  static std::size_t bytes(std::size_t count) {
    if (count == 0) {
      detail::throw_rdx(errc::invalid_argument, "registered_buffer: zero elements");
    }
    if (count > (SIZE_MAX - page) / sizeof(T)) {
      detail::throw_rdx(errc::limit_exceeded,
                        "registered_buffer: " + std::to_string(count) + " elements overflow");
    }
    return count * sizeof(T);
  }
  static std::unique_ptr<T, free_deleter> allocate(std::size_t count) {
    std::size_t n = (bytes(count) + page - 1) / page * page;
    void* p = std::aligned_alloc(page, n);
    if (p == nullptr) {
      throw std::bad_alloc();
    }
    std::memset(p, 0, n);
    return std::unique_ptr<T, free_deleter>(static_cast<T*>(p));
  }
  // Declared in this order: the region is deregistered before the memory is freed.
  std::unique_ptr<T, free_deleter> mem_;
  std::size_t count_;
  memory_region mr_;
};

}  // namespace rdx
