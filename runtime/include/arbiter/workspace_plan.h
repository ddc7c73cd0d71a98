// Which workspaces a communicator makes, and the spec each is created with,
// from the tables and the options alone (no device, no peers, no module).
// The communicator creates its workspaces from this plan and `arbiter
// footprint` sizes the same plan, so the two cannot disagree.
#pragma once

#include <cstdint>
#include <vector>

#include "arbiter/communicator.h"
#include "arbiter/policy.h"
#include "arbiter_backend.h"

namespace arbiter {

// The most a fallback workspace holds per call; larger calls run in slices.
inline constexpr std::uint64_t kFallbackSliceBytes = std::uint64_t{16} << 20;

struct PlannedWorkspace {
  Backend backend = Backend::kNone;
  bool fallback = false;  // the capability's fallback (takes any size, in slices)
  bool allowed = false;   // the tables may pick it (`enabled:`, ARBITER_BACKENDS)
  // As workspace_create() gets it, but for rank (0), device (options.device)
  // and timeout_ms (0); pattern_mask is every pattern asked for (the
  // communicator narrows it to what the module runs).
  arbiter_workspace_spec spec{};
};

struct WorkspacePlan {
  std::uint32_t asked_patterns = 0;  // bit (1 << Pattern)
  std::uint64_t fused_cap = 0;       // the largest cap among them; 0: nothing fused
  Topology topology = Topology::kSingleNode;
  // In the communicator's order: the topology's preference list (when
  // anything is fused), then the fallback.
  std::vector<PlannedWorkspace> workspaces;
};

// The request of a call with `pattern` on a communicator of `world_size`
// ranks created with `options`, before the call's own size and flags.
// Inline: the communicator builds one per call.
inline Request request_of(const CommunicatorOptions& options, std::uint32_t world_size,
                          Pattern pattern) {
  Request r;
  r.capability = options.capability;
  r.world_size = world_size;
  r.nodes = options.nodes;
  r.nvlink_domain = options.nvlink_domain;
  r.multicast = options.multicast;
  r.dtype = options.dtype;
  r.pattern = pattern;
  return r;
}

// REQUIRES: options.pattern_mask names only patterns (0: all of them).
WorkspacePlan plan_workspaces(const Policy& policy, const CommunicatorOptions& options,
                              std::uint32_t world_size);

}  // namespace arbiter
