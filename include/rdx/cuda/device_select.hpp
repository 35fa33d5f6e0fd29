// rdx::cuda: a GPU named the way people name it. CUDA's ordinals depend on
// CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, and differ from nvidia-smi's;
// a GPU's UUID ("GPU-8f6c...", `nvidia-smi -L`) is the same in every process
// of a host. These map one to the other for a process, and a command line's
// --gpu (an ordinal or a UUID) to the ordinal to use.
#pragma once

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/same_host_types.hpp>
#include <rdx/error.hpp>

#include <cuda_runtime_api.h>

#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rdx::cuda {

//! The UUID of every GPU this process sees, by CUDA ordinal (empty without a GPU).
//! @throws rdx::cuda::cuda_error when CUDA fails to describe a device it counted
[[nodiscard]] inline std::vector<gpu_uuid> visible_gpus() {
  std::vector<gpu_uuid> out;
  const int n = device_count();
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    RDX_CUDA_TRY(cudaGetDeviceProperties(&p, d));
    gpu_uuid u{};
    std::memcpy(u.data(), &p.uuid, u.size());
    out.push_back(u);
  }
  return out;
}

//! The CUDA ordinal of the GPU whose UUID is u, in this process.
//! @throws rdx::error (errc::invalid_argument) naming every GPU this process sees when none is u
[[nodiscard]] inline int device_of(const gpu_uuid& u) {
  const std::vector<gpu_uuid> gpus = visible_gpus();
  if (const int d = ordinal_in(gpus, u); d >= 0) {
    return d;
  }
  std::string seen;
  for (std::size_t d = 0; d < gpus.size(); ++d) {
    seen += (d == 0 ? "" : ", ") + std::to_string(d) + " " + to_string(gpus[d]);
  }
  rdx::detail::throw_rdx(errc::invalid_argument, "no GPU " + to_string(u) + " in this process (it sees " +
                                                     (gpus.empty() ? "none: " + no_device_reason() : seen) +
                                                     "; CUDA_VISIBLE_DEVICES or a container may hide it)");
}

//! The CUDA ordinal a command line names: an ordinal ("0") or a UUID as `nvidia-smi -L` prints it.
//! @throws rdx::error (errc::invalid_argument) for other text, an ordinal this process does not
//!         see, or a UUID no GPU here has (device_of() says which it sees)
[[nodiscard]] inline int select_device(std::string_view spec) {
  if (const std::optional<gpu_uuid> u = parse_gpu_uuid(spec)) {
    return device_of(*u);
  }
  const bool digits =
      !spec.empty() && spec.size() <= 4 && spec.find_first_not_of("0123456789") == std::string_view::npos;
  if (!digits) {
    rdx::detail::throw_rdx(errc::invalid_argument,
                           "GPU '" + std::string(spec) +
                               "': give a CUDA ordinal (0, 1, ...) or a UUID as nvidia-smi -L prints it "
                               "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)");
  }
  const int d = std::stoi(std::string(spec));
  const int n = device_count();
  if (d >= n) {
    rdx::detail::throw_rdx(errc::invalid_argument, "GPU " + std::to_string(d) + ": this process sees " +
                                                       std::to_string(n) + " GPU(s)" +
                                                       (n == 0 ? " (" + no_device_reason() + ")" : ""));
  }
  return d;
}

}  // namespace rdx::cuda
