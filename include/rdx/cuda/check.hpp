// rdx::cuda: the one check every CUDA call goes through. It keeps the call's
// name and status, clears CUDA's last error, and throws rdx::cuda::cuda_error
// (an rdx::error) whose code is in the "cuda" or "cuda driver" category.
#pragma once

//! \file
//! RDX_CUDA_TRY, the check every CUDA call goes through; cuda_error and the CUDA error categories.

#include <rdx/cuda/config.hpp>

#if !RDX_HAS_CUDA()
#error "rdx/cuda/check.hpp needs the CUDA Toolkit: link the rdx::cuda target (it defines RDX_WITH_CUDA=1)"
#endif

#include <rdx/error.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <system_error>

//! GPU memory for RDMA: CUDA buffers, GPUDirect registration, host staging and topology (target
//! rdx::cuda).
namespace rdx::cuda {

namespace detail {
//! Errors after which the CUDA context is unusable until the process exits.
constexpr bool is_sticky(cudaError_t s) noexcept {
  switch (s) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable: return true;
    default: return false;
  }
}

class runtime_category_impl final : public std::error_category {
public:
  const char* name() const noexcept override { return "cuda"; }
  std::string message(int ev) const override {
    const auto s = static_cast<cudaError_t>(ev);
    std::string m = cudaGetErrorName(s);
    m += ": ";
    m += cudaGetErrorString(s);
    if (is_sticky(s)) {
      m += " (sticky: this process's CUDA context is unusable from now on)";
    }
    return m;
  }
};

// The driver's own strings need libcuda, which rdx never links directly (so
// that programs start, and skip, where no driver is installed); the common
// codes of the calls rdx makes are named here.
class driver_category_impl final : public std::error_category {
public:
  const char* name() const noexcept override { return "cuda driver"; }
  std::string message(int ev) const override {
    switch (static_cast<CUresult>(ev)) {
      case CUDA_SUCCESS: return "CUDA_SUCCESS";
      case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE: invalid argument";
      case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY: out of memory";
      case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED: driver not initialized";
      case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED: driver shutting down";
      case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE: no CUDA-capable device";
      case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE: invalid device ordinal";
      case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT: no current context";
      case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND: named symbol not found";
      case CUDA_ERROR_NOT_SUPPORTED:
        return "CUDA_ERROR_NOT_SUPPORTED: operation not supported on this device or driver";
      case CUDA_ERROR_NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED: operation not permitted";
      case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
      default: return "CUresult " + std::to_string(ev);
    }
  }
};
}  // namespace detail

//! Category of CUDA runtime statuses (cudaError_t).
inline const std::error_category& runtime_category() noexcept {
  static const detail::runtime_category_impl c;
  return c;
}
//! Category of CUDA driver statuses (CUresult).
inline const std::error_category& driver_category() noexcept {
  static const detail::driver_category_impl c;
  return c;
}
//! A CUDA runtime status as an error code of runtime_category() (cudaSuccess: empty).
[[nodiscard]] inline std::error_code make_error_code(cudaError_t s) noexcept {
  return s == cudaSuccess ? std::error_code{} : std::error_code{static_cast<int>(s), runtime_category()};
}
//! A CUDA driver status as an error code of driver_category() (CUDA_SUCCESS: empty).
[[nodiscard]] inline std::error_code make_error_code(CUresult s) noexcept {
  return s == CUDA_SUCCESS ? std::error_code{} : std::error_code{static_cast<int>(s), driver_category()};
}

//! A failed CUDA call: the status (code()) and the call's text (call()).
class cuda_error : public rdx::error {
public:
  //! The status ec of call; what() is "call on object" (object may be empty).
  cuda_error(std::error_code ec, std::string call, std::string_view object)
      : rdx::error(ec, describe(call, object)), call_(std::move(call)) {}
  //! The call as written at the check site, e.g. "cudaMalloc(&p, bytes)".
  [[nodiscard]] const std::string& call() const noexcept { return call_; }

private:
  static std::string describe(std::string_view call, std::string_view object) {
    std::string w(call);
    if (!object.empty()) {
      w += " on ";
      w += object;
    }
    return w;
  }
  std::string call_;
};

namespace detail {
//! Throws cuda_error for a failed runtime call, after clearing the last error
//! so that the next unrelated call does not report it again.
inline void check(cudaError_t status, std::string_view call, std::string_view object = {}) {
  if (status == cudaSuccess) {
    return;
  }
  (void)cudaGetLastError();
  throw cuda_error(make_error_code(status), std::string(call), object);
}
//! Throws cuda_error for a failed driver call.
inline void check(CUresult status, std::string_view call, std::string_view object = {}) {
  if (status == CUDA_SUCCESS) {
    return;
  }
  (void)cudaGetLastError();
  throw cuda_error(make_error_code(status), std::string(call), object);
}
//! For destructors: reports a failure through rdx's log hook, never throws.
inline void check_noexcept(cudaError_t status, std::string_view call) noexcept {
  if (status == cudaSuccess) {
    return;
  }
  (void)cudaGetLastError();
  char buf[256];
  const int n = std::snprintf(buf, sizeof buf, "%.*s failed: %s", static_cast<int>(call.size()), call.data(),
                              cudaGetErrorName(status));
  rdx::detail::log_hook_ref()(std::string_view(buf, n > 0 ? static_cast<std::size_t>(n) : 0));
}
}  // namespace detail

//! Number of CUDA devices usable here; 0 where there is no driver or no GPU
//! (never throws for those, so tests and tools can skip cleanly).
[[nodiscard]] inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

//! Why no GPU is usable here ("" when one is): the runtime's own status text.
[[nodiscard]] inline std::string no_device_reason() {
  int n = 0;
  const cudaError_t s = cudaGetDeviceCount(&n);
  if (s == cudaSuccess && n > 0) {
    return {};
  }
  (void)cudaGetLastError();
  if (s == cudaSuccess) {
    return "cudaGetDeviceCount found 0 devices";
  }
  return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(s) + ": " + cudaGetErrorString(s);
}

}  // namespace rdx::cuda

//! Runs a CUDA runtime or driver call and throws rdx::cuda::cuda_error naming
//! the call if it fails.
#define RDX_CUDA_TRY(...) ::rdx::cuda::detail::check((__VA_ARGS__), #__VA_ARGS__)
