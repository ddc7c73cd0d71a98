// arbiter: decide, validate, show, sweep and diff all-reduce tuning tables.
#include <iostream>
#include <string>

#include "cli.h"

namespace arbiter::cli {
int cmd_tune(const Args& args);   // cmd_tune.cpp
int cmd_plot(const Args& args);   // cmd_plot.cpp
int cmd_bench(const Args& args);  // cmd_bench.cpp
}  // namespace arbiter::cli

namespace {

constexpr const char* kUsage =
    "usage: arbiter COMMAND [OPTIONS]\n"
    "\n"
    "commands:\n"
    "  decide    the decision for one call (--explain, --json)\n"
    "  validate  check table files: exit 0 valid, 1 invalid, 2 usage error or unreadable\n"
    "  show      the effective tables as capability x world size grids\n"
    "  sweep     the decision as a function of message size\n"
    "  diff      which decisions differ between two tables\n"
    "  launch    start N local ranks of a program (RANK, WORLD_SIZE, MASTER_ADDR, ...)\n"
    "  plugins   backend modules found, and available or why not (--json)\n"
    "  footprint workspace bytes per rank of each backend, for a model shape (--budget)\n"
    "  tune      caps, regret and a site overlay from benchmark results (CSV)\n"
    "  plot      latency charts (SVG) from benchmark results, with the tables' decisions\n"
    "  bench     measure every backend and algorithm on every rank (results CSV for tune)\n"
    "\n"
    "Run `arbiter COMMAND --help` for a command's options; `arbiter --version` for the version.\n"
    "Environment: ARBITER_CONFIG (site tables, ':'-separated),\n"
    "             ARBITER_BACKENDS (comma list restricting the backends),\n"
    "             ARBITER_PLUGIN_PATH (backend module folders, ':'-separated).\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace arbiter::cli;
  if (argc < 2) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  const std::string command = argv[1];
  const Args args(argv + 2, argv + argc);
  try {
    if (command == "decide") return cmd_decide(args);
    if (command == "validate") return cmd_validate(args);
    if (command == "show") return cmd_show(args);
    if (command == "sweep") return cmd_sweep(args);
    if (command == "diff") return cmd_diff(args);
    if (command == "launch") return cmd_launch(args);
    if (command == "plugins") return cmd_plugins(args);
    if (command == "footprint") return cmd_footprint(args);
    if (command == "tune") return cmd_tune(args);
    if (command == "plot") return cmd_plot(args);
    if (command == "bench") return cmd_bench(args);
    if (command == "--help" || command == "-h" || command == "help") {
      std::cout << kUsage;
      return kExitOk;
    }
    if (command == "--version" || command == "-V") {
      std::cout << "arbiter " << ARBITER_VERSION << "\n";
      return kExitOk;
    }
    std::cerr << "arbiter: unknown command '" << command << "'\n\n" << kUsage;
    return kExitUsage;
  } catch (const UsageError& e) {
    std::cerr << "arbiter " << command << ": " << e.message << "\n"
              << "Run `arbiter " << command << " --help` for usage.\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "arbiter " << command << ": error: " << e.what() << "\n";
    return kExitFailed;
  }
}
