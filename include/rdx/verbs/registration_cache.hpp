// rdx: a bounded, thread-safe cache of memory registrations over memory rdx does not own.
//
// Staleness: a registration pins the physical pages that backed its range when it was made.
// Memory unmapped and mapped again at the same address (free() of a large malloc block, munmap +
// mmap, a heap trimmed by the allocator) has new pages, and a cached registration would still
// send from, and receive into, the old ones: no error, old bytes on the wire (measured on
// Soft-RoCE). Linux gives an unprivileged process no cheap way to see that on a hit (pagemap
// hides frame numbers, anonymous mappings have no identity in /proc, mincore reports residency
// only), so the cache relies on one rule:
//
//   before memory given to get() is freed or unmapped, call invalidate(addr, len) over it,
//   or allocate it with allocate() and free it with deallocate(), which does that.
//
// Memory that is never unmapped (a pool kept for the process's life) needs nothing. On a device
// with on-demand paging, asking for access::on_demand in get() makes registrations follow the
// mapping instead (Soft-RoCE on Linux 6.1 refuses it). More in rdx's design notes (share/doc/rdx/design.md),
// "Ownership", "Registration cache".
#pragma once

#include <rdx/error.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

namespace rdx {

//! Bounds of a registration_cache, fixed at construction.
struct registration_cache_attr {
  std::size_t max_entries = 1024;                //!< registrations kept
  std::size_t max_bytes = std::size_t{1} << 30;  //!< bytes they span (page-rounded)
};

//! What a registration_cache has done and holds.
struct registration_cache_stats {
  std::uint64_t hits = 0;           //!< get() answered by a cached registration
  std::uint64_t misses = 0;         //!< get() that registered (or tried to)
  std::uint64_t evictions = 0;      //!< idle entries deregistered to stay within the bounds
  std::uint64_t invalidations = 0;  //!< entries dropped by invalidate() or deallocate()
  std::uint64_t merges = 0;         //!< entries replaced by a registration covering them
  std::size_t entries = 0;          //!< registrations held now
  std::size_t bytes = 0;            //!< bytes they span now
};

namespace detail {
struct cache_entry {
  cache_entry(const protection_domain& pd, std::uintptr_t b, std::uintptr_t e, access r)
      : mr(pd, reinterpret_cast<void*>(b), e - b, r), begin(b), end(e) {}
  memory_region mr;  // immutable once made: handles read it without the cache's lock
  std::uintptr_t begin;
  std::uintptr_t end;
  std::list<cache_entry*>::iterator lru;  // guarded by the cache's mutex
};
}  // namespace detail

//! A registration handed out by a registration_cache: shared ownership of the memory region.
//! While any copy lives, the region stays registered, whatever the cache evicts, invalidates or
//! merges; the last copy deregisters a region the cache no longer holds. Copies may be used and
//! destroyed on any thread.
class cached_region {
public:
  cached_region() = default;
  //! True when it holds a registration (not default-constructed or moved from).
  explicit operator bool() const noexcept { return e_ != nullptr; }

  //! The whole registration: it covers at least the range asked for, page-rounded, maybe more.
  [[nodiscard]] const memory_region& region() const noexcept { return e_->mr; }
  //! The registration's lkey.
  [[nodiscard]] std::uint32_t lkey() const noexcept { return e_->mr.lkey(); }
  //! The registration's rkey: it reaches the whole registration (see remote()).
  [[nodiscard]] std::uint32_t rkey() const noexcept { return e_->mr.rkey(); }
  //! The rights of the registration (a superset of those asked for).
  [[nodiscard]] access rights() const noexcept { return e_->mr.rights(); }
  //! The range asked for.
  [[nodiscard]] void* data() const noexcept { return addr_; }
  //! Bytes of the range asked for.
  [[nodiscard]] std::size_t size() const noexcept { return len_; }

