// Presets: upstream tables shipped with arbiter (configs/presets/), embedded
// in the library, named `preset:NAME` wherever a table file is taken.
#include "presets.h"

namespace arbiter {
namespace detail {
struct EmbeddedPreset {
  std::string_view name;
  std::string_view bytes;
};
const EmbeddedPreset* embedded_preset_table(std::size_t* count);  // embedded_presets.cpp
}  // namespace detail

std::vector<std::string> preset_names() {
  std::size_t count = 0;
  const detail::EmbeddedPreset* table = detail::embedded_preset_table(&count);
  std::vector<std::string> names{std::string(kDefaultPreset)};
  for (std::size_t i = 0; i < count; ++i) names.emplace_back(table[i].name);
  return names;
}

std::optional<std::string_view> embedded_preset(std::string_view name) {
  std::size_t count = 0;
  const detail::EmbeddedPreset* table = detail::embedded_preset_table(&count);
  for (std::size_t i = 0; i < count; ++i) {
    if (table[i].name == name) return table[i].bytes;
  }
  return std::nullopt;
}

std::optional<std::string_view> preset_reference(std::string_view source) {
  if (source.substr(0, kPresetPrefix.size()) != kPresetPrefix) return std::nullopt;
  return source.substr(kPresetPrefix.size());
}

}  // namespace arbiter
