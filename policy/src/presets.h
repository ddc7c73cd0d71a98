// The names behind `preset:NAME` (declared for users in arbiter/policy.h).
#pragma once

#include "arbiter/policy.h"

namespace arbiter {

// `preset:NAME` -> NAME; anything else (a file path) -> nullopt.
std::optional<std::string_view> preset_reference(std::string_view source);

}  // namespace arbiter
