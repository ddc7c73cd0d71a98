// Host-side CUDA runtime helpers shared by the GPU modules. Only the runtime
// API (linked statically): a module must load where there is no driver.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "arbiter/common/arch_coverage.h"
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

// scope.use(device) as a Status.
inline Status use_device(DeviceScope& scope, int device) {
  if (const cudaError_t e = scope.use(device); e != cudaSuccess) {
    return Status(ARBITER_UNAVAILABLE,
                  cuda_message("cudaSetDevice(" + std::to_string(device) + ")", e));
  }
  return Status();
}

// A non-blocking stream of the module's own: work on it never waits for the
// legacy default stream, so for none of a framework's blocking streams
// (which may hold work that waits on peers). Destroyed with the scope.
class PrivateStream {
 public:
  PrivateStream() { error_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  ~PrivateStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  PrivateStream(const PrivateStream&) = delete;
  PrivateStream& operator=(const PrivateStream&) = delete;

  cudaStream_t get() const { return stream_; }
  cudaError_t error() const { return error_; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaError_t error_ = cudaSuccess;
};

// Waits until everything enqueued on `stream` has finished, or timeout_ms
// (<= 0: 60 s) has passed: ARBITER_TIMEOUT naming `what`, where
// cudaStreamSynchronize would block forever on a stuck kernel. A CUDA
// error is ARBITER_INTERNAL. Polls, sleeping up to 1 ms: for workspace
// set-up, not the hot path.
inline Status wait_for_stream(cudaStream_t stream, std::int64_t timeout_ms,
                              const std::string& what) {
  const std::int64_t limit = timeout_ms > 0 ? timeout_ms : 60000;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit);
  auto nap = std::chrono::microseconds(10);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return Status();
    if (e != cudaErrorNotReady) {
      cudaGetLastError();
      return Status(ARBITER_INTERNAL, cuda_message(what, e));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(ARBITER_TIMEOUT, what + ": not finished after " + std::to_string(limit) +
                                         " ms (the GPU is stuck or busy with another "
                                         "process's work)");
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

// Enqueues `launch` (returning the launch's cudaError_t) with `device`
// current, restoring the caller's device; a failure is ARBITER_INTERNAL.
template <typename Launch>
Status launch_on_device(int device, Launch launch) {
  DeviceScope scope;
  if (const cudaError_t e = scope.use(device); e != cudaSuccess) {
    return Status(ARBITER_INTERNAL, cuda_message("cudaSetDevice", e));
  }
  if (const cudaError_t e = launch(); e != cudaSuccess) {
    cudaGetLastError();
    return Status(ARBITER_INTERNAL, cuda_message("kernel launch", e));
  }
  return Status();
}

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

// probe() of a GPU module: a driver, the device, capability >= min, and
// kernels built for it (`archs`: the module's CUDA architectures joined by
// ','). Fills *capability; the Status says which of them is missing.
inline Status probe_gpu(const arbiter_probe_args& args, std::uint32_t min_capability,
                        const char* archs, std::uint32_t* capability) {
  if (args.device_kind != ARBITER_DEVICE_GPU) {
    return Status(ARBITER_UNAVAILABLE, "serves GPU ranks only");
  }
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    return Status(ARBITER_UNAVAILABLE, "no CUDA driver (cudaDriverGetVersion reports none)");
  }
  int count = 0;  // left unchanged by a failing cudaGetDeviceCount
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return Status(ARBITER_UNAVAILABLE, cuda_message("no CUDA device", e));
  }
  if (args.device < 0 || args.device >= count) {
    return Status(ARBITER_UNAVAILABLE, "no CUDA device " + std::to_string(args.device) + ": " +
                                           std::to_string(count) + " visible");
  }
  unsigned cap = 0;
  if (const cudaError_t e = device_capability(args.device, &cap); e != cudaSuccess) {
    return Status(ARBITER_UNAVAILABLE, cuda_message("cudaDeviceGetAttribute", e));
  }
  if (cap < min_capability) {
    return Status(ARBITER_UNAVAILABLE, "needs capability >= " + std::to_string(min_capability) +
                                           "; device " + std::to_string(args.device) + " has " +
                                           std::to_string(cap));
  }
  if (!kernel_built_for(cap, archs)) {
    return Status(ARBITER_UNAVAILABLE,
                  "this build's kernels are for " + std::string(archs) + "; device " +
                      std::to_string(args.device) + " has capability " + std::to_string(cap) +
                      " (rebuild with -DARBITER_CUDA_ARCHITECTURES including it)");
  }
  *capability = cap;
  return Status();
}

// How long a kernel waits for a peer before it traps (ending the stream in
// a CUDA error instead of hanging the job): ARBITER_KERNEL_TIMEOUT_MS, in
// milliseconds, 0 for no deadline; 10 minutes by default, the same as
// PyTorch's NCCL watchdog, so a peer that is merely late (compilation, graph
// capture, a host stall) never kills a healthy job. Not the rendezvous
// timeout: that one bounds workspace creation.
inline Status kernel_timeout_ns(std::uint64_t* out) {
  constexpr std::uint64_t kDefaultMs = 600000;
  const char* text = std::getenv("ARBITER_KERNEL_TIMEOUT_MS");
  std::uint64_t ms = kDefaultMs;
  if (text != nullptr && *text != '\0') {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(text, &end, 10);
    // 2^44 ms is over 500 years; beyond it the nanoseconds would overflow.
    if (*end != '\0' || errno != 0 || text[0] == '-' || v > (1ull << 44)) {
      return Status(ARBITER_INVALID_ARGUMENT,
                    std::string("ARBITER_KERNEL_TIMEOUT_MS=") + text +
                        ": not a whole number of milliseconds (0 turns the deadline off)");
    }
    ms = v;
  }
  *out = ms * 1000000ull;
  return Status();
}

}  // namespace arbiter::common
