// rdx::detail: a connection's message handler (channel<T>::on_message),
// held by value inside the connection: a small trivially copyable callable
// and the function that calls it with a message's bytes. No allocation, no
// virtual call: setting one copies a few words, calling one is an indirect
// call through a plain function pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

namespace rdx::detail {

struct message_handler {
  //! Bytes a handler's callable may take (four pointers: a lambda capturing
  //! a few references, or one pointer to the caller's state).
  static constexpr std::size_t capacity = 4 * sizeof(void*);
  //! Calls the callable in store with the message's bytes (n of them).
  using call_fn = void (*)(const void* store, const std::byte* data, std::uint32_t n) noexcept;

  call_fn call = nullptr;       //!< nullptr: no handler; messages go to receives
  std::uint32_t elem_size = 1;  //!< a message must be a whole number of these bytes
  alignas(std::max_align_t) std::byte store[capacity] = {};

  //! A callable F can be held: it fits, and copying its bytes copies it
  //! (trivially copyable, hence trivially destructible too).
  template <class F>
  static constexpr bool fits = std::is_trivially_copyable_v<F> && sizeof(F) <= capacity &&
                               alignof(F) <= alignof(std::max_align_t);

  //! Holds f, to be called through call (which reads it back as an F).
  template <class F>
  static message_handler make(const F& f, call_fn call, std::uint32_t elem_size) noexcept {
    static_assert(fits<F>);
    message_handler h;
    h.call = call;
    h.elem_size = elem_size == 0 ? 1 : elem_size;
    std::memcpy(h.store, std::addressof(f), sizeof(F));
    return h;
  }
  //! The F that make() stored.
  template <class F>
  static const F& held(const void* store) noexcept {
    return *std::launder(static_cast<const F*>(store));
  }
};

}  // namespace rdx::detail
