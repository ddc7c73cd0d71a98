// fp16 and bf16 storage types and their conversions to and from float, plus
// element access for a dtype known only at run time.
//
// Conversions round to nearest, ties to even, and are exact for subnormals,
// infinities and NaN (a NaN stays a NaN of the same sign). They never depend
// on the FPU's flush-to-zero mode: everything is done on raw bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "arbiter/common/bits.h"
#include "arbiter/common/host_device.h"
#include "arbiter_backend.h"

namespace arbiter::common {

// IEEE binary16 and bfloat16 as raw bits, so host code needs no CUDA headers.
struct Half {
  std::uint16_t bits;
};
struct Bfloat16 {
  std::uint16_t bits;
};

ARBITER_HD inline std::uint16_t float_to_half_bits(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {  // NaN: keep the top payload bits, force quiet
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x03FFu));
  }
  // 65520 (halfway between 65504 and 2^16) and above round to infinity.
  if (magnitude >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (magnitude < 0x38800000u) {  // below 2^-14: an fp16 subnormal (or zero)
    const std::uint32_t exponent = magnitude >> 23;
    if (exponent == 0) return sign;  // float zero or subnormal: far below 2^-25
    const std::uint32_t mantissa = (magnitude & 0x007FFFFFu) | 0x00800000u;
    // value = mantissa * 2^(exponent-150); in units of 2^-24 that is
    // mantissa / 2^(126-exponent). A carry into 0x400 is the smallest normal.
    return static_cast<std::uint16_t>(sign | shift_right_rne(mantissa, 126 - exponent));
  }
  // Normal: rebias the exponent (127 -> 15) and round away 13 mantissa bits;
  // a carry out of the mantissa correctly bumps the exponent.
  const std::uint32_t rebased = magnitude - (112u << 23);
  return static_cast<std::uint16_t>(sign | shift_right_rne(rebased, 13));
}

ARBITER_HD inline float half_bits_to_float(std::uint16_t half) {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1Fu;
  std::uint32_t mantissa = half & 0x03FFu;
  if (exponent == 0x1F) return bits_float(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // Subnormal: normalise; every fp16 subnormal is a normal float.
    std::uint32_t float_exponent = 113;
    while ((mantissa & 0x0400u) == 0) {
      mantissa <<= 1;
      --float_exponent;
    }
    return bits_float(sign | (float_exponent << 23) | ((mantissa & 0x03FFu) << 13));
  }
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

ARBITER_HD inline std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: truncate, force quiet
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  // Adding 0x7FFF plus the lowest kept bit rounds ties to even; overflow
  // carries into the exponent and ends at infinity as it should.
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

ARBITER_HD inline float bf16_bits_to_float(std::uint16_t bf16) {
  return bits_float(static_cast<std::uint32_t>(bf16) << 16);
}

ARBITER_HD inline Half to_half(float value) { return Half{float_to_half_bits(value)}; }
ARBITER_HD inline Bfloat16 to_bf16(float value) { return Bfloat16{float_to_bf16_bits(value)}; }
ARBITER_HD inline float to_float(Half value) { return half_bits_to_float(value.bits); }
ARBITER_HD inline float to_float(Bfloat16 value) { return bf16_bits_to_float(value.bits); }

ARBITER_HD constexpr std::size_t dtype_size(arbiter_dtype dtype) {
  return dtype == ARBITER_DTYPE_FP32 ? 4 : 2;
}

ARBITER_HD constexpr bool is_valid_dtype(std::int64_t dtype) {
  return dtype == ARBITER_DTYPE_FP16 || dtype == ARBITER_DTYPE_BF16 || dtype == ARBITER_DTYPE_FP32;
}

// The storage bits of `value` in `dtype` (16-bit types in the low half).
ARBITER_HD inline std::uint32_t float_to_dtype_bits(float value, arbiter_dtype dtype) {
  switch (dtype) {
    case ARBITER_DTYPE_FP16:
      return float_to_half_bits(value);
    case ARBITER_DTYPE_BF16:
      return float_to_bf16_bits(value);
    default:
      return float_bits(value);
  }
}

ARBITER_HD inline float dtype_bits_to_float(std::uint32_t bits, arbiter_dtype dtype) {
  switch (dtype) {
    case ARBITER_DTYPE_FP16:
      return half_bits_to_float(static_cast<std::uint16_t>(bits));
    case ARBITER_DTYPE_BF16:
      return bf16_bits_to_float(static_cast<std::uint16_t>(bits));
    default:
      return bits_float(bits);
  }
}

// What storing `value` as `dtype` and loading it back gives.
ARBITER_HD inline float round_to_dtype(float value, arbiter_dtype dtype) {
  return dtype == ARBITER_DTYPE_FP32
             ? value
             : dtype_bits_to_float(float_to_dtype_bits(value, dtype), dtype);
}

// REQUIRES: base is aligned to dtype_size(dtype).
ARBITER_HD inline std::uint32_t load_bits(const void* base, std::size_t index,
                                          arbiter_dtype dtype) {
  if (dtype == ARBITER_DTYPE_FP32) return static_cast<const std::uint32_t*>(base)[index];
  return static_cast<const std::uint16_t*>(base)[index];
}

ARBITER_HD inline void store_bits(void* base, std::size_t index, arbiter_dtype dtype,
                                  std::uint32_t bits) {
  if (dtype == ARBITER_DTYPE_FP32) {
    static_cast<std::uint32_t*>(base)[index] = bits;
  } else {
    static_cast<std::uint16_t*>(base)[index] = static_cast<std::uint16_t>(bits);
  }
}

ARBITER_HD inline float load_element(const void* base, std::size_t index, arbiter_dtype dtype) {
  return dtype_bits_to_float(load_bits(base, index, dtype), dtype);
}

ARBITER_HD inline void store_element(void* base, std::size_t index, arbiter_dtype dtype,
                                     float value) {
  store_bits(base, index, dtype, float_to_dtype_bits(value, dtype));
}

}  // namespace arbiter::common
