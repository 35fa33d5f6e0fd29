// Skips (exit 77) a cuda test program before Catch2 starts when there is no
// usable GPU, or no RDMA device where one is needed, saying why.
#pragma once

#include <rdx/cuda/check.hpp>

#include <infiniband/verbs.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace rdx_test {
inline bool require_gpu_or_skip(const char* program) {
  const std::string why = rdx::cuda::no_device_reason();
  if (!why.empty()) {
    std::fprintf(stderr, "%s: SKIP: needs a CUDA GPU: %s\n", program, why.c_str());
    std::fflush(stderr);
    std::_Exit(77);
  }
  return true;
}

inline bool require_rdma_device_or_skip(const char* program) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list != nullptr) ibv_free_device_list(list);
  if (n <= 0) {
    std::fprintf(
        stderr,
        "%s: SKIP: needs a GPU and an RDMA device on one machine; ibv_get_device_list found none here. "
        "Run `ctest --test-dir build-cuda -L cuda` on a machine with both.\n",
        program);
    std::fflush(stderr);
    std::_Exit(77);
  }
  return true;
}
}  // namespace rdx_test
