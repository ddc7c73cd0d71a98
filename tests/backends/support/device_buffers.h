// Device and pinned host memory of the fused all-reduce GPU tests, and the
// way outputs come back: downloads through pinned staging, compared bit for
// bit with what another rank or algorithm wrote. A CUDA error while copying
// leaves the context unusable, so it ends the test (fail_and_exit).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "arbiter_backend.h"
#include "fused_call.h"
#include "gpu_check.h"

namespace arbiter::test {

// The name finish() prints when a fatal failure ends the test.
inline std::string& test_name() {
  static std::string name = "gpu_test";
  return name;
}

// Counts a failed check, prints the summary and ends the process: for what
// cannot be recovered in-process (a hung kernel, an unusable context).
[[noreturn]] inline void fail_and_exit(const std::string& context, const std::string& message) {
  check(false, context, message);
  finish(test_name().c_str());
  std::_Exit(1);
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&pointer_, bytes) != cudaSuccess) {
      pointer_ = nullptr;
      cudaGetLastError();
    }
  }
  ~DeviceBuffer() {
    if (pointer_ != nullptr) cudaFree(pointer_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : pointer_(std::exchange(other.pointer_, nullptr)), bytes_(other.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(pointer_, other.pointer_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return pointer_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
};

// Page-locked host memory: device-to-host copies into it run at full speed.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) {
    if (cudaMallocHost(&pointer_, bytes) != cudaSuccess) {
      pointer_ = nullptr;
      cudaGetLastError();
    }
  }
  ~PinnedBuffer() {
    if (pointer_ != nullptr) cudaFreeHost(pointer_);
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept : pointer_(std::exchange(other.pointer_, nullptr)) {}
  PinnedBuffer& operator=(PinnedBuffer&&) = delete;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  std::uint8_t* get() const { return static_cast<std::uint8_t*>(pointer_); }

 private:
  void* pointer_ = nullptr;
};

// The device buffers of one rank's call that hold outputs, as HostOutputs
// names them.
struct OutputField {
  const char* name;
  const void* device;
  std::size_t bytes;
  Bytes HostOutputs::*host;
  Field field;
};

inline std::vector<OutputField> output_fields(const arbiter_allreduce_args& a, const Call& c) {
  return {
      {"allreduce_out", a.allreduce_out, c.bytes(), &HostOutputs::allreduce_out, Field::kValues},
      {"residual_out", a.residual_out, c.bytes(), &HostOutputs::residual_out, Field::kValues},
      {"norm_out", a.norm_out, c.bytes(), &HostOutputs::norm_out, Field::kValues},
      {"quant_out", a.quant_out, c.quant_bytes(), &HostOutputs::quant_out, quant_field(c)},
      {"scale_out", a.scale_out, c.scale_bytes(), &HostOutputs::scale_out, Field::kScales}};
}

// Fills every output of `a` with 0xFF bytes (NaN in every dtype and in
// e4m3) on `stream`, so an element the call does not write shows.
inline cudaError_t clear_outputs(const arbiter_allreduce_args& a, const Call& c,
                                 cudaStream_t stream) {
  cudaError_t e = cudaSuccess;
  for (const OutputField& f : output_fields(a, c)) {
    if (f.device != nullptr && f.bytes != 0 && e == cudaSuccess) {
      e = cudaMemsetAsync(const_cast<void*>(f.device), 0xFF, f.bytes, stream);
    }
  }
  return e;
}

// Copies `bytes` of device memory to `staging`; a failure (the CUDA context
// is then unusable) ends the test.
inline void copy_to_host(std::uint8_t* staging, const void* device, std::size_t bytes,
                         const std::string& context) {
  const cudaError_t e = cudaMemcpy(staging, device, bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    fail_and_exit(context, std::string("download: ") + cudaGetErrorString(e) +
                               " (the CUDA context is unusable)");
  }
}

// The outputs `a` names, through `staging` (at least c.bytes() bytes).
inline HostOutputs download(const arbiter_allreduce_args& a, const Call& c, std::uint8_t* staging,
                            const std::string& context) {
  HostOutputs out;
  for (const OutputField& f : output_fields(a, c)) {
    if (f.device == nullptr || f.bytes == 0) continue;
    copy_to_host(staging, f.device, f.bytes, context);
    (out.*f.host).assign(staging, staging + f.bytes);
  }
  return out;
}

// Checks that the outputs `a` names have the bits of `want`, copying them
// through `staging` (at least c.bytes() bytes).
inline void compare_device_outputs(const arbiter_allreduce_args& a, const Call& c,
                                   const HostOutputs& want, std::uint8_t* staging,
                                   const std::string& context) {
  for (const OutputField& f : output_fields(a, c)) {
    if (f.device == nullptr || f.bytes == 0) continue;
    copy_to_host(staging, f.device, f.bytes, context);
    compare_field(f.name, Span{staging, f.bytes}, span(want.*f.host), f.field, c, false, context);
  }
}

}  // namespace arbiter::test
