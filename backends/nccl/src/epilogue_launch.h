// Launcher of the nccl backend's epilogue: residual add + RMSNorm (+ FP8 or
// NVFP4) on the all-reduced sum. Turns runtime values (dtype, quantisation,
// whether 16-byte vectors fit) into template arguments of the kernel in
// epilogue.cuh. Never allocates; safe to call during stream capture.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "arbiter/common/cuda/epilogue_params.h"
#include "arbiter_backend.h"

namespace arbiter::nccl {

// Every pointer is a device pointer on the current device. Buffers hold
// tokens x hidden elements of dtype unless noted.
struct EpilogueParams {
  arbiter_dtype dtype = ARBITER_DTYPE_BF16;
  // kNorm, kNormFp8 (quant_out = e4m3(y / *scale), saturating) or kNormFp4
  // (NVFP4 as arbiter/common/nvfp4.h, *scale the global scale).
  common::Epilogue epilogue = common::Epilogue::kNorm;
  std::uint32_t tokens = 0;       // > 0
  std::uint32_t hidden = 0;       // > 0; NVFP4: a multiple of 16
  const void* sum = nullptr;      // the all-reduced input (one rank: the input itself);
                                  // may equal residual_out or norm_out
  void* allreduce_out = nullptr;  // optional: a copy of sum; may equal residual_in
  const void* residual_in = nullptr;
  void* residual_out = nullptr;  // sum + residual_in (rounded to dtype); may equal residual_in
  const void* gamma = nullptr;   // hidden elements
  float eps = 0.0f;
  float weight_bias = 0.0f;      // y = x * rsqrt(mean(x^2) + eps) * (gamma + weight_bias)
  void* norm_out = nullptr;      // optional: y in dtype
  void* quant_out = nullptr;     // FP8: 1 byte per element; NVFP4: 2 elements per byte
  const float* scale = nullptr;  // FP8 / NVFP4 only: the per-tensor scale, device memory
  // NVFP4 only: the call's scale factors. Not offset per chunk: token t of
  // this launch is row first_token + t of the call, and its scale factors
  // go where the call's layout puts that row (the 128x4 swizzled layout
  // groups rows by 128, which a chunk need not start on).
  void* scale_out = nullptr;
  std::uint32_t first_token = 0;
  bool linear_scales = false;  // else 128x4 swizzled
  bool pdl = false;            // launch with programmatic dependent launch
};

// Launches one kernel on `stream`. Returns the launch status;
// cudaErrorInvalidValue for an epilogue the kernel has no form for (kAllreduce,
// NVFP4 on fp32 or without 16-byte vectors). The other checks on pointers and
// sizes belong to the caller.
cudaError_t launch_residual_rmsnorm(const EpilogueParams& p, cudaStream_t stream);

}  // namespace arbiter::nccl
