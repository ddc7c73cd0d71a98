// Lets Boost.Test print arbiter's enums in failed checks.
#pragma once

#include <ostream>

#include "arbiter/decision.h"
#include "arbiter/tables.h"
#include "arbiter/types.h"

namespace arbiter {
inline std::ostream& operator<<(std::ostream& o, Backend b) { return o << backend_name(b); }
inline std::ostream& operator<<(std::ostream& o, Algorithm a) { return o << algorithm_name(a); }
inline std::ostream& operator<<(std::ostream& o, Reason r) { return o << reason_name(r); }
inline std::ostream& operator<<(std::ostream& o, Dtype d) { return o << dtype_name(d); }
inline std::ostream& operator<<(std::ostream& o, Pattern p) { return o << pattern_name(p); }
inline std::ostream& operator<<(std::ostream& o, Layer l) { return o << layer_name(l); }
}  // namespace arbiter
