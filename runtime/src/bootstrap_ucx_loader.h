// Loading the UCX side of arbiter::Bootstrap (private).
#pragma once

#include "bootstrap_ucx_abi.h"

namespace arbiter::bootstrap {

// The table of libarbiter_bootstrap_ucx.so, loaded from the folder that holds
// libarbiter_runtime on the first call and kept for the life of the process.
// Throws BootstrapError(ARBITER_UNAVAILABLE) saying what is missing (the
// library, or the UCX it needs) and what to install; a later call tries again.
// Thread-safe.
const arbiter_bootstrap_ucx_v1_t& ucx_library();

}  // namespace arbiter::bootstrap
