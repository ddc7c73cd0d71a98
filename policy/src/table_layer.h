// One parsed table file (or override fragment) before merging: every key is
// optional, and each value remembers where it was written.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/diagnostic.h"
#include "arbiter/tables.h"

namespace arbiter::detail {

struct Pos {
  std::uint32_t line = 0;
  std::uint32_t column = 0;
};

template <class T>
struct Set {
  std::optional<T> value;
  Pos pos;
  bool has() const { return value.has_value(); }
};

struct LayerCell {
  Cell cell;  // cell.origin unused here
  Pos pos;
};

struct BackendLayer {
  bool present = false;
  Pos pos;
  BackendRules rules;  // only fields with set[f] are meaningful
  std::array<bool, BackendRules::kFieldCount> set{};
  std::array<Pos, BackendRules::kFieldCount> field_pos{};
};

struct TableLayer {
  std::string file;
  Layer layer = Layer::kSite;
  Set<int> format;
  std::vector<std::string> provenance;  // "key: text"
  Set<std::uint32_t> enabled;           // mask
  std::array<Set<Backend>, kDeviceKindCount> fallback;
  std::array<Set<std::vector<Backend>>, kTopologyCount> preference;
  std::array<BackendLayer, kBackendCount> backends;
  std::vector<LayerCell> fusion;
  std::vector<LayerCell> oneshot;
  Set<Algorithm> oneshot_default;
};

// Reads a table from text. On errors, appends diagnostics and returns false
// (the layer is then unusable). Warnings may be appended either way.
bool parse_table(std::string_view bytes, const std::string& file, Layer layer, TableLayer& out,
                 std::vector<Diagnostic>& diagnostics);

}  // namespace arbiter::detail
