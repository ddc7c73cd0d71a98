// What the fused epilogue of the GPU kernels needs, passed by value inside
// each module's kernel parameters, and how a module fills it from a call.
// Plain C++ (no CUDA): the host side of the modules includes it.
#pragma once

#include <cstdint>

#include "arbiter_backend.h"

namespace arbiter::common {

// What is fused after the sum; the optional outputs are runtime NULL checks.
enum class Epilogue { kAllreduce, kNorm, kNormFp8, kNormFp4 };

// Thread layout: a token is spread over the CTAs of one cluster; thread t of
// cluster CTA c owns vector c * blockDim.x + t of it (16 bytes). Threads past
// threads_per_token own nothing but take part in every reduction.
struct EpilogueParams {
  std::uint32_t hidden = 0;
  std::uint32_t threads_per_token = 0;  // hidden / elements per vector
  std::uint32_t cluster_size = 1;       // CTAs per token
  void* allreduce_out = nullptr;
  const void* residual_in = nullptr;
  void* residual_out = nullptr;
  const void* gamma = nullptr;
  void* norm_out = nullptr;
  void* quant_out = nullptr;
  void* scale_out = nullptr;
  const float* scale = nullptr;
  float eps = 0.0f;
  float weight_bias = 0.0f;
  bool linear_scales = false;
};

inline EpilogueParams make_epilogue_params(const arbiter_allreduce_args& a,
                                           std::uint32_t threads_per_token,
                                           std::uint32_t cluster_size) {
  EpilogueParams e;
  e.hidden = a.hidden;
  e.threads_per_token = threads_per_token;
  e.cluster_size = cluster_size;
  e.allreduce_out = a.allreduce_out;
  e.residual_in = a.residual_in;
  e.residual_out = a.residual_out;
  e.gamma = a.gamma;
  e.norm_out = a.norm_out;
  e.quant_out = a.quant_out;
  e.scale_out = a.scale_out;
  e.scale = a.scale;
  e.eps = a.eps;
  e.weight_bias = a.weight_bias;
  e.linear_scales = (a.flags & ARBITER_RUN_NVFP4_LINEAR_SCALES) != 0;
  return e;
}

inline Epilogue epilogue_of(arbiter_pattern pattern) {
  switch (pattern) {
    case ARBITER_PATTERN_RESIDUAL_RMSNORM:
      return Epilogue::kNorm;
    case ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8:
      return Epilogue::kNormFp8;
    case ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4:
      return Epilogue::kNormFp4;
    default:
      return Epilogue::kAllreduce;
  }
}

}  // namespace arbiter::common
