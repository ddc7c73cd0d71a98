// Passing POSIX file descriptors (cuMem POSIX_FILE_DESCRIPTOR handles)
// between the ranks of one host: over abstract Unix sockets with SCM_RIGHTS,
// which needs no ptrace rights (unlike pidfd_getfd) and works in containers
// that share the network namespace. Every wait has the deadline.
#pragma once

#include <cstdint>
#include <vector>

#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::mnnvl {

// Collective over `oob`. Ranks with fd >= 0 offer it; every rank receives
// every other rank's offered fd: (*received)[r] is a new descriptor of rank
// r's (the caller closes it), -1 for ranks that offered none and for itself.
common::Status exchange_fds(const arbiter_oob& oob, int fd, std::vector<int>* received,
                            std::int64_t timeout_ms);

}  // namespace arbiter::mnnvl
