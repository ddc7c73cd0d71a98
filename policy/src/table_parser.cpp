// YAML tree -> TableLayer, with every schema check that needs only one file.
#include <algorithm>
#include <charconv>
#include <map>

#include "arbiter/size.h"
#include "table_layer.h"
#include "text_util.h"
#include "yaml_tree.h"

namespace arbiter::detail {
namespace {

using Keys = std::vector<std::string_view>;

class Parser {
 public:
  Parser(const std::string& file, std::vector<Diagnostic>& diagnostics)
      : file_(file), diagnostics_(diagnostics) {}

  bool failed() const { return errors_ > 0; }

  void error(const YamlNode& at, std::string message, std::string hint = {}) {
    ++errors_;
    diagnostics_.push_back(
        {Severity::kError, file_, at.line, at.column, std::move(message), std::move(hint)});
  }
  void warning(const YamlNode& at, std::string message, std::string hint = {}) {
    diagnostics_.push_back(
        {Severity::kWarning, file_, at.line, at.column, std::move(message), std::move(hint)});
  }

  // Checks that `node` is a mapping whose keys are all in `known`, with no
  // key twice. Returns the entries worth reading (known, first occurrence).
  std::vector<const std::pair<YamlNode, YamlNode>*> entries(const YamlNode& node, const Keys& known,
                                                            std::string_view where) {
    std::vector<const std::pair<YamlNode, YamlNode>*> out;
    if (!node.is_map()) {
      error(node, std::string(where) + " must be a mapping, not " + std::string(node.kind_name()));
      return out;
    }
    std::map<std::string, std::uint32_t> seen;
    for (const auto& entry : node.entries) {
      const YamlNode& key = entry.first;
      if (!key.is_scalar()) {
        error(key, "empty key in " + std::string(where));
        continue;
      }
      if (auto it = seen.find(key.value); it != seen.end()) {
        error(key,
              "duplicate key '" + key.value + "' in " + std::string(where) + " (first at line " +
                  std::to_string(it->second) + ")",
              "keep one of them");
        continue;
      }
      seen.emplace(key.value, key.line);
      if (std::find(known.begin(), known.end(), key.value) == known.end()) {
        std::string hint;
        if (std::string near = closest_name(key.value, known); !near.empty()) {
          hint = "did you mean '" + near + "'?";
        } else {
          hint = "known keys: " + join(known);
        }
        error(key, "unknown key '" + key.value + "' in " + std::string(where), hint);
        continue;
      }
      out.push_back(&entry);
    }
    return out;
  }

  std::optional<std::int64_t> integer(const YamlNode& node, std::string_view what) {
    if (!node.is_scalar() || node.quoted) {
      error(node, std::string(what) + " must be an integer, not " +
                      (node.is_scalar() ? "the quoted string '" + node.value + "'"
                                        : std::string(node.kind_name())));
      return std::nullopt;
    }
    std::int64_t v = 0;
    const std::string& s = node.value;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size()) {
      error(node, std::string(what) + " must be an integer, got '" + s + "'");
      return std::nullopt;
    }
    return v;
  }

  std::optional<bool> boolean(const YamlNode& node, std::string_view what) {
    if (node.is_scalar() && !node.quoted) {
      if (node.value == "true") return true;
      if (node.value == "false") return false;
    }
    error(node, std::string(what) + " must be true or false, got " + describe(node));
    return std::nullopt;
  }

  std::optional<std::string> text(const YamlNode& node, std::string_view what) {
    if (!node.is_scalar()) {
      error(node, std::string(what) + " must be a scalar, not " + std::string(node.kind_name()));
      return std::nullopt;
    }
    return node.value;
  }

  template <class E>
  std::optional<E> name(const YamlNode& node, Parsed<E> (*parse)(std::string_view),
                        std::string_view what) {
    auto t = text(node, what);
    if (!t) return std::nullopt;
    Parsed<E> r = parse(*t);
    if (!r) {
      error(node, r.error);
      return std::nullopt;
    }
    return r.value;
  }

