// rdx: shared ownership of verbs objects, with children keeping parents alive.
#pragma once

#include <rdx/error.hpp>

#include <array>
#include <memory>
#include <utility>

namespace rdx::detail {

//! Destroys a verbs object once the last owner lets go, then drops the parents
//! it was created from (so a parent can never be destroyed while in use).
template <class T>
struct verbs_deleter {
  using destroy_fn = int (*)(T*);
  destroy_fn destroy = nullptr;
  const char* verb = "";
  std::array<std::shared_ptr<const void>, 4> parents{};
  bool released = false;

  void operator()(T* p) const noexcept {
    if (p == nullptr || released || destroy == nullptr) {
      return;
    }
    if (int rc = destroy(p); rc != 0) {
      report_destroy_failure(verb, rc < 0 ? -rc : rc);
    }
  }
};

//! A shared verbs handle with the deleter above; owners wrap it and are move-only.
template <class T>
using shared_verbs = std::shared_ptr<T>;

template <class T>
[[nodiscard]] shared_verbs<T> make_shared_verbs(T* p, int (*destroy)(T*), const char* verb,
                                                std::array<std::shared_ptr<const void>, 4> parents = {}) {
  // If allocating the control block throws, shared_ptr calls the deleter: nothing leaks.
  return shared_verbs<T>(p, verbs_deleter<T>{destroy, verb, std::move(parents), false});
}

//! Gives up ownership without destroying; refused while children still share it.
template <class T, class Deleter = verbs_deleter<T>>
[[nodiscard]] T* release_verbs(shared_verbs<T>& h, const char* what) {
  if (!h) {
    return nullptr;
  }
  if (h.use_count() != 1) {
    throw_rdx(errc::not_ready,
              std::string("release() of ") + what + ": objects created from it are still alive");
  }
  auto* d = std::get_deleter<Deleter>(h);
  if (d != nullptr) {
    d->released = true;
  }
  T* p = h.get();
  h.reset();
  return p;
}

//! Base for move-only owners: copying is deleted, a moved-from owner is empty.
class move_only {
public:
  move_only() = default;
  move_only(const move_only&) = delete;
  move_only& operator=(const move_only&) = delete;
  move_only(move_only&&) noexcept = default;
  move_only& operator=(move_only&&) noexcept = default;
  ~move_only() = default;
};

// A value that a move hands over and leaves as T{} (a borrowed pointer, a
// set of flags), so that a moved-from owner cannot reach what it gave away.
template <class T>
class reset_on_move {
public:
  reset_on_move() noexcept = default;
  reset_on_move(T v) noexcept : v_(v) {}  // NOLINT(google-explicit-constructor)
  reset_on_move(const reset_on_move&) = delete;
  reset_on_move& operator=(const reset_on_move&) = delete;
  reset_on_move(reset_on_move&& o) noexcept : v_(std::exchange(o.v_, T{})) {}
  reset_on_move& operator=(reset_on_move&& o) noexcept {
    v_ = std::exchange(o.v_, T{});
    return *this;
  }
  reset_on_move& operator=(T v) noexcept {
    v_ = v;
    return *this;
  }
  ~reset_on_move() = default;
  [[nodiscard]] T get() const noexcept { return v_; }
  operator T() const noexcept { return v_; }  // NOLINT(google-explicit-constructor)

private:
  T v_{};
};

//! Null checks for from_native_handle()/adopt().
template <class T>
inline void refuse_null(T* p, std::string_view what) {
  if (p == nullptr) {
    throw_rdx(errc::invalid_argument, std::string(what) + ": null handle");
  }
}

}  // namespace rdx::detail
