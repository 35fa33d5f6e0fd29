// rdx::cuda internals: what a same-host peer owns, made and checked at its
// construction: the options, its socket, the facts of both sides (this
// process's sent in its hello), its copy stream and a fixed ring of CUDA
// events (one per copy in flight), the ring of notifications arrived unread,
// the grants received and the ids revoked. peer_state.hpp drives operations
// over them.
#pragma once

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/detail/mapping_cache.hpp>
#include <rdx/cuda/detail/op_node.hpp>
#include <rdx/cuda/detail/unix_socket.hpp>
#include <rdx/cuda/device_select.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/same_host_types.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <unistd.h>

namespace rdx::cuda {

//! A copy of bytes from src to dst queued on stream s (device pointers of this process); returns
//! its launch status. rdx/cuda/sm_copy.cuh's sm_copy copies with a kernel.
using copy_fn = cudaError_t (*)(void* dst, const void* src, std::size_t bytes, cudaStream_t s) noexcept;

//! Settings of a same-host peer.
struct same_host_options {
  int device = -1;            //!< the CUDA device that runs this side's copies; -1: the current one
  std::uint32_t depth = 128;  //!< copies in flight at most (one CUDA event each)
  copy_fn copier = nullptr;   //!< nullptr: cudaMemcpyAsync (the copy engines); else e.g. sm_copy
  std::uint32_t max_unread_notifications = 4096;   //!< more arrived and unread fail the peer
  std::chrono::milliseconds setup_timeout{10000};  //!< bound of each set-up wait
};

namespace detail {

struct received_grant {
  frame f;
  unique_fd fd;
};

class peer_resources {
public:
  //! Takes a connected socket, makes the stream and events, says hello. Throws before anything
  //! is left behind.
  peer_resources(unique_fd sock, const same_host_options& o) : sock_(std::move(sock)), opt_(o) {
    if (opt_.depth == 0 || opt_.depth > 65536) {
      rdx::detail::throw_rdx(errc::invalid_argument,
                             "same_host_options::depth " + std::to_string(opt_.depth) + " (1 to 65536)");
    }
    if (opt_.max_unread_notifications == 0) {
      rdx::detail::throw_rdx(errc::invalid_argument, "same_host_options::max_unread_notifications 0");
    }
    opt_.device = o.device < 0 ? current_device() : o.device;
    if (opt_.device >= device_count()) {
      rdx::detail::throw_rdx(errc::invalid_argument,
                             "same_host_options::device " + std::to_string(opt_.device) +
                                 ": this process sees " + std::to_string(device_count()) + " CUDA devices");
    }
    device_guard g(opt_.device);
    stream_.emplace();
    events_.reserve(opt_.depth);
    slots_.resize(opt_.depth);
    for (auto& s : slots_) {
      s.ev = events_.emplace_back().native_handle();
    }
    arrived_.resize(opt_.max_unread_notifications);
    me_.boot_id = read_boot_id();
    me_.pid = static_cast<std::int64_t>(::getpid());
    me_.process_token = process_token();
    me_.gpus = visible_gpus();
    if (me_.gpus.size() > max_frame_gpus) {
      me_.gpus.resize(max_frame_gpus);  // the hello frame's room
    }
    me_.device = static_cast<std::uint32_t>(opt_.device);
    const frame h = hello_frame(me_);
    if (const int e = send_frame(sock_.get(), &h, sizeof h); e != 0) {
      errno = e;
      throw_errno("sendmsg", "(hello to the same-host peer)");
    }
  }
  peer_resources(const peer_resources&) = delete;
  peer_resources& operator=(const peer_resources&) = delete;
  //! Lets every queued copy finish before the events and the stream go.
  ~peer_resources() {
    if (stream_) {
      check_noexcept(cudaStreamSynchronize(stream_->native_handle()), "cudaStreamSynchronize");
    }
  }

  [[nodiscard]] const same_host_options& options() const noexcept { return opt_; }
  void set_copier(copy_fn f) noexcept { opt_.copier = f; }
  [[nodiscard]] const host_facts& me() const noexcept { return me_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_->native_handle(); }
  [[nodiscard]] int socket() const noexcept { return sock_.get(); }
  [[nodiscard]] bool has_peer_facts() const noexcept { return peer_.has_value(); }
  [[nodiscard]] const host_facts& peer() const noexcept { return *peer_; }
  //! Empty while operations may start; else why not.
  [[nodiscard]] std::error_code usable() const noexcept {
    if (closed_) {
      return make_error_code(errc::operation_aborted);
    }
    if (failure_) {
      return failure_;
    }
    return {};
  }
  [[nodiscard]] bool revoked(std::uint64_t id) const noexcept {
    return std::find(revoked_.begin(), revoked_.end(), id) != revoked_.end();
  }
  [[nodiscard]] std::optional<received_grant> take_grant() {
    if (grants_.empty()) {
      return std::nullopt;
    }
    received_grant g = std::move(grants_.front());
    grants_.pop_front();
    return g;
  }
  //! Waits for the copies that read or write m (a window going away) to finish.
  void drain(const mapping* m) noexcept {
    for (std::size_t k = 0; k < count_; ++k) {
      if (slots_[(head_ + k) % slots_.size()].map == m) {
        check_noexcept(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (window teardown)");
        return;
      }
    }
  }

protected:
  struct slot {
    cudaEvent_t ev = nullptr;
    op_node* op = nullptr;
    const mapping* map = nullptr;
    std::uint64_t grant = 0;
    std::uint32_t tag = 0;
    bool notify = false;
  };

  [[noreturn]] static void throw_failure(std::error_code ec, const char* what) {
    throw rdx::error(ec, std::string(what) + ": the peer is unusable (" + ec.message() + ")");
  }

  unique_fd sock_;
  same_host_options opt_;
  host_facts me_;
  std::optional<host_facts> peer_;
  std::optional<cuda::stream> stream_;
  std::vector<event> events_;  // declared after stream_: destroyed before it
  std::vector<slot> slots_;
  std::size_t head_ = 0, count_ = 0;
  std::vector<std::uint32_t> arrived_;
  std::size_t first_unread_ = 0, unread_ = 0;
  std::deque<received_grant> grants_;
  std::vector<std::uint64_t> revoked_;
  std::error_code failure_;
  bool closed_ = false;
};

}  // namespace detail
}  // namespace rdx::cuda
