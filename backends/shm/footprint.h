// What an shm workspace costs, from its spec alone: the one place that sizes
// it. workspace_create() lays its memory out with layout_for(), and the
// footprint companion reports the same layout, so the two cannot disagree.
#pragma once

#include "arbiter_backend.h"
#include "shared_layout.h"
#include "status.h"

namespace arbiter::shm {

// The checks of a spec that need neither the oob nor the machine: world
// size, dtype, nodes, max_message_bytes. OK, or the reason workspace_create()
// refuses the spec.
Status check_shape(const arbiter_workspace_spec& spec);

// The layout of the workspace a spec gets. REQUIRES: check_shape(spec) ok.
Layout layout_for(const arbiter_workspace_spec& spec);

// The footprint companion's entry (arbiter_backend_footprint_v1_t).
int32_t footprint(const arbiter_workspace_spec* spec, arbiter_footprint* out);

}  // namespace arbiter::shm