  std::optional<Capability> capability(const YamlNode& node) {
    if (!node.is_scalar()) {
      error(node, "capability must be a scalar, not " + std::string(node.kind_name()));
      return std::nullopt;
    }
    // YAML reads an unquoted 10.3 as a float (10.30 is the same float), so
    // editors and the JSON Schema see a number, not a capability.
    if (!node.quoted && node.value.find('.') != std::string::npos) {
      error(node, "capability " + node.value + " is a YAML float",
            "quote it (\"" + node.value + "\") or write major*10+minor");
      return std::nullopt;
    }
    Parsed<Capability> r = parse_capability(node.value);
    if (!r) {
      error(node, r.error);
      return std::nullopt;
    }
    return r.value;
  }

  // A size; `off` is accepted only when allow_off, and yields nullopt in
  // *bytes with true returned.
  bool size(const YamlNode& node, bool allow_off, std::optional<std::uint64_t>& bytes) {
    if (!node.is_scalar()) {
      error(node, "size must be a number (MiB) or a string like 512KiB, not " +
                      std::string(node.kind_name()));
      return false;
    }
    if (node.value == "off") {
      if (!allow_off) {
        error(node, "'off' is only meaningful in fusion cells", "omit the cell to use the default");
        return false;
      }
      bytes.reset();
      return true;
    }
    // A quoted size is a string, and a string carries its unit (FORMAT.md).
    Parsed<std::uint64_t> r =
        node.quoted ? parse_size_string(node.value) : parse_size(node.value, /*plain_is_mib=*/true);
    if (!r) {
      std::string hint;
      if (r.error.find("is zero") != std::string::npos && allow_off) {
        hint = "write `max: off` to disable fusion for this cell";
      }
      error(node, r.error, hint);
      return false;
    }
    bytes = r.value;
    return true;
  }

  // Cells need 2 ranks (one rank has nothing to fuse); a backend's
  // world_sizes may include 1 (it runs single-rank groups: the epilogue).
  std::optional<std::uint32_t> world_size(const YamlNode& node, std::int64_t least = 2) {
    auto v = integer(node, "world size");
    if (!v) return std::nullopt;
    if (*v < least) {
      error(node, "world size " + std::to_string(*v) + " is below " + std::to_string(least) +
                      (least == 2 ? "; an all-reduce needs at least 2 ranks"
                                  : "; a backend serves groups of at least 1 rank"));
      return std::nullopt;
    }
    if (*v > kMaxWorldSize) {
      error(node, "world size " + std::to_string(*v) + " is above the maximum " +
                      std::to_string(kMaxWorldSize));
      return std::nullopt;
    }
    return static_cast<std::uint32_t>(*v);
  }

  std::optional<std::vector<Backend>> backend_list(const YamlNode& node, std::string_view what) {
    if (!node.is_seq()) {
      error(node,
            std::string(what) + " must be a list of backend names, not " +
                std::string(node.kind_name()),
            "write e.g. [trtllm, mnnvl]");
      return std::nullopt;
    }
    std::vector<Backend> out;
    bool ok = true;
    for (const YamlNode& item : node.items) {
      auto b = name<Backend>(item, parse_backend, "backend name");
      if (!b) {
        ok = false;
        continue;
      }
      if (std::find(out.begin(), out.end(), *b) != out.end()) {
        error(item, "backend '" + std::string(backend_name(*b)) + "' is listed twice in " +
                        std::string(what));
        ok = false;
        continue;
      }
      out.push_back(*b);
    }
    if (!ok) return std::nullopt;
    return out;
  }

  static std::string describe(const YamlNode& node) {
    if (node.is_scalar()) return "'" + node.value + "'";
    return std::string(node.kind_name());
  }

