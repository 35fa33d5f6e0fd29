// The raw-verbs resources of pingpong's native and --rc-compat modes, and the
// steps of their round trips: post a receive, post a send, wait for and check
// a completion.
#pragma once

#include <rdx/rdx.hpp>

#include <cstdint>
#include <optional>

#include "options.hpp"

namespace pingpong {

inline constexpr std::uint32_t recv_slots = 2;

inline std::optional<rdx::completion_channel> make_channel(const rdx::context& ctx, bool events) {
  if (!events) return std::nullopt;
  return rdx::completion_channel(ctx);
}

struct resources {
  rdx::context ctx;
  rdx::protection_domain pd;
  std::optional<rdx::completion_channel> send_ch;  // event mode (-e) only
  std::optional<rdx::completion_channel> recv_ch;
  rdx::completion_queue send_cq;
  rdx::completion_queue recv_cq;
  rdx::queue_pair qp;
  rdx::registered_buffer<std::byte> send_buf;
  rdx::registered_buffer<std::byte> ring;  // recv_slots slots of `size` bytes

  resources(const options& o, rdx::context c)
      : ctx(std::move(c)),
        pd(ctx),
        send_ch(make_channel(ctx, o.events)),
        recv_ch(make_channel(ctx, o.events)),
        send_cq(ctx, rdx::completion_queue_attr{.depth = 16, .channel = send_ch ? &*send_ch : nullptr}),
        recv_cq(ctx, rdx::completion_queue_attr{.depth = 16, .channel = recv_ch ? &*recv_ch : nullptr}),
        qp(pd, send_cq, recv_cq,
           rdx::queue_pair_attr{
               .max_send_wr = 4,
               .max_recv_wr = recv_slots + 2,
               .port = o.ib_port,
               .gid_index = o.gid_index,
               .remote_access = o.m == mode::write_imm ? rdx::access::remote_write : rdx::access::none}),
        send_buf(pd, o.size),
        ring(pd, o.size * recv_slots,
             o.m == mode::write_imm ? rdx::access::local_write | rdx::access::remote_write
                                    : rdx::access::local_write) {}
};

// Posts the receive for slot `slot`: into the ring (send mode) or empty (write
// with immediate: the data lands by RDMA write, the receive only carries imm).
void post_recv_slot(resources& r, const options& o, std::uint32_t slot);

//! Waits for the next completion of cq (polling, or with -e sleeping); throws
//! failure naming round trip `iter` when none comes or it failed.
rdx::completion wait_completion(rdx::completion_queue& cq, const char* what, std::uint32_t iter,
                                const options& o);

//! Checks that a receive completion is round trip `iter`'s, of the right kind and size.
void check_recv(const rdx::completion& c, const options& o, std::uint32_t iter);

//! Posts round trip `iter`'s send from src: a send, or a write with immediate into the peer's ring.
void post_echo_or_ping(resources& r, const options& o, const rdx::remote_descriptor& peer_ring,
                       const ibv_sge& src, std::uint32_t iter);

//! Prints this side's device, port, GID choice and address.
void print_local(const resources& r, const char* role, const options& o);

}  // namespace pingpong
