// FP8 e4m3fn (the "fn" variant: no infinities, one NaN pattern per sign,
// largest finite 448) to and from float.
//
// float -> e4m3 rounds to nearest even and saturates like PTX
// `cvt.rn.satfinite.e4m3x2.f32`: anything beyond +-448, infinities included,
// becomes +-448; NaN becomes the NaN pattern 0x7F.
#pragma once

#include <cstdint>

#include "arbiter/common/bits.h"
#include "arbiter/common/host_device.h"

namespace arbiter::common {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr std::uint8_t kE4m3MaxBits = 0x7E;
inline constexpr std::uint8_t kE4m3NanBits = 0x7F;

ARBITER_HD inline std::uint8_t float_to_e4m3(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint8_t sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return kE4m3NanBits;
  if (magnitude >= 0x43E00000u) return sign | kE4m3MaxBits;  // >= 448 (and inf)
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent >= 121) {  // >= 2^-6: normal; rebias 127 -> 7, keep 3 mantissa bits
    // The largest result is 448 itself: values below it never round past it.
    return sign | static_cast<std::uint8_t>(shift_right_rne(magnitude - (120u << 23), 20));
  }
  if (exponent == 0) return sign;  // float zero or subnormal
  // Subnormal e4m3: units of 2^-9. value = mantissa * 2^(exponent-150).
  const std::uint32_t mantissa = (magnitude & 0x007FFFFFu) | 0x00800000u;
  return sign | static_cast<std::uint8_t>(shift_right_rne(mantissa, 141 - exponent));
}

ARBITER_HD inline float e4m3_to_float(std::uint8_t code) {
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  const std::uint32_t exponent = (code >> 3) & 0x0Fu;
  std::uint32_t mantissa = code & 0x07u;
  if ((code & 0x7Fu) == kE4m3NanBits) return bits_float(sign | 0x7FC00000u);
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    std::uint32_t float_exponent = 121;  // 2^-6, the smallest normal
    while ((mantissa & 0x08u) == 0) {
      mantissa <<= 1;
      --float_exponent;
    }
    return bits_float(sign | (float_exponent << 23) | ((mantissa & 0x07u) << 20));
  }
  return bits_float(sign | ((exponent + 120) << 23) | (mantissa << 20));
}

}  // namespace arbiter::common
