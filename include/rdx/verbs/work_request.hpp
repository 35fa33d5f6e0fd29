// rdx: typed work-request builders (send, recv, write, write with immediate,
// read, fetch-and-add, compare-and-swap). No allocation; wr_id carries a pointer.
#pragma once

#include <rdx/verbs/address_handle.hpp>
#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/memory_region.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>

#include <arpa/inet.h>

namespace rdx {

//! A send request of one SGE (or none), held by value: an RDMA write or
//! read, a send, their immediate forms, or an atomic. What the connection
//! engine posts: queue_pair::post_send(flat_wr&) writes it straight into the
//! provider's queue by the extended post API, with no ibv_send_wr built, or
//! converts it (send_wr::from) for ibv_post_send.
struct flat_wr {
  std::uint64_t wr_id = 0;        //!< carried back by the completion
  ibv_sge sge{};                  //!< length 0: a zero-length request (no SGE)
  std::uint64_t remote_addr = 0;  //!< the target of an RDMA request or atomic
  std::uint64_t compare_add = 0;  //!< atomics: the value compared (compare-and-swap) or added
  std::uint64_t swap = 0;         //!< compare-and-swap: the value written if equal
  std::uint32_t rkey = 0;         //!< the target's key
  std::uint32_t imm_data = 0;     //!< network order (htonl), for send_imm and write_imm
  //! IBV_WR_RDMA_WRITE (the default), _WITH_IMM, SEND, SEND_WITH_IMM, RDMA_READ or an atomic
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
  unsigned send_flags = IBV_SEND_SIGNALED;  //!< IBV_SEND_*; inline is decided at post
};

namespace detail {
//! Send-queue opcodes whose payload may go inline: sends and writes.
[[nodiscard]] constexpr bool inline_kind(ibv_wr_opcode op) noexcept {
  return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE ||
         op == IBV_WR_RDMA_WRITE_WITH_IMM;
}
}  // namespace detail

//! A send-queue work request: ibv_send_wr plus room for a one-entry SGL, so a
//! builder given a single ibv_sge owns it. A longer SGL (a span) is referenced
//! and must outlive the post. Signaled by default; inline is decided at post
//! time from the queue pair's max_inline_data unless no_inline() is set.
class send_wr {
public:
  send_wr() noexcept { wr_.sg_list = &sge_; }
  //! Copies o; an SGE embedded in o is copied with it and re-pointed, and next is cleared.
  send_wr(const send_wr& o) noexcept { copy_from(o); }
  //! Copies o, as the copy constructor does.
  send_wr& operator=(const send_wr& o) noexcept {
    if (this != &o) {
      copy_from(o);
    }
    return *this;
  }
  //! A move is a copy: the embedded SGE must be re-pointed either way.
  send_wr(send_wr&& o) noexcept { copy_from(o); }
  //! Copies o (a move is a copy).
  send_wr& operator=(send_wr&& o) noexcept {
    if (this != &o) {
      copy_from(o);
    }
    return *this;
  }
  ~send_wr() = default;

