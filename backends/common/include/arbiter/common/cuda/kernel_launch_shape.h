// The shape of one kernel launch, as a module's host code chose it. Plain C++.
#pragma once

#include <cstdint>

namespace arbiter::common {

struct LaunchShape {
  std::uint32_t grid_blocks = 0;  // a multiple of cluster_size, at most one wave
  std::uint32_t cta_threads = 0;  // even for NVFP4 (block partners share a warp)
  std::uint32_t cluster_size = 1;
  bool pdl = false;  // programmatic dependent launch
};

}  // namespace arbiter::common
