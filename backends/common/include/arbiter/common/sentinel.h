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

// Packed forms for moving 64-bit words (four 16-bit or two 32-bit lanes).

// A word whose every lane is the sentinel: what a buffer is filled with.
ARBITER_HD constexpr std::uint64_t negative_zero_word(arbiter_dtype dtype) {
  return dtype == ARBITER_DTYPE_FP32 ? 0x8000000080000000ull : 0x8000800080008000ull;
}

// True when any lane of `word` is still the sentinel.
ARBITER_HD constexpr bool word_has_negative_zero(std::uint64_t word, arbiter_dtype dtype) {
  if (dtype == ARBITER_DTYPE_FP32) {
    return static_cast<std::uint32_t>(word) == kNegativeZeroBits32 ||
           static_cast<std::uint32_t>(word >> 32) == kNegativeZeroBits32;
  }
  for (int lane = 0; lane < 4; ++lane) {
    if (static_cast<std::uint16_t>(word >> (16 * lane)) == kNegativeZeroBits16) return true;
  }
  return false;
}

// Every sentinel lane of `word` replaced by +0.0.
ARBITER_HD constexpr std::uint64_t sanitize_word(std::uint64_t word, arbiter_dtype dtype) {
  const int lane_bits = dtype == ARBITER_DTYPE_FP32 ? 32 : 16;
  const std::uint64_t lane_mask = dtype == ARBITER_DTYPE_FP32 ? 0xFFFFFFFFull : 0xFFFFull;
  const std::uint64_t sentinel = negative_zero_bits(dtype);
  std::uint64_t result = word;
  for (int shift = 0; shift < 64; shift += lane_bits) {
    if (((word >> shift) & lane_mask) == sentinel) result &= ~(lane_mask << shift);
  }
  return result;
}

}  // namespace arbiter::common
