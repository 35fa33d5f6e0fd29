// rdx::cuda: GPU memory made reachable by a peer, one way or the other. The
// direct path registers the GPU memory itself; the staged path registers
// pinned bounce buffers and moves bytes through a staging pipeline. Either
// way the caller gets the same object, and path() says which it is.
#pragma once

#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/probe.hpp>
#include <rdx/cuda/register.hpp>
#include <rdx/cuda/staging.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>

#include <cstddef>
#include <optional>
#include <string>

namespace rdx::cuda {

//! GPU memory prepared for RDMA: directly registered, or staged.
class gpu_region {
public:
  //! Registers [device_ptr, device_ptr + bytes) directly unless force is
  //! staged, or registration fails and force is automatic; then sets up a
  //! staging pipeline and registers its bounce buffers instead.
  //! @throws rdx::error when force names a direct path that fails (saying
  //!         why), or when the staged path's setup fails
  [[nodiscard]] static gpu_region make(const protection_domain& pd, void* device_ptr, std::size_t bytes,
                                       access rights = access::local_write,
                                       gpu_path force = gpu_path::automatic,
                                       const staging_options& staging = {}) {
    gpu_region r;
    r.device_ptr_ = device_ptr;
    r.bytes_ = bytes;
    if (force != gpu_path::staged) {
      try {
        auto mr = register_memory(pd, device_ptr, bytes, rights, force);
        r.path_ = mr.path;
        r.region_.emplace(std::move(mr.region));
        return r;
      } catch (const rdx::error& e) {
        if (force != gpu_path::automatic) {
          throw;
        }
        r.why_staged_ = e.what();
      }
    } else {
      r.why_staged_ = "gpu_path::staged asked for";
    }
    r.path_ = gpu_path::staged;
    r.pipeline_.emplace(staging);
    r.region_.emplace(pd, r.pipeline_->bounce_buffers(), rights);
    return r;
  }

  //! dma_buf or peermem (the GPU memory is registered), or staged.
  [[nodiscard]] gpu_path path() const noexcept { return path_; }
  //! True when the GPU memory itself is registered (dma_buf or peermem), not staged.
  [[nodiscard]] bool direct() const noexcept { return path_ != gpu_path::staged; }
  //! Why the direct path was not taken ("" when it was).
  [[nodiscard]] const std::string& why_staged() const noexcept { return why_staged_; }
  //! The registered memory: the GPU memory (direct) or the bounce buffers
  //! (staged). Local work requests take their sge from it; a peer writes to
  //! its remote().
  [[nodiscard]] const memory_region& region() const noexcept { return *region_; }
  //! What a peer needs to write to region(): its address, rkey and length.
  [[nodiscard]] remote_descriptor remote() const noexcept { return region_->remote(); }
  //! The staging pipeline; nullptr on a direct path.
  [[nodiscard]] staging_pipeline* pipeline() noexcept { return pipeline_ ? &*pipeline_ : nullptr; }
  //! The GPU memory, as given to make().
  [[nodiscard]] void* device_ptr() const noexcept { return device_ptr_; }
  //! Bytes of the GPU memory, as given to make().
  [[nodiscard]] std::size_t size_bytes() const noexcept { return bytes_; }

private:
  gpu_region() = default;
  gpu_path path_ = gpu_path::automatic;
  std::string why_staged_;
  void* device_ptr_ = nullptr;
  std::size_t bytes_ = 0;
  // Declared before region_: the bounce buffers outlive their registration.
  std::optional<staging_pipeline> pipeline_;
  std::optional<memory_region> region_;
};

//! gpu_region::make over a whole device_buffer.
template <class T>
[[nodiscard]] gpu_region make_gpu_region(const protection_domain& pd, device_buffer<T>& buffer,
                                         access rights = access::local_write,
                                         gpu_path force = gpu_path::automatic,
                                         const staging_options& staging = {}) {
  return gpu_region::make(pd, static_cast<void*>(buffer.data()), buffer.size_bytes(), rights, force, staging);
}

}  // namespace rdx::cuda
