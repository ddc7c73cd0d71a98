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
// kernels store a sum that rounds to -0.0 as +0.0: equal in value. The host
// epilogue stores every NaN as the dtype's canonical quiet NaN.)
//
// The per-element pieces are ARBITER_HD so a CUDA kernel calls them per
// element and reduces the sum of squares its own way; apply_epilogue_token()
// is the whole sequence for one token, used by the host backend.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

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

// The host epilogue adds the square of element i into partial sum
// i % kEpilogueLanes and then the partial sums in order, so the sum of
// squares has the same bits whatever the vector width.
inline constexpr std::uint32_t kEpilogueLanes = 16;

// The dtype's storage bits of `value`, without a branch (vectorisable).
// Every NaN becomes the dtype's canonical quiet NaN (positive): which of two
// NaN operands an add or multiply passes on is the first source operand on
// x86, and the compiler orders commutative operands differently for
// different ISAs, so payloads and signs would differ between builds.
template <arbiter_dtype kDtype>
ARBITER_HD ARBITER_HOST_INLINE inline std::uint32_t to_storage_bits(float value) {
  constexpr std::uint32_t kCanonicalNan = kDtype == ARBITER_DTYPE_BF16   ? 0x7FC0u
                                          : kDtype == ARBITER_DTYPE_FP16 ? 0x7E00u
                                                                         : 0x7FC00000u;
  const bool nan = (float_bits(value) & 0x7FFFFFFFu) > 0x7F800000u;
  return nan ? kCanonicalNan : float_to_dtype_bits(value, kDtype);
}

template <arbiter_dtype kDtype>
ARBITER_HD ARBITER_HOST_INLINE inline float rounded_to(float value) {
  if constexpr (kDtype == ARBITER_DTYPE_FP32) {
    return value;
  } else {
    return dtype_bits_to_float(to_storage_bits<kDtype>(value), kDtype);
  }
}

// Applies the epilogue of args.pattern to token `token`, writing every output
// args names (NULL outputs are skipped). `row` holds the token's hidden fp32
// sums on entry and is used as scratch.
// REQUIRES: host-visible buffers; norm patterns need gamma (residual_in NULL:
// no residual),
// FP8/NVFP4 need quant_out and scale, NVFP4 needs scale_out and hidden % 16 == 0.
template <arbiter_dtype kDtype>
ARBITER_HD ARBITER_HOST_INLINE inline void apply_epilogue_token_as(
    const arbiter_allreduce_args& args, std::uint32_t token, float* row) {
  // A compile-time dtype folds the per-element conversions' switches away.
  constexpr arbiter_dtype dtype = kDtype;
  constexpr std::uint32_t kLanes = kEpilogueLanes;
  using Bits = std::conditional_t<kDtype == ARBITER_DTYPE_FP32, std::uint32_t, std::uint16_t>;
  const std::uint32_t hidden = args.hidden;
  const std::size_t base = static_cast<std::size_t>(token) * hidden;
  Bits* const allreduce_out =
      args.allreduce_out ? static_cast<Bits*>(args.allreduce_out) + base : nullptr;
  if (!pattern_has_norm(args.pattern)) {
    if (allreduce_out == nullptr) return;
    for (std::uint32_t i = 0; i < hidden; ++i) {
      allreduce_out[i] = static_cast<Bits>(to_storage_bits<kDtype>(row[i]));
    }
    return;
  }
  // NULL residual_in: no residual (a first block), x is the sum alone.
  const Bits* const residual_in =
      args.residual_in ? static_cast<const Bits*>(args.residual_in) + base : nullptr;
  Bits* const residual_out =
      args.residual_out ? static_cast<Bits*>(args.residual_out) + base : nullptr;
  Bits* const norm_out = args.norm_out ? static_cast<Bits*>(args.norm_out) + base : nullptr;
  const Bits* const gamma = static_cast<const Bits*>(args.gamma);

  // Each element's residual is loaded before any output of it is stored
  // (same iteration), and each loop is a plain pass the compiler vectorises.
  if (residual_in != nullptr) {
    for (std::uint32_t i = 0; i < hidden; ++i) {
      const float residual = dtype_bits_to_float(residual_in[i], dtype);
      const float sum = rounded_to<kDtype>(row[i]);
      if (allreduce_out != nullptr) {
        allreduce_out[i] = static_cast<Bits>(to_storage_bits<kDtype>(sum));
      }
      row[i] = rounded_to<kDtype>(sum + residual);
    }
  } else {
    for (std::uint32_t i = 0; i < hidden; ++i) {
      row[i] = rounded_to<kDtype>(row[i]);
      if (allreduce_out != nullptr) {
        allreduce_out[i] = static_cast<Bits>(to_storage_bits<kDtype>(row[i]));
      }
    }
  }
  if (residual_out != nullptr) {
    for (std::uint32_t i = 0; i < hidden; ++i) {
      residual_out[i] = static_cast<Bits>(to_storage_bits<kDtype>(row[i]));
    }
  }
  float partial[kLanes] = {};
  const std::uint32_t whole = hidden - hidden % kLanes;
  for (std::uint32_t first = 0; first < whole; first += kLanes) {
    for (std::uint32_t k = 0; k < kLanes; ++k) partial[k] += row[first + k] * row[first + k];
  }
  for (std::uint32_t i = whole; i < hidden; ++i) partial[i - whole] += row[i] * row[i];
  float sum_of_squares = 0.0f;
  for (std::uint32_t k = 0; k < kLanes; ++k) sum_of_squares += partial[k];
  const float inv_rms = inverse_rms(sum_of_squares, hidden, args.eps);
  const float weight_bias = args.weight_bias;
  for (std::uint32_t i = 0; i < hidden; ++i) {
    row[i] =
        rounded_to<kDtype>(row[i] * inv_rms * (dtype_bits_to_float(gamma[i], dtype) + weight_bias));
  }
  if (norm_out != nullptr) {
    for (std::uint32_t i = 0; i < hidden; ++i) {
      norm_out[i] = static_cast<Bits>(to_storage_bits<kDtype>(row[i]));
    }
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