  //! Carries ctx's address as wr_id (read back with completion::context<T>()).
  send_wr& context(const void* ctx) noexcept {
    wr_.wr_id = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ctx));
    return *this;
  }
  //! Sets wr_id to a plain number, instead of a context pointer.
  send_wr& id(std::uint64_t wr_id) noexcept {
    wr_.wr_id = wr_id;
    return *this;
  }
  //! Asks for a completion (IBV_SEND_SIGNALED, the default); unsignaled, only a failure completes.
  send_wr& signaled(bool on = true) noexcept { return flag(IBV_SEND_SIGNALED, on); }
  //! No completion unless the request fails: signaled(false).
  send_wr& unsignaled() noexcept { return flag(IBV_SEND_SIGNALED, false); }
  //! Starts this request only after earlier RDMA reads and atomics on the queue pair end (IBV_SEND_FENCE).
  send_wr& fence(bool on = true) noexcept { return flag(IBV_SEND_FENCE, on); }
  //! Sets the solicited bit, which wakes a receiver waiting for solicited events only.
  send_wr& solicited(bool on = true) noexcept { return flag(IBV_SEND_SOLICITED, on); }
  //! Never send inline, even when the payload is small enough.
  send_wr& no_inline() noexcept {
    no_inline_ = true;
    return flag(IBV_SEND_INLINE, false);
  }
  //! UD destination: the address handle, the remote QP number and its Q_Key.
  send_wr& to(const address_handle& ah, std::uint32_t remote_qpn, std::uint32_t remote_qkey) noexcept {
    wr_.wr.ud.ah = ah.native_handle();
    wr_.wr.ud.remote_qpn = remote_qpn;
    wr_.wr.ud.remote_qkey = remote_qkey;
    return *this;
  }

  //! The ibv_send_wr itself, for fields the builders do not set.
  [[nodiscard]] ibv_send_wr& native() noexcept { return wr_; }
  //! The ibv_send_wr itself.
  [[nodiscard]] const ibv_send_wr& native() const noexcept { return wr_; }
  //! The verbs opcode (IBV_WR_*).
  [[nodiscard]] ibv_wr_opcode opcode() const noexcept { return wr_.opcode; }
  //! The wr_id that the completion carries back.
  [[nodiscard]] std::uint64_t wr_id() const noexcept { return wr_.wr_id; }
  //! The IBV_SEND_* flags set so far.
  [[nodiscard]] unsigned flags() const noexcept { return wr_.send_flags; }
  //! The scatter/gather list: the embedded entry or the caller's span.
  [[nodiscard]] std::span<const ibv_sge> sgl() const noexcept {
    return {wr_.sg_list, static_cast<std::size_t>(wr_.num_sge)};
  }
  //! Bytes the SGL covers.
  [[nodiscard]] std::uint64_t total_length() const noexcept {
    std::uint64_t n = 0;
    for (int i = 0; i < wr_.num_sge; ++i) {
      n += wr_.sg_list[i].length;
    }
    return n;
  }
  //! Whether the payload may be inlined (send and write kinds, not disabled).
  [[nodiscard]] bool inline_candidate() const noexcept {
    return !no_inline_ && detail::inline_kind(wr_.opcode);
  }

  //! The same request as f, for ibv_post_send.
  static send_wr from(const flat_wr& f) noexcept {
    send_wr w(f.opcode, f.sge, nullptr);
    w.wr_.wr_id = f.wr_id;
    w.wr_.send_flags = f.send_flags;
    w.wr_.imm_data = f.imm_data;
    if (f.sge.length == 0) {
      w.wr_.num_sge = 0;
    }
    if (f.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || f.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      w.atomic(remote_ptr{f.remote_addr, f.rkey}, f.compare_add, f.swap);
    } else {
      w.remote(remote_ptr{f.remote_addr, f.rkey});
    }
    return w;
  }
  //! A request of kind op over one SGE, copied in; signaled, with ctx as wr_id (what rdx::wr
  //! builds on).
  static send_wr make(ibv_wr_opcode op, const ibv_sge& one, const void* ctx) noexcept {
    return send_wr(op, one, ctx);
  }
  //! A request of kind op over sgl, which is referenced and must outlive the post; signaled,
  //! with ctx as wr_id.
  static send_wr make(ibv_wr_opcode op, std::span<const ibv_sge> sgl, const void* ctx) noexcept {
    send_wr w;
    if (!sgl.empty()) {
      w.wr_.sg_list = const_cast<ibv_sge*>(sgl.data());  // verbs never writes the SGL
    }
    w.wr_.num_sge = static_cast<int>(sgl.size());
    w.init(op, ctx);
    return w;
  }
  //! Sets the remote address and rkey of an RDMA write or read.
  send_wr& remote(remote_ptr r) noexcept {
    wr_.wr.rdma.remote_addr = r.addr;
    wr_.wr.rdma.rkey = r.rkey;
    return *this;
  }
  //! Sets an atomic's target word and operands: compare_add is the value compared (compare-and-swap)
  //! or added (fetch-and-add); swap the value written if equal.
  send_wr& atomic(remote_ptr r, std::uint64_t compare_add, std::uint64_t swap) noexcept {
    wr_.wr.atomic.remote_addr = r.addr;
    wr_.wr.atomic.rkey = r.rkey;
    wr_.wr.atomic.compare_add = compare_add;
    wr_.wr.atomic.swap = swap;
    return *this;
  }
  //! Makes this a type 2 memory-window bind: mw gets new_rkey over info's range.
  send_wr& bind(ibv_mw* mw, std::uint32_t new_rkey, const ibv_mw_bind_info& info) noexcept {
    wr_.opcode = IBV_WR_BIND_MW;
    wr_.num_sge = 0;
    wr_.bind_mw.mw = mw;
    wr_.bind_mw.rkey = new_rkey;
    wr_.bind_mw.bind_info = info;
    return *this;
  }
  //! Sets the rkey that the request invalidates (local invalidate, send with invalidate).
  send_wr& invalidate(std::uint32_t rkey) noexcept {
    wr_.invalidate_rkey = rkey;
    return *this;
  }
  //! Sets the immediate data, given in host order and sent in network order.
  send_wr& imm(std::uint32_t host_order) noexcept {
    wr_.imm_data = htonl(host_order);
    return *this;
  }

