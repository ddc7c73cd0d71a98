// One rank's mnnvl workspace: its own memory (workspace_layout.h), every
// peer's memory mapped into one reserved range at a uniform stride, and the
// multicast mapping that reaches all of them with one store. In loopback
// mode (every rank in this process, on one GPU) the memory is plain device
// allocations and there is no multicast mapping. Created and destroyed
// collectively (workspace.cpp).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "arbiter/common/fused_module.h"
#include "arbiter/common/status.h"
#include "arbiter/mnnvl/workspace_layout.h"
#include "arbiter_backend.h"
#include "kernel_params.h"

// What the driver-API path holds, released in reverse order on destroy.
struct MnnvlMemory {
  std::uint64_t granularity = 0;       // of both the allocation and the multicast object
  std::uint64_t allocation_bytes = 0;  // the layout's total, rounded to the granularity
  CUmemGenericAllocationHandle local = 0;
  bool local_created = false;
  CUmemGenericAllocationHandle imported[arbiter::mnnvl::kMaxRanks] = {};
  bool imported_valid[arbiter::mnnvl::kMaxRanks] = {};
  CUdeviceptr range = 0;  // world_size x allocation_bytes, every rank's memory at r x stride
  bool range_reserved = false;
  bool mapped[arbiter::mnnvl::kMaxRanks] = {};
  CUmemGenericAllocationHandle multicast = 0;
  bool multicast_valid = false;
  bool multicast_added = false;
  bool multicast_bound = false;
  CUdeviceptr multicast_va = 0;
  bool multicast_reserved = false;
  bool multicast_mapped = false;
};

struct arbiter_workspace : arbiter::common::FusedRank {
  arbiter::mnnvl::WorkspaceLayout layout;
  bool loopback = false;
  char* loopback_base = nullptr;  // loopback: this rank's cudaMalloc
  MnnvlMemory memory;             // otherwise
  char* peers[arbiter::mnnvl::kMaxRanks] = {};
  char* multicast = nullptr;
};

namespace arbiter::mnnvl {

common::Status create_workspace(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                                arbiter_workspace& ws);

void destroy_workspace(arbiter_workspace& ws);

}  // namespace arbiter::mnnvl
