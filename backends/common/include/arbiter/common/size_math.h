// Overflow-checked 64-bit size arithmetic for workspace layouts. Every rank
// computes the same sizes from the same spec; a spec whose sizes do not fit
// in 64 bits is refused instead of wrapping into a small allocation that the
// kernels then overrun.
#pragma once

#include <cstdint>

#include "arbiter/common/host_device.h"

namespace arbiter::common {

// a * b, or false (and *out unchanged) when it does not fit in 64 bits.
ARBITER_HD constexpr bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  if (a != 0 && b > ~std::uint64_t{0} / a) return false;
  *out = a * b;
  return true;
}

// a + b, or false (and *out unchanged) when it does not fit in 64 bits.
ARBITER_HD constexpr bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  if (b > ~std::uint64_t{0} - a) return false;
  *out = a + b;
  return true;
}

// REQUIRES: multiple > 0 and value + multiple - 1 fits in 64 bits.
ARBITER_HD constexpr std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// value rounded up to a multiple of `multiple`, or false when that does not
// fit in 64 bits. REQUIRES: multiple > 0.
ARBITER_HD constexpr bool checked_round_up(std::uint64_t value, std::uint64_t multiple,
                                           std::uint64_t* out) {
  const std::uint64_t remainder = value % multiple;
  if (remainder == 0) {
    *out = value;
    return true;
  }
  return checked_add(value, multiple - remainder, out);
}

// ceil(a / b). REQUIRES: b > 0.
ARBITER_HD constexpr std::uint64_t div_round_up(std::uint64_t a, std::uint64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

}  // namespace arbiter::common
