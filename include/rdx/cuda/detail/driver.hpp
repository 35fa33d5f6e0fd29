// rdx::cuda internals: the few driver API entry points rdx needs, fetched
// through the runtime, so that no program linked with rdx::cuda depends on
// libcuda at load time (it starts, and reports "no GPU", where none is).
#pragma once

#include <rdx/cuda/check.hpp>

#include <cudaTypedefs.h>

namespace rdx::cuda::detail {

struct driver_api {
  PFN_cuMemGetAddressRange_v3020 mem_get_address_range = nullptr;
  PFN_cuMemGetHandleForAddressRange_v11070 mem_get_handle_for_address_range = nullptr;
};

template <class Fn>
void load_entry(const char* symbol, unsigned version, Fn& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  check(cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &found),
        "cudaGetDriverEntryPointByVersion", symbol);
#else
  (void)version;
  check(cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &found), "cudaGetDriverEntryPoint", symbol);
#endif
  if (found != cudaDriverEntryPointSuccess || p == nullptr) {
    throw cuda_error(make_error_code(CUDA_ERROR_NOT_FOUND), "cudaGetDriverEntryPoint",
                     std::string(symbol) + " (the installed driver is too old for this call)");
  }
  fn = reinterpret_cast<Fn>(p);
}

//! The driver entry points, looked up once per process.
//! @throws rdx::cuda::cuda_error if there is no driver or it lacks a symbol
inline const driver_api& driver() {
  static const driver_api api = [] {
    driver_api a;
    load_entry("cuMemGetAddressRange", 12000, a.mem_get_address_range);
    load_entry("cuMemGetHandleForAddressRange", 12000, a.mem_get_handle_for_address_range);
    return a;
  }();
  return api;
}

}  // namespace rdx::cuda::detail