 private:
  const std::string& file_;
  std::vector<Diagnostic>& diagnostics_;
  int errors_ = 0;
};

Pos pos_of(const YamlNode& n) { return {n.line, n.column}; }

void parse_provenance(Parser& p, const YamlNode& node, TableLayer& out) {
  static const Keys kKeys = {"source", "date", "tool",  "notes",           "hardware",
                             "driver", "nccl", "hosts", "arbiter_version", "measured_on"};
  for (const auto* e : p.entries(node, kKeys, "provenance")) {
    if (auto t = p.text(e->second, "provenance." + e->first.value)) {
      out.provenance.push_back(e->first.value + ": " + *t);
    }
  }
}

void parse_world_sizes(Parser& p, const YamlNode& node, BackendLayer& b) {
  auto& ws = b.rules.world_sizes;
  ws.reset();
  if (node.is_seq()) {
    if (node.items.empty()) {
      p.error(node, "world_sizes is an empty list", "omit world_sizes to allow every world size");
      return;
    }
    std::string text;
    for (const YamlNode& item : node.items) {
      auto v = p.world_size(item, 1);
      if (!v) return;
      ws.set(*v);
      text += (text.empty() ? "" : ", ") + std::to_string(*v);
    }
    b.rules.world_sizes_text = "[" + text + "]";
  } else if (node.is_map()) {
    std::optional<std::uint32_t> lo, hi;
    for (const auto* e : p.entries(node, {"min", "max"}, "world_sizes")) {
      (e->first.value == "min" ? lo : hi) = p.world_size(e->second, 1);
    }
    if (!lo || !hi) {
      if (!p.failed()) p.error(node, "world_sizes needs both min and max");
      return;
    }
    if (*lo > *hi) {
      p.error(node,
              "world_sizes min " + std::to_string(*lo) + " is above max " + std::to_string(*hi));
      return;
    }
    for (std::uint32_t w = *lo; w <= *hi; ++w) ws.set(w);
    b.rules.world_sizes_text = std::to_string(*lo) + ".." + std::to_string(*hi);
  } else {
    p.error(node, "world_sizes must be a list ([2, 4, 8]) or {min: N, max: M}");
    return;
  }
  b.set[BackendRules::kWorldSizes] = true;
}

void parse_backend_rules(Parser& p, Backend which, const YamlNode& node, BackendLayer& b) {
  static const Keys kKeys = {"device",
                             "world_sizes",
                             "nodes",
                             "needs_nvlink",
                             "needs_multicast",
                             "dtypes",
                             "patterns",
                             "min_capability",
                             "algorithm",
                             "oneshot_max_total",
                             "twoshot_needs_tokens_ge_world_size"};
  const std::string where = "backends." + std::string(backend_name(which));
  b.present = true;
  b.pos = pos_of(node);
  BackendRules& r = b.rules;
  for (const auto* e : p.entries(node, kKeys, where)) {
    const std::string& key = e->first.value;
    const YamlNode& v = e->second;
    int field = -1;
    if (key == "device") {
      field = BackendRules::kDevice;
      if (auto t = p.text(v, "device")) {
        if (*t == "gpu")
          r.device = DeviceKind::kGpu;
        else if (*t == "cpu")
          r.device = DeviceKind::kCpu;
        else {
          p.error(v, "device must be gpu or cpu, got '" + *t + "'");
          continue;
        }
      } else
        continue;
    } else if (key == "world_sizes") {
      parse_world_sizes(p, v, b);
      b.field_pos[BackendRules::kWorldSizes] = pos_of(v);
      continue;
    } else if (key == "nodes") {
      field = BackendRules::kNodes;
      if (auto t = p.text(v, "nodes")) {
        if (*t == "any")
          r.nodes = NodesRule::kAny;
        else if (*t == "single")
          r.nodes = NodesRule::kSingle;
        else if (*t == "multi")
          r.nodes = NodesRule::kMulti;
        else {
          p.error(v, "nodes must be single, multi or any, got '" + *t + "'");
          continue;
        }
        // Its peers' memory is mapped over one node's NVLink; the module
        // refuses more, so a table may not promise it.
        if (which == Backend::kTrtllm && r.nodes != NodesRule::kSingle) {
          p.error(v, "trtllm runs on one node only (its peers' memory is mapped over NVLink); "
                     "its nodes must be single: multi-node jobs take mnnvl or nccl");
          continue;
        }
      } else
        continue;
    } else if (key == "needs_nvlink" || key == "needs_multicast" ||
               key == "twoshot_needs_tokens_ge_world_size") {
      auto flag = p.boolean(v, key);
      if (!flag) continue;
      if (key == "needs_nvlink") {
        field = BackendRules::kNvlink;
        r.needs_nvlink = *flag;
      } else if (key == "needs_multicast") {
        field = BackendRules::kMulticast;
        r.needs_multicast = *flag;
      } else {
        field = BackendRules::kTwoshotTokens;
        r.twoshot_needs_tokens_ge_world_size = *flag;
      }
    } else if (key == "dtypes" || key == "patterns") {
      if (!v.is_seq() || v.items.empty()) {
        p.error(v, key + " must be a non-empty list");
        continue;
      }
      std::uint8_t mask = 0;
      bool ok = true;
      for (const YamlNode& item : v.items) {
        if (key == "dtypes") {
          auto d = p.name<Dtype>(item, parse_dtype, "dtype");
          if (d)
            mask |= 1u << static_cast<int>(*d);
          else
            ok = false;
        } else {
          auto pt = p.name<Pattern>(item, parse_pattern, "pattern");
          if (pt)
            mask |= 1u << static_cast<int>(*pt);
          else
            ok = false;
        }
      }
      if (!ok) continue;
      field = key == "dtypes" ? BackendRules::kDtypes : BackendRules::kPatterns;
      (key == "dtypes" ? r.dtype_mask : r.pattern_mask) = mask;
    } else if (key == "min_capability") {
      static const Keys kPatterns = {"allreduce", "residual_rmsnorm", "residual_rmsnorm_fp8",
                                     "residual_rmsnorm_fp4"};
      r.min_capability.fill(0);
      bool ok = v.is_map();
      for (const auto* pe : p.entries(v, kPatterns, where + ".min_capability")) {
        auto pt = parse_pattern(pe->first.value);
        auto cap = p.capability(pe->second);
        if (!cap) {
          ok = false;
          continue;
        }
        if (cap->is_cpu()) {
          p.error(pe->second, "min_capability must be a GPU capability, not cpu");
          ok = false;
          continue;
        }
        r.min_capability[static_cast<int>(*pt.value)] = cap->code();
      }
      if (!ok) continue;
      field = BackendRules::kMinCapability;
    } else if (key == "algorithm") {
      auto t = p.text(v, "algorithm");
      if (!t) continue;
      if (*t == "oneshot_table" && (which == Backend::kMnnvl || which == Backend::kNccl)) {
        // The one-shot table has no nodes key: it is single-node trtllm's
        // (and the cpu shm split's).
        p.error(v, "algorithm oneshot_table is for trtllm (and shm): the one-shot table is "
                   "scoped to single-node trtllm; " +
                       std::string(which == Backend::kMnnvl
                                       ? "mnnvl takes threshold (with oneshot_max_total)"
                                       : "nccl takes native") +
                       " (schema/FORMAT.md)");
        continue;
      }
      if (*t == "oneshot_table")
        r.algorithm = AlgorithmRule::kOneshotTable;
      else if (*t == "threshold")
        r.algorithm = AlgorithmRule::kThreshold;
      else if (*t == "native")
        r.algorithm = AlgorithmRule::kNative;
      else {
        p.error(v, "algorithm must be oneshot_table, threshold or native, got '" + *t + "'");
        continue;
      }
      field = BackendRules::kAlgorithm;
    } else if (key == "oneshot_max_total") {
      std::optional<std::uint64_t> bytes;
      if (!p.size(v, false, bytes)) continue;
      r.oneshot_max_total = *bytes;
      field = BackendRules::kOneshotMaxTotal;
    }
    if (field >= 0) {
      b.set[field] = true;
      b.field_pos[field] = pos_of(v);
    }
  }
}

void parse_cells(Parser& p, const YamlNode& node, bool fusion, std::vector<LayerCell>& out) {
  const std::string where = fusion ? "fusion" : "oneshot.cells";
  if (!node.is_seq()) {
    p.error(node, where + " must be a list of cells, not " + std::string(node.kind_name()),
            "write - {capability: 90, world_size: 2, max: 64}");
    return;
  }
  static const Keys kFusionKeys = {"capability", "world_size", "nodes",   "pattern",
                                   "dtype",      "residual",   "buffers", "max"};
  static const Keys kOneshotKeys = {"capability", "world_size", "pattern", "dtype",
                                    "residual",   "buffers",    "max"};
  for (const YamlNode& item : node.items) {
    LayerCell lc;
    lc.pos = pos_of(item);
    bool ok = item.is_map();
    bool has_cap = false, has_ws = false, has_max = false;
    if (!fusion && item.is_map()) {
      for (const auto& e : item.entries) {
        if (e.first.is_scalar() && e.first.value == "nodes") {
          p.error(e.first, "one-shot cells are not keyed by 'nodes'",
                  "the one-shot table applies to single-node trtllm and cpu shm only");
          ok = false;
        }
      }
      if (!ok) continue;
    }
    const auto fields = p.entries(item, fusion ? kFusionKeys : kOneshotKeys, where + " cell");
    if (!ok) continue;
    for (const auto* e : fields) {
      const std::string& key = e->first.value;
      const YamlNode& v = e->second;
      if (key == "capability") {
        auto c = p.capability(v);
        has_cap = true;
        if (c)
          lc.cell.key.capability = *c;
        else
          ok = false;
      } else if (key == "world_size") {
        auto w = p.world_size(v);
        has_ws = true;
        if (w)
          lc.cell.key.world_size = *w;
        else
          ok = false;
      } else if (key == "nodes") {
        auto n = p.integer(v, "nodes");
        if (!n) {
          ok = false;
          continue;
        }
        if (*n < 1) {
          p.error(v, "nodes " + std::to_string(*n) + " must be at least 1");
          ok = false;
          continue;
        }
        if (*n > kMaxWorldSize) {
          p.error(v, "nodes " + std::to_string(*n) + " is above the maximum world size " +
                         std::to_string(kMaxWorldSize));
          ok = false;
          continue;
        }
        lc.cell.key.nodes = static_cast<std::uint32_t>(*n);
      } else if (key == "pattern") {
        auto pt = p.name<Pattern>(v, parse_pattern, "pattern");
        if (pt)
          lc.cell.key.pattern = *pt;
        else
          ok = false;
      } else if (key == "dtype") {
        auto d = p.name<Dtype>(v, parse_dtype, "dtype");
        if (d)
          lc.cell.key.dtype = *d;
        else
          ok = false;
      } else if (key == "residual") {
        auto rs = p.name<Residual>(v, parse_residual, "residual");
        if (rs)
          lc.cell.key.residual = *rs;
        else
          ok = false;
      } else if (key == "buffers") {
        auto b = p.name<BufferKind>(v, parse_buffer_kind, "buffers");
        if (b)
          lc.cell.key.buffers = *b;
        else
          ok = false;
      } else if (key == "max") {
        has_max = true;
        std::optional<std::uint64_t> bytes;
        if (!p.size(v, fusion, bytes)) {
          ok = false;
          continue;
        }
        lc.cell.off = !bytes.has_value();
        lc.cell.max_bytes = bytes.value_or(0);
      }
    }
    if (!has_cap || !has_ws || !has_max) {
      std::string missing;
      if (!has_cap) missing += " capability";
      if (!has_ws) missing += " world_size";
      if (!has_max) missing += " max";
      p.error(item, where + " cell is missing:" + missing,
              "a cell needs capability, world_size and max");
      continue;
    }
    if (!ok) continue;
    const CellKey& k = lc.cell.key;
    if (k.nodes > k.world_size) {
      p.error(item, "nodes " + std::to_string(k.nodes) + " is above world size " +
                        std::to_string(k.world_size));
      continue;
    }
    if (k.residual && k.pattern == Pattern::kAllreduce) {
      p.error(item, "cell (" + k.to_string() + ") never applies: pattern allreduce has no residual",
              "drop 'residual', or key the cell by a residual pattern such as residual_rmsnorm");
      continue;
    }
    if (k.capability.is_cpu() && k.nodes > 1) {
      p.warning(item, "a cpu cell keyed by nodes " + std::to_string(k.nodes) +
                          " never applies: the shm backend serves one host");
    }
    // Registered memory: shm on cpu, trtllm from capability 90 (its minimum).
    if (k.buffers == BufferKind::kRegistered && !k.capability.is_cpu() &&
        k.capability.code() < 90) {
      p.warning(item, "a cell keyed by buffers registered never applies on capability " +
                          std::to_string(k.capability.code()) +
                          ": no module registers memory there (trtllm needs capability 90 or "
                          "later; docs/registered-buffers.md)");
    }
    auto twin = std::find_if(out.begin(), out.end(),
                             [&](const LayerCell& o) { return o.cell.key.same_keys(k); });
    if (twin != out.end()) {
      p.error(item,
              "cell (" + k.to_string() + ") is defined twice in " + where + " (first at line " +
                  std::to_string(twin->pos.line) + ")",
              "keep one of them");
      continue;
    }
    out.push_back(lc);
  }
}

void parse_oneshot(Parser& p, const YamlNode& node, TableLayer& out) {
  for (const auto* e : p.entries(node, {"default", "cells"}, "oneshot")) {
    if (e->first.value == "default") {
      auto t = p.text(e->second, "oneshot.default");
      if (!t) continue;
      if (*t == "oneshot")
        out.oneshot_default.value = Algorithm::kOneshot;
      else if (*t == "twoshot")
        out.oneshot_default.value = Algorithm::kTwoshot;
      else {
        p.error(e->second, "oneshot.default must be oneshot or twoshot, got '" + *t + "'",
                "it says what a missing one-shot cell means");
        continue;
      }
      out.oneshot_default.pos = pos_of(e->second);
    } else {
      parse_cells(p, e->second, false, out.oneshot);
    }
  }
}

}  // namespace

