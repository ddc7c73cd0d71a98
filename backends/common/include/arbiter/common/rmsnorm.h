// The fused epilogue applied to each token after the sum, on fp32 values.
//
// Exact semantics, shared by every algorithm and backend so the fused and the
// unfused paths agree bit for bit where they run the same code:
//   s = dtype(sum over ranks in rank order, accumulated in fp32)   allreduce_out
//   x = dtype(s + residual_in)                                      residual_out
//   r = 1 / sqrt(sum(x*x) / hidden + eps)          (sum of squares in fp32)
//   y = dtype(x * r * (gamma + weight_bias))                        norm_out
//   FP8:   quant_out = e4m3(y / scale)                 (scale: the dequant scale)
//   NVFP4: see nvfp4.h, with scale = the global scale
// Every value is rounded to the dtype where it is stored, and later steps read
// the stored value, exactly as an unfused sequence of kernels would. (The GPU
// kernels store a sum that rounds to -0.0 as +0.0: equal in value.)
//
// The per-element pieces are ARBITER_HD so a CUDA kernel calls them per
// element and reduces the sum of squares its own way; apply_epilogue_token()
// is the whole sequence for one token, used by the host backend.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "arbiter/common/fp8.h"
#include "arbiter/common/host_device.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter_backend.h"

namespace arbiter::common {

ARBITER_HD constexpr bool pattern_has_norm(arbiter_pattern pattern) {
  return pattern != ARBITER_PATTERN_ALLREDUCE;
}

ARBITER_HD inline float add_residual(float sum, float residual, arbiter_dtype dtype) {
  return round_to_dtype(sum + residual, dtype);
}

ARBITER_HD inline float reciprocal_sqrt(float value) {
#ifdef __CUDA_ARCH__
  return rsqrtf(value);
#else
  return 1.0f / std::sqrt(value);
#endif
}

ARBITER_HD inline float inverse_rms(float sum_of_squares, std::uint32_t hidden, float eps) {
  return reciprocal_sqrt(sum_of_squares / static_cast<float>(hidden) + eps);
}

ARBITER_HD inline float rmsnorm_element(float x, float inv_rms, float gamma, float weight_bias,
                                        arbiter_dtype dtype) {
  return round_to_dtype(x * inv_rms * (gamma + weight_bias), dtype);
}

ARBITER_HD inline std::uint8_t fp8_quantize(float y, float scale) {
  return float_to_e4m3(y / scale);
}

// Quantises one block of `count` (<= 16) normalised values `y` to NVFP4:
// writes (count + 1) / 2 bytes to `packed` and returns the scale factor.
ARBITER_HD inline std::uint8_t nvfp4_quantize_block(const float* y, std::uint32_t count,
                                                    float global_scale, std::uint8_t* packed) {
  float amax = 0.0f;
  for (std::uint32_t i = 0; i < count; ++i) {
    const float magnitude = std::fabs(y[i]);
    amax = magnitude > amax ? magnitude : amax;
  }
  const std::uint8_t sf = nvfp4_block_scale(amax, global_scale);
  const float value_scale = nvfp4_value_scale(sf, global_scale);
  for (std::uint32_t i = 0; i < count; i += 2) {
    const std::uint8_t even = float_to_e2m1(y[i] * value_scale);
    const std::uint8_t odd = i + 1 < count ? float_to_e2m1(y[i + 1] * value_scale) : 0;
    packed[i / 2] = pack_e2m1(even, odd);
  }
  return sf;
}

// Applies the epilogue of args.pattern to token `token`, writing every output
// args names (NULL outputs are skipped). `row` holds the token's hidden fp32
// sums on entry and is used as scratch.
// REQUIRES: host-visible buffers; norm patterns need residual_in and gamma,
// FP8/NVFP4 need quant_out and scale, NVFP4 needs scale_out and hidden % 16 == 0.
template <arbiter_dtype kDtype>
ARBITER_HD inline void apply_epilogue_token_as(const arbiter_allreduce_args& args,
                                               std::uint32_t token, float* row) {
  // A compile-time dtype folds the per-element conversions' switches away.
  constexpr arbiter_dtype dtype = kDtype;
  const std::uint32_t hidden = args.hidden;
  const std::size_t base = static_cast<std::size_t>(token) * hidden;
  if (!pattern_has_norm(args.pattern)) {
    if (args.allreduce_out == nullptr) return;
    for (std::uint32_t i = 0; i < hidden; ++i) {
      store_element(args.allreduce_out, base + i, dtype, round_to_dtype(row[i], dtype));
    }
    return;
  }

  // Each element's residual is read before any output of it is written:
  // every output may be residual_in itself (aliasing.h).
  float sum_of_squares = 0.0f;
  for (std::uint32_t i = 0; i < hidden; ++i) {
    const float residual = load_element(args.residual_in, base + i, dtype);
    const float sum = round_to_dtype(row[i], dtype);
    if (args.allreduce_out) store_element(args.allreduce_out, base + i, dtype, sum);
    row[i] = add_residual(sum, residual, dtype);
    if (args.residual_out) store_element(args.residual_out, base + i, dtype, row[i]);
    sum_of_squares += row[i] * row[i];
  }
  const float inv_rms = inverse_rms(sum_of_squares, hidden, args.eps);
  for (std::uint32_t i = 0; i < hidden; ++i) {
    row[i] = rmsnorm_element(row[i], inv_rms, load_element(args.gamma, i, dtype), args.weight_bias,
                             dtype);
    if (args.norm_out) store_element(args.norm_out, base + i, dtype, row[i]);
  }

  if (args.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) {
    auto* quant = static_cast<std::uint8_t*>(args.quant_out);
    const float scale = *args.scale;
    for (std::uint32_t i = 0; i < hidden; ++i) quant[base + i] = fp8_quantize(row[i], scale);
  } else if (args.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    auto* quant = static_cast<std::uint8_t*>(args.quant_out) + base / 2;
    auto* scales = static_cast<std::uint8_t*>(args.scale_out);
    const bool linear = (args.flags & ARBITER_RUN_NVFP4_LINEAR_SCALES) != 0;
    const std::uint32_t blocks = nvfp4_blocks_per_row(hidden);
    for (std::uint32_t block = 0; block < blocks; ++block) {
      const std::uint32_t first = block * kNvfp4BlockSize;
      scales[scale_offset(linear, token, block, blocks)] =
          nvfp4_quantize_block(row + first, kNvfp4BlockSize, *args.scale, quant + first / 2);
    }
  }
}

// Dispatches once per token on the runtime dtype.
ARBITER_HD inline void apply_epilogue_token(const arbiter_allreduce_args& args, std::uint32_t token,
                                            float* row) {
  switch (args.dtype) {
    case ARBITER_DTYPE_FP16:
      return apply_epilogue_token_as<ARBITER_DTYPE_FP16>(args, token, row);
    case ARBITER_DTYPE_BF16:
      return apply_epilogue_token_as<ARBITER_DTYPE_BF16>(args, token, row);
    default:
      return apply_epilogue_token_as<ARBITER_DTYPE_FP32>(args, token, row);
  }
}

}  // namespace arbiter::common
