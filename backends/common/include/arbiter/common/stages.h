// Rotations shared by every rank of a workspace; each rank advances its own
// copy identically, so no rank ever has to ask another where it is.
//
// Lamport stages: a call reads stage s, may race a fast peer already writing
// next_stage(s), and resets the stage of the call before it, stage_to_clear(s)
// = (s + 2) % 3. Three stages are the fewest where the three never coincide.
// That holds when every rank polls its own copy of the stages (the GPU
// backends). Where all ranks poll one shared copy (shm), a slow peer may still
// be polling the previous stage, so an owner instead resets its slot of
// next_stage(s) before it publishes stage s: that stage was last read two
// calls ago, and every rank has finished that call.
//
// Barrier flags: a rank arriving at a barrier publishes next_flag(f) and waits
// while any peer still shows f (its value from the previous barrier). A peer
// can be at most one barrier ahead, so three values never alias.
#pragma once

#include <cstdint>

#include "arbiter/common/host_device.h"

namespace arbiter::common {

inline constexpr std::uint32_t kLamportStages = 3;
inline constexpr std::uint32_t kBarrierFlagValues = 3;

ARBITER_HD constexpr std::uint32_t next_stage(std::uint32_t stage) {
  return (stage + 1) % kLamportStages;
}

ARBITER_HD constexpr std::uint32_t stage_to_clear(std::uint32_t stage) {
  return (stage + 2) % kLamportStages;
}

ARBITER_HD constexpr std::uint32_t next_flag(std::uint32_t flag) {
  return (flag + 1) % kBarrierFlagValues;
}

ARBITER_HD constexpr std::uint32_t previous_flag(std::uint32_t flag) {
  return (flag + kBarrierFlagValues - 1) % kBarrierFlagValues;
}

}  // namespace arbiter::common