bool parse_table(std::string_view bytes, const std::string& file, Layer layer, TableLayer& out,
                 std::vector<Diagnostic>& diagnostics) {
  out = TableLayer{};
  out.file = file;
  out.layer = layer;
  YamlNode root;
  if (!parse_yaml(bytes, file, root, diagnostics)) return false;
  Parser p(file, diagnostics);
  if (root.is_null()) {
    diagnostics.push_back(
        {Severity::kError, file, 1, 1, "empty table file", "a table needs at least `format: 1`"});
    return false;
  }
  if (!root.is_map()) {
    p.error(root, "a table must be a mapping of keys (format, fusion, ...), not " +
                      std::string(root.kind_name()));
    return false;
  }
  static const Keys kTop = {"format",     "provenance", "enabled", "fallback",
                            "preference", "backends",   "fusion",  "oneshot"};
  bool saw_format = false;
  for (const auto* e : p.entries(root, kTop, "the table")) {
    const std::string& key = e->first.value;
    const YamlNode& v = e->second;
    if (key == "format") {
      saw_format = true;
      auto f = p.integer(v, "format");
      if (!f) continue;
      if (*f != 1) {
        p.error(v,
                "format " + std::to_string(*f) +
                    " is not supported by this arbiter (it reads format 1)",
                "convert the table or use a newer arbiter");
        continue;
      }
      out.format = {1, pos_of(v)};
    } else if (key == "provenance") {
      parse_provenance(p, v, out);
    } else if (key == "enabled") {
      if (auto list = p.backend_list(v, "enabled")) {
        std::uint32_t mask = 0;
        for (Backend b : *list) mask |= 1u << static_cast<int>(b);
        out.enabled = {mask, pos_of(v)};
      }
    } else if (key == "fallback") {
      for (const auto* fe : p.entries(v, {"gpu", "cpu"}, "fallback")) {
        auto b = p.name<Backend>(fe->second, parse_backend, "fallback backend");
        if (!b) continue;
        const int kind = fe->first.value == "gpu" ? 0 : 1;
        out.fallback[kind] = {*b, pos_of(fe->second)};
      }
    } else if (key == "preference") {
      for (const auto* pe : p.entries(v, {"single_node", "multi_node", "cpu"}, "preference")) {
        const std::string& t = pe->first.value;
        const int topo = t == "single_node" ? 0 : t == "multi_node" ? 1 : 2;
        if (auto list = p.backend_list(pe->second, "preference." + t)) {
          out.preference[topo] = {*list, pos_of(pe->second)};
        }
      }
    } else if (key == "backends") {
      static const Keys kNames = {"trtllm", "mnnvl", "nccl", "shm"};
      for (const auto* be : p.entries(v, kNames, "backends")) {
        Backend b = *arbiter::parse_backend(be->first.value).value;
        parse_backend_rules(p, b, be->second, out.backends[static_cast<int>(b)]);
      }
    } else if (key == "fusion") {
      parse_cells(p, v, true, out.fusion);
    } else if (key == "oneshot") {
      parse_oneshot(p, v, out);
    }
  }
  if (!saw_format) {
    diagnostics.push_back({Severity::kError, file, root.line, root.column, "missing `format: 1`",
                           "every table file starts with `format: 1`"});
    return false;
  }
  return !p.failed();
}

}  // namespace arbiter::detail