private:
  // Each field written once, in place (make's result is this object).
  send_wr(ibv_wr_opcode op, const ibv_sge& one, const void* ctx) noexcept
      : wr_{.wr_id = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ctx)),
            .next = nullptr,
            .sg_list = &sge_,
            .num_sge = 1,
            .opcode = op,
            .send_flags = IBV_SEND_SIGNALED,
            .imm_data = 0,
            .wr = {},
            .qp_type = {},
            .bind_mw = {}},
        sge_(one) {}
  void init(ibv_wr_opcode op, const void* ctx) noexcept {
    wr_.opcode = op;
    wr_.send_flags = IBV_SEND_SIGNALED;
    context(ctx);
  }
  send_wr& flag(unsigned f, bool on) noexcept {
    wr_.send_flags = on ? (wr_.send_flags | f) : (wr_.send_flags & ~f);
    return *this;
  }
  void copy_from(const send_wr& o) noexcept {
    wr_ = o.wr_;
    sge_ = o.sge_;
    no_inline_ = o.no_inline_;
    if (o.wr_.sg_list == &o.sge_) {
      wr_.sg_list = &sge_;
    }
    wr_.next = nullptr;
  }
  ibv_send_wr wr_{};
  ibv_sge sge_{};
  bool no_inline_ = false;
};

//! A receive work request: ibv_recv_wr plus room for a one-entry SGL.
class recv_wr {
public:
  recv_wr() noexcept { wr_.sg_list = &sge_; }
  //! Copies o; an SGE embedded in o is copied with it and re-pointed, and next is cleared.
  recv_wr(const recv_wr& o) noexcept { copy_from(o); }
  //! Copies o, as the copy constructor does.
  recv_wr& operator=(const recv_wr& o) noexcept {
    if (this != &o) {
      copy_from(o);
    }
    return *this;
  }
  //! A move is a copy: the embedded SGE must be re-pointed either way.
  recv_wr(recv_wr&& o) noexcept { copy_from(o); }
  //! Copies o (a move is a copy).
  recv_wr& operator=(recv_wr&& o) noexcept {
    if (this != &o) {
      copy_from(o);
    }
    return *this;
  }
  ~recv_wr() = default;

  //! Carries ctx's address as wr_id (read back with completion::context<T>()).
  recv_wr& context(const void* ctx) noexcept {
    wr_.wr_id = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ctx));
    return *this;
  }
  //! Sets wr_id to a plain number, instead of a context pointer.
  recv_wr& id(std::uint64_t wr_id) noexcept {
    wr_.wr_id = wr_id;
    return *this;
  }
  //! The ibv_recv_wr itself, for fields the builders do not set.
  [[nodiscard]] ibv_recv_wr& native() noexcept { return wr_; }
  //! The ibv_recv_wr itself.
  [[nodiscard]] const ibv_recv_wr& native() const noexcept { return wr_; }
  //! The wr_id that the completion carries back.
  [[nodiscard]] std::uint64_t wr_id() const noexcept { return wr_.wr_id; }
  //! The scatter/gather list: the embedded entry or the caller's span.
  [[nodiscard]] std::span<const ibv_sge> sgl() const noexcept {
    return {wr_.sg_list, static_cast<std::size_t>(wr_.num_sge)};
  }

  //! A receive into one SGE, copied in, with ctx as wr_id (what rdx::wr::recv builds on).
  static recv_wr make(const ibv_sge& one, const void* ctx) noexcept {
    recv_wr w;
    w.sge_ = one;
    w.wr_.sg_list = &w.sge_;
    w.wr_.num_sge = 1;
    w.context(ctx);
    return w;
  }
  //! A receive scattered into sgl, which is referenced and must outlive the post; ctx as wr_id.
  static recv_wr make(std::span<const ibv_sge> sgl, const void* ctx) noexcept {
    recv_wr w;
    if (!sgl.empty()) {
      w.wr_.sg_list = const_cast<ibv_sge*>(sgl.data());
    }
    w.wr_.num_sge = static_cast<int>(sgl.size());
    w.context(ctx);
    return w;
  }

private:
  void copy_from(const recv_wr& o) noexcept {
    wr_ = o.wr_;
    sge_ = o.sge_;
    if (o.wr_.sg_list == &o.sge_) {
      wr_.sg_list = &sge_;
    }
    wr_.next = nullptr;
  }
  ibv_recv_wr wr_{};
  ibv_sge sge_{};
};

