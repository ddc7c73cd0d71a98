// The shape of one kernel launch, as a module's host code chose it, and how a
// module gets it for a call. Plain C++.
#pragma once

#include <cstdint>

#include "arbiter/common/launch_config.h"
#include "arbiter_backend.h"

namespace arbiter::common {

struct LaunchShape {
  std::uint32_t grid_blocks = 0;  // a multiple of cluster_size, at most one wave
  std::uint32_t cta_threads = 0;  // even for NVFP4 (block partners share a warp)
  std::uint32_t cluster_size = 1;
  bool pdl = false;  // programmatic dependent launch
};

// The launch configuration of one call on `world_size` ranks.
inline Result<LaunchConfig> launch_config_for(const arbiter_allreduce_args& a,
                                              std::uint32_t world_size,
                                              const DeviceLimits& limits) {
  LaunchRequest request;
  request.tokens = a.tokens;
  request.hidden = a.hidden;
  request.dtype = a.dtype;
  request.world_size = world_size;
  request.algorithm = a.algorithm;
  request.pattern = a.pattern;
  return choose_launch_config(request, limits);
}

// The launch of `config`, with PDL when the call asks for it (ARBITER_RUN_PDL).
inline LaunchShape launch_shape_of(const LaunchConfig& config, std::uint32_t flags) {
  LaunchShape shape;
  shape.grid_blocks = config.grid_blocks;
  shape.cta_threads = config.cta_threads;
  shape.cluster_size = config.cluster_size;
  shape.pdl = (flags & ARBITER_RUN_PDL) != 0;
  return shape;
}

}  // namespace arbiter::common
