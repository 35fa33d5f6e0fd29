// rdx::cuda: the GPU halves of a host-staged transfer. Where GPU memory
// cannot be registered with the RDMA device, bytes travel through pinned host
// bounce buffers in chunks: device to host on the sender, host to device on
// the receiver, each chunk's copy overlapped with the network work of its
// neighbours.
//
// The network side stays abstract: the sender hands each chunk that has
// reached host memory to a callable (which posts the RDMA write, say), and
// the receiver asks a callable to fill each chunk (waiting for it to land)
// before copying it to the GPU.
#pragma once

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/staging_types.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace rdx::cuda {

//! Pinned bounce buffers, a dedicated stream and one event per buffer.
class staging_pipeline {
public:
  //! @throws rdx::error (invalid_argument) for a chunk size that is zero or
  //!         not a multiple of 4 KiB, or a depth under 2
  //! @throws rdx::cuda::cuda_error when pinned memory, stream or events fail
  explicit staging_pipeline(const staging_options& o = {})
      : opt_(validated(o)), bounce_(opt_.chunk_bytes * opt_.depth), stream_(make_stream(opt_.device)) {
    device_guard g(opt_.device);
    events_.reserve(opt_.depth);
    for (std::size_t i = 0; i < opt_.depth; ++i) {
      events_.emplace_back();
    }
  }

  static constexpr std::size_t chunk_alignment = 4096;  //!< chunk_bytes must be a multiple of it

  //! The options it was made with; a device of -1 is replaced by the device it uses.
  [[nodiscard]] const staging_options& options() const noexcept { return opt_; }
  //! Always gpu_path::staged: the path a transfer through this pipeline takes.
  [[nodiscard]] static constexpr gpu_path path() noexcept { return gpu_path::staged; }
  //! All bounce buffers, one contiguous pinned range: register it once with
  //! the RDMA device; slot k starts at k * chunk_bytes.
  [[nodiscard]] std::span<std::byte> bounce_buffers() const noexcept { return bounce_.span(); }
  //! The dedicated copy stream.
  [[nodiscard]] const cuda::stream& copy_stream() const noexcept { return stream_; }

  //! Sender half: copies device bytes [src, src + bytes) to host chunk by
  //! chunk, handing each to sink as soon as it is there, while the next
  //! chunks' copies run. A slot_waiter sink's writes run on after it returns:
  //! a slot is refilled only when a chunk needs it (after wait_slot), or, with
  //! a slot_poller, as soon as slot_done says its write has completed.
  //! @throws rdx::cuda::cuda_error for a failed copy; whatever sink throws
  template <chunk_sink Sink>
  transfer_stats send(const void* device_src, std::size_t bytes, Sink&& sink) {
    using S = std::remove_reference_t<Sink>;
    device_guard g(opt_.device);
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t n = chunk_count(bytes);
    const auto* src = static_cast<const std::byte*>(device_src);
    std::size_t next = 0;  // the next chunk whose copy to host is not enqueued yet
    const auto enqueue = [&] {
      const staged_chunk c = chunk(next++, n, bytes);
      RDX_CUDA_TRY(cudaMemcpyAsync(c.host.data(), src + c.offset, c.host.size(), cudaMemcpyDeviceToHost,
                                   stream_.native_handle()));
      events_[c.slot].record(stream_);
    };
    while (next < n && next < opt_.depth) {
      enqueue();
    }
    for (std::size_t i = 0; i < n; ++i) {
      const staged_chunk c = chunk(i, n, bytes);
      if constexpr (slot_waiter<S>) {
        if (next == i) {  // its slot still holds chunk i - depth's write
          sink.wait_slot(c.slot);
          enqueue();
        }
      }
      events_[c.slot].synchronize();
      sink(c);
      if constexpr (!slot_waiter<S>) {
        if (next < n) {
          enqueue();  // the sink is done with the slot: chunk i + depth goes in
        }
      } else if constexpr (slot_poller<S>) {
        // Only slots whose chunk has gone to the sink (chunk next - depth <= i):
        // a slot further on holds a chunk not yet written.
        while (next < n && next <= i + opt_.depth && sink.slot_done(next % opt_.depth)) {
          enqueue();
        }
      }
    }
    return finish(bytes, n, t0);
  }

  //! Receiver half: for each chunk, has source fill its bounce buffer, then
  //! copies it to device bytes [dst, dst + bytes) while the next chunks land.
  //! A slot_releaser source is told as soon as each copy has finished (its
  //! slot may take the chunk depth later). Returns once every byte is in
  //! device memory.
  template <chunk_source Source>
  transfer_stats receive(void* device_dst, std::size_t bytes, Source&& source) {
    using S = std::remove_reference_t<Source>;
    device_guard g(opt_.device);
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t n = chunk_count(bytes);
    auto* dst = static_cast<std::byte*>(device_dst);
    std::size_t released = 0;  // chunks whose slot has gone back (slot_releaser)
    const auto release = [&] {
      if constexpr (slot_releaser<S>) {
        if (released + opt_.depth < n) {
          source.slot_released(released);
        }
      }
      ++released;
    };
    for (std::size_t i = 0; i < n; ++i) {
      const staged_chunk c = chunk(i, n, bytes);
      // The copy that last read this slot must be done before it is refilled.
      if (i >= opt_.depth) {
        if constexpr (slot_releaser<S>) {
          while (released + opt_.depth <= i) {
            events_[released % opt_.depth].synchronize();
            release();
          }
        } else {
          events_[c.slot].synchronize();
        }
      }
      source(c);
      RDX_CUDA_TRY(cudaMemcpyAsync(dst + c.offset, c.host.data(), c.host.size(), cudaMemcpyHostToDevice,
                                   stream_.native_handle()));
      events_[c.slot].record(stream_);
      if constexpr (slot_releaser<S>) {
        while (released <= i && events_[released % opt_.depth].ready()) {
          release();
        }
      }
    }
    stream_.synchronize();
    return finish(bytes, n, t0);
  }

  //! Number of chunks a transfer of bytes takes.
  [[nodiscard]] std::size_t chunk_count(std::size_t bytes) const noexcept {
    const std::size_t len = chunk_for(bytes, opt_.chunk_bytes);
    return (bytes + len - 1) / len;
  }

private:
  static staging_options validated(staging_options o) {
    if (o.chunk_bytes == 0 || o.chunk_bytes % chunk_alignment != 0) {
      rdx::detail::throw_rdx(errc::invalid_argument, "staging_pipeline: chunk_bytes " +
                                                         std::to_string(o.chunk_bytes) +
                                                         " is not a non-zero multiple of 4096");
    }
    if (o.depth < 2) {
      rdx::detail::throw_rdx(errc::invalid_argument, "staging_pipeline: depth " + std::to_string(o.depth) +
                                                         " (at least 2 bounce buffers)");
    }
    if (o.device < 0) {
      o.device = current_device();
    }
    return o;
  }
  static cuda::stream make_stream(int device) {
    device_guard g(device);
    return cuda::stream();
  }
  [[nodiscard]] staged_chunk chunk(std::size_t i, std::size_t n, std::size_t bytes) const noexcept {
    staged_chunk c;
    c.index = i;
    const std::size_t chunk_len = chunk_for(bytes, opt_.chunk_bytes);
    c.offset = i * chunk_len;
    c.slot = i % opt_.depth;
    const std::size_t len = (bytes - c.offset < chunk_len) ? bytes - c.offset : chunk_len;
    c.host = bounce_.span().subspan(c.slot * opt_.chunk_bytes, len);
    c.last = (i + 1 == n);
    return c;
  }
  [[nodiscard]] static transfer_stats finish(std::size_t bytes, std::size_t n,
                                             std::chrono::steady_clock::time_point t0) noexcept {
    transfer_stats s;
    s.bytes = bytes;
    s.chunks = n;
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s;
  }

  staging_options opt_;
  pinned_buffer<std::byte> bounce_;
  cuda::stream stream_;
  std::vector<event> events_;
};

static_assert(chunk_pipeline<staging_pipeline>);

}  // namespace rdx::cuda
