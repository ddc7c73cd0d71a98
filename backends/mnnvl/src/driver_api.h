// The CUDA driver functions mnnvl needs (virtual memory management, handle
// export and import, multicast), reached only through
// cudaGetDriverEntryPointByVersion: the module never links libcuda, so it
// loads on a machine without a driver and says so.
#pragma once

#include <cuda.h>

#include <string>

#include "arbiter/common/status.h"

namespace arbiter::mnnvl {

struct DriverApi {
  decltype(&cuGetErrorString) get_error_string = nullptr;
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) mem_get_allocation_granularity = nullptr;
  decltype(&cuMemCreate) mem_create = nullptr;
  decltype(&cuMemRelease) mem_release = nullptr;
  decltype(&cuMemExportToShareableHandle) mem_export = nullptr;
  decltype(&cuMemImportFromShareableHandle) mem_import = nullptr;
  decltype(&cuMemAddressReserve) mem_address_reserve = nullptr;
  decltype(&cuMemAddressFree) mem_address_free = nullptr;
  decltype(&cuMemMap) mem_map = nullptr;
  decltype(&cuMemUnmap) mem_unmap = nullptr;
  decltype(&cuMemSetAccess) mem_set_access = nullptr;
  decltype(&cuMulticastCreate) multicast_create = nullptr;
  decltype(&cuMulticastAddDevice) multicast_add_device = nullptr;
  decltype(&cuMulticastBindMem) multicast_bind_mem = nullptr;
  decltype(&cuMulticastUnbind) multicast_unbind = nullptr;
  decltype(&cuMulticastGetGranularity) multicast_get_granularity = nullptr;

  // "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
  std::string message(const char* call, CUresult r) const;
};

// The process-wide table, looked up once; the Status says which symbol is
// missing (no driver, or one too old for multicast: CUDA 12.1).
common::Status driver_api(const DriverApi** api);

}  // namespace arbiter::mnnvl
