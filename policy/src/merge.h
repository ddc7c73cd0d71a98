// Layers -> effective Tables, with the checks that need the whole picture:
// conflicting cells, device kinds of preference lists, missing settings.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "arbiter/diagnostic.h"
#include "arbiter/tables.h"
#include "table_layer.h"

namespace arbiter::detail {

// Merges `layers` in order (later wins) and applies ARBITER_BACKENDS.
// Appends diagnostics; returns false on any error.
bool merge_layers(const std::vector<TableLayer>& layers,
                  const std::optional<std::string>& backends_env, Tables& out,
                  std::vector<Diagnostic>& diagnostics);

}  // namespace arbiter::detail
