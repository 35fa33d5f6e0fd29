// The network side of a staged transfer (rdx/cuda/staged_rdma.hpp) between
// two connected queue pairs of one RDMA device (natively, or rxe0 in a
// Soft-RoCE VM), driven by a host-memory pipeline in place of the GPU one:
// every byte arrives, in order, however the chunks fall. Needs no GPU.
#include <rdx/cuda/pattern.hpp>
#include <rdx/cuda/staged_rdma.hpp>
#include <rdx/cuda/staging_types.hpp>
#include <rdx/rdx.hpp>
#if RDX_TEST_SEALED
#include <rdx/auth/aes_gcm.hpp>
#endif

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

// The staging pipeline's chunking and callbacks, with memcpy for the GPU
// copies (each done when it returns): the same refill and release order as
// rdx::cuda::staging_pipeline. poll_slots: refill a slot as soon as its write
// is done (slot_done), or only when a chunk needs it (wait_slot).
class host_pipeline {
public:
  explicit host_pipeline(const rdx::cuda::staging_options& o, bool poll_slots = false)
      : opt_(o), bounce_(std::make_unique<std::byte[]>(o.chunk_bytes * o.depth)), poll_(poll_slots) {}
  [[nodiscard]] const rdx::cuda::staging_options& options() const noexcept { return opt_; }
  [[nodiscard]] std::span<std::byte> bounce_buffers() const noexcept {
    return {bounce_.get(), opt_.chunk_bytes * opt_.depth};
  }
  template <class Sink>
  rdx::cuda::transfer_stats send(const void* src, std::size_t bytes, Sink&& sink) {
    using S = std::remove_reference_t<Sink>;
    const std::size_t n = count(bytes);
    std::size_t next = 0;
    const auto fill = [&] {
      const auto c = chunk(next++, n, bytes);
      std::memcpy(c.host.data(), static_cast<const std::byte*>(src) + c.offset, c.host.size());
    };
    while (next < n && next < opt_.depth) fill();
    for (std::size_t i = 0; i < n; ++i) {
      const auto c = chunk(i, n, bytes);
      if constexpr (rdx::cuda::slot_waiter<S>) {
        if (next == i) {
          sink.wait_slot(c.slot);
          fill();
        }
      }
      sink(c);
      if constexpr (!rdx::cuda::slot_waiter<S>) {
        if (next < n) fill();
      } else if constexpr (rdx::cuda::slot_poller<S>) {
        while (poll_ && next < n && next <= i + opt_.depth && sink.slot_done(next % opt_.depth)) fill();
      }
    }
    return {rdx::cuda::gpu_path::staged, bytes, n, 0};
  }
  template <class Source>
  rdx::cuda::transfer_stats receive(void* dst, std::size_t bytes, Source&& source) {
    using S = std::remove_reference_t<Source>;
    const std::size_t n = count(bytes);
    std::size_t released = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto c = chunk(i, n, bytes);
      source(c);
      std::memcpy(static_cast<std::byte*>(dst) + c.offset, c.host.data(), c.host.size());
      if constexpr (rdx::cuda::slot_releaser<S>) {
        for (; released <= i; ++released) {
          if (released + opt_.depth < n) source.slot_released(released);
        }
      }
    }
    return {rdx::cuda::gpu_path::staged, bytes, n, 0};
  }

private:
  [[nodiscard]] std::size_t count(std::size_t bytes) const noexcept {
    const std::size_t len = rdx::cuda::chunk_for(bytes, opt_.chunk_bytes);
    return (bytes + len - 1) / len;
  }
  [[nodiscard]] rdx::cuda::staged_chunk chunk(std::size_t i, std::size_t n,
                                              std::size_t bytes) const noexcept {
    rdx::cuda::staged_chunk c;
    c.index = i;
    const std::size_t chunk_len = rdx::cuda::chunk_for(bytes, opt_.chunk_bytes);
    c.offset = i * chunk_len;
    c.slot = i % opt_.depth;
    const std::size_t len = std::min(chunk_len, bytes - c.offset);
    c.host = bounce_buffers().subspan(c.slot * opt_.chunk_bytes, len);
    c.last = i + 1 == n;
    return c;
  }
  rdx::cuda::staging_options opt_;
  std::unique_ptr<std::byte[]> bounce_;
  bool poll_;
};
static_assert(rdx::cuda::chunk_pipeline<host_pipeline>);

[[maybe_unused]] const bool device_present = [] {
  rdx::device_list list;
  if (list.empty()) {
    std::fprintf(stderr,
                 "cuda_staged_rdma_test: SKIP: no RDMA device (runs natively or in cmake/softroce/rdx-vm)\n");
    std::exit(77);
  }
  return true;
}();

