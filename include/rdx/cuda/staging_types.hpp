// rdx::cuda: the vocabulary of host-staged transfers (options, chunks,
// statistics and the callables a pipeline drives), without CUDA, so that the
// network side can be written and tested on machines without a GPU.
#pragma once

#include <rdx/cuda/path.hpp>

#include <concepts>
#include <cstddef>
#include <span>

namespace rdx::cuda {

//! Chunking and buffering of a staging pipeline.
struct staging_options {
  //! Bytes of each bounce buffer (a multiple of 4 KiB): the largest chunk. A transfer's chunks are
  //! chunk_for(bytes): 4 MiB up to 32 MiB transfers (their latency as before), growing to
  //! chunk_bytes from 128 MiB, where fewer, larger chunks bring the pipeline within 1% of one
  //! cudaMemcpy.
  std::size_t chunk_bytes = std::size_t{16} << 20;
  std::size_t depth = 2;  //!< bounce buffers; at least 2
  int device = -1;        //!< CUDA device; -1: the current one
};

//! The chunk length of a transfer of bytes with bounce buffers of chunk_bytes: an eighth of the
//! transfer (4 KiB aligned), at least 4 MiB and at most chunk_bytes. Both ends of a staged
//! transfer compute it from the same numbers, so they agree without saying so.
[[nodiscard]] constexpr std::size_t chunk_for(std::size_t bytes, std::size_t chunk_bytes) noexcept {
  constexpr std::size_t floor = std::size_t{4} << 20;
  const std::size_t eighth = (bytes / 8 + 4095) / 4096 * 4096;
  const std::size_t want = eighth > floor ? eighth : floor;
  return want < chunk_bytes ? want : chunk_bytes;
}
static_assert(chunk_for(std::size_t{1} << 20, std::size_t{16} << 20) == std::size_t{4} << 20);
static_assert(chunk_for(std::size_t{32} << 20, std::size_t{16} << 20) == std::size_t{4} << 20);
static_assert(chunk_for(std::size_t{64} << 20, std::size_t{16} << 20) == std::size_t{8} << 20);
static_assert(chunk_for(std::size_t{1} << 30, std::size_t{16} << 20) == std::size_t{16} << 20);
static_assert(chunk_for(std::size_t{1} << 30, std::size_t{1} << 20) == std::size_t{1} << 20);

//! One chunk sitting in a bounce buffer.
struct staged_chunk {
  std::size_t index = 0;      //!< chunk number in the transfer, from 0
  std::size_t offset = 0;     //!< byte offset of the chunk in the transfer
  std::size_t slot = 0;       //!< bounce buffer number (0 .. depth-1)
  std::span<std::byte> host;  //!< the chunk's bytes in the bounce buffer
  bool last = false;          //!< the transfer's final chunk
};

//! What a transfer did, for the caller and for logs.
struct transfer_stats {
  gpu_path path = gpu_path::staged;  //!< the path the bytes took
  std::size_t bytes = 0;             //!< bytes transferred
  std::size_t chunks = 0;            //!< chunks they went in
  double seconds = 0;                //!< wall time of the transfer
  //! bytes / seconds in GB/s (10^9 bytes a second); 0 when no time was measured.
  [[nodiscard]] double gb_per_s() const noexcept {
    return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
  }
};

//! Called once per chunk, in order, once its bytes are in host memory (the
//! sender's RDMA write of the chunk goes here). When it returns, the slot may
//! be refilled, unless the callable also has wait_slot (see below).
template <class F>
concept chunk_sink = std::invocable<F&, const staged_chunk&>;

//! Called once per chunk, in order, to fill its host bytes (the receiver
//! waits for the chunk's RDMA write to land here); the chunk is copied to the
//! GPU when it returns.
template <class F>
concept chunk_source = std::invocable<F&, const staged_chunk&>;

//! A sink that lets its RDMA writes run on after it returns names
//! wait_slot(slot): the pipeline calls it before refilling that bounce buffer,
//! and refills a slot only when a chunk needs it, so that up to depth writes
//! are in flight while the next copy runs.
template <class F>
concept slot_waiter = requires(F& f, std::size_t slot) {
  f.wait_slot(slot);
};

//! A slot_waiter that can also say, without waiting, whether the write from a
//! slot has completed (slot_done(slot)): the pipeline then refills each slot as
//! soon as it is free, so copies overlap the writes in flight too.
template <class F>
concept slot_poller = slot_waiter<F> && requires(F& f, std::size_t slot) {
  { f.slot_done(slot) } -> std::convertible_to<bool>;
};

//! A source that hands bounce slots back to the sender itself names
//! slot_released(k): the pipeline calls it, in order, as soon as chunk k's copy
//! to the GPU has finished and its slot may take chunk k + depth (only for
//! chunks that have one), before it asks for chunk k + depth.
template <class F>
concept slot_releaser = requires(F& f, std::size_t chunk_index) {
  f.slot_released(chunk_index);
};

//! What the network side needs of a staging pipeline: its options, its
//! bounce buffers, and chunked send and receive driven by callables.
//! rdx::cuda::staging_pipeline is one; a test can supply a host-memory one.
template <class P>
concept chunk_pipeline = requires(P& p, const P& cp, const void* src, void* dst, std::size_t n,
                                  void (*f)(const staged_chunk&)) {
  { cp.options() } -> std::convertible_to<const staging_options&>;
  { cp.bounce_buffers() } -> std::convertible_to<std::span<std::byte>>;
  { p.send(src, n, f) } -> std::convertible_to<transfer_stats>;
  { p.receive(dst, n, f) } -> std::convertible_to<transfer_stats>;
};

}  // namespace rdx::cuda
