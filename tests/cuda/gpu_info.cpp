// Prints, for every GPU, the GPUDirect probe and the RDMA devices nearest to
// it, read from the real sysfs (or the root given as the first argument).
#include <rdx/cuda/check.hpp>
#include <rdx/cuda/probe.hpp>
#include <rdx/cuda/topology.hpp>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  const std::filesystem::path sysfs = argc > 1 ? argv[1] : "/sys";
  const int n = rdx::cuda::device_count();
  if (n == 0) {
    std::fprintf(stderr, "cuda_gpu_info: SKIP: no CUDA GPU: %s\n", rdx::cuda::no_device_reason().c_str());
    return 77;
  }
  int rc = 0;
  for (int d = 0; d < n; ++d) {
    try {
      std::printf("%s", rdx::cuda::probe_gpudirect(d, sysfs).to_string().c_str());
      std::printf("  topology: %s", rdx::cuda::locate_gpu(d, sysfs).to_string().c_str());
    } catch (const std::exception& e) {
      std::printf("GPU %d: %s\n", d, e.what());
      rc = 1;
    }
  }
  return rc;
}