// One side: a queue pair with its own completion queues, a pipeline and its
// registered bounce buffers.
struct side {
  rdx::completion_queue send_cq;
  rdx::completion_queue recv_cq;
  rdx::queue_pair qp;
  host_pipeline pipe;
  rdx::memory_region bounce;
  side(const rdx::context& ctx, const rdx::protection_domain& pd, const rdx::cuda::staging_options& o,
       bool poll_slots = false)
      : send_cq(ctx, 64),
        recv_cq(ctx, 64),
        qp(pd, send_cq, recv_cq,
           rdx::queue_pair_attr{.max_send_wr = 16,
                                .max_recv_wr = static_cast<std::uint32_t>(o.depth + 8),
                                .remote_access = rdx::access::remote_write}),
        pipe(o, poll_slots),
        bounce(pd, pipe.bounce_buffers(), rdx::access::local_write | rdx::access::remote_write) {}
};

std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  rdx::cuda::fill_pattern_host(v.data(), n, seed);
  return v;
}

}  // namespace

TEST_CASE("staged transfers arrive whole, both ways, over one queue pair", "[rdma]") {
  const std::size_t chunk = GENERATE(std::size_t{4096}, std::size_t{16384});
  const std::size_t depth = GENERATE(std::size_t{2}, std::size_t{3});
  const bool poll_slots = GENERATE(false, true);
  const rdx::cuda::staging_options opt{.chunk_bytes = chunk, .depth = depth};
  INFO("chunk " << chunk << " depth " << depth << (poll_slots ? ", slots polled" : ", slots waited for"));

  auto ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  side a(ctx, pd, opt, poll_slots);
  side b(ctx, pd, opt, poll_slots);
  a.qp.connect(b.qp.local_endpoint());
  b.qp.connect(a.qp.local_endpoint());
  rdx::cuda::staged_rdma ra(a.qp, a.send_cq, a.recv_cq, a.bounce, b.bounce.remote(), opt,
                            std::chrono::seconds(60));
  rdx::cuda::staged_rdma rb(b.qp, b.send_cq, b.recv_cq, b.bounce, a.bounce.remote(), opt,
                            std::chrono::seconds(60));
  REQUIRE(ra.receive_depth() <= depth + 8);
  ra.post_receives();
  rb.post_receives();

  // Sizes: shorter than a chunk, exactly depth chunks, and a ragged many-chunk one.
  const std::vector<std::size_t> sizes{100, chunk * depth, chunk * 9 + 123};
  std::exception_ptr b_error;
  std::vector<std::vector<std::byte>> echoed;
  std::thread peer([&] {
    try {
      for (std::size_t n : sizes) {
        std::vector<std::byte> got(n);
        const auto st = rb.receive(b.pipe, got.data(), n);
        if (st.chunks != (n + chunk - 1) / chunk) {
          throw std::runtime_error("wrong chunk count");
        }
        rb.send(b.pipe, got.data(), n);  // echo what arrived
        echoed.push_back(std::move(got));
      }
    } catch (...) {
      b_error = std::current_exception();
    }
  });
  std::exception_ptr a_error;
  std::vector<std::vector<std::byte>> back;
  std::vector<std::uint32_t> peaks;
  try {
    std::uint64_t seed = 40;
    for (std::size_t n : sizes) {
      const auto msg = pattern(n, ++seed);
      ra.send(a.pipe, msg.data(), n);
      // Pipelined: the first depth chunks' writes are all posted before the
      // first is waited for (slots polled: as many as had not completed).
      if (!poll_slots && n >= chunk * depth) peaks.push_back(ra.peak_in_flight());
      std::vector<std::byte> got(n);
      ra.receive(a.pipe, got.data(), n);
      back.push_back(std::move(got));
    }
  } catch (...) {
    a_error = std::current_exception();
  }
  peer.join();
  if (a_error) {
    std::rethrow_exception(a_error);
  }
  if (b_error) {
    std::rethrow_exception(b_error);
  }

  for (const std::uint32_t p : peaks) CHECK(p >= depth);
  CHECK(peaks.size() == (poll_slots ? 0u : 2u));
  REQUIRE(echoed.size() == sizes.size());
  REQUIRE(back.size() == sizes.size());
  std::uint64_t seed = 40;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    ++seed;
    INFO("message " << k << " of " << sizes[k] << " bytes");
    REQUIRE(rdx::cuda::check_pattern_host(echoed[k].data(), sizes[k], seed).ok());
    REQUIRE(rdx::cuda::check_pattern_host(back[k].data(), sizes[k], seed).ok());
  }
}

