// How a rank waits for a peer once a short spin has not seen it
// (backoff.h), chosen per workspace at creation from ARBITER_SHM_WAIT:
//   yield (default): spin 20 us, then sched_yield until 1 ms, then sleep on
//     a futex. Right for an oversubscribed host (more ranks than cores: the
//     awaited rank needs this core), costly on a host with one busy
//     co-tenant: each yield hands the core to it for a time slice.
//   spin: spin with `pause` until 1 ms, then sleep on a futex, never
//     yielding to a peer on another CPU: the core stays with the call, as
//     MPI's ranks keep theirs; a wait past 1 ms still gives the core away.
// A peer last seen on this rank's own CPU is yielded to at once under both.
#pragma once

#include "status.h"

namespace arbiter::shm {

enum class WaitPolicy { kYield, kSpin };

// The policy `request` names: NULL or "" (the default, yield), "yield" or
// "spin". Anything else is an error naming the variable and the choices.
Status choose_wait_policy(const char* request, WaitPolicy* out);

}  // namespace arbiter::shm
