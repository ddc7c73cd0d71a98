// The per-thread message behind the ABI's last_error() for the shm module.
#pragma once

#include <cstdint>

#include "arbiter/common/status.h"

namespace arbiter::shm {

using common::Status;

// Records `status` as this thread's last error (when it is one) and returns
// its code for the ABI.
std::int32_t report(const Status& status);

// This thread's last error message; "" before any failure.
const char* last_error_message();

}  // namespace arbiter::shm