TEST_CASE("staged_rdma refuses mismatched pipelines and short peer buffers", "[rdma]") {
  const rdx::cuda::staging_options opt{.chunk_bytes = 4096, .depth = 2};
  auto ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  side a(ctx, pd, opt);
  auto peer = a.bounce.remote();
  peer.length = 4096;  // one chunk where two are needed
  REQUIRE_THROWS_AS(rdx::cuda::staged_rdma(a.qp, a.send_cq, a.recv_cq, a.bounce, peer, opt), rdx::error);

  rdx::cuda::staged_rdma r(a.qp, a.send_cq, a.recv_cq, a.bounce, a.bounce.remote(), opt);
  host_pipeline other({.chunk_bytes = 8192, .depth = 2});
  std::vector<std::byte> buf(100);
  REQUIRE_THROWS_WITH(r.send(other, buf.data(), buf.size()), Catch::Contains("chunk size or depth"));
  host_pipeline same_shape(opt);  // right shape, but not the registered bounce buffers
  REQUIRE_THROWS_WITH(r.send(same_shape, buf.data(), buf.size()), Catch::Contains("not the pipeline's"));
}

TEST_CASE("a receiver that never hands a slot back ends the send in time, and the object after it",
          "[rdma]") {
  const rdx::cuda::staging_options opt{.chunk_bytes = 4096, .depth = 2};
  auto ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  side a(ctx, pd, opt);
  side b(ctx, pd, opt);
  a.qp.connect(b.qp.local_endpoint());
  b.qp.connect(a.qp.local_endpoint());
  rdx::cuda::staged_rdma ra(a.qp, a.send_cq, a.recv_cq, a.bounce, b.bounce.remote(), opt,
                            std::chrono::seconds(1));
  rdx::cuda::staged_rdma rb(b.qp, b.send_cq, b.recv_cq, b.bounce, a.bounce.remote(), opt);
  ra.post_receives();
  rb.post_receives();  // b takes the writes but never runs receive(): no slot comes back
  const auto msg = pattern(5 * 4096, 7);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(ra.send(a.pipe, msg.data(), msg.size()),
                      Catch::Contains("slot credit for chunk 2") && Catch::Contains("no completion in time"));
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took >= std::chrono::milliseconds(900));
  CHECK(took < std::chrono::seconds(5));
  CHECK(ra.peak_in_flight() >= 2);  // chunks 0 and 1 were both in flight before the wait
  // The protocol state is lost: the object refuses further transfers, naming why.
  REQUIRE_THROWS_WITH(ra.send(a.pipe, msg.data(), msg.size()), Catch::Contains("an earlier transfer"));
  std::vector<std::byte> got(msg.size());
  REQUIRE_THROWS_WITH(ra.receive(a.pipe, got.data(), got.size()), Catch::Contains("an earlier transfer"));
  // The two writes that went out landed whole in b's bounce slots.
  REQUIRE(std::memcmp(b.pipe.bounce_buffers().data(), msg.data(), 2 * 4096) == 0);
}

