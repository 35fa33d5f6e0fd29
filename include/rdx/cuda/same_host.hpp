// rdx::cuda: GPU memory shared between two processes of one host, behind the
// window API. One process grants a range of its GPU memory (a
// shareable_buffer, exported as a POSIX file descriptor over a Unix-domain
// socket, or a device_buffer, exported as a legacy CUDA IPC handle); the other
// accepts the grant as a same_host_window and writes, reads and notifies with
// operations shaped like rdx::remote_window's: each ends exactly once with an
// error_code, and wait, co_await, deadlines and stop tokens work. Copies run on
// the importer's stream (copy engines by default, or a kernel:
// rdx/cuda/sm_copy.cuh); progress polls CUDA events and never blocks.
//
// Trust: CUDA maps whole allocations, so the importer can reach every byte of
// the exported allocation, not only the granted range. A grant is refused
// when the allocation is larger than the granted bytes rounded out to the
// allocation granularity (2 MiB on current GPUs), unless the caller allows
// more (max_exposed_bytes). A revoked grant refuses new operations, but the
// importer's mapping lives until its window goes: CUDA cannot unmap another
// process's view.
//
// Threading: a peer, its windows and grants are used by one thread at a time,
// whose current CUDA device is same_host_options::device.
#pragma once

#include <rdx/channel/window.hpp>
#include <rdx/cuda/check.hpp>
#include <rdx/cuda/detail/driver.hpp>
#include <rdx/cuda/detail/mapping_cache.hpp>
#include <rdx/cuda/detail/peer_state.hpp>
#include <rdx/cuda/detail/unix_socket.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/same_host_operation.hpp>
#include <rdx/cuda/same_host_types.hpp>
#include <rdx/cuda/same_host_window.hpp>
#include <rdx/cuda/shareable_buffer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace rdx::cuda {

//! One end of a connection between two processes of one host. Move-only; destroying it ends
//! every pending operation with errc::operation_aborted and tells the peer goodbye; windows and
//! grants made from it stay safe to use and destroy (their operations end with that error).
class same_host_peer {
public:
  same_host_peer() noexcept = default;
  //! Takes a connected AF_UNIX SOCK_SEQPACKET socket (socketpair(), or accepted) and exchanges
  //! the hello with the peer, waiting up to o.setup_timeout.
  //! @throws rdx::error (invalid_argument) for a bad option or fd; rdx::error when the peer does
  //!         not answer in time or answers wrongly; rdx::cuda::cuda_error when CUDA fails
  [[nodiscard]] static same_host_peer from_socket(int fd, const same_host_options& o = {}) {
    if (fd < 0) {
      rdx::detail::throw_rdx(errc::invalid_argument, "same_host_peer::from_socket: fd " + std::to_string(fd));
    }
    return same_host_peer(detail::unique_fd(fd), o);
  }
  //! Connects to a peer that accept()s at path ('@' first: Linux's abstract namespace).
  [[nodiscard]] static same_host_peer connect(const std::string& path, const same_host_options& o = {}) {
    return same_host_peer(detail::seqpacket_connect(path, o.setup_timeout), o);
  }
  //! Listens at path and accepts one peer.
  [[nodiscard]] static same_host_peer accept(const std::string& path, const same_host_options& o = {}) {
    const detail::unique_fd l = detail::seqpacket_listen(path);
    return same_host_peer(detail::seqpacket_accept(l.get(), o.setup_timeout), o);
  }
  //! Takes over o; o is left empty.
  same_host_peer(same_host_peer&&) noexcept = default;
  //! Revokes or closes what this holds, then takes over o.
  same_host_peer& operator=(same_host_peer&& o) noexcept {
    if (this != &o) {
      close();
      st_ = std::move(o.st_);
      grants_ = o.grants_;
    }
    return *this;
  }
  same_host_peer(const same_host_peer&) = delete;
  same_host_peer& operator=(const same_host_peer&) = delete;
  ~same_host_peer() { close(); }

  //! What this process told the peer.
  [[nodiscard]] const host_facts& local_facts() const noexcept { return st_->me(); }
  //! What the peer told this process.
  [[nodiscard]] const host_facts& peer_facts() const noexcept { return st_->peer(); }
  //! The path for the peer's GPU memory, and why (same-host, same-process or rdma).
  [[nodiscard]] transport_choice choice() const {
    return choose_transport(st_->me(), st_->peer(), memory_kind::gpu, st_->peer().device);
  }

