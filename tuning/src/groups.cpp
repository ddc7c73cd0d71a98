#include "arbiter/tuning/groups.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include "arbiter/size.h"
#include "text.h"

namespace arbiter::tuning {
namespace {

using detail::us_text;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

Diagnostic refusal(const Row& at, const GroupKey& key, std::string message, std::string hint) {
  return {Severity::kError, at.file, at.line, 0, key.to_string() + ": " + std::move(message),
          std::move(hint)};
}

std::string size_list(const std::vector<std::uint64_t>& sizes) {
  if (sizes.empty()) return "none";
  if (sizes.size() == 1) return format_size(sizes.front());
  return format_size(sizes.front()) + " .. " + format_size(sizes.back()) + " (" +
         std::to_string(sizes.size()) + " sizes)";
}

// "2.14x"
std::string ratio_text(double ratio) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3g", ratio);
  return std::string(buffer) + "x";
}

using BestAt = std::function<std::optional<Group::Best>(std::uint64_t)>;

// The cap that fits the measurements best: `preferred` at and below it,
// `other` above, with the least summed regret over the compared sizes (each
// size counts once; `preferred` counts margin_pct faster). Ties go to the
// larger cap. So a loss at one size does not end the cap when `preferred`
// gains more above it (the report names such sizes), and the first compared
// size above the cap is always one where `preferred` lost.
Cap derive(const Group& group, double margin_pct, const std::string& preferred_name,
           const BestAt& preferred, const BestAt& other) {
  Cap cap;
  cap.preferred = preferred_name;
  struct Compared {
    std::uint64_t bytes;
    Group::Best p, o;
    bool lost;  // beyond the margin
  };
  std::vector<Compared> sizes;
  for (std::uint64_t bytes : group.sizes) {
    const std::optional<Group::Best> p = preferred(bytes), o = other(bytes);
    if (!p || !o) continue;
    cap.compared.push_back(bytes);
    // In this form a margin of 18% compares 118 with 100 exactly.
    sizes.push_back({bytes, *p, *o, p->latency_us * 100.0 > o->latency_us * (100.0 + margin_pct)});
  }
  if (sizes.empty()) {
    cap.why = "never measured at the same size as the option it is compared with";
    return cap;
  }
  // The regret of each choice at one size, as a fraction of the better one.
  const double scale = 100.0 / (100.0 + margin_pct);
  auto regret = [&](const Compared& c, bool choose_preferred) {
    const double p = c.p.latency_us * scale, o = c.o.latency_us;
    return (choose_preferred ? p : o) / std::min(p, o) - 1.0;
  };
  // cost(n): the first n sizes run the preferred option, the rest the other.
  double cost = 0;
  for (const Compared& c : sizes) cost += regret(c, false);
  double best_cost = cost;
  std::size_t best_n = 0;
  for (std::size_t n = 1; n <= sizes.size(); ++n) {
    cost += regret(sizes[n - 1], true) - regret(sizes[n - 1], false);
    if (cost <= best_cost + 1e-12) {
      best_cost = std::min(best_cost, cost);
      best_n = n;
    }
  }
  for (std::size_t k = 0; k < best_n; ++k) {
    if (sizes[k].lost) cap.lost_inside.push_back(sizes[k].bytes);
  }
  if (best_n < sizes.size()) {
    const Compared& first_out = sizes[best_n];
    cap.lost_at = first_out.bytes;
    cap.lost_us = first_out.p.latency_us;
    cap.winner_us = first_out.o.latency_us;
    cap.winner = first_out.o.curve->option.label();
  }
  if (best_n == 0) {
    cap.kind = Cap::Kind::kOff;
  } else {
    cap.kind = Cap::Kind::kBytes;
    cap.bytes = sizes[best_n - 1].bytes;
  }
  return cap;
}

}  // namespace

std::string GroupKey::to_string() const {
  return "capability " + capability_name(capability) + ", world size " +
         std::to_string(world_size) + ", " + std::to_string(nodes) +
         (nodes == 1 ? " node, " : " nodes, ") + std::string(pattern_name(pattern)) + ", " +
         std::string(dtype_name(dtype)) + (replicated() ? ", residual replicated" : "") +
         (registered ? ", registered buffers" : "");
}

std::string Option::label() const {
  return backend + " " + algorithm + (fused ? " fused" : " unfused");
}

const Point* Curve::at(std::uint64_t bytes) const {
  const auto it = std::lower_bound(points.begin(), points.end(), bytes,
                                   [](const Point& p, std::uint64_t b) { return p.bytes < b; });
  return it != points.end() && it->bytes == bytes ? &*it : nullptr;
}