#if RDX_TEST_SEALED
namespace {

// Window keys of one side of a made-up set-up with secret seed s.
std::unique_ptr<rdx::auth::aes_gcm_seal> staged_seal_for(unsigned char s, bool first) {
  std::array<std::byte, 32> secret{}, d1{}, d2{};
  std::array<std::byte, 40> h1{}, h2{};
  for (std::size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<std::byte>(s + i);
  h1.fill(std::byte{1});
  h2.fill(std::byte{2});
  d1.fill(std::byte{0x11});
  d2.fill(std::byte{0x22});
  const auto keys = first ? rdx::auth::derive_session_keys(secret, h1, h2, d1, d2)
                          : rdx::auth::derive_session_keys(secret, h2, h1, d1, d2);
  return std::make_unique<rdx::auth::aes_gcm_seal>(keys, rdx::auth::seal_lane::windows);
}

// A side's sealed slots: depth * (chunk + 24) bytes, remote-writable.
struct sealed_slots {
  std::vector<std::byte> mem;
  rdx::memory_region mr;
  sealed_slots(const rdx::protection_domain& pd, const rdx::cuda::staging_options& o)
      : mem((o.chunk_bytes + rdx::sealed_message_overhead) * o.depth),
        mr(pd, std::span(mem), rdx::access::local_write | rdx::access::remote_write) {}
};

}  // namespace

TEST_CASE("sealed staged transfers arrive whole; a chunk sealed with another key is never delivered",
          "[crypt]") {
  const rdx::cuda::staging_options opt{.chunk_bytes = 4096, .depth = 3};
  auto ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  side a(ctx, pd, opt);
  side b(ctx, pd, opt);
  sealed_slots sa(pd, opt), sb(pd, opt);
  a.qp.connect(b.qp.local_endpoint());
  b.qp.connect(a.qp.local_endpoint());
  const bool foreign = GENERATE(false, true);
  INFO((foreign ? "a seals with another key" : "both sides share the keys"));
  auto seal_a = staged_seal_for(foreign ? 9 : 5, true);
  auto seal_b = staged_seal_for(5, false);
  // a waits for an echo that a refusing b never sends: not long.
  const auto limit = foreign ? std::chrono::seconds(2) : std::chrono::seconds(10);
  rdx::cuda::staged_rdma ra(a.qp, a.send_cq, a.recv_cq, a.bounce, b.bounce.remote(), opt, limit,
                            {.seal = seal_a.get(), .local = &sa.mr, .peer = sb.mr.remote()});
  rdx::cuda::staged_rdma rb(b.qp, b.send_cq, b.recv_cq, b.bounce, a.bounce.remote(), opt, limit,
                            {.seal = seal_b.get(), .local = &sb.mr, .peer = sa.mr.remote()});
  ra.post_receives();
  rb.post_receives();
  const std::vector<std::size_t> sizes{100, 4096 * 3, 4096 * 9 + 123};
  std::string b_error;
  std::vector<std::vector<std::byte>> got_b;
  std::thread peer([&] {
    try {
      for (std::size_t n : sizes) {
        got_b.emplace_back(n, std::byte{0xee});
        rb.receive(b.pipe, got_b.back().data(), n);
        rb.send(b.pipe, got_b.back().data(), n);  // echo, sealed by b
      }
    } catch (const rdx::error& e) {
      CHECK(e.code() == rdx::errc::integrity_failed);
      b_error = e.what();
    }
  });
  std::uint64_t seed = 70;
  std::vector<std::vector<std::byte>> back;
  try {
    for (std::size_t n : sizes) {
      const auto msg = pattern(n, ++seed);
      ra.send(a.pipe, msg.data(), n);
      back.emplace_back(n);
      ra.receive(a.pipe, back.back().data(), n);
    }
  } catch (const rdx::error& e) {
    CHECK(foreign);  // a sees its peer stop answering
  }
  peer.join();
  if (!foreign) {
    CHECK(b_error.empty());
    REQUIRE(back.size() == sizes.size());
    seed = 70;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      ++seed;
      REQUIRE(rdx::cuda::check_pattern_host(got_b[k].data(), sizes[k], seed).ok());
      REQUIRE(rdx::cuda::check_pattern_host(back[k].data(), sizes[k], seed).ok());
    }
    // What crossed the wire into b's sealed slots is ciphertext.
    CHECK(std::memcmp(sb.mem.data() + rdx::sealed_payload_offset, pattern(4096, seed).data(), 64) != 0);
  } else {
    INFO(b_error);
    CHECK(b_error.find("chunk 0: ") != std::string::npos);
    CHECK(b_error.find("authentication tag") != std::string::npos);
    // Nothing of the refused chunk reached the receiver's memory.
    REQUIRE(got_b.size() == 1);
    CHECK(std::all_of(got_b[0].begin(), got_b[0].end(), [](std::byte c) { return c == std::byte{0xee}; }));
  }
}

TEST_CASE("a sealed staged transfer refuses sealed slots that are too small", "[crypt]") {
  const rdx::cuda::staging_options opt{.chunk_bytes = 4096, .depth = 2};
  auto ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  side a(ctx, pd, opt);
  sealed_slots sa(pd, opt);
  auto seal = staged_seal_for(5, true);
  auto short_peer = sa.mr.remote();
  short_peer.length = 2 * 4096;  // the chunks, without their 24 bytes each
  REQUIRE_THROWS_WITH(rdx::cuda::staged_rdma(a.qp, a.send_cq, a.recv_cq, a.bounce, a.bounce.remote(), opt,
                                             std::chrono::seconds(1),
                                             {.seal = seal.get(), .local = &sa.mr, .peer = short_peer}),
                      Catch::Contains("depth * (chunk + 24) = 8240 bytes"));
  REQUIRE_THROWS_AS(rdx::cuda::staged_rdma(a.qp, a.send_cq, a.recv_cq, a.bounce, a.bounce.remote(), opt,
                                           std::chrono::seconds(1), {.seal = seal.get()}),
                    rdx::error);
}
#endif
