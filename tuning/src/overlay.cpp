#include "arbiter/tuning/overlay.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "arbiter/size.h"
#include "text.h"

namespace arbiter::tuning {
namespace {

using detail::number_text;
using detail::printable;
using detail::size_cell;
using detail::yaml_quoted;

// What a cell is keyed by: a group without its dtype. A distinct residual
// (and allreduce's none) writes no residual key, copied buffers no buffers
// key: such cells serve every call, and a replicated (registered) one's
// cell, keyed, wins over them for its calls.
struct Scope {
  Capability capability;
  std::uint32_t world_size = 0;
  std::uint32_t nodes = 1;
  Pattern pattern = Pattern::kAllreduce;
  bool replicated = false;
  bool registered = false;
  friend auto operator<=>(const Scope&, const Scope&) = default;

  static Scope of(const GroupKey& k) {
    return {k.capability, k.world_size, k.nodes, k.pattern, k.replicated(), k.registered};
  }
  bool keyed() const { return replicated || registered; }
  std::string to_string() const {
    return "capability " + capability_name(capability) + ", world size " +
           std::to_string(world_size) + ", " + std::to_string(nodes) +
           (nodes == 1 ? " node, " : " nodes, ") + std::string(pattern_name(pattern)) +
           (replicated ? ", residual replicated" : "") + (registered ? ", registered buffers" : "");
  }
};

// The residual and buffers keys of a cell of `scope`. A registered group of
// a residual pattern names its residual even when distinct: otherwise its
// cell and a replicated group's, equally specific, would both match a call
// that is replicated and registered, which the tables refuse as a conflict.
void key_cell(OverlayCell& cell, const Scope& scope) {
  if (scope.replicated) cell.residual = Residual::kReplicated;
  if (scope.registered) {
    cell.buffers = BufferKind::kRegistered;
    if (scope.pattern != Pattern::kAllreduce && !scope.replicated) {
      cell.residual = Residual::kDistinct;
    }
  }
}

struct Derived {
  Dtype dtype;
  Cap cap;
};

// The smaller of the usable caps (off < any size); nullptr when none is.
const Derived* smallest(const std::vector<Derived>& caps) {
  const Derived* best = nullptr;
  for (const Derived& d : caps) {
    if (d.cap.kind == Cap::Kind::kNone) continue;
    const bool smaller = !best ||
                         (d.cap.kind == Cap::Kind::kOff && best->cap.kind != Cap::Kind::kOff) ||
                         (d.cap.kind == Cap::Kind::kBytes && best->cap.kind == Cap::Kind::kBytes &&
                          d.cap.bytes < best->cap.bytes);
    if (smaller) best = &d;
  }
  return best;
}

bool same_value(const Cap& a, const Cap& b) {
  return a.kind == b.kind && (a.kind != Cap::Kind::kBytes || a.bytes == b.bytes);
}

// One comment line per dtype, and a last one when they disagreed.
std::string dtype_comment(const std::vector<Derived>& caps, const Derived& chosen,
                          std::string_view what, bool* disagree_out) {
  std::string comment;
  bool disagree = false;
  for (const Derived& d : caps) {
    if (!comment.empty()) comment += "\n";
    comment +=
        std::string(dtype_name(d.dtype)) + " measured: " + std::string(what) + " " + d.cap.text();
    if (d.cap.kind != Cap::Kind::kNone && !same_value(d.cap, chosen.cap)) disagree = true;
  }
  *disagree_out = disagree;
  if (disagree) {
    comment += "\nthe dtypes disagree: the smaller cap (" + std::string(dtype_name(chosen.dtype)) +
               ") is written, since the tables are not keyed by dtype";
  }
  return comment;
}

std::string cell_line(const OverlayCell& c) {
  std::string s = "{capability: " + capability_name(c.capability) +
                  ", world_size: " + std::to_string(c.world_size);
  if (c.nodes != 0) s += ", nodes: " + std::to_string(c.nodes);
  s += ", pattern: " + std::string(pattern_name(c.pattern));
  if (c.residual) s += ", residual: " + std::string(residual_name(*c.residual));
  if (c.buffers) s += ", buffers: " + std::string(buffer_kind_name(*c.buffers));
  s += ", max: " + (c.off ? std::string("off") : size_cell(c.bytes)) + "}";
  return s;
}

void write_comment(std::string& out, std::string_view indent, std::string_view text) {
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t nl = text.find('\n', start);
    const std::string_view line =
        text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    out += std::string(indent) + "# " + printable(line) + "\n";
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
}

// Distinct values of a provenance key over the files, "; "-joined.
std::string provenance_values(const std::vector<ResultsFile>& files,
                              const std::vector<std::string_view>& keys) {
  std::vector<std::string> values;
  for (const ResultsFile& f : files) {
    for (std::string_view key : keys) {
      const std::string v = f.provenance_value(key);
      if (!v.empty() && std::find(values.begin(), values.end(), v) == values.end()) {
        values.push_back(v);
      }
    }
  }
  std::string out;
  for (const std::string& v : values) out += (out.empty() ? "" : "; ") + v;
  return out;
}

}  // namespace

Overlay make_overlay(const std::vector<Group>& groups, const std::vector<ResultsFile>& files,
                     const OverlayOptions& options) {
  std::map<Scope, std::vector<std::pair<const Group*, Derived>>> fusion_by_scope;
  std::map<Scope, std::vector<Derived>> oneshot_by_scope;
  std::map<Scope, bool> has_trtllm;
  for (const Group& g : groups) {
    const Scope scope = Scope::of(g.key);
    const FusedRun runs = options.fused_run ? options.fused_run(g) : FusedRun{};
    fusion_by_scope[scope].push_back(
        {&g, Derived{g.key.dtype, fusion_cap(g, options.margin_pct, runs)}});
    oneshot_by_scope[scope].push_back(Derived{g.key.dtype, oneshot_cap(g, options.margin_pct)});
    for (const Curve& c : g.curves) {
      if (c.option.fused && c.option.backend == "trtllm") has_trtllm[scope] = true;
    }
  }

  Overlay overlay;
  overlay.fusion.reserve(fusion_by_scope.size());
  // The fusion cell written for the scope (when `own`), else for it without
  // its buffers key, else without its residual key too: the order a call's
  // cells widen in. (Never a registered cell without the residual: that one
  // is keyed `residual: distinct`, so it does not cover a replicated scope.)
  // Filled as cells are written; overlay.fusion is reserved, so its
  // addresses hold.
  std::map<Scope, const OverlayCell*> fusion_cell;
  auto covering = [&](Scope scope, bool own) -> const OverlayCell* {
    auto written = [&](const Scope& s) -> const OverlayCell* {
      const auto f = fusion_cell.find(s);
      return f == fusion_cell.end() ? nullptr : f->second;
    };
    if (own) {
      if (const OverlayCell* c = written(scope)) return c;
    }
    if (scope.registered) {
      scope.registered = false;
      if (const OverlayCell* c = written(scope)) return c;
    }
    if (scope.replicated) {
      scope.replicated = false;
      if (const OverlayCell* c = written(scope)) return c;
    }
    return nullptr;
  };
  if (!options.fusion_cells) fusion_by_scope.clear();
  for (const auto& [scope, entries] : fusion_by_scope) {
    std::vector<Derived> caps;
    for (const auto& e : entries) caps.push_back(e.second);
    const Derived* chosen = smallest(caps);
    if (!chosen) {
      std::string why;
      for (const Derived& d : caps) {
        why += (why.empty() ? "" : "; ") + std::string(dtype_name(d.dtype)) + ": " + d.cap.why;
      }
      overlay.notes.push_back(scope.to_string() + ": no fusion cell (" + why + ")");
      continue;
    }
    if (options.current_cap && !covering(scope, false)) {
      // Every dtype's fused won up to the largest size measured: a cell
      // could only lower a current cap that is no lower. (Under a cell this
      // overlay writes for the scope without its residual or buffers key,
      // the current cap is not what these calls get: the cell is written.)
      bool won_to_the_end = true;
      std::uint64_t largest = 0;
      for (const auto& [g, d] : entries) {
        if (d.cap.kind == Cap::Kind::kNone) continue;
        won_to_the_end = won_to_the_end && d.cap.kind == Cap::Kind::kBytes && d.cap.lost_at == 0 &&
                         !d.cap.compared.empty() && d.cap.compared.back() == g->sizes.back();
        largest = std::max(largest, d.cap.bytes);
      }
      const std::optional<std::uint64_t> current =
          won_to_the_end ? options.current_cap(*entries[chosen - caps.data()].first) : std::nullopt;
      if (current && *current >= largest) {
        overlay.notes.push_back(scope.to_string() + ": no fusion cell: fused won at every size " +
                                "compared, up to the largest measured (" + format_size(largest) +
                                "), and the current cap " + format_size(*current) +
                                " is no lower, so it stays (measure larger sizes to move it)");
        continue;
      }
    }
    OverlayCell cell;
    cell.capability = scope.capability;
    cell.world_size = scope.world_size;
    cell.nodes = scope.nodes > 1 || !scope.capability.is_cpu() ? scope.nodes : 0;
    cell.pattern = scope.pattern;
    key_cell(cell, scope);
    cell.off = chosen->cap.kind == Cap::Kind::kOff;
    cell.bytes = chosen->cap.bytes;
    bool disagree = false;
    cell.comment = scope.to_string() + "\n" + dtype_comment(caps, *chosen, "fusion cap", &disagree);
    if (disagree) {
      overlay.notes.push_back(scope.to_string() +
                              ": the dtypes measured give different fusion "
                              "caps; the smaller is written");
    }
    overlay.fusion.push_back(std::move(cell));
    fusion_cell[scope] = &overlay.fusion.back();
  }

  // A one-shot cell for `scope` from the caps of its dtypes; `what` names
  // the cap ("one-shot cap", "shm one-shot split").
  auto oneshot_cell = [&](const Scope& scope, const std::vector<Derived>& caps,
                          const std::string& what) {
    const Derived* chosen = smallest(caps);
    if (!chosen) {
      std::string why;
      for (const Derived& d : caps) {
        why += (why.empty() ? "" : "; ") + std::string(dtype_name(d.dtype)) + ": " + d.cap.why;
      }
      overlay.notes.push_back(scope.to_string() + ": no one-shot cell (" + why + ")");
      return;
    }
    if (chosen->cap.kind == Cap::Kind::kOff) {
      overlay.notes.push_back(
          scope.to_string() + ": no one-shot cell: " + std::string(dtype_name(chosen->dtype)) +
          " " + what + " " + chosen->cap.text() + "; a one-shot cell cannot say off");
      return;
    }
    OverlayCell cell;
    cell.capability = scope.capability;
    cell.world_size = scope.world_size;
    cell.pattern = scope.pattern;
    key_cell(cell, scope);
    cell.bytes = chosen->cap.bytes;
    bool disagree = false;
    cell.comment = scope.to_string() + "\n" + dtype_comment(caps, *chosen, what, &disagree);
    if (disagree) {
      overlay.notes.push_back(scope.to_string() + ": the dtypes measured give different " + what +
                              "s; the smaller is written");
    }
    // Above the fusion cell that covers its calls nothing is fused.
    const OverlayCell* f = covering(scope, true);
    if (f && !f->off && f->bytes < cell.bytes) {
      cell.comment +=
          "\nlowered to the fusion cap " + format_size(f->bytes) + ": above it nothing is fused";
      overlay.notes.push_back(scope.to_string() + ": " + what + " " + format_size(cell.bytes) +
                              " lowered to the fusion cap " + format_size(f->bytes));
      cell.bytes = f->bytes;
    }
    overlay.oneshot.push_back(std::move(cell));
  };

  for (const auto& [scope, caps] : oneshot_by_scope) {
    if (scope.nodes != 1 || !has_trtllm[scope]) continue;
    oneshot_cell(scope, caps, "one-shot cap");
  }

  for (const char* backend : kThresholdBackends) {
    std::vector<std::pair<const Group*, Cap>> splits;
    std::map<Scope, std::vector<Derived>> cell_splits;
    for (const Group& g : groups) {
      Cap cap = split_cap(g, backend, options.margin_pct);
      if (cap.kind == Cap::Kind::kNone) continue;
      if (g.key.capability.is_cpu()) {
        // shm reads a cpu one-shot cell before its threshold: each measured
        // world size (and residual, buffers) gets its own split, where one
        // threshold for all made a 2-rank call run the 4 ranks' two-shot.
        cell_splits[Scope::of(g.key)].push_back(Derived{g.key.dtype, std::move(cap)});
      } else if (!Scope::of(g.key).keyed()) {
        splits.emplace_back(&g, std::move(cap));
      } else {
        overlay.notes.push_back(g.key.to_string() + ": " + backend + " one-shot split " +
                                cap.text() +
                                " not written: oneshot_max_total serves every call, and only "
                                "cpu one-shot cells can key a split by the residual or the "
                                "buffers");
      }
    }
    for (const auto& [scope, caps] : cell_splits) {
      oneshot_cell(scope, caps, std::string(backend) + " one-shot split");
    }
    if (splits.empty()) continue;
    OverlayThreshold t;
    t.backend = backend;
    t.comment =
        "one-shot while bytes x world size <= this: the smallest split x world size "
        "over the groups measured";
    const Group* off = nullptr;
    for (const auto& [g, cap] : splits) {
      t.comment += "\n" + g->key.to_string() + ": one-shot split " + cap.text();
      if (cap.kind == Cap::Kind::kOff) {
        off = g;
        continue;
      }
      const std::uint64_t total = cap.bytes * g->key.world_size;
      t.comment += " -> x " + std::to_string(g->key.world_size) + " = " + format_size(total);
      if (t.bytes == 0 || total < t.bytes) t.bytes = total;
    }
    if (off != nullptr) {  // every other split is a measured size, never 0
      overlay.notes.push_back(std::string(backend) +
                              ": no oneshot_max_total: " + off->key.to_string() +
                              ": its split is off, two-shot at every compared size (a "
                              "threshold cannot say off)");
      continue;
    }
    overlay.thresholds.push_back(std::move(t));
  }

  // The file.
  std::string& y = overlay.yaml;
  const std::string margin = number_text(options.margin_pct) + "%";
  y += "# Written by `arbiter tune` from benchmark results. A site table (schema/FORMAT.md):\n";
  y += "# check it with `arbiter validate FILE`; load it with --config FILE or\n";
  y += "# ARBITER_CONFIG=FILE. It sets only the cells that were measured.\n";
  y += "#\n";
  y += "# Every cap is a measured size, never interpolated: the one that fits the\n";
  y += "# measurements best as a single cap (the least regret summed over the measured\n";
  if (options.fused_run) {
    y += "# sizes) for the fused option the tables run at each size (fusion: their preferred\n";
    y += "# eligible backend, one-shot or two-shot by the one-shot rules below) against the\n";
    y += "# best unfused option, or trtllm one-shot (oneshot) against two-shot, counting the\n";
    y += "# former " + margin + " faster.\n";
  } else {
    y += "# sizes) for the best fused option (fusion) or trtllm one-shot (oneshot) against\n";
    y += "# the best unfused option (two-shot), counting the former " + margin + " faster.\n";
  }
  y += "# mnnvl's oneshot_max_total is the smallest one-shot split x world size over the\n";
  y += "# groups that measured its one-shot and two-shot; on cpu each group's shm split\n";
  y += "# is a one-shot cell of its own.\n";
  y += "# Cells are keyed by pattern, so that one pattern's measurement leaves the others\n";
  y += "# alone, and (on GPUs) by nodes, one included. The tables are not keyed by\n";
  y += "# dtype: each cell says which dtype was measured. Calls measured with a replicated\n";
  y += "# residual (bench --residual-replicated) write cells keyed `residual: replicated`.\n";
  y += "# Calls measured in registered memory (bench --registered) likewise write cells\n";
  y += "# keyed `buffers: registered`.\n";
  y += "format: 1\n\n";

  std::string source;
  for (const ResultsFile& f : files) source += (source.empty() ? "" : ", ") + f.path;
  std::string devices;
  for (const Group& g : groups) {
    if (!g.device.empty() && devices.find(g.device) == std::string::npos) {
      devices += (devices.empty() ? "" : "; ") + g.device;
    }
  }
  std::string date = provenance_values(files, {"date"});
  const std::string tuned = options.date.empty() ? std::string() : ", tuned " + options.date;
  if (date.empty()) date = options.date;
  y += "provenance:\n";
  y += "  source: " + yaml_quoted("benchmark results " + source) + "\n";
  y += "  measured_on: " +
       yaml_quoted(devices.empty() ? "unknown (no device column or # device: line)" : devices) +
       "\n";
  if (!date.empty()) y += "  date: " + yaml_quoted(date) + "\n";
  y += "  tool: " +
       yaml_quoted(options.tool.empty() ? "arbiter tune " ARBITER_VERSION : options.tool) + "\n";
  y += "  notes: " +
       yaml_quoted("margin " + margin + ": fused (one-shot) counted " + margin +
                   " faster than measured against unfused (two-shot)" + tuned) +
       "\n";
  // Provenance keys of the table format, and the results comments that feed them.
  const std::vector<std::pair<std::string, std::vector<std::string_view>>> extra = {
      {"driver", {"driver"}},
      {"nccl", {"nccl", "nccl_version"}},
      {"hosts", {"hosts", "host_count"}},
      {"arbiter_version", {"arbiter_version"}}};
  for (const auto& [key, aliases] : extra) {
    const std::string v = provenance_values(files, aliases);
    if (!v.empty()) y += "  " + key + ": " + yaml_quoted(v) + "\n";
  }

  if (!overlay.fusion.empty()) {
    y += "\nfusion:\n";
    for (const OverlayCell& c : overlay.fusion) {
      write_comment(y, "  ", c.comment);
      y += "  - " + cell_line(c) + "\n";
    }
  }
  if (!overlay.oneshot.empty()) {
    y += "\noneshot:\n  cells:\n";
    for (const OverlayCell& c : overlay.oneshot) {
      write_comment(y, "    ", c.comment);
      y += "    - " + cell_line(c) + "\n";
    }
  }
  if (!overlay.thresholds.empty()) {
    y += "\nbackends:\n";
    for (const OverlayThreshold& t : overlay.thresholds) {
      y += "  " + t.backend + ":\n";
      write_comment(y, "    ", t.comment);
      y += "    oneshot_max_total: " + size_cell(t.bytes) + "\n";
    }
  }
  if (!overlay.notes.empty()) {
    y += "\n";
    write_comment(y, "", "Not written, or changed:");
    for (const std::string& n : overlay.notes) write_comment(y, "", "  " + n);
  }
  return overlay;
}

}  // namespace arbiter::tuning
