// rdx_cost_model's UCX twins (built when Debian's libucx-dev is found): two
// UCP workers of one process on the same device, each with an endpoint to
// the other, so that UCX's rows run the same loopback as rdx's and plain
// verbs'. window_write: ucp_put_nbx of 64 bytes into the peer's mapped
// memory and the ucp_ep_flush_nbx that completes it, driven by
// ucp_worker_progress. channel_64: ucp_am_send_nbx of 64 bytes and its
// receipt in the peer's active-message handler (which copies it out, as
// rdx's receive does), both workers progressed until both ends are done.
// With peers N (rdx_cost_model --peers N), each worker also holds N - 1
// other endpoints to the other, wired up (the first worker's by a message,
// the other's by a flush) before anything is counted and idle after, as
// rdx's workers hold N - 1 idle connections beside the measured one. On Soft-RoCE, UCX 1.13 connects only
// with UCX_IB_GID_INDEX=0 (its UD wire-up fails on the IPv4-mapped GID);
// cost_model.sh sets it.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

namespace ucx_twin {

[[noreturn]] inline void fail(const std::string& what, ucs_status_t s) {
  throw std::runtime_error("UCX: " + what + ": " + ucs_status_string(s));
}

inline void check(ucs_status_t s, const char* what) {
  if (s != UCS_OK) fail(what, s);
}

struct pair {
  ucp_context_h ctx = nullptr;
  ucp_worker_h wa = nullptr, wb = nullptr;
  ucp_ep_h ea = nullptr, eb = nullptr;
  ucp_mem_h mem = nullptr;
  ucp_rkey_h rkey = nullptr;
  std::vector<std::byte> target = std::vector<std::byte>(64 * 1024);
  std::vector<std::byte> source = std::vector<std::byte>(64 * 1024);
  std::byte received[4096] = {};
  std::size_t received_bytes = 0;
  std::uint64_t arrivals = 0;
  std::vector<ucp_ep_h> idle;  // the other endpoints of both workers (peers - 1 pairs)

