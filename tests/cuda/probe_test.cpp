// The GPUDirect probe, dma-buf export and the flush step, on a GPU (an RDMA
// device is not needed: what needs one is reported as not checked).
#include <rdx/cuda/detail/driver.hpp>
#include <rdx/cuda/memory.hpp>
#include <rdx/cuda/probe.hpp>
#include <rdx/cuda/register.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "gpu_skip.hpp"
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {
[[maybe_unused]] const bool gpu_present = rdx_test::require_gpu_or_skip("cuda_probe_test");

int attribute(int a) {
  int v = -1;
  REQUIRE(cudaDeviceGetAttribute(&v, static_cast<cudaDeviceAttr>(a), 0) == cudaSuccess);
  return v;
}
}  // namespace

using rdx::cuda::flush_method;
using rdx::cuda::flush_scope;
using rdx::cuda::required_flush;
// Ordering 100 (owner) needs nothing for the owner, a flush for peers.
static_assert(required_flush(100, 1, flush_scope::owner) == flush_method::none);
static_assert(required_flush(100, 1, flush_scope::all_devices) == flush_method::cuda_flush);
static_assert(required_flush(200, 0, flush_scope::all_devices) == flush_method::none);
static_assert(required_flush(0, 1, flush_scope::owner) == flush_method::cuda_flush);
static_assert(required_flush(0, 0, flush_scope::owner) == flush_method::rdma_read);

TEST_CASE("probe reports the device attributes as CUDA gives them", "[cuda]") {
  const auto r = rdx::cuda::probe_gpudirect(0);
  std::printf("%s", r.to_string().c_str());
  REQUIRE_FALSE(r.gpu_name.empty());
  REQUIRE(r.gpu_pci_address.size() == 12);
  REQUIRE(r.dma_buf_attribute == (attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) != 0));
  REQUIRE(r.gpu_direct_rdma_supported == (attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) != 0));
  REQUIRE(r.flush_writes_options == attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS));
  REQUIRE(r.writes_ordering == attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING));
  if (r.dma_buf_attribute) {
    REQUIRE(r.dma_buf_export == rdx::cuda::support::yes);
  }
  const std::string text = r.to_string();
  for (const char* key :
       {"DMA_BUF_SUPPORTED", "GPU_DIRECT_RDMA_SUPPORTED", "FLUSH_WRITES_OPTIONS", "WRITES_ORDERING",
        "ibv_reg_dmabuf_mr", "nv_mem/version", "nvidia_peermem/version", "best path"}) {
    INFO(key);
    REQUIRE(text.find(key) != std::string::npos);
  }
  if (r.rdma_device.empty()) {
    // Nothing to register with: the kernel check did not run, and says so.
    REQUIRE(r.kernel_dmabuf_mr == rdx::cuda::support::unknown);
    REQUIRE(r.best_path() == rdx::cuda::gpu_path::staged);
    REQUIRE(r.rdma_device_detail.find("ibv_get_device_list") != std::string::npos);
  } else {
    REQUIRE(r.kernel_dmabuf_mr != rdx::cuda::support::unknown);
  }
}

