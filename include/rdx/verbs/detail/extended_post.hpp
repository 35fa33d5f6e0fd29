// rdx::detail: the plumbing under queue_pair's posting: the set of operations
// a queue pair's extended post API carries (bit IBV_WR_x: opcode x), the
// ibv_wr_* calls that write one request straight into the provider's send
// queue between ibv_wr_start and ibv_wr_complete, and the std::error_code a
// post returns. Everything a post calls is always inlined.
#pragma once

#include <rdx/error.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>
#include <rdx/verbs/work_request.hpp>

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

namespace rdx::detail {

// Each IBV_QP_EX_WITH_x flag is bit IBV_WR_x, so extended_ops() is also the
// set of opcodes the queue pair carries.
static_assert(IBV_QP_EX_WITH_RDMA_WRITE == 1U << IBV_WR_RDMA_WRITE &&
              IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM == 1U << IBV_WR_RDMA_WRITE_WITH_IMM &&
              IBV_QP_EX_WITH_SEND == 1U << IBV_WR_SEND &&
              IBV_QP_EX_WITH_SEND_WITH_IMM == 1U << IBV_WR_SEND_WITH_IMM &&
              IBV_QP_EX_WITH_RDMA_READ == 1U << IBV_WR_RDMA_READ &&
              IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP == 1U << IBV_WR_ATOMIC_CMP_AND_SWP &&
              IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD == 1U << IBV_WR_ATOMIC_FETCH_AND_ADD);

// The operations rdx posts by the extended API (UC has no reads or atomics).
[[nodiscard]] inline std::uint64_t extended_ops(qp_type t) noexcept {
  std::uint64_t ops = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                      IBV_QP_EX_WITH_SEND_WITH_IMM;
  if (t == qp_type::rc) {
    ops |= IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
  }
  return ops;
}

// Bit op of a set of opcodes (bit IBV_WR_x: opcode x).
[[nodiscard, gnu::always_inline]] inline bool has_opcode(std::uint32_t set, ibv_wr_opcode op) noexcept {
  return static_cast<unsigned>(op) < 32 && ((set >> static_cast<unsigned>(op)) & 1U) != 0;
}

// What the extended post API carries of a builder's request: an operation in
// set (the queue pair's) with at most one SGE. Binds, invalidations and
// gather lists go by ibv_post_send: Soft-RoCE before rdma-core 64 (Debian 12
// ships 44) sets a list's length to its first entry's times the count in
// ibv_wr_set_sge_list.
[[nodiscard, gnu::always_inline]] inline bool extended_carries(std::uint32_t set, const send_wr& w) noexcept {
  return w.native().num_sge <= 1 && has_opcode(set, w.opcode());
}

// Writes a request into the provider's send queue between ibv_wr_start and
// ibv_wr_complete: its opcode's call, then its data (sge.length 0: a
// zero-length request). The flags go as they are (IBV_SEND_INLINE included:
// some providers read it there). Everything by value, so a request built at
// the call site never needs to be in memory.
[[gnu::always_inline]] inline void put_extended(ibv_qp_ex* const q, std::uint64_t wr_id, unsigned flags,
                                                ibv_wr_opcode op, std::uint32_t rkey, std::uint64_t raddr,
                                                std::uint64_t compare_add, std::uint64_t swap, __be32 imm,
                                                ibv_sge sge) noexcept {
  q->wr_id = wr_id;
  q->wr_flags = flags;
  switch (op) {
    case IBV_WR_RDMA_WRITE: ::ibv_wr_rdma_write(q, rkey, raddr); break;
    case IBV_WR_RDMA_WRITE_WITH_IMM: ::ibv_wr_rdma_write_imm(q, rkey, raddr, imm); break;
    case IBV_WR_SEND: ::ibv_wr_send(q); break;
    case IBV_WR_SEND_WITH_IMM: ::ibv_wr_send_imm(q, imm); break;
    case IBV_WR_RDMA_READ: ::ibv_wr_rdma_read(q, rkey, raddr); break;
    case IBV_WR_ATOMIC_CMP_AND_SWP: ::ibv_wr_atomic_cmp_swp(q, rkey, raddr, compare_add, swap); break;
    // NOLINTNEXTLINE(readability-suspicious-call-argument): raddr is remote_addr, compare_add the add.
    case IBV_WR_ATOMIC_FETCH_AND_ADD: ::ibv_wr_atomic_fetch_add(q, rkey, raddr, compare_add); break;
    default: break;  // extended_carries() sent it to ibv_post_send
  }
  if (sge.length == 0) {
    static const ibv_sge none{};
    ::ibv_wr_set_sge_list(q, 0, &none);
  } else if ((flags & IBV_SEND_INLINE) != 0) {
    ::ibv_wr_set_inline_data(q, reinterpret_cast<void*>(static_cast<std::uintptr_t>(sge.addr)), sge.length);
  } else {
    ::ibv_wr_set_sge(q, sge.lkey, sge.addr, sge.length);
  }
}

// A request the builders made (one SGE or none; extended_carries()).
[[gnu::always_inline]] inline void put_extended(ibv_qp_ex* const q, const send_wr& w) noexcept {
  const ibv_send_wr& n = w.native();
  const ibv_sge sge = n.num_sge == 1 ? n.sg_list[0] : ibv_sge{};
  if (n.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || n.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    put_extended(q, n.wr_id, n.send_flags, n.opcode, n.wr.atomic.rkey, n.wr.atomic.remote_addr,
                 n.wr.atomic.compare_add, n.wr.atomic.swap, n.imm_data, sge);
  } else {
    put_extended(q, n.wr_id, n.send_flags, n.opcode, n.wr.rdma.rkey, n.wr.rdma.remote_addr, 0, 0, n.imm_data,
                 sge);
  }
}

[[gnu::cold, gnu::noinline]] inline std::error_code post_error(int rc) noexcept {
  int e = rc > 0 ? rc : (errno != 0 ? errno : EINVAL);
  return {e, std::generic_category()};
}
// A post's return (ibv_post_send, ibv_post_recv, ibv_wr_complete) as the
// std::error_code queue_pair returns: empty on success, else the errno.
[[gnu::always_inline]] inline std::error_code post_status(int rc) noexcept {
  if (rc == 0) [[likely]] {
    return no_error();
  }
  return post_error(rc);
}

}  // namespace rdx::detail