  explicit pair(unsigned peers = 0) {
    ucp_config_t* cfg = nullptr;
    check(ucp_config_read(nullptr, nullptr, &cfg), "ucp_config_read");
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
    const ucs_status_t s = ucp_init(&p, cfg, &ctx);
    ucp_config_release(cfg);
    check(s, "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(ctx, &wp, &wa), "ucp_worker_create");
    check(ucp_worker_create(ctx, &wp, &wb), "ucp_worker_create");
    ea = connect(wa, wb);
    eb = connect(wb, wa);
    // The peer's memory, mapped and its key unpacked at the initiator.
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = target.data();
    mp.length = target.size();
    check(ucp_mem_map(ctx, &mp, &mem), "ucp_mem_map");
    void* packed = nullptr;
    std::size_t packed_len = 0;
    check(ucp_rkey_pack(ctx, mem, &packed, &packed_len), "ucp_rkey_pack");
    const ucs_status_t u = ucp_ep_rkey_unpack(ea, packed, &rkey);
    ucp_rkey_buffer_release(packed);
    check(u, "ucp_ep_rkey_unpack");
    ucp_am_handler_param_t hp{};
    hp.field_mask =
        UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = 1;
    hp.cb = &pair::on_message;
    hp.arg = this;
    check(ucp_worker_set_am_recv_handler(wb, &hp), "ucp_worker_set_am_recv_handler");
    // Wire-up: a first put and message, each completed, before anything is counted.
    for (int i = 0; i < 4; ++i) {
      wait(put(), true);
      const std::uint64_t before = arrivals;
      ucs_status_ptr_t r = send(64);
      while (arrivals == before) progress_both();
      wait(r, false);
    }
    // The other peers: an endpoint each way, each wired up by a message that
    // arrives and a flush that ends, then left idle.
    for (unsigned i = 1; i < peers; ++i) {
      const ucp_ep_h a = connect(wa, wb);
      idle.push_back(a);
      const ucp_ep_h b = connect(wb, wa);
      idle.push_back(b);
      const std::uint64_t before = arrivals;
      ucs_status_ptr_t r = send(64, a);
      while (arrivals == before) progress_both();
      wait(r, true);
      ucp_request_param_t rp{};
      wait(ucp_ep_flush_nbx(b, &rp), true);
    }
  }
  pair(const pair&) = delete;
  pair& operator=(const pair&) = delete;
  ~pair() {
    if (rkey != nullptr) ucp_rkey_destroy(rkey);
    if (mem != nullptr) ucp_mem_unmap(ctx, mem);
    idle.push_back(ea);
    idle.push_back(eb);
    for (ucp_ep_h e : idle) {
      if (e == nullptr) continue;
      ucp_request_param_t rp{};
      rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(e, &rp);
      if (UCS_PTR_IS_PTR(r)) {
        for (int i = 0; i < 100000 && ucp_request_check_status(r) == UCS_INPROGRESS; ++i) progress_both();
        ucp_request_free(r);
      }
    }
    if (wb != nullptr) ucp_worker_destroy(wb);
    if (wa != nullptr) ucp_worker_destroy(wa);
    if (ctx != nullptr) ucp_cleanup(ctx);
  }

  static ucs_status_t on_message(void* arg, const void*, std::size_t, void* data, std::size_t length,
                                 const ucp_am_recv_param_t*) {
    auto* self = static_cast<pair*>(arg);
    if (length <= sizeof self->received) std::memcpy(self->received, data, length);
    self->received_bytes = length;
    ++self->arrivals;
    return UCS_OK;
  }

  ucp_ep_h connect(ucp_worker_h from, ucp_worker_h to) {
    ucp_address_t* addr = nullptr;
    std::size_t len = 0;
    check(ucp_worker_get_address(to, &addr, &len), "ucp_worker_get_address");
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = addr;
    ucp_ep_h e = nullptr;
    const ucs_status_t s = ucp_ep_create(from, &ep, &e);
    ucp_worker_release_address(to, addr);
    check(s, "ucp_ep_create");
    return e;
  }

  void progress_both() {
    (void)ucp_worker_progress(wa);
    (void)ucp_worker_progress(wb);
  }

  // A 64-byte put and its flush: the request that ends when the put is complete.
  ucs_status_ptr_t put() {
    ucp_request_param_t rp{};
    ucs_status_ptr_t p =
        ucp_put_nbx(ea, source.data(), 64, reinterpret_cast<std::uint64_t>(target.data()), rkey, &rp);
    if (UCS_PTR_IS_ERR(p)) fail("ucp_put_nbx", UCS_PTR_STATUS(p));
    if (UCS_PTR_IS_PTR(p)) ucp_request_free(p);  // the flush covers it
    ucs_status_ptr_t f = ucp_ep_flush_nbx(ea, &rp);
    if (UCS_PTR_IS_ERR(f)) fail("ucp_ep_flush_nbx", UCS_PTR_STATUS(f));
    return f;
  }

  ucs_status_ptr_t send(std::size_t bytes) { return send(bytes, ea); }
  ucs_status_ptr_t send(std::size_t bytes, ucp_ep_h from) {
    ucp_request_param_t rp{};
    ucs_status_ptr_t p = ucp_am_send_nbx(from, 1, nullptr, 0, source.data(), bytes, &rp);
    if (UCS_PTR_IS_ERR(p)) fail("ucp_am_send_nbx", UCS_PTR_STATUS(p));
    return p;
  }

  // True when r (a request, or an immediate status) has ended.
  static bool done(ucs_status_ptr_t r) {
    if (!UCS_PTR_IS_PTR(r)) return true;
    const ucs_status_t s = ucp_request_check_status(r);
    if (s == UCS_INPROGRESS) return false;
    if (s != UCS_OK) fail("request", s);
    return true;
  }
  static void release(ucs_status_ptr_t r) {
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
  }

  // Progresses until r ends (the peer too when both is set), then frees it.
  void wait(ucs_status_ptr_t r, bool both) {
    if (UCS_PTR_IS_ERR(r)) fail("request", UCS_PTR_STATUS(r));
    for (long i = 0; !done(r); ++i) {
      (void)ucp_worker_progress(wa);
      if (both) (void)ucp_worker_progress(wb);
      if (i > 100000000) throw std::runtime_error("UCX: a request did not end");
    }
    release(r);
  }
};

}  // namespace ucx_twin
