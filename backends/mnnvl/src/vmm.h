// The driver-API path of mnnvl workspaces: cuMem allocations shared as
// FABRIC handles (across nodes of an NVLink domain; needs IMEX) or POSIX file
// descriptors (one host), every rank's memory mapped into one range at a
// uniform stride, and a multicast object created by rank 0 that every rank
// joins and binds its memory to. Each step ends in an agreement round, so a
// failure on any rank fails every rank at the same step, with the reason.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "arbiter/common/status.h"
#include "driver_api.h"
#include "workspace.h"

namespace arbiter::mnnvl {

enum class HandleKind { kFabric, kPosixFd };

const char* handle_kind_name(HandleKind kind);

// Collective. Fills ws.memory, ws.peers (unicast, at the uniform stride) and
// ws.multicast. On failure the caller runs release_memory().
common::Status map_memory(const arbiter_oob& oob, const DriverApi& api, HandleKind kind,
                          std::uint64_t total_bytes, arbiter_workspace& ws);

// Local: undoes whatever map_memory() got to, in reverse order.
void release_memory(const DriverApi& api, arbiter_workspace& ws);

}  // namespace arbiter::mnnvl
