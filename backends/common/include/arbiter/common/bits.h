// Raw bit views of floats and the round-to-nearest-even shift that every
// narrowing conversion (fp16, bf16, e4m3) is built from.
#pragma once

#include <cstdint>
#ifndef __CUDA_ARCH__
#include <cstring>
#endif

#include "arbiter/common/host_device.h"

namespace arbiter::common {

ARBITER_HD inline std::uint32_t float_bits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

ARBITER_HD inline float bits_float(std::uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// value / 2^shift rounded to nearest, ties to even.
ARBITER_HD constexpr std::uint32_t shift_right_rne(std::uint32_t value, std::uint32_t shift) {
  if (shift == 0) return value;
  if (shift > 32) return 0;  // value < 2^32 <= 2^(shift-1): below one half
  const std::uint64_t wide = value;
  std::uint64_t quotient = wide >> shift;
  const std::uint64_t remainder = wide & ((std::uint64_t{1} << shift) - 1);
  const std::uint64_t half = std::uint64_t{1} << (shift - 1);
  if (remainder > half || (remainder == half && (quotient & 1))) ++quotient;
  return static_cast<std::uint32_t>(quotient);
}

}  // namespace arbiter::common
