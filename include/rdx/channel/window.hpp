// rdx: one-sided windows. A side grants a window over exactly a range of its
// registered memory, with exact remote rights (read, write, atomic), on one
// connection: by default a type 2 memory window per queue pair, bound to the
// range and to that queue pair, with random key bits, so the NIC enforces
// the range and the key is useless anywhere else; revoke() (or destruction)
// takes it back. The peer reaches it through a remote_window whose type
// carries the rights it may use, so a write through a read-only window does
// not compile. Local and remote memory are distinct types. Every range is
// checked before anything is posted. A grant refuses a region with remote
// rights of its own, so the peer reaches memory only through grants. More in
// rdx's design notes (share/doc/rdx/design.md), "Trust".
#pragma once

#include <rdx/channel/connection.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/memory_region.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace rdx {

//! Remote rights of a window.
enum class rights : unsigned { none = 0, read = 1, write = 2, atomic = 4 };

//! The union of two sets of rights.
[[nodiscard]] constexpr rights operator|(rights a, rights b) noexcept {
  return static_cast<rights>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
//! True when every right in want is in have.
[[nodiscard]] constexpr bool has(rights have, rights want) noexcept {
  return (static_cast<unsigned>(have) & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}
//! The memory-region access flags that grant exactly r.
[[nodiscard]] constexpr access to_access(rights r) noexcept {
  access a = access::none;
  if (has(r, rights::read)) {
    a |= access::remote_read;
  }
  if (has(r, rights::write)) {
    a |= access::remote_write;
  }
  if (has(r, rights::atomic)) {
    a |= access::remote_atomic;
  }
  return a;
}
//! The remote rights a memory region's access flags grant.
[[nodiscard]] constexpr rights remote_rights(access a) noexcept {
  unsigned r = 0;
  if (has(a, access::remote_read)) {
    r |= static_cast<unsigned>(rights::read);
  }
  if (has(a, access::remote_write)) {
    r |= static_cast<unsigned>(rights::write);
  }
  if (has(a, access::remote_atomic)) {
    r |= static_cast<unsigned>(rights::atomic);
  }
  return static_cast<rights>(r);
}
//! The rights in words: "read", "write|atomic", ..., or "none".
[[nodiscard]] inline std::string to_string(rights r) {
  if (r == rights::none) {
    return "none";
  }
  std::string s;
  if (has(r, rights::read)) {
    s += "read|";
  }
  if (has(r, rights::write)) {
    s += "write|";
  }
  if (has(r, rights::atomic)) {
    s += "atomic|";
  }
  s.pop_back();
  return s;
}

//! Local registered memory: T elements and the lkey that covers them. The
//! only kind of memory a window operation takes on this side.
template <class T>
class local_span {
public:
  //! The element type; const T for a source that is only read.
  using element_type = T;
  local_span() = default;
  //! All of a registered buffer.
  template <class U>
  // NOLINTNEXTLINE(google-explicit-constructor): a registered_buffer is passed where a local_span is taken.
  requires std::is_same_v<std::remove_const_t<T>, U> local_span(const registered_buffer<U>& b)
  noexcept : data_(b.data()), size_(b.size()), lkey_(b.lkey()) {}
  //! Part of a memory region. @throws rdx::error (errc::out_of_range) when s is not inside mr.
  local_span(const memory_region& mr, std::span<T> s) : data_(s.data()), size_(s.size()), lkey_(mr.lkey()) {
    const auto base = reinterpret_cast<std::uintptr_t>(mr.addr());
    const auto p = reinterpret_cast<std::uintptr_t>(s.data());
    if (p < base || p - base > mr.length() || s.size_bytes() > mr.length() - (p - base)) {
      detail::throw_rdx(errc::out_of_range, "local_span: " + std::to_string(s.size_bytes()) +
                                                " bytes are not inside the memory region");
    }
  }
  //! A const view of the same memory.
  operator local_span<const T>() const noexcept  // NOLINT(google-explicit-constructor): T passes as const T
      requires(!std::is_const_v<T>) {
    return local_span<const T>(data_, size_, lkey_);
  }
  //! Elements [offset, offset + count), clamped to the span.
  [[nodiscard]] local_span subspan(std::size_t offset, std::size_t count) const noexcept {
    if (offset > size_) {
      offset = size_;
    }
    if (count > size_ - offset) {
      count = size_ - offset;
    }
    return local_span(data_ + offset, count, lkey_);
  }
  //! The first element.
  [[nodiscard]] T* data() const noexcept { return data_; }
  //! Number of elements.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! Bytes: size() * sizeof(T).
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  //! True when the span has no elements.
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  //! The lkey of the registration that covers the elements.
  [[nodiscard]] std::uint32_t lkey() const noexcept { return lkey_; }
  //! The same elements as a std::span.
  [[nodiscard]] std::span<T> span() const noexcept { return {data_, size_}; }
  //! Element i; not bounds-checked.
  [[nodiscard]] T& operator[](std::size_t i) const noexcept { return data_[i]; }

private:
  template <class>
  friend class local_span;
  local_span(T* d, std::size_t n, std::uint32_t k) noexcept : data_(d), size_(n), lkey_(k) {}
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::uint32_t lkey_ = 0;
};

//! What travels to the peer for a window: the memory, the rights granted,
//! the element size (checked when the peer builds its remote_window), and
//! the key for each queue pair of the granting connection.
struct window_descriptor {
  remote_descriptor memory{};      //!< memory.rkey: the key on queue pair 0
  rights granted = rights::none;   //!< what the peer may do; a remote_window needs all of its rights
  std::uint32_t element_size = 0;  //!< sizeof(T) on the granting side
  //! The key on each queue pair, in order (empty: memory.rkey on all).
  std::vector<std::uint32_t> keys{};
  //! Field-wise equality.
  friend bool operator==(const window_descriptor&, const window_descriptor&) = default;
};

//! What the peer offered when connecting (over TCP or rdma_cm): its
//! connection and its window grants, in its order.
struct peer_offer {
  connection_info info;                    //!< the peer's queue pairs, credit word and buffer settings
  std::vector<window_descriptor> windows;  //!< the peer's grants, in its order
};

//! A grant on one connection: elements of T in a registered region that the
//! peer may reach with exactly the rights R, and nothing else of the region.
//! Backed by a type 2 memory window per queue pair, each bound to its queue
//! pair and to a registration of exactly the range (with no remote rights of
//! its own) once the connection is connected (or at once when it already is);
//! on a device without type 2 windows, by a registration of exactly the range
//! with the rights R (backing() and description() say which). The region
//! itself must have no remote rights: its own rkey never leaves the process.
//!
//! revoke() or destruction invalidates the keys before it returns; destroying
//! the connection revokes its grants first. Move-only. Threading: its
//! connection's (one thread at a time).
//!
//! From its internal base it also has revoked() (true once revoked, or once the
//! connection is destroyed), backing() (memory_window or exact_registration),
//! keys() (the peer's key on each queue pair, in order) and description() (the
//! backing in words, for logs).
template <class T, rights R>
requires registrable<T>
class grant : private detail::grant_base {
public:
  //! Grants elements s of the region mr (registered without remote rights,
  //! as make_window_buffer does) on connection c.
  //! @throws rdx::error: errc::invalid_argument (a region with remote rights,
  //! of another protection domain, or zero elements),
  //! errc::out_of_range (s not inside mr), errc::unsupported (memory windows
  //! asked for on a device without them), or a failed verb.
  grant(connection& c, const memory_region& mr, std::span<T> s, grant_options opt = {})
      : grant_base(detail::start_access::of(c), checked(mr, s), s.data(), s.size_bytes(), to_access(R), opt),
        local_(mr, s) {}
  //! All of a registered buffer.
  grant(connection& c, const registered_buffer<T>& b, grant_options opt = {})
      : grant(c, b.region(), std::span<T>(const_cast<T*>(b.data()), b.size()), opt) {}
  grant(const grant&) = delete;
  grant& operator=(const grant&) = delete;
  //! Takes over o's keys and its place in the connection's list; o is left revoked, owning
  //! nothing.
  grant(grant&&) noexcept = default;
  grant& operator=(grant&&) = delete;
  ~grant() = default;

  //! The descriptor to send to the peer (exchange_and_connect sends it).
  [[nodiscard]] window_descriptor descriptor() const {
    const auto& k = keys();
    return {{reinterpret_cast<std::uint64_t>(local_.data()), k.empty() ? 0u : k[0], local_.size_bytes()},
            R,
            static_cast<std::uint32_t>(sizeof(T)),
            k};
  }
  //! Invalidates every key of the grant before it returns: the peer's later
  //! reads and writes fail at its side with a remote access error, and the
  //! memory may be reused at once. Idempotent; destruction does it too.
  void revoke() noexcept { grant_base::revoke(); }
  using grant_base::backing;
  using grant_base::description;
  using grant_base::keys;
  using grant_base::revoked;
  //! The same memory, for local use (a source or destination of operations).
  [[nodiscard]] local_span<T> local() const noexcept { return local_; }
  //! The granted elements.
  [[nodiscard]] std::span<T> span() const noexcept { return local_.span(); }
  //! Number of granted elements.
  [[nodiscard]] std::size_t size() const noexcept { return local_.size(); }

private:
  static const memory_region& checked(const memory_region& mr, std::span<T> s) {
    static_assert(R != rights::none, "a grant gives the peer at least one right");
    if (s.empty()) {
      detail::throw_rdx(errc::invalid_argument, "grant: zero elements");
    }
    (void)local_span<T>(mr, s);  // errc::out_of_range when s is not inside mr
    if (remote_rights(mr.rights()) != rights::none) {
      detail::throw_rdx(errc::invalid_argument,
                        "grant: the memory region itself allows remote " +
                            to_string(remote_rights(mr.rights())) +
                            ", so its own rkey would reach all of it; register it with access::local_write "
                            "only (make_window_buffer does): the grant gives the peer exactly " +
                            to_string(R) + " over exactly the granted elements");
    }
    return mr;
  }
  local_span<T> local_;
};

//! Makes a registered buffer for grants: local write, no remote rights (each
//! grant over it gives the peer exactly its rights over exactly its range).
//! R is accepted for older callers and changes nothing.
template <class T, rights R = rights::none>
[[nodiscard]] registered_buffer<T> make_window_buffer(const protection_domain& pd, std::size_t count) {
  return registered_buffer<T>(pd, count, access::local_write);
}

//! The peer's window, reached over a connection with the rights R, which the
//! peer must have granted. Offsets and counts are in elements of T.
//! Threading: its connection's (one thread at a time).
template <class T, rights R>
requires registrable<T>
class remote_window {
public:
  //! @throws rdx::error (errc::invalid_argument) when the grant lacks a right
  //! in R, has another element size, a misaligned address, a length that is
  //! not whole elements, or wraps the address space.
  remote_window(connection& c, const window_descriptor& d) : conn_(&c), d_(d) {
    auto bad = [](const std::string& what) {
      detail::throw_rdx(errc::invalid_argument, "remote_window: " + what);
    };
    if (!has(d.granted, R)) {
      bad("the peer granted " + to_string(d.granted) + ", this window needs " + to_string(R));
    }
    if (d.element_size != sizeof(T)) {
      bad("the peer's elements are " + std::to_string(d.element_size) + " bytes, T is " +
          std::to_string(sizeof(T)));
    }
    if (d.memory.addr % alignof(T) != 0) {
      bad("the peer's address is not aligned for T");
    }
    if (has(R, rights::atomic) && d.memory.addr % 8 != 0) {
      bad("atomic windows need 8-byte aligned addresses");
    }
    if (d.memory.length % sizeof(T) != 0) {
      bad("the peer's length is not a whole number of elements");
    }
    if (d.memory.length != 0 && d.memory.length - 1 > UINT64_MAX - d.memory.addr) {
      bad("the peer's range wraps");
    }
    if (!d.keys.empty()) {
      if (d.keys[0] != d.memory.rkey) {
        bad("the peer's key for queue pair 0 differs from its memory key");
      }
      window_ = detail::start_access::of(c).add_peer_window(d.keys);
    }
    count_ = d.memory.length / sizeof(T);
  }

  //! Number of elements of T the peer granted.
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  //! The peer's descriptor the window was built from.
  [[nodiscard]] const window_descriptor& descriptor() const noexcept { return d_; }
  //! The connection the window is reached over.
  [[nodiscard]] connection& conn() const noexcept { return *conn_; }

  //! Whether [offset, offset + count) is a valid, non-empty range of the window.
  //! @return empty; errc::invalid_argument for zero elements; errc::out_of_range
  //! past the end (without overflow, however large the numbers).
  [[nodiscard]] std::error_code check(std::size_t offset, std::size_t count) const noexcept {
    if (count == 0) {
      return make_error_code(errc::invalid_argument);
    }
    if (offset > count_ || count > count_ - offset) {
      return make_error_code(errc::out_of_range);
    }
    return detail::no_error();
  }

  //! Writes src to elements [offset, offset + src.size()) of the window.
  [[nodiscard]] operation write(local_span<const T> src, std::size_t offset) noexcept
      requires(has(R, rights::write)) {
    return rdma(detail::op_kind::write, reinterpret_cast<std::uint64_t>(src.data()), src.lkey(), offset,
                src.size());
  }
  //! Reads elements [offset, offset + dst.size()) of the window into dst.
  [[nodiscard]] operation read(local_span<T> dst, std::size_t offset) noexcept
      requires(has(R, rights::read) && !std::is_const_v<T>) {
    return rdma(detail::op_kind::read, reinterpret_cast<std::uint64_t>(dst.data()), dst.lkey(), offset,
                dst.size());
  }
  //! Atomically adds add to element index; old_value() is its previous value.
  [[nodiscard]] operation fetch_add(std::size_t index, std::uint64_t add) noexcept
      requires(has(R, rights::atomic) && sizeof(T) == 8) {
    return atomic(false, index, add, 0);
  }
  //! Atomically sets element index to desired if it equals expected;
  //! old_value() is its previous value (equal to expected when it swapped).
  [[nodiscard]] operation compare_swap(std::size_t index, std::uint64_t expected,
                                       std::uint64_t desired) noexcept
      requires(has(R, rights::atomic) && sizeof(T) == 8) {
    return atomic(true, index, expected, desired);
  }

  //! For tests of the NIC's own checks only: a window that believes it has
  //! count elements, whatever the peer granted.
  [[nodiscard]] static remote_window unchecked_for_testing(connection& c, window_descriptor d,
                                                           std::size_t count) {
    remote_window w(c, d);
    w.count_ = count;
    return w;
  }

private:
  // The operation is made with its parameters (each written once), then
  // started, or ended at once when the range is wrong.
  [[nodiscard]] operation rdma(detail::op_kind kind, std::uint64_t laddr, std::uint32_t lkey,
                               std::size_t offset, std::size_t count) noexcept {
    operation op = detail::start_access::make(*conn_, kind,
                                              {.laddr = laddr,
                                               .raddr = d_.memory.addr + offset * sizeof(T),
                                               .length = count * sizeof(T),
                                               .lkey = lkey,
                                               .rkey = d_.memory.rkey,
                                               .window = window_});
    detail::engine& e = detail::start_access::of(*conn_);
    if (std::error_code ec = check(offset, count)) {
      e.fail_now(op, ec);
    } else {
      e.start_rdma(op);
    }
    return op;
  }
  [[nodiscard]] operation atomic(bool cas, std::size_t index, std::uint64_t a, std::uint64_t b) noexcept {
    operation op =
        detail::start_access::make(*conn_, cas ? detail::op_kind::compare_swap : detail::op_kind::fetch_add,
                                   {.raddr = d_.memory.addr + index * 8,
                                    .length = 8,
                                    .rkey = d_.memory.rkey,
                                    .operand = a,
                                    .swap_value = b});
    detail::engine& e = detail::start_access::of(*conn_);
    if (std::error_code ec = check(index, 1)) {
      e.fail_now(op, ec);
    } else {
      e.start_atomic(op);
    }
    return op;
  }

  connection* conn_;
  window_descriptor d_;
  std::size_t count_ = 0;
  std::uint32_t window_ = detail::no_slot;
};

}  // namespace rdx