//! Work-request builders. Each takes the local memory as one ibv_sge (copied into the
//! request) or an SGL span (referenced: keep it alive until posted), the
//! remote side as a remote_ptr (never an lkey), and the operation's state as
//! ctx, carried in wr_id.
namespace wr {

//! Send of src's bytes; it consumes one receive posted by the peer.
[[nodiscard]] inline send_wr send(const ibv_sge& src, const void* ctx = nullptr) noexcept {
  return send_wr::make(IBV_WR_SEND, src, ctx);
}
//! Send gathered from an SGL (referenced until posted).
[[nodiscard]] inline send_wr send(std::span<const ibv_sge> src, const void* ctx = nullptr) noexcept {
  return send_wr::make(IBV_WR_SEND, src, ctx);
}
//! Send with 32-bit immediate data (host order; the receiver reads completion::imm()).
[[nodiscard]] inline send_wr send_imm(const ibv_sge& src, std::uint32_t imm,
                                      const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_SEND_WITH_IMM, src, ctx);
  w.imm(imm);
  return w;
}
//! Send with immediate data (host order), gathered from an SGL.
[[nodiscard]] inline send_wr send_imm(std::span<const ibv_sge> src, std::uint32_t imm,
                                      const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_SEND_WITH_IMM, src, ctx);
  w.imm(imm);
  return w;
}
//! RDMA write of src's bytes to the peer's memory at dst; the peer gets no completion.
[[nodiscard]] inline send_wr write(const ibv_sge& src, remote_ptr dst, const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_RDMA_WRITE, src, ctx);
  w.remote(dst);
  return w;
}
//! RDMA write gathered from an SGL.
[[nodiscard]] inline send_wr write(std::span<const ibv_sge> src, remote_ptr dst,
                                   const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_RDMA_WRITE, src, ctx);
  w.remote(dst);
  return w;
}
//! RDMA write that also consumes a receive at the peer, carrying imm (host order).
[[nodiscard]] inline send_wr write_imm(const ibv_sge& src, remote_ptr dst, std::uint32_t imm,
                                       const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_RDMA_WRITE_WITH_IMM, src, ctx);
  w.remote(dst);
  w.imm(imm);
  return w;
}
//! RDMA write with immediate data, gathered from an SGL.
[[nodiscard]] inline send_wr write_imm(std::span<const ibv_sge> src, remote_ptr dst, std::uint32_t imm,
                                       const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_RDMA_WRITE_WITH_IMM, src, ctx);
  w.remote(dst);
  w.imm(imm);
  return w;
}
//! RDMA read of the peer's memory at src into dst.
[[nodiscard]] inline send_wr read(const ibv_sge& dst, remote_ptr src, const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_RDMA_READ, dst, ctx);
  w.remote(src);
  return w;
}
//! RDMA read scattered into an SGL.
[[nodiscard]] inline send_wr read(std::span<const ibv_sge> dst, remote_ptr src,
                                  const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_RDMA_READ, dst, ctx);
  w.remote(src);
  return w;
}
//! Atomically adds add to the 8-byte remote word; the old value lands in old_value (8 bytes).
[[nodiscard]] inline send_wr fetch_add(const ibv_sge& old_value, remote_ptr target, std::uint64_t add,
                                       const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_ATOMIC_FETCH_AND_ADD, old_value, ctx);
  w.atomic(target, add, 0);
  return w;
}
//! Atomically replaces the 8-byte remote word with desired if it equals expected;
//! the old value lands in old_value (8 bytes).
[[nodiscard]] inline send_wr compare_swap(const ibv_sge& old_value, remote_ptr target, std::uint64_t expected,
                                          std::uint64_t desired, const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_ATOMIC_CMP_AND_SWP, old_value, ctx);
  w.atomic(target, expected, desired);
  return w;
}
//! Invalidates a type 2 memory window's rkey locally (the window stops granting access).
[[nodiscard]] inline send_wr local_invalidate(std::uint32_t rkey, const void* ctx = nullptr) noexcept {
  send_wr w = send_wr::make(IBV_WR_LOCAL_INV, std::span<const ibv_sge>(), ctx);
  w.invalidate(rkey);
  return w;
}
//! Receive into dst: the next send (or write with immediate) from the peer consumes it.
[[nodiscard]] inline recv_wr recv(const ibv_sge& dst, const void* ctx = nullptr) noexcept {
  return recv_wr::make(dst, ctx);
}
//! Receive scattered into an SGL.
[[nodiscard]] inline recv_wr recv(std::span<const ibv_sge> dst, const void* ctx = nullptr) noexcept {
  return recv_wr::make(dst, ctx);
}

}  // namespace wr
}  // namespace rdx
