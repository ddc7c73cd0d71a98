#include "driver_api.h"

#include <cuda_runtime_api.h>

#include <mutex>

namespace arbiter::mnnvl {
namespace {

// The ABI version the symbols are requested at: multicast appeared in 12.1.
constexpr unsigned kDriverAbiVersion = 12010;

template <typename Function>
bool lookup(const char* symbol, Function* out, std::string* missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &p, kDriverAbiVersion, cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();
    if (missing->empty()) *missing = symbol;
    return false;
  }
  *out = reinterpret_cast<Function>(p);
  return true;
}

}  // namespace

std::string DriverApi::message(const char* call, CUresult r) const {
  const char* text = nullptr;
  if (get_error_string != nullptr) get_error_string(r, &text);
  return std::string(call) + ": CUDA driver error " + std::to_string(static_cast<int>(r)) +
         (text != nullptr ? std::string(" (") + text + ")" : std::string());
}

common::Status driver_api(const DriverApi** api) {
  static DriverApi table;
  static std::string missing;
  static std::once_flag once;
  std::call_once(once, [] {
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
      missing = "(no CUDA driver)";
      return;
    }
    DriverApi t;
    bool ok = true;
    ok &= lookup("cuGetErrorString", &t.get_error_string, &missing);
    ok &= lookup("cuDeviceGet", &t.device_get, &missing);
    ok &= lookup("cuDeviceGetAttribute", &t.device_get_attribute, &missing);
    ok &= lookup("cuMemGetAllocationGranularity", &t.mem_get_allocation_granularity, &missing);
    ok &= lookup("cuMemCreate", &t.mem_create, &missing);
    ok &= lookup("cuMemRelease", &t.mem_release, &missing);
    ok &= lookup("cuMemExportToShareableHandle", &t.mem_export, &missing);
    ok &= lookup("cuMemImportFromShareableHandle", &t.mem_import, &missing);
    ok &= lookup("cuMemAddressReserve", &t.mem_address_reserve, &missing);
    ok &= lookup("cuMemAddressFree", &t.mem_address_free, &missing);
    ok &= lookup("cuMemMap", &t.mem_map, &missing);
    ok &= lookup("cuMemUnmap", &t.mem_unmap, &missing);
    ok &= lookup("cuMemSetAccess", &t.mem_set_access, &missing);
    ok &= lookup("cuMulticastCreate", &t.multicast_create, &missing);
    ok &= lookup("cuMulticastAddDevice", &t.multicast_add_device, &missing);
    ok &= lookup("cuMulticastBindMem", &t.multicast_bind_mem, &missing);
    ok &= lookup("cuMulticastUnbind", &t.multicast_unbind, &missing);
    ok &= lookup("cuMulticastGetGranularity", &t.multicast_get_granularity, &missing);
    if (ok) table = t;
  });
  if (!missing.empty()) {
    return common::Status(ARBITER_UNAVAILABLE,
                          missing == "(no CUDA driver)"
                              ? "no CUDA driver (cudaDriverGetVersion reports none)"
                              : "the CUDA driver has no " + missing +
                                    " (multicast needs a CUDA 12.1 or newer driver)");
  }
  *api = &table;
  return common::Status();
}

}  // namespace arbiter::mnnvl
