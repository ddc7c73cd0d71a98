// Loading: read every layer, merge, validate, compile. All or nothing.
#include "arbiter/policy.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "arbiter/size.h"
#include "compiled.h"
#include "merge.h"
#include "presets.h"
#include "table_layer.h"

namespace arbiter {
namespace detail {
std::string_view default_yaml_bytes();  // generated from configs/default.yaml
}

namespace {

constexpr const char* kDefaultName = "default.yaml";
constexpr std::size_t kMaxTableFileBytes = 16 * 1024 * 1024;

bool read_file(const std::string& path, std::string& out, std::vector<Diagnostic>& diagnostics) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    diagnostics.push_back({Severity::kError, path, 0, 0, "is a directory, not a table file",
                           "give the path of a .yaml file"});
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    diagnostics.push_back(
        {Severity::kError, path, 0, 0, "cannot open the file", "check the path given"});
    return false;
  }
  // Read at most one byte past the limit, so /dev/zero or an endless pipe
  // ends in an error instead of filling memory.
  out.clear();
  char buffer[65536];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    out.append(buffer, static_cast<std::size_t>(in.gcount()));
    if (out.size() > kMaxTableFileBytes) {
      diagnostics.push_back(
          {Severity::kError, path, 0, 0, "the file is larger than 16 MiB; not a tuning table", ""});
      return false;
    }
  }
  if (in.bad()) {
    diagnostics.push_back({Severity::kError, path, 0, 0, "cannot read the file", ""});
    return false;
  }
  return true;
}

// The embedded default, parsed once per process: the text never changes,
// and parsing it was most of the cost of every load.
struct DefaultLayer {
  bool ok = false;
  detail::TableLayer layer;
  std::vector<Diagnostic> diagnostics;  // none for a default that passed its tests
};
const DefaultLayer& default_layer() {
  static const DefaultLayer parsed = [] {
    DefaultLayer d;
    d.ok = detail::parse_table(detail::default_yaml_bytes(), kDefaultName, Layer::kDefault, d.layer,
                               d.diagnostics);
    return d;
  }();
  return parsed;
}

// Appends the default layer to `layers`; false when it is unusable.
bool add_default_layer(std::vector<detail::TableLayer>& layers,
                       std::vector<Diagnostic>& diagnostics) {
  const DefaultLayer& d = default_layer();
  diagnostics.insert(diagnostics.end(), d.diagnostics.begin(), d.diagnostics.end());
  if (d.ok) layers.push_back(d.layer);
  return d.ok;
}

// Typed overrides become one more layer.
detail::TableLayer layer_from_cells(const Overrides& o) {
  detail::TableLayer layer;
  layer.file = "<override>";
  layer.layer = Layer::kOverride;
  std::uint32_t n = 0;
  for (const Overrides::CellOverride& c : o.cells()) {
    detail::LayerCell lc;
    lc.cell.key = c.key;
    lc.cell.off = !c.bytes.has_value();
    lc.cell.max_bytes = c.bytes.value_or(0);
    lc.pos = {++n, 0};  // the n-th override, for the trace
    (c.fusion ? layer.fusion : layer.oneshot).push_back(lc);
  }
  return layer;
}

// Checks typed overrides as strictly as a file would be checked.
void check_override_cells(const Overrides& o, std::vector<Diagnostic>& diagnostics) {
  std::uint32_t n = 0;
  for (const Overrides::CellOverride& c : o.cells()) {
    ++n;
    auto bad = [&](std::string msg) {
      diagnostics.push_back({Severity::kError, "<override>", n, 0, std::move(msg), ""});
    };
    if (c.key.world_size < 2 || c.key.world_size > kMaxWorldSize) {
      bad("world size " + std::to_string(c.key.world_size) + " is outside 2.." +
          std::to_string(kMaxWorldSize));
    }
    if (!c.key.capability.is_cpu() && (c.key.capability.code() < Capability::kMinSm ||
                                       c.key.capability.code() > Capability::kMaxSm)) {
      bad("capability " + std::to_string(c.key.capability.code()) + " is outside " +
          std::to_string(Capability::kMinSm) + ".." + std::to_string(Capability::kMaxSm) +
          " (and not cpu)");
    }
    if (c.key.nodes > c.key.world_size) bad("nodes above world size");
    if (c.key.residual && c.key.pattern == Pattern::kAllreduce) {
      bad("the cell never applies: pattern allreduce has no residual (drop the residual key, or "
          "key the cell by a residual pattern)");
    }
    if (!c.fusion && c.key.nodes != 0) bad("one-shot cells are not keyed by nodes");
    if (c.bytes && (*c.bytes == 0 || *c.bytes > kMaxSizeBytes)) {
      bad("size " + std::to_string(*c.bytes) + " bytes is outside 1 B .. 1 TiB");
    }
    if (!c.fusion && !c.bytes) bad("one-shot cells cannot be off");
  }
}

}  // namespace

