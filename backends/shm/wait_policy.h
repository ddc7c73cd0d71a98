// How a rank waits for a peer once a short spin has not seen it
// (backoff.h), chosen per workspace at creation from ARBITER_SHM_WAIT:
//   yield: spin 20 us, then sched_yield until 1 ms, then sleep on a futex.
//     Right for an oversubscribed host (more ranks than CPUs: the awaited
//     rank needs this core), costly on a host with one busy co-tenant:
//     each yield hands the core to it for a time slice.
//   spin: spin with `pause` until 1 ms, then sleep on a futex, never
//     yielding to a peer on another CPU: the core stays with the call, as
//     MPI's ranks keep theirs; a wait past 1 ms still gives the core away.
//   auto (the default): spin while every rank has a CPU of its own (the
//     ranks' united affinity masks and their cgroups' CPU quota: cpu_budget.h),
//     else yield. Open MPI decides the same way: its ranks poll aggressively
//     unless the node is oversubscribed.
// A peer last seen on this rank's own CPU is yielded to at once under both.
#pragma once

#include <cstdint>

#include "status.h"

namespace arbiter::shm {

enum class WaitPolicy { kYield, kSpin };
enum class WaitRequest { kAuto, kYield, kSpin };

// The request `text` names: NULL or "" (the default, auto), "auto", "yield"
// or "spin". Anything else is an error naming the variable and the choices.
Status choose_wait_policy(const char* text, WaitRequest* out);

// What `request` means for `ranks` ranks that can run on `cpus` CPUs at
// once (0: unknown, which yields).
WaitPolicy resolve_wait_policy(WaitRequest request, std::int32_t ranks, std::uint32_t cpus);

}  // namespace arbiter::shm
