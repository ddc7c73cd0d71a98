#include "merge.h"

#include <algorithm>
#include <tuple>

#include "arbiter/decision.h"
#include "arbiter/size.h"
#include "checked.h"
#include "text_util.h"

namespace arbiter {

const Origin* Tables::find_origin(std::uint16_t id) const {
  if (id == kNoOrigin) return nullptr;
  ARBITER_INVARIANT(id < origins.size(), "origin id past the end of Tables::origins");
  return id < origins.size() ? &origins[id] : nullptr;
}

bool CellKey::overlaps(const CellKey& o) const {
  return capability == o.capability && world_size == o.world_size &&
         (nodes == 0 || o.nodes == 0 || nodes == o.nodes) &&
         (!pattern || !o.pattern || *pattern == *o.pattern) &&
         (!dtype || !o.dtype || *dtype == *o.dtype) &&
         (!residual || !o.residual || *residual == *o.residual) &&
         (!buffers || !o.buffers || *buffers == *o.buffers) &&
         // A residual key never matches allreduce, which has no residual.
         !(residual && o.pattern == Pattern::kAllreduce) &&
         !(o.residual && pattern == Pattern::kAllreduce);
}

std::string CellKey::to_string() const {
  std::string s =
      "capability " + capability_name(capability) + ", world size " + std::to_string(world_size);
  if (nodes != 0) s += ", nodes " + std::to_string(nodes);
  if (pattern) s += ", pattern " + std::string(pattern_name(*pattern));
  if (dtype) s += ", dtype " + std::string(dtype_name(*dtype));
  if (residual) s += ", residual " + std::string(residual_name(*residual));
  if (buffers) s += ", buffers " + std::string(buffer_kind_name(*buffers));
  return s;
}

std::string_view layer_name(Layer layer) {
  switch (layer) {
    case Layer::kDefault:
      return "default";
    case Layer::kSite:
      return "site";
    case Layer::kOverride:
      return "override";
    case Layer::kEnvironment:
      return "environment";
  }
  return "?";
}
std::string_view nodes_rule_name(NodesRule r) {
  switch (r) {
    case NodesRule::kAny:
      return "any";
    case NodesRule::kSingle:
      return "single";
    case NodesRule::kMulti:
      return "multi";
  }
  return "?";
}
std::string_view algorithm_rule_name(AlgorithmRule r) {
  switch (r) {
    case AlgorithmRule::kOneshotTable:
      return "oneshot_table";
    case AlgorithmRule::kThreshold:
      return "threshold";
    case AlgorithmRule::kNative:
      return "native";
  }
  return "?";
}
std::string_view topology_name(Topology t) {
  switch (t) {
    case Topology::kSingleNode:
      return "single_node";
    case Topology::kMultiNode:
      return "multi_node";
    case Topology::kCpu:
      return "cpu";
  }
  return "?";
}

namespace detail {
namespace {

class Merger {
 public:
  Merger(Tables& t, std::vector<Diagnostic>& d) : t_(t), diagnostics_(d) {}

  std::uint16_t origin(const TableLayer& layer, Pos pos) {
    t_.origins.push_back({layer.file, pos.line, pos.column, layer.layer});
    return static_cast<std::uint16_t>(t_.origins.size() - 1);
  }

  // A diagnostic at the place `id` names. A setting no layer wrote has no
  // place: the diagnostic then names the topmost layer's file (the message
  // names the key).
  void report(Severity severity, std::uint16_t id, std::string msg, std::string hint) {
    if (const Origin* o = t_.find_origin(id)) {
      diagnostics_.push_back(
          {severity, o->file, o->line, o->column, std::move(msg), std::move(hint)});
    } else {
      diagnostics_.push_back({severity, top_file_, 0, 0, std::move(msg), std::move(hint)});
    }
    if (severity == Severity::kError) ++errors_;
  }
  void error_at(std::uint16_t id, std::string msg, std::string hint = {}) {
    report(Severity::kError, id, std::move(msg), std::move(hint));
  }
  void warning_at(std::uint16_t id, std::string msg, std::string hint = {}) {
    report(Severity::kWarning, id, std::move(msg), std::move(hint));
  }
  // Of two settings that clash, the one a later layer wrote: where the
  // change came from (origin ids grow with the layers).
  static std::uint16_t later(std::uint16_t a, std::uint16_t b) {
    if (a == kNoOrigin) return b;
    if (b == kNoOrigin) return a;
    return std::max(a, b);
  }
  // "file:line" of `id`, for messages that point at a second place.
  std::string place(std::uint16_t id) const {
    const Origin* o = t_.find_origin(id);
    if (!o) return top_file_;
    return o->file + ":" + std::to_string(o->line);
  }
  void error_env(std::string msg, std::string hint) {
    diagnostics_.push_back(
        {Severity::kError, "ARBITER_BACKENDS", 0, 0, std::move(msg), std::move(hint)});
    ++errors_;
  }