  //! Grants the peer elements [offset, offset + count) of b, exported as a POSIX descriptor.
  //! @param max_exposed_bytes what the peer may reach at most; 0: the granted bytes rounded out to
  //!        the allocation granularity
  //! @throws rdx::error: out_of_range beyond the buffer; invalid_argument for no elements, rights
  //!         other than read and write, or an allocation that exposes more than allowed;
  //!         unsupported for a peer in this process or one that cannot see the GPU
  template <class T>
  [[nodiscard]] same_host_grant grant(const shareable_buffer<T>& b, std::size_t offset, std::size_t count,
                                      rights r, std::size_t max_exposed_bytes = 0) {
    detail::frame f = grant_frame(b.size(), offset, count, sizeof(T), r, b.device(), offset * sizeof(T),
                                  b.allocation_bytes(), b.granularity(), max_exposed_bytes);
    f.kind = detail::share_kind::vmm;
    f.serial = b.serial();
    const detail::unique_fd fd = b.export_fd();
    st_->send_setup(f, fd.get());
    return same_host_grant(st_, f.id, f.length, f.alloc_bytes);
  }
  //! Grants elements of cudaMalloc memory through a legacy CUDA IPC handle (the peer reaches the
  //! whole cudaMalloc allocation); as the other grant() otherwise.
  template <class T>
  [[nodiscard]] same_host_grant grant(const device_buffer<T>& b, std::size_t offset, std::size_t count,
                                      rights r, std::size_t max_exposed_bytes = 0) {
    if (b.data() == nullptr) {
      rdx::detail::throw_rdx(errc::invalid_argument, "same-host grant: an empty device_buffer");
    }
    device_guard g(b.device());
    CUdeviceptr base = 0;
    std::size_t bytes = 0;
    detail::check(
        detail::driver().mem_get_address_range(&base, &bytes, reinterpret_cast<CUdeviceptr>(b.data())),
        "cuMemGetAddressRange");
    const auto at = static_cast<std::size_t>(reinterpret_cast<CUdeviceptr>(b.data()) - base);
    detail::frame f = grant_frame(b.size(), offset, count, sizeof(T), r, b.device(), at + offset * sizeof(T),
                                  bytes, detail::allocation_granularity(b.device()), max_exposed_bytes);
    f.kind = detail::share_kind::legacy_ipc;
    cudaIpcMemHandle_t h{};
    RDX_CUDA_TRY(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)));
    static_assert(sizeof h == sizeof f.ipc_handle);
    std::memcpy(f.ipc_handle, &h, sizeof h);
    st_->send_setup(f, -1);
    return same_host_grant(st_, f.id, f.length, f.alloc_bytes);
  }

  //! Waits up to timeout for the peer's next grant and maps it (once per allocation per process).
  //! @throws rdx::error: timed_out; wire_format for a grant of another element size;
  //!         unsupported for a peer in this process or a GPU not visible here; the peer's failure
  template <class T>
  [[nodiscard]] same_host_window<T> accept_window(
      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::optional<detail::received_grant> got;
    st_->pump_until([&] { return (got = st_->take_grant()).has_value(); },
                    std::chrono::steady_clock::now() + timeout, "same-host accept_window");
    const detail::frame& f = got->f;
    if (f.element_size != sizeof(T)) {
      rdx::detail::throw_rdx(errc::wire_format, "same-host accept_window: the grant holds elements of " +
                                                    std::to_string(f.element_size) + " bytes, awaited as " +
                                                    std::to_string(sizeof(T)));
    }
    refuse_same_process("accept_window");
    // The memory's GPU, as this process numbers it: mapped here (the same GPU, or one reached by
    // P2P), else on that GPU with copies staged through host memory.
    const int memory = ordinal_in(st_->me().gpus, f.gpu);  // the hello listed this process's GPUs by ordinal
    if (memory < 0) {
      rdx::detail::throw_rdx(errc::unsupported, "same-host accept_window: the GPU " + to_string(f.gpu) +
                                                    " holding the memory is not visible in this process");
    }
    const int local = st_->options().device;
    int p2p = 0;
    if (memory != local) {
      RDX_CUDA_TRY(cudaDeviceCanAccessPeer(&p2p, local, memory));
    }
    same_host_window<T> w;
    w.route_ = choose_gpu_route(local, memory, p2p != 0);
    w.map_ = detail::mapping_cache::instance().get(st_->peer().process_token, f, got->fd, w.route_.map_on);
    w.st_ = st_;
    w.base_ = reinterpret_cast<T*>(w.map_->base() + f.offset);
    w.count_ = f.length / sizeof(T);
    w.rights_ = static_cast<rights>(f.rights);
    w.id_ = f.id;
    w.kind_ = f.kind;
    return w;
  }

  //! Sends a notification with tag now; the peer's receive_notification() ends with it.
  [[nodiscard]] peer_operation notify(std::uint32_t tag) noexcept {
    peer_operation op;
    st_->start_notify(op.node(), tag);
    return op;
  }
  //! Ends with the peer's next notification (one that arrived unread, at once).
  [[nodiscard]] peer_operation receive_notification() noexcept {
    peer_operation op;
    st_->start_notification(op.node());
    return op;
  }
  //! One progress pass: finished copies, frames from the peer, deadlines. Never blocks.
  //! @return operations ended
  std::size_t progress() noexcept { return st_ ? st_->progress() : 0; }
  //! Empty while the peer is usable; else why not (errc::peer_disconnected: the peer is gone).
  [[nodiscard]] std::error_code status() const noexcept {
    return st_ ? st_->usable() : make_error_code(errc::not_ready);
  }
  //! Copies started from now on use f (nullptr: cudaMemcpyAsync, the copy engines).
  void set_copier(copy_fn f) noexcept { st_->set_copier(f); }
  //! The stream this side's copies run on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return st_->stream(); }

