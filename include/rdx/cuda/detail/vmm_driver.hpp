// rdx::cuda internals: the driver's virtual memory management entry points
// (cuMemCreate and its kin) that shareable allocations need, fetched through
// the runtime like rdx/cuda/detail/driver.hpp's, so that no program depends
// on libcuda at load time.
#pragma once

#include <rdx/cuda/detail/driver.hpp>

namespace rdx::cuda::detail {

struct vmm_api {
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_attribute = nullptr;
};

//! The entry points, looked up once per process.
//! @throws rdx::cuda::cuda_error if there is no driver or it lacks a symbol
inline const vmm_api& vmm() {
  static const vmm_api api = [] {
    vmm_api a;
    load_entry("cuMemCreate", 10020, a.create);
    load_entry("cuMemRelease", 10020, a.release);
    load_entry("cuMemAddressReserve", 10020, a.reserve);
    load_entry("cuMemAddressFree", 10020, a.address_free);
    load_entry("cuMemMap", 10020, a.map);
    load_entry("cuMemUnmap", 10020, a.unmap);
    load_entry("cuMemSetAccess", 10020, a.set_access);
    load_entry("cuMemGetAllocationGranularity", 10020, a.granularity);
    load_entry("cuMemExportToShareableHandle", 10020, a.export_handle);
    load_entry("cuMemImportFromShareableHandle", 10020, a.import_handle);
    load_entry("cuDeviceGetAttribute", 2000, a.device_attribute);
    return a;
  }();
  return api;
}

//! Properties of pinned device memory on device, shareable as a POSIX file descriptor.
inline CUmemAllocationProp shareable_properties(int device) noexcept {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

//! Read and write access for device, over a mapping.
inline CUmemAccessDesc read_write_access(int device) noexcept {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return d;
}

//! The minimum granularity of a shareable allocation on device (2 MiB on the GPUs seen so far).
inline std::size_t allocation_granularity(int device) {
  const CUmemAllocationProp p = shareable_properties(device);
  std::size_t g = 0;
  check(vmm().granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
  return g;
}

}  // namespace rdx::cuda::detail
