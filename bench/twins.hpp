// rdx benchmarks: the two posting interfaces compared, rdx and plain verbs.
// Each posts `k` copies of a request on a queue pair with one call (one
// doorbell), the last one signaled when asked (carrying `id`, the number of
// requests its completion retires), posts receives and polls.
#pragma once

#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/post.hpp>
#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/work_request.hpp>

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <system_error>

#include "common.hpp"

namespace rdx_bench {

//! One work request as the loops describe it; each interface builds its own from it.
struct wr_desc {
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
  ibv_sge sge{};
  rdx::remote_ptr remote{};
};

//! Plain verbs: ibv_send_wr arrays, ibv_post_send, ibv_post_recv, ibv_poll_cq.
struct raw_api {
  static constexpr std::string_view name = "raw";
  using wc_type = ibv_wc;
  static bool ok(const ibv_wc& c) noexcept { return c.status == IBV_WC_SUCCESS; }
  static std::uint64_t id(const ibv_wc& c) noexcept { return c.wr_id; }
  static const char* status(const ibv_wc& c) noexcept { return ::ibv_wc_status_str(c.status); }

  static int post(rdx::queue_pair& qp, const wr_desc& d, unsigned k, bool signal_last,
                  std::uint64_t id) noexcept {
    ibv_send_wr wrs[max_batch];
    ibv_sge sges[max_batch];
    const bool inl = d.opcode != IBV_WR_RDMA_READ && d.sge.length <= qp.max_inline_data();
    for (unsigned j = 0; j < k; ++j) {
      sges[j] = d.sge;
      ibv_send_wr& w = wrs[j];
      w = ibv_send_wr{};
      w.wr_id = id;
      w.next = j + 1 < k ? &wrs[j + 1] : nullptr;
      w.sg_list = &sges[j];
      w.num_sge = 1;
      w.opcode = d.opcode;
      w.send_flags = (signal_last && j + 1 == k ? unsigned{IBV_SEND_SIGNALED} : 0u) |
                     (inl ? unsigned{IBV_SEND_INLINE} : 0u);
      w.wr.rdma.remote_addr = d.remote.addr;
      w.wr.rdma.rkey = d.remote.rkey;
    }
    ibv_send_wr* bad = nullptr;
    return ::ibv_post_send(qp.native_handle(), wrs, &bad);
  }
  static int post_recv(rdx::queue_pair& qp, ibv_sge sge) noexcept {
    ibv_recv_wr w{};
    w.sg_list = &sge;
    w.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ::ibv_post_recv(qp.native_handle(), &w, &bad);
  }
  static int poll(rdx::completion_queue& cq, ibv_wc* out, int n) noexcept {
    return ::ibv_poll_cq(cq.native_handle(), n, out);
  }
};

//! rdx: typed builders, a reused send_batch filled in place, queue_pair::post_send/post_recv,
//! completion_queue::poll.
struct rdx_api {
  static constexpr std::string_view name = "rdx";
  using wc_type = rdx::completion;
  static bool ok(const rdx::completion& c) noexcept { return c.ok(); }
  static std::uint64_t id(const rdx::completion& c) noexcept { return c.wr_id(); }
  static const char* status(const rdx::completion& c) noexcept { return ::ibv_wc_status_str(c.status()); }

  static rdx::send_wr build(const wr_desc& d) noexcept {
    switch (d.opcode) {
      case IBV_WR_RDMA_READ: return rdx::wr::read(d.sge, d.remote);
      case IBV_WR_SEND: return rdx::wr::send(d.sge);
      default: return rdx::wr::write(d.sge, d.remote);
    }
  }
  static int post(rdx::queue_pair& qp, const wr_desc& d, unsigned k, bool signal_last,
                  std::uint64_t id) noexcept {
    if (k == 1) return qp.post_send(build(d).id(id).signaled(signal_last)).value();
    // A long-lived batch, as an application keeps one per queue pair.
    static thread_local rdx::send_batch<max_batch> batch;
    for (unsigned j = 0; j < k; ++j) {
      (void)batch.emplace([&]() noexcept {
        rdx::send_wr w = build(d);
        w.id(id).signaled(signal_last && j + 1 == k);
        return w;
      });
    }
    std::error_code ec = rdx::post(qp, batch);
    if (ec) batch.clear();
    return ec.value();
  }
  static int post_recv(rdx::queue_pair& qp, ibv_sge sge) noexcept {
    return qp.post_recv(rdx::wr::recv(sge)).value();
  }
  static int poll(rdx::completion_queue& cq, rdx::completion* out, int n) noexcept {
    std::size_t got = 0;
    if (const std::error_code ec =
            cq.poll(std::span<rdx::completion>(out, static_cast<std::size_t>(n)), got)) {
      return -ec.value();
    }
    return static_cast<int>(got);
  }
};

}  // namespace rdx_bench
