// What one backend's workspace costs this rank: the module's own sizing
// (arbiter_backend_v1_footprint), the same function that laid it out.
#pragma once

#include <cstdint>
#include <string>

#include "arbiter/types.h"

namespace arbiter {

struct WorkspaceFootprint {
  Backend backend = Backend::kNone;
  // false: the module predates the footprint companion; the figures are 0.
  bool known = false;
  std::uint64_t device_bytes = 0;  // device memory only this rank maps
  std::uint64_t host_bytes = 0;    // host memory only this rank maps
  std::uint64_t shared_bytes = 0;  // memory peers map too (/dev/shm, IPC, multicast)
  // The largest message one call takes, by Algorithm (0: not offered;
  // UINT64_MAX: any size).
  std::uint64_t max_message_bytes[3] = {0, 0, 0};
  std::string note;  // what is not counted (e.g. NCCL's own buffers); may be ""

  std::uint64_t total_bytes() const { return device_bytes + host_bytes + shared_bytes; }
};

}  // namespace arbiter
