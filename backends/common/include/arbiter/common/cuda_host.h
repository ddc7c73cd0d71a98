// Host-side CUDA runtime helpers shared by the GPU modules. Only the runtime
// API (linked statically): a module must load where there is no driver.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

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

}  // namespace arbiter::common