  void apply(const TableLayer& layer) {
    top_file_ = layer.file;
    for (const std::string& line : layer.provenance) {
      t_.provenance.push_back(layer.file + ": " + line);
    }
    if (layer.enabled.has()) {
      t_.enabled_mask = *layer.enabled.value;
      t_.enabled_origin = origin(layer, layer.enabled.pos);
    }
    for (int k = 0; k < kDeviceKindCount; ++k) {
      if (layer.fallback[k].has()) {
        t_.fallback[k] = *layer.fallback[k].value;
        t_.fallback_origin[k] = origin(layer, layer.fallback[k].pos);
      }
    }
    for (int k = 0; k < kTopologyCount; ++k) {
      if (layer.preference[k].has()) {
        t_.preference[k] = *layer.preference[k].value;
        t_.preference_origin[k] = origin(layer, layer.preference[k].pos);
      }
    }
    for (int b = 0; b < kBackendCount; ++b) apply_backend(layer, b);
    apply_cells(layer, layer.fusion, t_.fusion);
    apply_cells(layer, layer.oneshot, t_.oneshot);
    if (layer.oneshot_default.has()) {
      t_.oneshot_default = *layer.oneshot_default.value;
      t_.oneshot_default_origin = origin(layer, layer.oneshot_default.pos);
    }
  }

  void apply_backend(const TableLayer& layer, int b) {
    const BackendLayer& src = layer.backends[b];
    if (!src.present) return;
    BackendRules& dst = t_.backends[b];
    dst.defined = true;
    const BackendRules& r = src.rules;
    for (int f = 0; f < BackendRules::kFieldCount; ++f) {
      if (!src.set[f]) continue;
      dst.origins[f] = origin(layer, src.field_pos[f]);
      switch (f) {
        case BackendRules::kDevice:
          dst.device = r.device;
          break;
        case BackendRules::kWorldSizes:
          dst.world_sizes = r.world_sizes;
          dst.world_sizes_text = r.world_sizes_text;
          break;
        case BackendRules::kNodes:
          dst.nodes = r.nodes;
          break;
        case BackendRules::kNvlink:
          dst.needs_nvlink = r.needs_nvlink;
          break;
        case BackendRules::kMulticast:
          dst.needs_multicast = r.needs_multicast;
          break;
        case BackendRules::kDtypes:
          dst.dtype_mask = r.dtype_mask;
          break;
        case BackendRules::kPatterns:
          dst.pattern_mask = r.pattern_mask;
          break;
        case BackendRules::kMinCapability:
          dst.min_capability = r.min_capability;
          break;
        case BackendRules::kAlgorithm:
          dst.algorithm = r.algorithm;
          break;
        case BackendRules::kOneshotMaxTotal:
          dst.oneshot_max_total = r.oneshot_max_total;
          break;
        case BackendRules::kTwoshotTokens:
          dst.twoshot_needs_tokens_ge_world_size = r.twoshot_needs_tokens_ge_world_size;
          break;
      }
    }
  }

  void apply_cells(const TableLayer& layer, const std::vector<LayerCell>& src,
                   std::vector<Cell>& dst) {
    for (const LayerCell& lc : src) {
      Cell c = lc.cell;
      c.origin = origin(layer, lc.pos);
      auto same = std::find_if(dst.begin(), dst.end(),
                               [&](const Cell& o) { return o.key.same_keys(c.key); });
      if (same != dst.end()) {
        *same = c;  // a later layer replaces the cell with the same keys
      } else {
        dst.push_back(c);
      }
    }
  }