TEST_CASE("peermem files are read from the sysfs root given", "[cuda]") {
  char tmpl[] = "/tmp/rdx-peermem-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::filesystem::path root = tmpl;
  std::filesystem::create_directories(root / "kernel/mm/memory_peers/nv_mem");
  std::filesystem::create_directories(root / "module/nvidia_peermem");
  std::FILE* f = std::fopen((root / "kernel/mm/memory_peers/nv_mem/version").c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs("1.3\n", f);
  std::fclose(f);
  f = std::fopen((root / "module/nvidia_peermem/version").c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs("580.00\n", f);
  std::fclose(f);
  const auto r = rdx::cuda::probe_gpudirect(0, nullptr, root);
  REQUIRE(r.nv_mem_version == "1.3");
  REQUIRE(r.nvidia_peermem_version == "580.00");
  REQUIRE(r.peermem_loaded());
  std::filesystem::remove_all(root);
}

TEST_CASE("a whole cudaMalloc allocation exports as a dma-buf, page-aligned", "[cuda]") {
  if (attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) == 0) {
    WARN("DMA_BUF_SUPPORTED is 0 on this GPU: export not checked");
    return;
  }
  rdx::cuda::device_buffer<std::byte> b((2u << 20) + 100);  // not a page multiple
  const auto& drv = rdx::cuda::detail::driver();
  CUdeviceptr base = 0;
  std::size_t size = 0;
  // An interior pointer finds the whole allocation.
  REQUIRE(drv.mem_get_address_range(&base, &size, reinterpret_cast<CUdeviceptr>(b.data()) + 12345) ==
          CUDA_SUCCESS);
  REQUIRE(base == reinterpret_cast<CUdeviceptr>(b.data()));
  REQUIRE(size >= b.size_bytes());
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  REQUIRE(base % page == 0);
  const std::size_t aligned = (size + page - 1) / page * page;
  int fd = -1;
  REQUIRE(drv.mem_get_handle_for_address_range(&fd, base, aligned, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) ==
          CUDA_SUCCESS);
  REQUIRE(fd >= 0);
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  REQUIRE(::fcntl(fd, F_GETFD) != -1);
  REQUIRE(::close(fd) == 0);
}

TEST_CASE("the flush step follows the device's attributes and runs", "[cuda]") {
  const int ordering = attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING);
  const int options = attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS);
  for (auto scope : {flush_scope::owner, flush_scope::all_devices}) {
    rdx::cuda::gpudirect_flush flush(0, scope);
    REQUIRE(flush.method() == required_flush(ordering, options, scope));
    REQUIRE(flush() == flush.method());  // cudaDeviceFlushGPUDirectRDMAWrites succeeds where chosen
  }
}

TEST_CASE("export_dma_buf gives the page-aligned allocation and the range's offset in it", "[cuda]") {
  if (attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) == 0) {
    WARN("DMA_BUF_SUPPORTED is 0 on this GPU: export not checked");
    return;
  }
  rdx::cuda::device_buffer<std::byte> b((4u << 20) + 100);
  const std::size_t inner = 12288 + 64;
  int fd = -1;
  {
    auto r = rdx::cuda::export_dma_buf(b.data() + inner, 1u << 20);
    fd = r.fd();
    REQUIRE(fd >= 0);
    REQUIRE(::fcntl(fd, F_GETFD) != -1);
    REQUIRE(r.offset() == inner);  // cudaMalloc allocations start page-aligned
    REQUIRE(r.length() == (1u << 20));
    REQUIRE(r.iova() == reinterpret_cast<std::uint64_t>(b.data() + inner));
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    REQUIRE(r.dma_buf_bytes() % page == 0);
    REQUIRE(r.dma_buf_bytes() >= b.size_bytes());
    auto moved = std::move(r);
    REQUIRE(r.fd() == -1);  // NOLINT(bugprone-use-after-move)
    REQUIRE(moved.fd() == fd);
    REQUIRE(moved.native_handle() == fd);
  }
  // The range closed its fd.
  REQUIRE(::fcntl(fd, F_GETFD) == -1);

  // release() hands the fd over.
  {
    auto r = rdx::cuda::export_dma_buf(b.data(), 4096);
    const int owned = r.release();
    REQUIRE(r.fd() == -1);
    REQUIRE(::fcntl(owned, F_GETFD) != -1);
    REQUIRE(::close(owned) == 0);
  }
  // The whole buffer, exactly, is fine; one byte more is not.
  REQUIRE_NOTHROW(rdx::cuda::export_dma_buf(b.data(), b.size_bytes()));
  try {
    (void)rdx::cuda::export_dma_buf(b.data() + 4096, b.size_bytes());
    FAIL("a range past the allocation exported");
  } catch (const rdx::error& e) {
    REQUIRE(e.code() == rdx::errc::out_of_range);
  }
  rdx::cuda::pinned_buffer<std::byte> host(4096);
  REQUIRE_THROWS_WITH(rdx::cuda::export_dma_buf(host.data(), 4096), Catch::Contains("not device memory"));
}
