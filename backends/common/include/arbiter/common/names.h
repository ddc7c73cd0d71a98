// The ABI's enums as words, for messages (one spelling for every module).
// Host only.
#pragma once

#include <cstdint>
#include <string>

#include "arbiter_backend.h"

namespace arbiter::common {

// "residual_rmsnorm"; a value that names no pattern as "pattern N".
inline std::string pattern_text(std::int64_t p) {
  switch (p) {
    case ARBITER_PATTERN_ALLREDUCE:
      return "allreduce";
    case ARBITER_PATTERN_RESIDUAL_RMSNORM:
      return "residual_rmsnorm";
    case ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8:
      return "residual_rmsnorm_fp8";
    case ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4:
      return "residual_rmsnorm_fp4";
    default:
      return "pattern " + std::to_string(p);
  }
}

// "bf16"; a value that names no dtype as "dtype N".
inline std::string dtype_text(std::int64_t d) {
  switch (d) {
    case ARBITER_DTYPE_FP16:
      return "fp16";
    case ARBITER_DTYPE_BF16:
      return "bf16";
    case ARBITER_DTYPE_FP32:
      return "fp32";
    default:
      return "dtype " + std::to_string(d);
  }
}

}  // namespace arbiter::common