  // `what` ("preference.cpu lists 'shm'") names backend b, which the
  // setting at `at` relies on: warn when no `enabled:` list admits it.
  void warn_if_not_enabled(Backend b, std::uint16_t at, const std::string& what,
                           std::string_view consequence) {
    if ((t_.enabled_mask >> static_cast<int>(b)) & 1u) return;
    const std::string name(backend_name(b));
    if (t_.enabled_origin == kNoOrigin) {
      warning_at(at,
                 what + ", which no layer enables (there is no `enabled:` list); " +
                     std::string(consequence),
                 "add `enabled: [" + name + ", ...]`");
    } else {
      // Blame whichever of the two settings was written last.
      warning_at(std::max(at, t_.enabled_origin),
                 what + ", which is not enabled; " + std::string(consequence),
                 "add " + name + " to `enabled:`");
    }
  }

  void check_backends() {
    auto need_defined = [&](Backend b, std::uint16_t at, std::string_view where) {
      if (!t_.backends[static_cast<int>(b)].defined) {
        error_at(at,
                 std::string(where) + " names backend '" + std::string(backend_name(b)) +
                     "', which no table describes",
                 "add backends." + std::string(backend_name(b)) + " with its rules");
        return false;
      }
      return true;
    };
    for (int b = 0; b < kBackendCount; ++b) {
      if ((t_.enabled_mask >> b) & 1u) {
        need_defined(static_cast<Backend>(b), t_.enabled_origin, "enabled");
      }
      const BackendRules& r = t_.backends[b];
      if (r.defined && r.algorithm == AlgorithmRule::kThreshold &&
          r.origins[BackendRules::kOneshotMaxTotal] == kNoOrigin) {
        error_at(r.origins[BackendRules::kAlgorithm],
                 "backend '" + std::string(backend_name(static_cast<Backend>(b))) +
                     "' uses algorithm: threshold but has no oneshot_max_total",
                 "add oneshot_max_total, e.g. 1MiB");
      }
    }
    for (int k = 0; k < kDeviceKindCount; ++k) {
      const auto kind = static_cast<DeviceKind>(k);
      const std::string where = "fallback." + std::string(device_kind_name(kind));
      if (t_.fallback[k] == Backend::kNone) {
        error_at(kNoOrigin,
                 "no fallback backend for " + std::string(device_kind_name(kind)) + " ranks",
                 "set " + where + (kind == DeviceKind::kGpu ? ": nccl" : ": shm"));
        continue;
      }
      if (!need_defined(t_.fallback[k], t_.fallback_origin[k], where)) continue;
      const BackendRules& r = t_.backends[static_cast<int>(t_.fallback[k])];
      if (r.device != kind) {
        // Reported where the later of the two settings is (a site file that
        // moved the backend to the other device, say), naming both.
        const std::string name(backend_name(t_.fallback[k]));
        const std::uint16_t device_at = r.origins[BackendRules::kDevice];
        error_at(later(t_.fallback_origin[k], device_at),
                 where + " is '" + name + "' (" + place(t_.fallback_origin[k]) + "), a " +
                     std::string(device_kind_name(r.device)) + " backend (backends." + name +
                     ".device, " + place(device_at) + ")",
                 "the fallback must run on the same device kind as the ranks");
      } else {
        warn_if_not_enabled(t_.fallback[k], t_.fallback_origin[k],
                            where + " is '" + std::string(backend_name(t_.fallback[k])) + "'",
                            "calls that are not fused will find no backend");
      }
    }
    for (int k = 0; k < kTopologyCount; ++k) {
      const auto topo = static_cast<Topology>(k);
      const DeviceKind want = topo == Topology::kCpu ? DeviceKind::kCpu : DeviceKind::kGpu;
      for (Backend b : t_.preference[k]) {
        const std::string where = "preference." + std::string(topology_name(topo));
        if (!need_defined(b, t_.preference_origin[k], where)) continue;
        const BackendRules& r = t_.backends[static_cast<int>(b)];
        if (r.device != want) {
          const std::string name(backend_name(b));
          const std::uint16_t device_at = r.origins[BackendRules::kDevice];
          error_at(later(t_.preference_origin[k], device_at),
                   where + " lists '" + name + "' (" + place(t_.preference_origin[k]) + "), a " +
                       std::string(device_kind_name(r.device)) + " backend (backends." + name +
                       ".device, " + place(device_at) + ")",
                   topo == Topology::kCpu ? "list only cpu backends (shm) here"
                                          : "list only gpu backends here");
        } else {
          warn_if_not_enabled(b, t_.preference_origin[k],
                              where + " lists '" + std::string(backend_name(b)) + "'",
                              "it will never be chosen");
        }
      }
    }
    const bool uses_table =
        std::any_of(t_.backends.begin(), t_.backends.end(), [](const BackendRules& r) {
          return r.defined && r.algorithm == AlgorithmRule::kOneshotTable;
        });
    if ((uses_table || !t_.oneshot.empty()) && t_.oneshot_default_origin == kNoOrigin) {
      // Blame the first one-shot cell, else the backend that reads the table.
      std::uint16_t at = kNoOrigin;
      if (!t_.oneshot.empty()) {
        at = t_.oneshot.front().origin;
      } else {
        for (const BackendRules& r : t_.backends) {
          if (r.defined && r.algorithm == AlgorithmRule::kOneshotTable) {
            at = r.origins[BackendRules::kAlgorithm];
            break;
          }
        }
      }
      error_at(at, "oneshot.default is not set",
               "write what a missing one-shot cell means: `default: oneshot` or "
               "`default: twoshot`");
    }
  }

