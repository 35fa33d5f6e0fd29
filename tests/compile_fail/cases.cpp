// Compile-fail cases for channels, windows and the owning types. Built once with no case
// defined (the positive control: every line here is valid), then once per
// RDX_CASE_* macro, each of which must fail for its stated reason
// (CMakeLists.txt checks the compiler's message).
#include <rdx/channel/channel.hpp>
#include <rdx/channel/window.hpp>

#include <cstdint>
#include <string>
#include <utility>

void valid_uses(rdx::connection& c, const rdx::protection_domain& pd, const rdx::window_descriptor& d) {
  rdx::registered_buffer<std::uint64_t> local(pd, 16);
  rdx::remote_window<std::uint64_t, rdx::rights::read | rdx::rights::write> rw(c, d);
  auto w = rw.write(local, 0);
  auto r = rw.read(local, 0);
  rdx::remote_window<std::uint64_t, rdx::rights::atomic> aw(c, d);
  auto f = aw.fetch_add(0, 1);
  rdx::channel<std::uint64_t> ch(c);
  auto s = ch.send(std::uint64_t{1});
  auto m = ch.notify(rw, local, 0, 7);
  auto table = rdx::make_window_buffer<std::uint64_t>(pd, 16);
  const rdx::grant<std::uint64_t, rdx::rights::write> g(c, table);
  rdx::registered_buffer<std::uint64_t> taken = std::move(local);  // owners move
  rdx::operation moved_op = std::move(w);                          // an operation moves until it ends

#if defined(RDX_CASE_NON_TRIVIAL_MESSAGE)
  // A channel carries bytes the NIC copies: std::string is not trivially copyable.
  rdx::channel<std::string> bad(c);
#endif

#if defined(RDX_CASE_REMOTE_AS_LOCAL)
  // The source of a write is local registered memory; a remote window is not.
  rdx::remote_window<std::uint64_t, rdx::rights::read | rdx::rights::write> other(c, d);
  auto bad = rw.write(other, 0);
#endif

#if defined(RDX_CASE_READ_ONLY_WRITE)
  // A read-only grant cannot be written through.
  rdx::remote_window<std::uint64_t, rdx::rights::read> ro(c, d);
  auto bad = ro.write(local, 0);
#endif

#if defined(RDX_CASE_READ_ONLY_NOTIFY)
  // Nor can a notification write into it.
  rdx::remote_window<std::uint64_t, rdx::rights::read> ro(c, d);
  auto bad = ch.notify(ro, local, 0, 7);
#endif

#if defined(RDX_CASE_ATOMIC_WITHOUT_RIGHT)
  // Atomics need the atomic right in the window's type.
  auto bad = rw.fetch_add(0, 1);
#endif

#if defined(RDX_CASE_OPERATION_COPY)
  // An operation ends exactly once: it moves, it is never copied.
  rdx::operation bad = moved_op;
#endif

#if defined(RDX_CASE_CONNECTION_COPY)
  // A connection owns its queue pairs and the peer's state: never copied.
  rdx::connection bad = c;
#endif

#if defined(RDX_CASE_CONNECTION_MOVE)
  // Nor moved: its operations, grants and channels refer to it where it is.
  rdx::connection bad = std::move(c);
#endif

#if defined(RDX_CASE_REGISTRATION_COPY)
  // A registration is owned once: a copy would deregister it twice.
  rdx::registered_buffer<std::uint64_t> bad = taken;
#endif

#if defined(RDX_CASE_GRANT_COPY)
  // A grant is revoked once, when its owner goes: never copied.
  rdx::grant<std::uint64_t, rdx::rights::write> bad = g;
#endif

#if defined(RDX_CASE_UNREGISTERED_SOURCE)
  // Plain (unregistered) memory is not local_span: it has no lkey.
  std::uint64_t plain[4] = {};
  auto bad = rw.write(std::span<const std::uint64_t>(plain), 0);
#endif
}

int main() {
  return 0;
}
