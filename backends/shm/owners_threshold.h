// From which call size a replicated two-shot with registered outputs copies
// the other slices from their owners' outputs instead of staging them
// (twoshot.cpp). Chosen per workspace at creation from
// ARBITER_SHM_OWNERS_FROM (bytes per rank; the same on every rank, checked).
// Below the default, 4 MiB, the owners' path was mostly slower than staging
// on this project's 2-core CI host, five quiet runs: 0.90-1.42x the staged
// registered two-shot up to 256 KiB, 0.65-1.33x from 512 KiB to 2 MiB; at
// 4 MiB 0.54-1.07x (faster in four runs), from 8 MiB 0.34-0.85x (all five).
// docs/registered-buffers.md has the command.
#pragma once

#include <cstdint>

#include "status.h"

namespace arbiter::shm {

inline constexpr std::uint64_t kDefaultOwnersFromBytes = std::uint64_t{4} << 20;

// The threshold `request` names: NULL or "" (the default), or a decimal
// byte count with an optional KiB or MiB suffix ("0" takes the owners' path
// at every size). Anything else is an error naming the variable.
Status choose_owners_from(const char* request, std::uint64_t* out);

}  // namespace arbiter::shm
