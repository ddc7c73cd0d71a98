// arbiter decide: the decision for one call.
#include <iostream>

#include "arbiter/size.h"
#include "cli.h"

namespace arbiter::cli {

int cmd_decide(const Args& args) {
  po::options_description desc("arbiter decide options");
  add_request_options(desc, RequestKind::kCall);
  add_config_option(desc);
  desc.add_options()("explain", po::bool_switch(), "print every rule evaluated")(
      "json", po::bool_switch(), "print one JSON object (includes the trace)")("help,h",
                                                                               "this help");
  po::variables_map vm = parse(args, desc);
  if (vm.count("help")) {
    std::cout << "usage: arbiter decide --capability C --world-size N "
                 "(--bytes SIZE | --tokens T --hidden H) [options]\n\n"
              << desc;
    return kExitOk;
  }
  const Request request = read_request(vm, RequestKind::kCall);
  std::optional<Policy> policy = load_policy(vm);
  if (!policy) return kExitFailed;
  const Decision decision = policy->explain(request);
  if (vm["json"].as<bool>()) {
    std::cout << policy->decision_json(request, decision) << "\n";
    return kExitOk;
  }
  if (vm["explain"].as<bool>()) {
    std::cout << policy->explain_text(request, decision);
    const auto cap = policy->max_fused_bytes(request);
    std::cout << "max_fused_bytes: "
              << (cap ? std::to_string(*cap) + " (" + format_size(*cap) + ")" : "none")
              << "\nfingerprint: " << policy->fingerprint_hex() << "\n";
    return kExitOk;
  }
  std::cout << decision_summary(decision) << "\n";
  return kExitOk;
}

}  // namespace arbiter::cli