Overrides& Overrides::fusion_cap(const CellKey& key, std::optional<std::uint64_t> bytes) {
  cells_.push_back({key, true, bytes});
  return *this;
}
Overrides& Overrides::oneshot_cap(const CellKey& key, std::uint64_t bytes) {
  cells_.push_back({key, false, bytes});
  return *this;
}
Overrides& Overrides::yaml(std::string name, std::string text) {
  fragments_.emplace_back(std::move(name), std::move(text));
  return *this;
}

LoadOptions LoadOptions::from_environment() {
  LoadOptions o;
  if (const char* config = std::getenv("ARBITER_CONFIG"); config && *config) {
    // ':'-separated, like PATH; `preset:NAME` keeps its own colon.
    const std::string_view preset_word = kPresetPrefix.substr(0, kPresetPrefix.size() - 1);
    std::string_view rest = config;
    bool preset = false;
    while (!rest.empty()) {
      const auto colon = rest.find(':');
      std::string_view item = rest.substr(0, colon);
      if (preset) {
        o.site_files.push_back(std::string(kPresetPrefix) + std::string(item));
        preset = false;
      } else if (item == preset_word && colon != std::string_view::npos) {
        preset = true;
      } else if (!item.empty()) {
        o.site_files.emplace_back(item);
      }
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
    // `preset:` last, with no name: kept, so the load names it and lists
    // the presets (dropped, the job ran on the default tables silently).
    if (preset) o.site_files.emplace_back(kPresetPrefix);
  }
  if (const char* backends = std::getenv("ARBITER_BACKENDS"); backends && *backends) {
    o.backends_env = backends;
  }
  return o;
}

std::string_view embedded_default_yaml() { return detail::default_yaml_bytes(); }

Policy::Policy(std::shared_ptr<const detail::Compiled> impl)
    : impl_(std::move(impl)),
      shape_of_(impl_->shape_of.data()),
      routes_(impl_->routes.data()),
      stride_(impl_->fusion.stride) {}

namespace {

// One site source: a file, or `preset:NAME` (presets.h). False, with a
// diagnostic, when it cannot be read. `*is_default`: `preset:default`, the
// embedded default itself, which adds no layer over it.
bool read_source(const std::string& source, std::string& bytes, std::string& name, bool* is_default,
                 std::vector<Diagnostic>& diagnostics) {
  *is_default = false;
  name = source;
  const std::optional<std::string_view> preset = preset_reference(source);
  if (!preset) return read_file(source, bytes, diagnostics);
  if (*preset == kDefaultPreset) {
    *is_default = true;
    bytes = std::string(embedded_default_yaml());
    name = kDefaultName;
    return true;
  }
  if (const std::optional<std::string_view> text = embedded_preset(*preset)) {
    bytes = std::string(*text);
    name = "presets/" + std::string(*preset) + ".yaml";
    return true;
  }
  std::string known;
  for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  diagnostics.push_back({Severity::kError, source, 0, 0,
                         "no preset named '" + std::string(*preset) + "'",
                         "presets shipped with this arbiter: " + known +
                             " (configs/presets/); give a file's path for any other table"});
  return false;
}

}  // namespace

LoadResult Policy::load(const LoadOptions& options) {
  LoadResult result;
  std::vector<detail::TableLayer> layers;
  bool ok = true;
  auto add = [&](std::string_view bytes, const std::string& name, Layer layer) {
    detail::TableLayer parsed;
    if (detail::parse_table(bytes, name, layer, parsed, result.diagnostics)) {
      layers.push_back(std::move(parsed));
    } else {
      ok = false;
    }
  };
  if (options.with_default && !add_default_layer(layers, result.diagnostics)) ok = false;
  for (const std::string& source : options.site_files) {
    std::string bytes, name;
    bool is_default = false;
    if (!read_source(source, bytes, name, &is_default, result.diagnostics)) {
      ok = false;
    } else if (is_default) {
      // Already the bottom layer; standalone, it is the whole table.
      if (!options.with_default && !add_default_layer(layers, result.diagnostics)) ok = false;
    } else {
      add(bytes, name, Layer::kSite);
    }
  }
  for (const auto& [name, text] : options.overrides.fragments()) {
    add(text, name, Layer::kOverride);
  }
  if (!options.overrides.cells().empty()) {
    const std::size_t before = result.diagnostics.size();
    check_override_cells(options.overrides, result.diagnostics);
    if (result.diagnostics.size() != before) ok = false;
    layers.push_back(layer_from_cells(options.overrides));
  }
  if (!ok) return result;  // all or nothing: no policy from a partial read
  if (layers.empty()) {
    result.diagnostics.push_back(
        {Severity::kError, "tables", 0, 0, "no tables to load", "load the default or a file"});
    return result;
  }
  auto compiled = std::make_shared<detail::Compiled>();
  if (!detail::merge_layers(layers, options.backends_env, compiled->tables, result.diagnostics)) {
    return result;
  }
  detail::compile(*compiled);
  for (const Diagnostic& d : result.diagnostics) {
    if (d.severity == Severity::kWarning) compiled->warnings.push_back(d);
  }
  result.policy = Policy(std::move(compiled));
  return result;
}

Policy Policy::load_or_throw(const LoadOptions& options) {
  LoadResult r = load(options);
  if (!r.policy) throw LoadError(std::move(r.diagnostics));
  return *std::move(r.policy);
}

Policy Policy::from_environment() { return load_or_throw(LoadOptions::from_environment()); }

Policy Policy::without_backends(std::uint32_t mask) const {
  if ((impl_->tables.allowed_mask & mask) == 0) return *this;
  auto compiled = std::make_shared<detail::Compiled>();
  compiled->tables = impl_->tables;
  compiled->tables.allowed_mask &= ~mask;
  compiled->warnings = impl_->warnings;
  detail::compile(*compiled);
  compiled->fingerprint = impl_->fingerprint;
  return Policy(std::move(compiled));
}

std::uint64_t Policy::fingerprint() const noexcept { return impl_->fingerprint; }

std::string Policy::fingerprint_hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(impl_->fingerprint));
  return buf;
}

