// The fault word of a workspace (SharedHeader::fault): the first fault any
// rank saw, so that every rank's error names the same culprit. Encoded in 32
// bits so that the first fault wins by compare-and-swap from 0:
//   bits 0-7 kind, bits 8-15 culprit rank + 1 (0: unknown), bits 16-23 the
//   rank that saw it.
#pragma once

#include <cstdint>
#include <string>

namespace arbiter::shm {

enum class FaultKind : std::uint32_t {
  kNone = 0,
  kTimeout = 1,  // `reporter` waited past its deadline for `culprit`
  kDied = 2,     // `reporter` saw `culprit`'s process gone (liveness.h)
  kAborted = 3,  // abort() was called on `culprit` (= reporter)
};

struct Fault {
  FaultKind kind = FaultKind::kNone;
  std::int32_t culprit = -1;  // -1: unknown
  std::int32_t reporter = 0;
};

inline std::uint32_t encode_fault(const Fault& f) {
  const std::uint32_t culprit = f.culprit < 0 ? 0u : static_cast<std::uint32_t>(f.culprit) + 1;
  return static_cast<std::uint32_t>(f.kind) | (culprit & 0xFFu) << 8 |
         (static_cast<std::uint32_t>(f.reporter) & 0xFFu) << 16;
}

inline Fault decode_fault(std::uint32_t word) {
  Fault f;
  f.kind = static_cast<FaultKind>(word & 0xFFu);
  f.culprit = static_cast<std::int32_t>((word >> 8) & 0xFFu) - 1;
  f.reporter = static_cast<std::int32_t>((word >> 16) & 0xFFu);
  return f;
}

}  // namespace arbiter::shm