private:
  same_host_peer(detail::unique_fd sock, const same_host_options& o)
      : st_(std::make_shared<detail::peer_state>(std::move(sock), o)) {
    st_->pump_until([&] { return st_->has_peer_facts(); }, std::chrono::steady_clock::now() + o.setup_timeout,
                    "same-host hello");
  }
  void close() noexcept {
    if (st_) {
      st_->close();
      st_.reset();
    }
  }
  void refuse_same_process(const char* what) const {
    if (st_->peer().process_token == st_->me().process_token) {
      rdx::detail::throw_rdx(errc::unsupported,
                             std::string("same-host ") + what +
                                 ": the peer is this process, and CUDA refuses to open a process's own IPC "
                                 "handles; use the device pointer directly (transport::same_process)");
    }
  }
  // The checked grant frame, or the reason it is refused, before anything is exported.
  [[nodiscard]] detail::frame grant_frame(std::size_t size, std::size_t offset, std::size_t count,
                                          std::size_t element, rights r, int device, std::size_t at,
                                          std::size_t alloc_bytes, std::size_t gran,
                                          std::size_t max_exposed) {
    if (!st_) {
      rdx::detail::throw_rdx(errc::not_ready, "same-host grant: an empty peer");
    }
    if (std::error_code ec = st_->usable()) {
      throw rdx::error(ec, "same-host grant: the peer is unusable");
    }
    if (count == 0) {
      rdx::detail::throw_rdx(errc::invalid_argument, "same-host grant of no elements");
    }
    if (offset > size || count > size - offset) {
      rdx::detail::throw_rdx(errc::out_of_range, "same-host grant of elements [" + std::to_string(offset) +
                                                     ", " + std::to_string(offset) + " + " +
                                                     std::to_string(count) + ") beyond the buffer's " +
                                                     std::to_string(size));
    }
    if (r == rights::none || has(r, rights::atomic)) {
      rdx::detail::throw_rdx(
          errc::invalid_argument,
          "same-host grant: rights must be read and/or write (no atomics between processes)");
    }
    refuse_same_process("grant");
    const std::size_t len = count * element;
    const std::size_t covered = detail::round_up(at + len, gran) - detail::round_down(at, gran);
    const std::size_t allowed = max_exposed != 0 ? max_exposed : covered;
    if (alloc_bytes > allowed) {
      rdx::detail::throw_rdx(
          errc::invalid_argument,
          "same-host grant of " + std::to_string(len) + " bytes would expose the whole allocation of " +
              std::to_string(alloc_bytes) +
              " bytes to the peer (CUDA maps whole allocations), more than the " + std::to_string(allowed) +
              " allowed" +
              (max_exposed != 0
                   ? std::string{}
                   : " (the grant rounded out to the " + std::to_string(gran) + "-byte granularity)") +
              ": allocate a buffer for this grant alone, or pass max_exposed_bytes");
    }
    const std::vector<gpu_uuid>& mine = st_->me().gpus;
    if (device < 0 || static_cast<std::size_t>(device) >= mine.size()) {
      rdx::detail::throw_rdx(
          errc::invalid_argument,
          "same-host grant: memory on CUDA device " + std::to_string(device) + ", not one this peer listed");
    }
    detail::frame f;
    f.type = detail::frame_type::grant;
    f.id = ++grants_;
    f.alloc_bytes = alloc_bytes;
    f.offset = at;
    f.length = len;
    f.rights = static_cast<std::uint32_t>(r);
    f.element_size = static_cast<std::uint32_t>(element);
    f.gpu = mine[static_cast<std::size_t>(device)];
    bool seen = false;
    for (const gpu_uuid& u : st_->peer().gpus) {
      seen = seen || u == f.gpu;
    }
    if (!seen) {
      rdx::detail::throw_rdx(errc::unsupported,
                             "same-host grant: the peer does not see GPU " + to_string(f.gpu) +
                                 " (CUDA_VISIBLE_DEVICES or a container hides it); use RDMA");
    }
    return f;
  }

  std::shared_ptr<detail::peer_state> st_;
  std::uint64_t grants_ = 0;
};

}  // namespace rdx::cuda
