// pingpong's native round-trip steps over raw verbs.
#include "resources.hpp"

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <system_error>

namespace pingpong {

void post_recv_slot(resources& r, const options& o, std::uint32_t slot) {
  std::error_code ec;
  if (o.m == mode::write_imm) {
    ec = r.qp.post_recv(rdx::wr::recv(std::span<const ibv_sge>{}).id(slot));
  } else {
    ec = r.qp.post_recv(rdx::wr::recv(r.ring.sge(slot * o.size, o.size)).id(slot));
  }
  if (ec) throw failure("post a receive: " + ec.message());
}

namespace {

// Busy-polls cq for one completion, or with `events` sleeps on its channel
// between polls (arm, poll once more to close the race, then wait).
std::error_code next_completion(rdx::completion_queue& cq, rdx::completion& c, bool events,
                                std::chrono::seconds timeout) {
  if (!events) return rdx::poll_one(cq, c, timeout);
  const auto deadline = steady::now() + timeout;
  for (;;) {
    std::size_t n = 0;
    if (std::error_code ec = cq.poll(std::span<rdx::completion>(&c, 1), n)) return ec;
    if (n == 1) return {};
    if (std::error_code ec = cq.arm()) return ec;
    if (std::error_code ec = cq.poll(std::span<rdx::completion>(&c, 1), n)) return ec;
    if (n == 1) return {};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
    if (left.count() <= 0) return rdx::make_error_code(rdx::errc::timed_out);
    if (std::error_code ec = cq.wait_event(left)) return ec;
  }
}

}  // namespace

rdx::completion wait_completion(rdx::completion_queue& cq, const char* what, std::uint32_t iter,
                                const options& o) {
  const std::chrono::seconds timeout = o.timeout;
  rdx::completion c{};
  const std::error_code ec = next_completion(cq, c, o.events, timeout);
  if (ec == rdx::errc::timed_out)
    throw failure("round trip " + std::to_string(iter) + ": no " + what + " completion within " +
                  std::to_string(timeout.count()) + " s (has the peer stopped? see its output)");
  if (ec) throw failure(std::string("polling the ") + what + " completion queue: " + ec.message());
  if (!c.ok()) {
    char vendor[32];
    std::snprintf(vendor, sizeof vendor, "vendor error 0x%x", c.vendor_err());
    throw failure("round trip " + std::to_string(iter) + ": " + what + " failed: " + c.error().message() +
                  " (" + vendor + ")");
  }
  return c;
}

void check_recv(const rdx::completion& c, const options& o, std::uint32_t iter) {
  const std::uint32_t slot = iter % recv_slots;
  const auto it = std::to_string(iter);
  if (c.wr_id() != slot)
    throw failure("round trip " + it + ": receive completed for slot " + std::to_string(c.wr_id()) +
                  ", expected " + std::to_string(slot));
  if (o.m == mode::write_imm) {
    if (c.opcode() != IBV_WC_RECV_RDMA_WITH_IMM || !c.has_imm())
      throw failure("round trip " + it + ": expected an RDMA write with immediate, got opcode " +
                    std::to_string(c.opcode()));
    if (c.imm() != iter)
      throw failure("round trip " + it + ": immediate data " + std::to_string(c.imm()) + ", expected " + it);
  } else if (c.opcode() != IBV_WC_RECV) {
    throw failure("round trip " + it + ": expected a receive, got opcode " + std::to_string(c.opcode()));
  }
  if (c.byte_len() != o.size)
    throw failure("round trip " + it + ": " + std::to_string(c.byte_len()) + " bytes arrived, expected " +
                  std::to_string(o.size));
}

void post_echo_or_ping(resources& r, const options& o, const rdx::remote_descriptor& peer_ring,
                       const ibv_sge& src, std::uint32_t iter) {
  const std::uint32_t slot = iter % recv_slots;
  std::error_code ec;
  if (o.m == mode::write_imm) {
    ec = r.qp.post_send(rdx::wr::write_imm(src, rdx::at(peer_ring, slot * o.size), iter));
  } else {
    ec = r.qp.post_send(rdx::wr::send(src));
  }
  if (ec) throw failure("round trip " + std::to_string(iter) + ": post a send: " + ec.message());
}

void print_local(const resources& r, const char* role, const options& o) {
  const rdx::gid_choice g = o.gid_index ? rdx::use_gid_index(r.ctx, r.qp.port(), *o.gid_index)
                                        : rdx::select_gid(r.ctx, r.qp.port());
  std::printf("rdx pingpong %s: %s port %u, %s\n", role, r.ctx.name().c_str(), r.qp.port(), g.reason.c_str());
  std::printf("  local address:  %s\n", rdx::to_string(r.qp.local_endpoint()).c_str());
}

}  // namespace pingpong
