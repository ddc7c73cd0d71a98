// arbiter tune: caps from benchmark results, the regret of the current
// tables and of the tuned ones, and a site overlay holding the new caps.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <ctime>
#include <fstream>
#include <iostream>

#include "arbiter/size.h"
#include "arbiter/tuning/groups.h"
#include "arbiter/tuning/overlay.h"
#include "arbiter/tuning/regret.h"
#include "arbiter/tuning/results.h"
#include "cli.h"

namespace arbiter::cli {
namespace {

using namespace arbiter::tuning;

constexpr const char* kTuneUsage =
    "usage: arbiter tune RESULTS.csv... [-o overlay.yaml] [--margin PCT] [--config FILE]...\n"
    "                    [--preset NAME] [--nvlink-domain] [--multicast]\n"
    "\n"
    "Derives, per (capability, world size, nodes, pattern, dtype, residual, buffers)\n"
    "measured, the fusion cap\n"
    "(the measured size that, as one cap, fits the measurements best: the least regret\n"
    "summed over the measured sizes, the fused option the tables run at each size\n"
    "(their preferred eligible backend, one-shot or two-shot by the tuned one-shot\n"
    "rules; the best fused one measured when no fused backend is eligible) counted\n"
    "PCT% faster than measured, against the best unfused one), the one-shot cap of\n"
    "single-node trtllm (one-shot against two-shot, by the same rule) and the one-shot\n"
    "split of shm and mnnvl (on cpu a one-shot cell per group; mnnvl's oneshot_max_total\n"
    "is the smallest one-shot split x world size over the groups measured); prints them\n"
    "with the regret of the current tables and of the tuned ones (how much slower the option\n"
    "the tables choose is than the best measured one), and writes a site table holding\n"
    "the new caps. Caps are always measured sizes; where fused won at every size\n"
    "measured and the current cap is no lower, no fusion cell is written (a note says\n"
    "so): nothing measured argues for fusing less. GPU cells name their node count,\n"
    "one node included. Groups measured with a replicated\n"
    "residual write cells keyed `residual: replicated` (on GPUs mnnvl's split is then\n"
    "not written: the threshold serves every call). Groups measured in\n"
    "registered memory (bench --registered) likewise write cells keyed `buffers:\n"
    "registered`.\n"
    "\n"
    "RESULTS.csv (as `arbiter bench` writes it): a header naming at least capability,\n"
    "world_size, nodes, dtype, hidden, num_tokens, bytes, pattern, backend, algorithm,\n"
    "fused and latency_us, in any order (other columns are ignored; device, residual and\n"
    "buffers columns are used: residual replicated or distinct, empty for allreduce;\n"
    "buffers registered or copied, empty meaning copied); `# key:\n"
    "value` lines are provenance (device, driver, nccl, hosts, date).\n"
    "Rows with a skipped or status column saying so, or no latency, are skipped.\n"
    "Duplicate rows (same option and bytes) count by their median and must agree\n"
    "within 2x.\n"
    "\n"
    "The overlay goes to -o FILE, else to stdout; the report goes to stdout with -o,\n"
    "else to stderr. Exit 0: done; 1: results refused (malformed, duplicates that\n"
    "disagree, mixed devices, a single size), or tables that do not load; 2: usage\n"
    "error or unreadable file.\n\n";

double margin_flag(std::string text) {
  if (!text.empty() && text.back() == '%') text.pop_back();
  double v = -1;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || !(v >= 0) ||
      v > 100) {
    throw UsageError{"--margin: '" + text + "' is not a percentage between 0 and 100"};
  }
  return v;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &tm);
  return text;
}

std::string us(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.4g us", v);
  return buffer;
}

std::string pct(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f%%", v);
  return buffer;
}

// Prints rows as columns: the first row is the heading; columns listed in
// `right` are right-aligned.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows,
                 const std::vector<bool>& right, const std::string& indent) {
  std::vector<std::size_t> width(right.size(), 0);
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line = indent;
    for (std::size_t i = 0; i < row.size(); ++i) {
      const std::string pad(width[i] - row[i].size(), ' ');
      line += right[i] ? pad + row[i] : row[i] + (i + 1 < row.size() ? pad : "");
      if (i + 1 < row.size()) line += "   ";
    }
    out << line << "\n";
  }
}

std::string chosen_cell(const RegretPoint& p) {
  if (!p.chosen_us) return p.chosen + " (not measured)";
  return p.chosen + ", " + us(*p.chosen_us);
}

std::string summary(const Regret& r) {
  if (!r.mean_pct) return "nothing it chose was measured";
  std::string s = "mean " + pct(*r.mean_pct) + ", worst " + pct(*r.worst_pct);
  if (*r.worst_pct > 0) s += " at " + format_size(r.worst_bytes);
  if (r.not_measured > 0) {
    s += " (" + std::to_string(r.not_measured) + " size" + (r.not_measured == 1 ? "" : "s") +
         " not measured, left out)";
  }
  return s;
}

