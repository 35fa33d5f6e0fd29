// Compile-fail cases for channels, windows, the verbs layer's keys and the owning types. Built
// once with no case defined (the positive control: every line here is valid), then once per
// RDX_CASE_* macro, each of which must fail for its stated reason
// (CMakeLists.txt checks the compiler's message).
#include <rdx/channel/channel.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/work_request.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <utility>

void valid_uses(rdx::connection& c, const rdx::protection_domain& pd, const rdx::window_descriptor& d,
                rdx::memory_region& region, rdx::queue_pair& qp, rdx::completion_queue& cq,
                rdx::protection_domain& own_pd) {
  rdx::registered_buffer<std::uint64_t> local(pd, 16);
  rdx::remote_window<std::uint64_t, rdx::rights::read | rdx::rights::write> rw(c, d);
  auto w = rw.write(local, 0);
  auto r = rw.read(local, 0);
  rdx::remote_window<std::uint64_t, rdx::rights::atomic> aw(c, d);
  auto f = aw.fetch_add(0, 1);
  rdx::channel<std::uint64_t> ch(c);
  auto s = ch.send(std::uint64_t{1});
  auto m = ch.notify(rw, local, 0, 7);
  std::uint64_t last = 0;
  (void)ch.post(std::uint64_t{2});
  (void)ch.on_message([&last](std::span<const std::uint64_t> v) { last = v[0]; });
  auto table = rdx::make_window_buffer<std::uint64_t>(pd, 16);
  const rdx::grant<std::uint64_t, rdx::rights::write> g(c, table);
  rdx::registered_buffer<std::uint64_t> taken = std::move(local);  // owners move
  rdx::operation moved_op = std::move(w);                          // an operation moves until it ends
  // Verbs: local memory is an ibv_sge (lkey), the peer's a remote_ptr (rkey).
  const rdx::remote_ptr there{0x1000, 7};
  auto put = rdx::wr::write(region.sge(), there);
  auto get = rdx::wr::read(region.sge(), there);
  // Verbs owners move.
  rdx::memory_region moved_region = std::move(region);
  rdx::queue_pair moved_qp = std::move(qp);
  rdx::completion_queue moved_cq = std::move(cq);
  rdx::protection_domain moved_pd = std::move(own_pd);

#if defined(RDX_CASE_NON_TRIVIAL_MESSAGE)
  // A channel carries bytes the NIC copies: std::string is not trivially copyable.
  rdx::channel<std::string> bad(c);
#endif

#if defined(RDX_CASE_OWNING_HANDLER)
  // A handler is held by value in the connection, copied as bytes: one that
  // owns memory (a std::string captured by value) is refused.
  std::string name = "peer";
  (void)ch.on_message([name](std::span<const std::uint64_t>) { (void)name.size(); });
#endif

#if defined(RDX_CASE_HANDLER_TYPE)
  // The handler takes the channel's messages as a span of its T.
  (void)ch.on_message([](std::span<const std::uint32_t>) {});
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

#if defined(RDX_CASE_LOCAL_KEY_AS_REMOTE)
  // The target of an RDMA write is the peer's memory (a remote_ptr, an rkey); a local
  // scatter-gather entry (an lkey) is not.
  auto bad = rdx::wr::write(moved_region.sge(), moved_region.sge());
#endif

#if defined(RDX_CASE_REMOTE_KEY_AS_LOCAL)
  // The destination of an RDMA read is local memory (an lkey); the peer's remote_ptr is not.
  auto bad = rdx::wr::read(there, there);
#endif

#if defined(RDX_CASE_MEMORY_REGION_COPY)
  // A registration is deregistered once: a memory region moves, it is never copied.
  rdx::memory_region bad = moved_region;
#endif

#if defined(RDX_CASE_QUEUE_PAIR_COPY)
  // A queue pair is destroyed once: never copied.
  rdx::queue_pair bad = moved_qp;
#endif

#if defined(RDX_CASE_COMPLETION_QUEUE_COPY)
  // Nor is a completion queue.
  rdx::completion_queue bad = moved_cq;
#endif

#if defined(RDX_CASE_PROTECTION_DOMAIN_COPY)
  // Nor a protection domain.
  rdx::protection_domain bad = moved_pd;
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
