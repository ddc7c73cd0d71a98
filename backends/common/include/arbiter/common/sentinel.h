// The Lamport "not yet written" marker: negative zero of the payload dtype.
//
// A one-shot buffer starts as -0.0 everywhere; a reader knows a peer's element
// has arrived when it is no longer -0.0. So a payload must never be -0.0
// (senders sanitise it to +0.0, the same value), and readiness is always
// decided on raw bits: a float compare under flush-to-zero turns a negative
// subnormal into -0.0 and the reader waits forever (the GB200 hang).
#pragma once

#include <cstdint>

#include "arbiter/common/host_device.h"
#include "arbiter_backend.h"

namespace arbiter::common {

inline constexpr std::uint32_t kNegativeZeroBits32 = 0x80000000u;
inline constexpr std::uint16_t kNegativeZeroBits16 = 0x8000u;

// The sentinel of one element of `dtype` (16-bit types in the low half).
ARBITER_HD constexpr std::uint32_t negative_zero_bits(arbiter_dtype dtype) {
  return dtype == ARBITER_DTYPE_FP32 ? kNegativeZeroBits32 : kNegativeZeroBits16;
}

ARBITER_HD constexpr bool is_negative_zero_bits(std::uint32_t bits, arbiter_dtype dtype) {
  return bits == negative_zero_bits(dtype);
}

// +0.0 for -0.0, every other pattern (negative subnormals, NaN) unchanged.
ARBITER_HD constexpr std::uint16_t sanitize_bits16(std::uint16_t bits) {
  return bits == kNegativeZeroBits16 ? std::uint16_t{0} : bits;
}

ARBITER_HD constexpr std::uint32_t sanitize_bits32(std::uint32_t bits) {
  return bits == kNegativeZeroBits32 ? 0u : bits;
}

ARBITER_HD constexpr std::uint32_t sanitize_bits(std::uint32_t bits, arbiter_dtype dtype) {
  return is_negative_zero_bits(bits, dtype) ? 0u : bits;
}

}  // namespace arbiter::common