void report_group(std::ostream& out, const Group& g, double margin, const FusedRun& fused_run,
                  const Policy& current, const std::optional<Policy>& tuned,
                  const TopologyFlags& topology) {
  out << g.key.to_string() << "\n";
  std::string files;
  for (const std::string& f : g.files) files += (files.empty() ? "" : ", ") + f;
  out << "  device " << (g.device.empty() ? "unknown" : g.device) << "; from " << files << "\n";
  std::string options;
  for (const Curve& c : g.curves) options += (options.empty() ? "" : ", ") + c.option.label();
  out << "  measured " << format_size(g.sizes.front()) << " .. " << format_size(g.sizes.back())
      << " (" << g.sizes.size() << " sizes): " << options << "\n";
  out << "  fusion cap:   " << fusion_cap(g, margin, fused_run).text() << "\n";
  const Cap oneshot = oneshot_cap(g, margin);
  if (g.key.nodes == 1 || oneshot.kind != Cap::Kind::kNone) {
    out << "  one-shot cap: " << oneshot.text() << "\n";
  }
  for (const char* backend : kThresholdBackends) {
    const Cap split = split_cap(g, backend, margin);
    if (split.kind == Cap::Kind::kNone) continue;
    out << "  " << backend << " one-shot split: " << split.text();
    if (split.kind == Cap::Kind::kBytes && g.key.capability.is_cpu()) {
      // A cpu one-shot cell of its own, never the threshold (see the overlay).
      std::string keys = g.key.replicated() ? "residual: replicated" : "";
      if (g.key.registered) keys += (keys.empty() ? "" : ", ") + std::string("buffers: registered");
      out << "; a one-shot cell" << (keys.empty() ? "" : " keyed " + keys);
    } else if (split.kind == Cap::Kind::kBytes && (g.key.replicated() || g.key.registered)) {
      out << "; not written (only cpu cells key it)";
    } else if (split.kind == Cap::Kind::kBytes) {
      out << "; x " << g.key.world_size << " = " << format_size(split.bytes * g.key.world_size);
    }
    out << "\n";
  }

  const Regret now = regret(current, g, topology);
  std::optional<Regret> after;
  if (tuned) after = regret(*tuned, g, topology);
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"size", "best measured", "current tables", "regret"});
  if (after) {
    rows.front().push_back("with the overlay");
    rows.front().push_back("regret");
  }
  for (std::size_t i = 0; i < now.points.size(); ++i) {
    const RegretPoint& p = now.points[i];
    std::vector<std::string> row = {format_size(p.bytes), p.best + ", " + us(p.best_us),
                                    chosen_cell(p), p.regret_pct ? pct(*p.regret_pct) : "-"};
    if (after) {
      const RegretPoint& q = after->points[i];
      row.push_back(chosen_cell(q));
      row.push_back(q.regret_pct ? pct(*q.regret_pct) : "-");
    }
    rows.push_back(std::move(row));
  }
  out << "  regret (chosen / best - 1):\n";
  print_table(out, rows, {true, false, false, true, false, true}, "    ");
  out << "  current tables:   " << summary(now) << "\n";
  if (after) out << "  with the overlay: " << summary(*after) << "\n";
  const bool ineligible = std::any_of(
      now.points.begin(), now.points.end(),
      [](const RegretPoint& p) { return p.decision.reason == Reason::kNoEligibleBackend; });
  if (ineligible) {
    out << "  note: no fused backend was eligible for some sizes (" +
               std::string(reason_name(Reason::kNoEligibleBackend)) +
               "); across nodes, pass --nvlink-domain and --multicast if the job has them\n";
  }
  out << "\n";
}

}  // namespace