const Tables& Policy::tables() const { return impl_->tables; }
const Origin& Policy::origin(std::uint16_t id) const { return impl_->tables.origins.at(id); }
const std::vector<Diagnostic>& Policy::warnings() const { return impl_->warnings; }

std::string Policy::origin_text(std::uint16_t id) const {
  const Origin* o = impl_->tables.find_origin(id);
  if (!o) return "-";
  std::string s = o->file;
  if (o->line != 0) {
    s += ":" + std::to_string(o->line);
    if (o->column != 0) s += ":" + std::to_string(o->column);
  }
  return s + " (" + std::string(layer_name(o->layer)) + ")";
}

std::vector<Diagnostic> validate_file(const std::string& path, bool over_default) {
  std::vector<Diagnostic> diagnostics;
  std::string bytes, name;
  bool is_default = false;
  if (!read_source(path, bytes, name, &is_default, diagnostics)) return diagnostics;
  detail::TableLayer layer;
  if (!detail::parse_table(bytes, name, is_default ? Layer::kDefault : Layer::kSite, layer,
                           diagnostics)) {
    return diagnostics;
  }
  std::vector<detail::TableLayer> layers;
  if (over_default && !add_default_layer(layers, diagnostics)) return diagnostics;
  layers.push_back(std::move(layer));
  Tables merged;
  detail::merge_layers(layers, std::nullopt, merged, diagnostics);
  return diagnostics;
}

}  // namespace arbiter
