// arbiter sweep: the decision as a function of message size.
#include <iomanip>
#include <iostream>

#include "arbiter/size.h"
#include "cli.h"

namespace arbiter::cli {

int cmd_sweep(const Args& args) {
  po::options_description desc("arbiter sweep options");
  add_request_options(desc, RequestKind::kCallWithoutSize);
  add_config_option(desc);
  desc.add_options()("from", po::value<std::string>()->default_value("1"),
                     "smallest size (a plain number is bytes)")(
      "to", po::value<std::string>()->default_value("1GiB"), "largest size")("help,h", "this help");
  po::variables_map vm = parse(args, desc);
  if (vm.count("help")) {
    std::cout << "usage: arbiter sweep --capability C --world-size N [options]\n\n" << desc;
    return kExitOk;
  }
  const Request request = read_request(vm, RequestKind::kCallWithoutSize);
  const std::uint64_t from = size_flag("from", vm["from"].as<std::string>());
  const std::uint64_t to = size_flag("to", vm["to"].as<std::string>());
  if (from > to) throw UsageError{"--from is above --to"};
  std::optional<Policy> policy = load_policy(vm);
  if (!policy) return kExitFailed;
  std::cout << describe_topology(request) << "\n";
  for (const Band& band : sweep(*policy, request, from, to)) {
    std::cout << "  " << std::left << std::setw(34) << band_text(band.first, band.last, from, to)
              << decision_summary(band.decision);
    if (band.decision.has_cap()) std::cout << ", cap " << format_size(band.decision.cap);
    std::cout << "\n";
  }
  return kExitOk;
}

}  // namespace arbiter::cli