  void sort_and_check_cells(std::vector<Cell>& cells, std::string_view table) {
    std::stable_sort(cells.begin(), cells.end(), [](const Cell& a, const Cell& b) {
      auto key = [](const Cell& c) {
        return std::make_tuple(c.key.capability.code(), c.key.world_size, -c.key.specificity(),
                               c.key.nodes, c.key.pattern ? static_cast<int>(*c.key.pattern) : -1,
                               c.key.dtype ? static_cast<int>(*c.key.dtype) : -1);
      };
      return key(a) < key(b);
    });
    for (std::size_t i = 0; i < cells.size(); ++i) {
      for (std::size_t j = i + 1; j < cells.size(); ++j) {
        const Cell& a = cells[i];
        const Cell& b = cells[j];
        if (b.key.capability != a.key.capability || b.key.world_size != a.key.world_size) {
          break;
        }
        if (a.key.specificity() != b.key.specificity() || !a.key.overlaps(b.key)) {
          continue;
        }
        if (a.off == b.off && a.max_bytes == b.max_bytes) continue;
        // Report at the cell written later (higher origin id).
        const Cell& later = a.origin > b.origin ? a : b;
        const Cell& earlier = a.origin > b.origin ? b : a;
        error_at(later.origin,
                 std::string(table) + " cell (" + later.key.to_string() +
                     ") = " + value_text(later) + " conflicts with the equally specific cell (" +
                     earlier.key.to_string() + ") = " + value_text(earlier) + " at " +
                     place(earlier.origin) + "; a call can match both",
                 "add a cell keyed by both to settle it, or give both the same max");
      }
    }
  }

  static std::string value_text(const Cell& c) { return c.off ? "off" : format_size(c.max_bytes); }