std::optional<Group::Best> Group::best(std::uint64_t bytes, std::optional<bool> fused) const {
  std::optional<Best> best;
  for (const Curve& c : curves) {
    if (fused && c.option.fused != *fused) continue;
    const Point* p = c.at(bytes);
    if (p && (!best || p->latency_us < best->latency_us)) best = Best{p->latency_us, &c};
  }
  return best;
}

const Curve* Group::curve(const Option& option) const {
  for (const Curve& c : curves) {
    if (c.option == option) return &c;
  }
  return nullptr;
}

Grouping group_results(const std::vector<ResultsFile>& files) {
  using Points = std::map<std::uint64_t, std::vector<const Row*>>;
  struct Raw {
    std::vector<const Row*> rows;
    std::map<Option, Points> options;
  };
  std::map<GroupKey, Raw> raw;
  for (const ResultsFile& file : files) {
    for (const Row& row : file.rows) {
      const GroupKey key{row.capability, row.world_size, row.nodes,     row.pattern,
                         row.dtype,      row.residual,   row.registered};
      Raw& r = raw[key];
      r.rows.push_back(&row);
      r.options[Option{row.backend, row.algorithm, row.fused}][row.bytes].push_back(&row);
    }
  }

  Grouping out;
  for (const auto& [key, r] : raw) {
    const std::size_t errors_before = out.refusals.size();
    Group group;
    group.key = key;
    for (const Row* row : r.rows) {
      if (std::find(group.files.begin(), group.files.end(), row->file) == group.files.end()) {
        group.files.push_back(row->file);
      }
      if (row->device.empty()) continue;
      if (group.device.empty()) {
        group.device = row->device;
        continue;
      }
      if (row->device != group.device) {
        const auto first = std::find_if(r.rows.begin(), r.rows.end(),
                                        [&](const Row* x) { return x->device == group.device; });
        out.refusals.push_back(refusal(
            **first, key,
            "rows name different devices: \"" + group.device + "\" (" + (*first)->where() +
                ") and \"" + row->device + "\" (" + row->where() + ")",
            "tune each device separately: caps measured on one device do not hold for another"));
        break;
      }
    }

    for (const auto& [option, points] : r.options) {
      Curve curve;
      curve.option = option;
      for (const auto& [bytes, rows] : points) {
        Point p;
        p.bytes = bytes;
        p.rows = rows;
        std::vector<double> latencies;
        for (const Row* row : rows) latencies.push_back(row->latency_us);
        p.latency_us = median(latencies);
        const auto [lo, hi] = std::minmax_element(rows.begin(), rows.end(), [](auto* a, auto* b) {
          return a->latency_us < b->latency_us;
        });
        if ((*hi)->latency_us > kMaxDuplicateSpread * (*lo)->latency_us) {
          std::string list;
          for (const Row* row : rows) {
            list += (list.empty() ? "" : ", ") + us_text(row->latency_us) + " at " + row->where();
          }
          out.refusals.push_back(refusal(
              *rows.front(), key,
              option.label() + " at " + format_size(bytes) + ": duplicate rows disagree (" + list +
                  "; the slowest is " + ratio_text((*hi)->latency_us / (*lo)->latency_us) +
                  " the fastest, more than " + ratio_text(kMaxDuplicateSpread) + ")",
              "re-measure, or remove the rows that are wrong"));
        }
        curve.points.push_back(std::move(p));
        group.sizes.push_back(bytes);
      }
      group.curves.push_back(std::move(curve));
    }
    std::sort(group.sizes.begin(), group.sizes.end());
    group.sizes.erase(std::unique(group.sizes.begin(), group.sizes.end()), group.sizes.end());
    if (group.sizes.size() < 2) {
      out.refusals.push_back(refusal(*r.rows.front(), key,
                                     "only one message size was measured (" +
                                         format_size(group.sizes.front()) +
                                         "); caps need at least 2",
                                     "measure a range of sizes, e.g. 4 KiB to 64 MiB"));
    }
    if (out.refusals.size() == errors_before) out.groups.push_back(std::move(group));
  }
  return out;
}