int cmd_tune(const Args& args) {
  po::options_description desc("arbiter tune options");
  add_config_option(desc);
  desc.add_options()("file", po::value<std::vector<std::string>>(), "results CSV files")(
      "output,o", po::value<std::string>(), "write the overlay here (default: stdout)")(
      "margin", po::value<std::string>()->default_value("0"),
      "fused (one-shot) may be up to PCT% slower than unfused (two-shot) and still win")(
      "nvlink-domain", po::bool_switch(),
      "multi-node groups: all ranks share one NVLink domain (MNNVL)")(
      "multicast", po::bool_switch(), "NVLink multicast usable on all ranks")("help,h",
                                                                              "this help");
  po::positional_options_description positional;
  positional.add("file", -1);
  po::variables_map vm = parse(args, desc, &positional);
  if (vm.count("help")) {
    std::cout << kTuneUsage << desc;
    return kExitOk;
  }
  if (!vm.count("file")) throw UsageError{"give at least one results CSV"};
  const double margin = margin_flag(vm["margin"].as<std::string>());
  const std::string output = vm.count("output") ? vm["output"].as<std::string>() : "";
  const TopologyFlags topology{vm["nvlink-domain"].as<bool>(), vm["multicast"].as<bool>()};
  std::ostream& out = output.empty() ? std::cerr : std::cout;

  if (!output.empty()) refuse_output_over_input(output, vm["file"].as<std::vector<std::string>>());
  const ResultsSet set = read_all_results(vm["file"].as<std::vector<std::string>>());
  for (const std::string& note : set.notes) std::cerr << note << "\n";
  for (const Diagnostic& d : set.errors) std::cerr << d.to_string() << "\n";
  if (set.unreadable) return kExitUsage;
  if (!set.errors.empty()) {
    std::cerr << "arbiter tune: the results were refused; nothing written\n";
    return kExitFailed;
  }
  const Grouping grouping = group_results(set.files);
  for (const Diagnostic& d : grouping.refusals) std::cerr << d.to_string() << "\n";
  if (!grouping.refusals.empty()) {
    std::cerr << "arbiter tune: " << grouping.refusals.size() << " problem"
              << (grouping.refusals.size() == 1 ? "" : "s") << " in the results; nothing written\n";
    return kExitFailed;
  }
  if (grouping.groups.empty()) {
    std::cerr << "arbiter tune: no measurements in the results (every row was skipped)\n";
    return kExitFailed;
  }

  std::optional<Policy> current = load_policy(vm);
  if (!current) return kExitFailed;
  OverlayOptions overlay_options;
  overlay_options.margin_pct = margin;
  overlay_options.date = today();
  // The current tables with `yaml` on top, as a site file would be.
  auto over_current = [&](const std::string& yaml) {
    LoadOptions load = load_options(vm);
    load.overrides.yaml(output.empty() ? "overlay" : output, yaml);
    return Policy::load(load);
  };
  overlay_options.current_cap = [&](const Group& g) {
    return current->max_fused_bytes(group_request(g.key, topology));
  };
  // The one-shot rules first: with them the tables say which fused option
  // runs at each size, and the fusion caps weigh that option.
  overlay_options.fusion_cells = false;
  const LoadResult staged =
      over_current(make_overlay(grouping.groups, set.files, overlay_options).yaml);
  overlay_options.fusion_cells = true;
  if (staged.policy) {
    overlay_options.fused_run = [&](const Group& g) {
      return tables_fused_run(*staged.policy, g, topology);
    };
  }
  const Overlay overlay = make_overlay(grouping.groups, set.files, overlay_options);
  LoadResult tuned = over_current(overlay.yaml);
  int rc = kExitOk;
  if (!tuned.policy) {
    std::cerr << "arbiter tune: the overlay does not load over the current tables:\n";
    bool conflict = false;
    for (const Diagnostic& d : tuned.diagnostics) {
      std::cerr << "  " << d.to_string() << "\n";
      conflict = conflict || d.message.find("conflicts") != std::string::npos;
    }
    if (conflict) {
      std::cerr << "  hint: the overlay replaces a site file tune wrote before: tune over the "
                   "tables without it (leave it out of --config and ARBITER_CONFIG); or key the "
                   "conflicting cell as the overlay's are (one-node GPU cells now say nodes: 1)\n";
    }
    rc = kExitFailed;
  }

  for (const Group& g : grouping.groups) {
    const FusedRun runs = overlay_options.fused_run ? overlay_options.fused_run(g) : FusedRun{};
    report_group(out, g, margin, runs, *current, tuned.policy, topology);
  }
  for (const std::string& note : overlay.notes) out << "note: " << note << "\n";

  const std::string counts = std::to_string(overlay.fusion.size()) + " fusion cell" +
                             (overlay.fusion.size() == 1 ? "" : "s") + ", " +
                             std::to_string(overlay.oneshot.size()) + " one-shot cell" +
                             (overlay.oneshot.size() == 1 ? "" : "s") + ", " +
                             std::to_string(overlay.thresholds.size()) + " one-shot threshold" +
                             (overlay.thresholds.size() == 1 ? "" : "s");
  if (output.empty()) {
    std::cout << overlay.yaml;
    out << "overlay: " << counts << " (on stdout)\n";
  } else {
    errno = 0;
    std::ofstream file(output, std::ios::binary | std::ios::trunc);
    file << overlay.yaml;
    file.close();
    if (!file) {
      std::cerr << write_error(output, "overlay") << "\n";
      return kExitFailed;
    }
    out << "wrote " << output << ": " << counts << "; check it with `arbiter validate " << output
        << "`\n";
  }
  return rc;
}

}  // namespace arbiter::cli