  //! A local scatter-gather entry for the range asked for.
  [[nodiscard]] ibv_sge sge() const noexcept { return sge(addr_, len_); }
  //! A local scatter-gather entry for [p, p + len) inside the registration (assert-checked).
  [[nodiscard]] ibv_sge sge(const void* p, std::size_t len) const noexcept {
    return e_->mr.sge(
        static_cast<std::size_t>(static_cast<const char*>(p) - static_cast<const char*>(e_->mr.addr())), len);
  }
  //! {addr, rkey, length} of the range asked for. The rkey reaches the whole registration, so
  //! give it only to a trusted peer (an untrusted one gets a grant).
  [[nodiscard]] remote_descriptor remote() const noexcept {
    return {reinterpret_cast<std::uint64_t>(addr_), e_->mr.rkey(), len_};
  }

private:
  friend class registration_cache;
  cached_region(std::shared_ptr<const detail::cache_entry> e, void* addr, std::size_t len) noexcept
      : e_(std::move(e)), addr_(addr), len_(len) {}
  std::shared_ptr<const detail::cache_entry> e_;
  void* addr_ = nullptr;
  std::size_t len_ = 0;
};

//! A least-recently-used cache of memory registrations of one protection domain, for memory the
//! application owns. Entries never overlap: a miss whose pages overlap cached entries registers
//! their union (with the union of their rights) and drops them.
//!
//! Thread-safety: every member function may be called from any thread at once; one mutex guards
//! the cache, and a miss registers (and invalidate() deregisters) while holding it, so misses are
//! serialised. This is a set-up path: keep handles, not get() calls, on the data path.
//!
//! Staleness: see the top of this header. invalidate() (or deallocate()) before memory is freed.
class registration_cache {
public:
  //! @throws rdx::error (invalid_argument) when a bound is zero.
  explicit registration_cache(const protection_domain& pd, registration_cache_attr attr = {})
      : pd_(pd.share()), attr_(attr), page_(static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE))) {
    if (attr_.max_entries == 0 || attr_.max_bytes == 0) {
      detail::throw_rdx(errc::invalid_argument, "registration_cache: a bound is zero");
    }
  }
  registration_cache(const registration_cache&) = delete;
  registration_cache& operator=(const registration_cache&) = delete;
  ~registration_cache() = default;

  //! A registration covering [addr, addr + len) with at least rights: a cached one, else a new
  //! registration of the page-rounded range (merged with overlapping entries).
  //! @throws rdx::error: invalid_argument for an empty or wrapping range; limit_exceeded when
  //! the range is larger than max_bytes or every entry that would have to go is in use;
  //! ibv_reg_mr's errno when registration fails. When it throws, the cache keeps the entries it
  //! had (only the miss is counted).
  [[nodiscard]] cached_region get(void* addr, std::size_t len, access rights = access::local_write) {
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    if (len == 0 || a > UINTPTR_MAX - page_ || len > UINTPTR_MAX - page_ - a) {
      detail::throw_rdx(errc::invalid_argument, "registration_cache::get: empty or wrapping range");
    }
    if (has(rights, access::remote_write) || has(rights, access::remote_atomic)) {
      rights |= access::local_write;  // as memory_region grants it, so a hit is found next time
    }
    const std::uintptr_t b = a & ~(page_ - 1);
    const std::uintptr_t e = (a + len + page_ - 1) & ~(page_ - 1);
    std::vector<std::shared_ptr<detail::cache_entry>> dropped;  // deregistered after unlocking
    std::lock_guard lock(m_);
    if (auto it = covering(b);
        it != index_.end() && it->second->end >= e && has(it->second->mr.rights(), rights)) {
      ++stats_.hits;
      lru_.splice(lru_.begin(), lru_, it->second->lru);
      return {it->second, addr, len};
    }
    ++stats_.misses;
    return insert(b, e, rights, addr, len, dropped);
  }
  template <class T>
  //! get() over the bytes of a span.
  [[nodiscard]] cached_region get(std::span<T> memory, access rights = access::local_write) {
    return get(static_cast<void*>(const_cast<std::remove_cv_t<T>*>(memory.data())), memory.size_bytes(),
               rights);
  }

  //! Drops every entry whose pages overlap [addr, addr + len): the next get() registers afresh.
  //! Call it before that memory is freed or unmapped. An entry still held by a cached_region is
  //! deregistered when its last copy goes (its user must not touch freed memory through it).
  //! @return the entries dropped.
  std::size_t invalidate(const void* addr, std::size_t len) noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    const std::uintptr_t b = a & ~(page_ - 1);
    const bool to_top = a > UINTPTR_MAX - page_ || len > UINTPTR_MAX - page_ - a;
    const std::uintptr_t e = to_top ? UINTPTR_MAX : (a + len + page_ - 1) & ~(page_ - 1);
    std::lock_guard lock(m_);
    std::size_t n = 0;
    for (auto it = first_from(b); it != index_.end() && it->first < e;) {
      // Deregistered here, under the lock, unless a cached_region still holds it.
      (void)remove(it++);
      ++n;
    }
    stats_.invalidations += n;
    return n;
  }
  //! Drops every entry (counted as invalidations).
  void clear() noexcept { invalidate(nullptr, UINTPTR_MAX); }

  //! Page-aligned, zeroed anonymous memory of at least len bytes, to be freed with deallocate().
  //! @throws std::bad_alloc when mmap fails.
  [[nodiscard]] void* allocate(std::size_t len) const {
    void* p = ::mmap(nullptr, round_up(len), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      throw std::bad_alloc();
    }
    return p;
  }
  //! Invalidates, then unmaps, memory from allocate() (same len).
  void deallocate(void* p, std::size_t len) noexcept {
    invalidate(p, len);
    ::munmap(p, round_up(len));
  }

  //! A snapshot of the counters and of what the cache holds now (taken under its lock).
  [[nodiscard]] registration_cache_stats stats() const {
    std::lock_guard lock(m_);
    return stats_;
  }
  //! The bounds it was made with.
  [[nodiscard]] const registration_cache_attr& attr() const noexcept { return attr_; }
  //! The page size ranges are rounded to (sysconf(_SC_PAGESIZE)).
  [[nodiscard]] std::size_t page_size() const noexcept { return page_; }

