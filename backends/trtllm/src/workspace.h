// One rank's trtllm workspace: its own allocation (workspace_layout.h), every
// peer's allocation mapped into this process, and what the launcher needs to
// know about the device. Created and destroyed collectively (workspace.cpp).
#pragma once

#include <cstdint>

#include "arbiter/common/fused_module.h"
#include "arbiter/common/status.h"
#include "arbiter/trtllm/workspace_layout.h"
#include "arbiter_backend.h"
#include "kernel_params.h"
#include "registered.h"

struct arbiter_workspace : arbiter::common::FusedRank {
  arbiter::trtllm::WorkspaceLayout layout;
  char* base = nullptr;  // this rank's allocation
  char* peers[arbiter::trtllm::kMaxRanks] = {};
  bool ipc_opened[arbiter::trtllm::kMaxRanks] = {};    // mappings to close on destroy
  bool same_process[arbiter::trtllm::kMaxRanks] = {};  // peers used by plain pointer (and self)
  arbiter::trtllm::RegisteredMemory registered;        // freed with the workspace
};

namespace arbiter::trtllm {

// Collective over `oob`. On failure every rank gets a non-OK Status with the
// reason and nothing is left allocated or mapped.
common::Status create_workspace(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                                arbiter_workspace& ws);

// Collective: waits for this rank's device, then for every rank, unmaps the
// peers and frees the allocation and the registered memory left. Never fails; a lost peer only
// shortens it. After abort() it is local: it waits on no peer.
void destroy_workspace(arbiter_workspace& ws);

}  // namespace arbiter::trtllm