  // A one-shot cap above the fusion cap that applies to every call the
  // one-shot cell matches (and above every more specific one that applies to
  // some of them) is dead weight: such calls are never fused. Said
  // of the cell whose file could have known better: not of a one-shot cell
  // whose cap a later file lowered (a site capping fusion below a default
  // one-shot cell means exactly that).
  void check_oneshot_vs_fusion() {
    for (const Cell& o : t_.oneshot) {
      const Cell* covering = nullptr;
      for (const Cell& f : t_.fusion) {
        const bool covers = f.key.capability == o.key.capability &&
                            f.key.world_size == o.key.world_size && f.key.nodes == 0 &&
                            (!f.key.pattern || f.key.pattern == o.key.pattern) &&
                            (!f.key.dtype || f.key.dtype == o.key.dtype) &&
                            (!f.key.residual || f.key.residual == o.key.residual) &&
                            (!f.key.buffers || f.key.buffers == o.key.buffers);
        if (covers && (!covering || f.key.specificity() > covering->key.specificity())) {
          covering = &f;
        }
      }
      if (!covering || covering->off || o.max_bytes <= covering->max_bytes) continue;
      // A more specific fusion cell that some of its calls match (a dtype's,
      // say) may let those fuse up to the one-shot cap: then it applies.
      // One-shot cells serve one node (single-node trtllm, cpu shm), so a
      // cell keyed by 2 nodes or more never decides their calls.
      bool applies_somewhere = false;
      for (const Cell& f : t_.fusion) {
        const bool some_calls =
            f.key.capability == o.key.capability && f.key.world_size == o.key.world_size &&
            f.key.nodes <= 1 &&
            (!f.key.pattern || !o.key.pattern || f.key.pattern == o.key.pattern) &&
            (!f.key.dtype || !o.key.dtype || f.key.dtype == o.key.dtype) &&
            (!f.key.residual || !o.key.residual || f.key.residual == o.key.residual) &&
            (!f.key.buffers || !o.key.buffers || f.key.buffers == o.key.buffers);
        if (some_calls && f.key.specificity() > covering->key.specificity() && !f.off &&
            f.max_bytes >= o.max_bytes) {
          applies_somewhere = true;
        }
      }
      if (applies_somewhere) continue;
      const Origin* oneshot_at = t_.find_origin(o.origin);
      const Origin* fusion_at = t_.find_origin(covering->origin);
      const bool lowered_later = oneshot_at && fusion_at && fusion_at->file != oneshot_at->file &&
                                 covering->origin > o.origin;
      if (!lowered_later) {
        warning_at(o.origin,
                   "one-shot cap " + format_size(o.max_bytes) + " for (" + o.key.to_string() +
                       ") is above the fusion cap " + format_size(covering->max_bytes) +
                       " set at " + place(covering->origin),
                   "messages above the fusion cap are never fused, so the one-shot cap "
                   "cannot apply there");
      }
    }
  }

  void apply_env(const std::optional<std::string>& env) {
    t_.allowed_mask = t_.enabled_mask;
    t_.backends_env = env;
    if (!env) return;
    std::uint32_t mask = 0;
    std::vector<std::string_view> known = {"trtllm", "mnnvl", "nccl", "shm"};
    std::string_view rest = *env;
    int item_number = 0;
    bool empty_said = false;  // one error for every empty name
    while (true) {
      ++item_number;
      const auto comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      if (item.empty()) {
        if (!empty_said) {
          error_env(
              "empty backend name (item " + std::to_string(item_number) + ") in '" + *env + "'",
              "write a comma list such as trtllm,nccl");
        }
        empty_said = true;
      } else if (Parsed<Backend> b = parse_backend(item); !b) {
        error_env(b.error + " (in '" + *env + "')", "fix the name or remove it");
      } else {
        mask |= 1u << static_cast<int>(*b.value);
        if (!((t_.enabled_mask >> static_cast<int>(*b.value)) & 1u)) {
          diagnostics_.push_back(
              {Severity::kWarning, "ARBITER_BACKENDS", 0, 0,
               std::string(backend_name(*b.value)) + " is not enabled by the tables; it stays off",
               "add it to `enabled:` in a site file"});
        }
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    t_.allowed_mask &= mask;
  }

  int errors() const { return errors_; }

 private:
  Tables& t_;
  std::vector<Diagnostic>& diagnostics_;
  std::string top_file_ = "tables";  // the file of the last layer applied
  int errors_ = 0;
};

}  // namespace

bool merge_layers(const std::vector<TableLayer>& layers,
                  const std::optional<std::string>& backends_env, Tables& out,
                  std::vector<Diagnostic>& diagnostics) {
  out = Tables{};
  Merger m(out, diagnostics);
  for (const TableLayer& layer : layers) m.apply(layer);
  if (out.origins.size() >= kNoOrigin) {
    diagnostics.push_back({Severity::kError, layers.back().file, 0, 0,
                           "too many table entries (more than 65534)", ""});
    return false;
  }
  m.check_backends();
  m.sort_and_check_cells(out.fusion, "fusion");
  m.sort_and_check_cells(out.oneshot, "oneshot");
  m.check_oneshot_vs_fusion();
  m.apply_env(backends_env);
  return m.errors() == 0;
}

}  // namespace detail
}  // namespace arbiter
