// rdx: a work completion record, filled by completion_queue::poll.
#pragma once

#include <rdx/error.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <system_error>
#include <type_traits>

#include <arpa/inet.h>

namespace rdx {

//! One work completion: ibv_wc with typed accessors. Standard layout with the
//! ibv_wc as its only member, so an array of completions is polled in place.
struct completion {
  ibv_wc wc;  //!< the verbs record itself

  //! True for IBV_WC_SUCCESS.
  [[nodiscard]] bool ok() const noexcept { return wc.status == IBV_WC_SUCCESS; }
  //! The verbs status (IBV_WC_*); error() gives it as an error code.
  [[nodiscard]] ibv_wc_status status() const noexcept { return wc.status; }
  //! The status as an error code of wc_category() (empty on success); its message has a hint.
  [[nodiscard]] std::error_code error() const noexcept { return make_wc_error_code(wc.status); }
  //! The wr_id of the work request that completed, valid whatever the status.
  [[nodiscard]] std::uint64_t wr_id() const noexcept { return wc.wr_id; }
  //! The pointer the work request carried as wr_id.
  template <class T>
  [[nodiscard]] T* context() const noexcept {
    return reinterpret_cast<T*>(static_cast<std::uintptr_t>(wc.wr_id));
  }
  //! Valid only when ok(): flushed and failed completions leave it undefined.
  [[nodiscard]] ibv_wc_opcode opcode() const noexcept { return wc.opcode; }
  //! Bytes received (receives), or moved by an RDMA read or atomic; valid only when ok().
  [[nodiscard]] std::uint32_t byte_len() const noexcept { return wc.byte_len; }
  //! True when the completion carries immediate data (imm()).
  [[nodiscard]] bool has_imm() const noexcept { return (wc.wc_flags & IBV_WC_WITH_IMM) != 0; }
  //! Immediate data in host byte order (the sender's value).
  [[nodiscard]] std::uint32_t imm() const noexcept { return ntohl(wc.imm_data); }
  //! The local queue pair the request was posted on.
  [[nodiscard]] std::uint32_t qp_num() const noexcept { return wc.qp_num; }
  //! UD receives: the sender's queue pair number.
  [[nodiscard]] std::uint32_t src_qp() const noexcept { return wc.src_qp; }
  //! UD receives: true when the first 40 bytes of the buffer hold a GRH.
  [[nodiscard]] bool has_grh() const noexcept { return (wc.wc_flags & IBV_WC_GRH) != 0; }
  //! The provider's own error code of a failed completion (vendor-specific).
  [[nodiscard]] std::uint32_t vendor_err() const noexcept { return wc.vendor_err; }
  //! True for a receive-side completion.
  [[nodiscard]] bool is_recv() const noexcept { return (wc.opcode & IBV_WC_RECV) != 0; }
};
static_assert(std::is_standard_layout_v<completion>);
static_assert(std::is_trivially_copyable_v<completion>);
static_assert(sizeof(completion) == sizeof(ibv_wc));
static_assert(alignof(completion) == alignof(ibv_wc));

//! The wr_id that carries a pointer (the operation's state).
template <class T>
[[nodiscard]] inline std::uint64_t to_wr_id(T* p) noexcept {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
}

}  // namespace rdx