std::string Cap::text() const {
  switch (kind) {
    case Kind::kNone:
      return "none (" + why + ")";
    case Kind::kOff:
      return "off (" + preferred + " lost at the smallest compared size, " +
             detail::size_text(lost_at) + ": " + us_text(lost_us) + " against " +
             us_text(winner_us) + " for " + winner + ")";
    case Kind::kBytes:
      break;
  }
  std::string s = detail::size_text(bytes);
  // Losses the cap keeps: they cost less than the wins above them gain.
  const std::string inside = lost_inside.empty()
                                 ? ""
                                 : "; kept where it lost at " + size_list(lost_inside) +
                                       ", as one cap fits the wins around " +
                                       (lost_inside.size() == 1 ? "it" : "them") + " better";
  if (lost_at != 0) {
    return s + " (" + preferred + " lost at " + detail::size_text(lost_at) + ": " +
           us_text(lost_us) + " against " + us_text(winner_us) + " for " + winner + inside + ")";
  }
  if (!lost_inside.empty()) {
    return s + " (the largest compared size" + inside + "; nothing is known above)";
  }
  return s + " (" + preferred + " won at every compared size, " + size_list(compared) +
         "; nothing is known above)";
}

Cap fusion_cap(const Group& group, double margin_pct, const FusedRun& runs) {
  const bool any_fused = std::any_of(group.curves.begin(), group.curves.end(),
                                     [](const Curve& c) { return c.option.fused; });
  const bool any_unfused = std::any_of(group.curves.begin(), group.curves.end(),
                                       [](const Curve& c) { return !c.option.fused; });
  if (!any_fused || !any_unfused) {
    Cap cap;
    cap.preferred = "fused";
    cap.why = !any_fused ? "no fused option was measured"
                         : "no unfused option was measured; add a baseline (fused = 0) to derive a "
                           "fusion cap";
    return cap;
  }
  // The options the tables run fused, by size; empty when none is eligible.
  std::vector<std::optional<Option>> run;
  if (runs) {
    for (std::uint64_t b : group.sizes) run.push_back(runs(b));
    if (std::none_of(run.begin(), run.end(), [](const auto& o) { return o.has_value(); })) {
      run.clear();
    }
  }
  const BestAt fused = [&](std::uint64_t b) -> std::optional<Group::Best> {
    if (run.empty()) return group.best(b, true);
    const auto at = std::lower_bound(group.sizes.begin(), group.sizes.end(), b);
    const std::optional<Option>& option = run[at - group.sizes.begin()];
    const Curve* c = option ? group.curve(*option) : nullptr;
    const Point* p = c ? c->at(b) : nullptr;
    if (!p) return std::nullopt;
    return Group::Best{p->latency_us, c};
  };
  Cap cap = derive(group, margin_pct, "fused", fused,
                   [&](std::uint64_t b) { return group.best(b, false); });
  if (cap.compared.empty() && !run.empty()) {
    std::vector<std::string> unmeasured;
    for (const std::optional<Option>& o : run) {
      if (o && std::find(unmeasured.begin(), unmeasured.end(), o->label()) == unmeasured.end()) {
        unmeasured.push_back(o->label());
      }
    }
    std::string list;
    for (const std::string& label : unmeasured) list += (list.empty() ? "" : ", ") + label;
    cap.why = "the tables run " + list +
              " here, never measured at a size where an unfused option was; measure it";
  } else if (cap.compared.empty()) {
    cap.why = "fused and unfused options were never measured at one size";
  }
  return cap;
}

namespace {

// `backend`'s fused one-shot against its fused two-shot.
Cap one_against_two(const Group& group, const std::string& backend, double margin_pct) {
  Cap none;
  none.preferred = "one-shot";
  const Curve* one = group.curve(Option{backend, "oneshot", true});
  const Curve* two = group.curve(Option{backend, "twoshot", true});
  if (!one || !two) {
    none.why = backend + " one-shot and two-shot were not both measured";
    return none;
  }
  auto at = [](const Curve* c) {
    return [c](std::uint64_t b) -> std::optional<Group::Best> {
      const Point* p = c->at(b);
      if (!p) return std::nullopt;
      return Group::Best{p->latency_us, c};
    };
  };
  Cap cap = derive(group, margin_pct, "one-shot", at(one), at(two));
  if (cap.compared.empty())
    cap.why = backend + " one-shot and two-shot were never measured at one size";
  return cap;
}

}  // namespace

Cap oneshot_cap(const Group& group, double margin_pct) {
  if (group.key.nodes != 1) {
    Cap none;
    none.preferred = "one-shot";
    none.why = "the one-shot table is for single-node trtllm only";
    return none;
  }
  return one_against_two(group, "trtllm", margin_pct);
}

Cap split_cap(const Group& group, const std::string& backend, double margin_pct) {
  return one_against_two(group, backend, margin_pct);
}

}  // namespace arbiter::tuning
