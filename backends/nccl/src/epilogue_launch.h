// Launcher of the nccl backend's epilogue: residual add + RMSNorm (+ FP8) on
// the all-reduced sum. Turns runtime values (dtype, quantisation, whether
// 16-byte vectors fit) into template arguments of the kernel in
// epilogue.cuh. Never allocates; safe to call during stream capture.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "arbiter_backend.h"

namespace arbiter::nccl {

// Every pointer is a device pointer on the current device. Buffers hold
// tokens x hidden elements of dtype unless noted.
struct EpilogueParams {
  arbiter_dtype dtype = ARBITER_DTYPE_BF16;
  bool fp8 = false;               // write quant_out = e4m3(y / *scale), saturating
  std::uint32_t tokens = 0;       // > 0
  std::uint32_t hidden = 0;       // > 0
  const void* sum = nullptr;      // the all-reduced input; may equal residual_out
  void* allreduce_out = nullptr;  // optional: a copy of sum; may equal residual_in
  const void* residual_in = nullptr;
  void* residual_out = nullptr;  // sum + residual_in (rounded to dtype); may equal residual_in
  const void* gamma = nullptr;   // hidden elements
  float eps = 0.0f;
  float weight_bias = 0.0f;      // y = x * rsqrt(mean(x^2) + eps) * (gamma + weight_bias)
  void* norm_out = nullptr;      // optional: y in dtype
  void* quant_out = nullptr;     // fp8 only: 1 byte per element
  const float* scale = nullptr;  // fp8 only: per-tensor (dequantisation) scale, device memory
  bool pdl = false;              // launch with programmatic dependent launch
};

// Launches one kernel on `stream`. Returns the launch status; the checks on
// null pointers and sizes belong to the caller.
cudaError_t launch_residual_rmsnorm(const EpilogueParams& p, cudaStream_t stream);

}  // namespace arbiter::nccl
