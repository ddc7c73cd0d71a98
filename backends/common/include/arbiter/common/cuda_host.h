// Host-side CUDA runtime helpers shared by the GPU modules. Only the runtime
// API (linked statically): a module must load where there is no driver.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "arbiter/common/gpu_share.h"
#include "arbiter/common/status.h"

namespace arbiter::common {

inline std::string cuda_message(const std::string& what, cudaError_t e) {
  return what + ": " + cudaGetErrorString(e);
}

// Makes `device` current for the scope and restores the caller's device.
class DeviceScope {
 public:
  DeviceScope() { had_ = cudaGetDevice(&previous_) == cudaSuccess; }
  ~DeviceScope() {
    if (had_ && switched_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  cudaError_t use(int device) {
    if (had_ && previous_ == device) return cudaSuccess;
    const cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) switched_ = true;
    return e;
  }

 private:
  int previous_ = 0;
  bool had_ = false;
  bool switched_ = false;
};

// major * 10 + minor of `device`.
inline cudaError_t device_capability(int device, unsigned* capability) {
  int major = 0;
  int minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e == cudaSuccess) *capability = static_cast<unsigned>(major * 10 + minor);
  return e;
}

// This rank's GPU: its capability and its GpuShare, with the resident
// clusters asked of `query` (a module's cudaOccupancyMaxActiveClusters for
// its kernels' footprint). A size the device cannot launch counts as none.
inline Status describe_gpu(int device, cudaError_t (*query)(std::uint32_t, int*),
                           std::uint32_t* capability, GpuShare* share) {
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    cudaGetLastError();
    return Status(ARBITER_UNAVAILABLE,
                  cuda_message("cudaGetDeviceProperties(" + std::to_string(device) + ")", e));
  }
  *capability = static_cast<std::uint32_t>(prop.major * 10 + prop.minor);
  std::memcpy(share->uuid, &prop.uuid, sizeof share->uuid);
  share->sm_count = static_cast<std::uint32_t>(prop.multiProcessorCount);
  for (int i = 0; i < kClusterSizesQueried; ++i) {
    int clusters = 0;
    if (query(2u << i, &clusters) != cudaSuccess) {
      cudaGetLastError();
      clusters = 0;
    }
    share->clusters[i] = static_cast<std::uint32_t>(std::max(clusters, 0));
  }
  return Status();
}

}  // namespace arbiter::common