private:
  using entry_ptr = std::shared_ptr<detail::cache_entry>;
  // By begin; entries never overlap. The index holds the cache's one reference to each entry.
  using index_t = std::map<std::uintptr_t, entry_ptr>;

  std::size_t round_up(std::size_t len) const noexcept { return (len + page_ - 1) & ~(page_ - 1); }

  // The entry that contains page b, if any.
  index_t::iterator covering(std::uintptr_t b) {
    auto it = index_.upper_bound(b);
    if (it == index_.begin()) {
      return index_.end();
    }
    --it;
    return it->second->end > b ? it : index_.end();
  }
  // The first entry that overlaps or follows page b.
  index_t::iterator first_from(std::uintptr_t b) {
    auto it = covering(b);
    return it != index_.end() ? it : index_.lower_bound(b);
  }
  std::vector<index_t::iterator> overlapping(std::uintptr_t b, std::uintptr_t e) {
    std::vector<index_t::iterator> out;
    for (auto it = first_from(b); it != index_.end() && it->first < e; ++it) {
      out.push_back(it);
    }
    return out;
  }
  // An entry is idle when the cache holds the only reference. Under the mutex that cannot change
  // to "in use": a new cached_region is made only here or copied from a live one.
  static bool idle(const entry_ptr& p) noexcept { return p.use_count() == 1; }

  entry_ptr remove(index_t::iterator it) noexcept {
    entry_ptr p = std::move(it->second);
    lru_.erase(p->lru);
    index_.erase(it);
    --stats_.entries;
    stats_.bytes -= p->end - p->begin;
    return p;
  }

  cached_region insert(std::uintptr_t b, std::uintptr_t e, access rights, void* addr, std::size_t len,
                       std::vector<entry_ptr>& dropped) {
    if (e - b > attr_.max_bytes) {
      detail::throw_rdx(errc::limit_exceeded, "registration_cache::get: " + std::to_string(e - b) +
                                                  " bytes exceed max_bytes " +
                                                  std::to_string(attr_.max_bytes));
    }
    // Overlapping entries go; the new registration spans them too unless that is too large.
    auto over = overlapping(b, e);
    std::uintptr_t mb = b;
    std::uintptr_t me = e;
    access mr = rights;
    std::size_t over_bytes = 0;
    for (auto it : over) {
      mb = std::min(mb, it->second->begin);
      me = std::max(me, it->second->end);
      mr |= it->second->mr.rights();
      over_bytes += it->second->end - it->second->begin;
    }
    if (me - mb > attr_.max_bytes) {
      mb = b, me = e, mr = rights;
    }
    // Idle entries to evict, least recently used first, until the new one fits.
    std::vector<index_t::iterator> victims;
    std::size_t n = stats_.entries - over.size();
    std::size_t bytes = stats_.bytes - over_bytes;
    for (auto l = lru_.rbegin();
         l != lru_.rend() && (n + 1 > attr_.max_entries || bytes + (me - mb) > attr_.max_bytes); ++l) {
      auto it = index_.find((*l)->begin);
      const entry_ptr& p = it->second;
      if (!idle(p) || (p->end > b && p->begin < e)) {
        continue;  // in use, or one of the overlapping entries already counted out
      }
      victims.push_back(it);
      --n;
      bytes -= p->end - p->begin;
    }
    if (n + 1 > attr_.max_entries || bytes + (me - mb) > attr_.max_bytes) {
      detail::throw_rdx(errc::limit_exceeded, "registration_cache::get: the bounds (" +
                                                  std::to_string(attr_.max_entries) + " entries, " +
                                                  std::to_string(attr_.max_bytes) +
                                                  " bytes) are held by registrations in use");
    }
    entry_ptr fresh;
    try {
      fresh = std::make_shared<detail::cache_entry>(pd_, mb, me, mr);
    } catch (const error&) {
      if (mb == b && me == e) {
        throw;
      }
      // An overlapping entry may be stale (its memory unmapped): register only what was asked.
      fresh = std::make_shared<detail::cache_entry>(pd_, b, e, rights);
    }
    for (auto it : over) {
      dropped.push_back(remove(it));
    }
    stats_.merges += over.size();
    for (auto it : victims) {
      dropped.push_back(remove(it));
    }
    stats_.evictions += victims.size();
    lru_.push_front(fresh.get());
    fresh->lru = lru_.begin();
    index_.emplace(fresh->begin, fresh);
    ++stats_.entries;
    stats_.bytes += fresh->end - fresh->begin;
    return {std::move(fresh), addr, len};
  }

  protection_domain pd_;
  registration_cache_attr attr_;
  std::uintptr_t page_;
  mutable std::mutex m_;
  index_t index_;
  std::list<detail::cache_entry*> lru_;  // most recently used first
  registration_cache_stats stats_;
};

}  // namespace rdx
