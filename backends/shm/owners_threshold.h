// From which call size a replicated two-shot with registered outputs copies
// the other slices from their owners' outputs instead of staging them
// (twoshot.cpp). Chosen per workspace at creation from
// ARBITER_SHM_OWNERS_FROM (bytes per rank; the same on every rank, checked).
// From the default, 64 KiB, the owners' path was as fast as staging or
// faster at 2, 4 and 8 ranks on this project's 2-core CI host (2026-12-06,
// wait policy auto), the staged registered two-shot's time over five runs
// (three at 8 ranks): 0.66-1.02x at 64 KiB, 0.71-0.98x from 128 KiB to
// 1 MiB, 0.33-0.84x above. Below it the ranks' extra end barrier weighs more
// than the copy it saves: 0.99-1.30x at 4 KiB at 2 ranks, and with 4 or 8
// ranks sharing the 2 cores 0.74-1.43x at 4-32 KiB. An earlier measurement
// (2026-12-05, before the ranks read small peer rows in place and spun on a
// CPU of their own) had put the start at 4 MiB.
// docs/registered-buffers.md has the command.
#pragma once

#include <cstdint>

#include "status.h"

namespace arbiter::shm {

inline constexpr std::uint64_t kDefaultOwnersFromBytes = std::uint64_t{64} << 10;

// The threshold `request` names: NULL or "" (the default), or a decimal
// byte count with an optional KiB or MiB suffix ("0" takes the owners' path
// at every size). Anything else is an error naming the variable.
Status choose_owners_from(const char* request, std::uint64_t* out);

}  // namespace arbiter::shm
