// fp16 and bf16 storage types and their conversions to and from float, plus
// element access for a dtype known only at run time.
//
// Conversions round to nearest, ties to even, and are exact for subnormals,
// infinities and NaN (a NaN stays a NaN of the same sign). They never depend
// on the FPU's flush-to-zero mode: everything is done on raw bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

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

// Both fp16 conversions compute every case and select, without branches or
// loops, so that loops over them vectorise (the shm backend's kernels).

ARBITER_HD ARBITER_HOST_INLINE inline std::uint16_t float_to_half_bits(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  // Normal: rebias the exponent (127 -> 15) and round away 13 mantissa bits
  // to nearest even; a carry out of the mantissa correctly bumps the exponent.
  const std::uint32_t rebased = magnitude - (112u << 23);
  const std::uint32_t normal = (rebased + 0x0FFFu + ((rebased >> 13) & 1u)) >> 13;
  // Below 2^-14, an fp16 subnormal (or zero) counts units of 2^-24: adding
  // 0.5 (whose ulp is 2^-24) rounds |value| to a whole number of them,
  // ties to even, in the mantissa. A carry into 0x400 is the smallest normal.
  const std::uint32_t subnormal = float_bits(bits_float(magnitude) + 0.5f) - 0x3F000000u;
  // NaN: keep the top payload bits, force quiet.
  const std::uint32_t nan = 0x7E00u | ((magnitude >> 13) & 0x03FFu);
  std::uint32_t out = magnitude < 0x38800000u ? subnormal : normal;
  // 65520 (halfway between 65504 and 2^16) and above round to infinity.
  out = magnitude >= 0x477FF000u ? 0x7C00u : out;
  out = magnitude > 0x7F800000u ? nan : out;
  return static_cast<std::uint16_t>(sign | out);
}

ARBITER_HD ARBITER_HOST_INLINE inline float half_bits_to_float(std::uint16_t half) {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1Fu;
  const std::uint32_t mantissa = half & 0x03FFu;
  const std::uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
  const std::uint32_t special = 0x7F800000u | (mantissa << 13);  // infinity, NaN
  // Subnormal or zero: mantissa x 2^-24, exact (a normal float).
  const std::uint32_t subnormal = float_bits(static_cast<float>(mantissa) * 0x1p-24f);
  std::uint32_t magnitude = exponent == 0 ? subnormal : normal;
  magnitude = exponent == 0x1Fu ? special : magnitude;
  return bits_float(sign | magnitude);
}

ARBITER_HD ARBITER_HOST_INLINE inline std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: truncate, force quiet
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  // Adding 0x7FFF plus the lowest kept bit rounds ties to even; overflow
  // carries into the exponent and ends at infinity as it should.
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

ARBITER_HD ARBITER_HOST_INLINE inline float bf16_bits_to_float(std::uint16_t bf16) {
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

// Host code: calls body(std::integral_constant<arbiter_dtype, D>{}) for the
// runtime `dtype` (anything but fp16 and bf16 as fp32: callers have checked
// it), so that a template over the dtype is instantiated once per dtype.
template <class Body>
decltype(auto) with_dtype(arbiter_dtype dtype, Body&& body) {
  switch (dtype) {
    case ARBITER_DTYPE_FP16:
      return body(std::integral_constant<arbiter_dtype, ARBITER_DTYPE_FP16>{});
    case ARBITER_DTYPE_BF16:
      return body(std::integral_constant<arbiter_dtype, ARBITER_DTYPE_BF16>{});
    default:
      return body(std::integral_constant<arbiter_dtype, ARBITER_DTYPE_FP32>{});
  }
}

// The storage bits of `value` in `dtype` (16-bit types in the low half).
ARBITER_HD ARBITER_HOST_INLINE inline std::uint32_t float_to_dtype_bits(float value,
                                                                        arbiter_dtype dtype) {
  switch (dtype) {
    case ARBITER_DTYPE_FP16:
      return float_to_half_bits(value);
    case ARBITER_DTYPE_BF16:
      return float_to_bf16_bits(value);
    default:
      return float_bits(value);
  }
}

ARBITER_HD ARBITER_HOST_INLINE inline float dtype_bits_to_float(std::uint32_t bits,
                                                                arbiter_dtype dtype) {
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
