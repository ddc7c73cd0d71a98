// arbiter plot: latency against message size from benchmark results, with
// what the tables decide drawn behind the curves.
#include <cerrno>
#include <fstream>
#include <iostream>

#include "arbiter/tuning/groups.h"
#include "arbiter/tuning/plot.h"
#include "arbiter/tuning/results.h"
#include "cli.h"

namespace arbiter::cli {

int cmd_plot(const Args& args) {
  using namespace arbiter::tuning;
  po::options_description desc("arbiter plot options");
  add_config_option(desc);
  desc.add_options()("file", po::value<std::vector<std::string>>(), "results CSV files")(
      "output,o", po::value<std::string>(), "the SVG file to write (required)")(
      "title", po::value<std::string>()->default_value("arbiter plot: latency by message size"),
      "the chart's title")("nvlink-domain", po::bool_switch(),
                           "multi-node groups: all ranks share one NVLink domain (MNNVL)")(
      "multicast", po::bool_switch(), "NVLink multicast usable on all ranks")("help,h",
                                                                              "this help");
  po::positional_options_description positional;
  positional.add("file", -1);
  po::variables_map vm = parse(args, desc, &positional);
  if (vm.count("help")) {
    std::cout << "usage: arbiter plot RESULTS.csv... [--config FILE]... -o chart.svg\n"
                 "                    [--nvlink-domain] [--multicast] [--title TEXT]\n\n"
                 "One panel per (capability, world size, nodes, pattern, dtype) measured:\n"
                 "latency against message size on log-log axes, one line per option, with\n"
                 "what the tables decide as background bands and their caps as vertical\n"
                 "lines. Results are read and grouped as `arbiter tune` does.\n"
                 "Exit 0: written; 1: results refused or tables invalid; 2: usage error.\n\n"
              << desc;
    return kExitOk;
  }
  if (!vm.count("file")) throw UsageError{"give at least one results CSV"};
  if (!vm.count("output")) throw UsageError{"give the SVG file to write: -o chart.svg"};
  const std::string output = vm["output"].as<std::string>();

  refuse_output_over_input(output, vm["file"].as<std::vector<std::string>>());
  const ResultsSet set = read_all_results(vm["file"].as<std::vector<std::string>>());
  for (const std::string& note : set.notes) std::cerr << note << "\n";
  for (const Diagnostic& d : set.errors) std::cerr << d.to_string() << "\n";
  if (set.unreadable) return kExitUsage;
  if (!set.errors.empty()) return kExitFailed;
  const Grouping grouping = group_results(set.files);
  for (const Diagnostic& d : grouping.refusals) std::cerr << d.to_string() << "\n";
  if (!grouping.refusals.empty()) return kExitFailed;
  if (grouping.groups.empty()) {
    std::cerr << "arbiter plot: no measurements in the results (every row was skipped)\n";
    return kExitFailed;
  }
  std::optional<Policy> policy = load_policy(vm);
  if (!policy) return kExitFailed;

  PlotOptions options;
  options.title = vm["title"].as<std::string>();
  options.topology = TopologyFlags{vm["nvlink-domain"].as<bool>(), vm["multicast"].as<bool>()};
  options.tables = "tables default";
  for (const std::string& s : load_options(vm).site_files) options.tables += " + " + s;

  errno = 0;
  std::ofstream file(output, std::ios::binary | std::ios::trunc);
  file << plot_svg(grouping.groups, *policy, options);
  file.close();
  if (!file) {
    std::cerr << write_error(output, "chart") << "\n";
    return kExitFailed;
  }
  std::cout << "wrote " << output << ": " << grouping.groups.size() << " panel"
            << (grouping.groups.size() == 1 ? "" : "s") << "\n";
  return kExitOk;
}

}  // namespace arbiter::cli
