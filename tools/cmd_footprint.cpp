// arbiter footprint: what the workspaces of a communicator cost each rank,
// for the tables in force and a model shape, before any rank starts. The
// backends come from the same plan the communicator creates from
// (workspace_plan.h) and the bytes from each module's own sizing (its
// arbiter_backend_v1_footprint companion), which needs no device: this runs
// on any machine for any capability.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "arbiter/json_writer.h"
#include "arbiter/registry.h"
#include "arbiter/size.h"
#include "arbiter/workspace_plan.h"
#include "cli.h"

namespace arbiter::cli {

namespace {

constexpr std::uint64_t kAnySize = std::numeric_limits<std::uint64_t>::max();
constexpr const char* kAlgorithms[] = {"oneshot", "twoshot", "native"};

struct Sized {
  PlannedWorkspace planned;
  bool known = false;
  arbiter_footprint figure{};
  std::string reason;  // why unknown
  std::uint64_t total() const {
    return figure.device_bytes + figure.host_bytes + figure.shared_bytes;
  }
};

std::string size_text(std::uint64_t bytes) {
  return bytes == kAnySize ? "any size" : format_size(bytes);
}

Sized size_one(const Registry& registry, const PlannedWorkspace& planned) {
  Sized s;
  s.planned = planned;
  const ModuleInfo* info = nullptr;
  for (const ModuleInfo& m : registry.modules()) {
    if (m.backend == planned.backend && m.footprint != nullptr) info = &m;
  }
  if (info == nullptr) {
    bool found = false;
    for (const ModuleInfo& m : registry.modules()) found = found || m.backend == planned.backend;
    s.reason = found ? "its module predates the footprint companion (rebuild it)"
                     : "no module found (see `arbiter plugins`)";
    return s;
  }
  if (info->footprint->footprint(&planned.spec, &s.figure) != ARBITER_OK) {
    s.reason = std::string("refused: ") + (info->last_error ? info->last_error() : "no reason");
    return s;
  }
  s.known = true;
  return s;
}

// "fused" for a backend of the topology's preference list (when anything is
// fused), "fallback" for the capability's fallback; both for shm on CPU.
std::string role_of(const PlannedWorkspace& w, const WorkspacePlan& plan, const Policy& policy) {
  const auto& preferred = policy.tables().preference[static_cast<int>(plan.topology)];
  const bool fused = plan.fused_cap > 0 &&
                     std::find(preferred.begin(), preferred.end(), w.backend) != preferred.end();
  if (w.fallback) return fused ? "fused, fallback" : "fallback";
  return "fused";
}

}  // namespace

int cmd_footprint(const Args& args) {
  po::options_description desc("arbiter footprint options");
  add_request_options(desc, RequestKind::kWorkspaces);
  add_config_option(desc);
  desc.add_options()("hidden", po::value<Count>(), "the model's hidden size (required)")(
      "max-tokens", po::value<Count>()->default_value(Count{0}, "0"),
      "the largest call's tokens (sizes the fallback; 0: unknown, as the communicator's "
      "default)")("budget", po::value<std::string>(),
                  "fail (exit 1) when the workspaces take more per rank: 4GiB, 512MiB, ...")(
      "json", po::bool_switch(), "print one JSON object")("help,h", "this help");
  po::variables_map vm = parse(args, desc);
  if (vm.count("help")) {
    std::cout << "usage: arbiter footprint --capability C --world-size N --hidden H "
                 "[--max-tokens T] [--pattern P,...] [--budget SIZE] [options]\n"
                 "Workspace bytes per rank of each backend the tables may pick, as the modules "
                 "size them.\n\n"
              << desc;
    return kExitOk;
  }
  const Request request = read_request(vm, RequestKind::kWorkspaces);
  if (!vm.count("hidden") || vm["hidden"].as<Count>().value == 0) {
    throw UsageError{"--hidden H is required and must be positive (the model's hidden size)"};
  }
  // The modules size workspaces through the C ABI, whose ranks are int32: a
  // larger count reached them as a negative one ("world size -1").
  if (request.world_size > static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max())) {
    throw UsageError{"--world-size " + std::to_string(request.world_size) +
                     " is above 2147483647, the most ranks the C ABI carries"};
  }
  std::optional<std::uint64_t> budget;
  if (vm.count("budget")) {
    // An amount of memory, not a message: above 1 TiB is no typo here.
    const Parsed<std::uint64_t> b = parse_amount(vm["budget"].as<std::string>());
    if (!b) throw UsageError{"--budget: " + b.error};
    budget = *b.value;
  }
  std::optional<Policy> policy = load_policy(vm);
  if (!policy) return kExitFailed;

  CommunicatorOptions options;
  options.capability = request.capability;
  options.nodes = request.nodes;
  options.nvlink_domain = request.nvlink_domain;
  options.multicast = request.multicast;
  options.hidden = vm["hidden"].as<Count>().value;
  options.max_tokens = vm["max-tokens"].as<Count>().value;
  options.dtype = request.dtype;
  // Every pattern unless --pattern names some, as a communicator with
  // default options sizes for the largest cap among them.
  options.pattern_mask = read_pattern_set(vm);
  std::string patterns;
  if (options.pattern_mask == (1u << kPatternCount) - 1) {
    patterns = "all patterns";
  } else {
    for (int p = 0; p < kPatternCount; ++p) {
      if ((options.pattern_mask >> p) & 1u) {
        patterns +=
            (patterns.empty() ? "" : ",") + std::string(pattern_name(static_cast<Pattern>(p)));
      }
    }
  }
  const WorkspacePlan plan = plan_workspaces(*policy, options, request.world_size);

  DiscoverOptions discover = DiscoverOptions::from_environment();
  if (request.capability.is_cpu()) discover.probe = {ARBITER_DEVICE_CPU, -1};
  const Registry registry = Registry::discover(discover);
  if (!registry.search_errors().empty()) {
    // The figures would be another module's, as a communicator refuses.
    std::cerr << "arbiter footprint: error: " << registry.search_error_message() << "\n";
    return kExitFailed;
  }
  std::vector<Sized> sized;
  for (const PlannedWorkspace& w : plan.workspaces) {
    if (w.allowed) sized.push_back(size_one(registry, w));
  }
  const std::string where =
      describe_topology(request, patterns) + ", hidden " + std::to_string(options.hidden) +
      ", max tokens " +
      (options.max_tokens == 0 ? std::string("unknown") : std::to_string(options.max_tokens));
  bool any_known = false;
  std::uint64_t total = 0;
  for (const Sized& s : sized) {
    any_known = any_known || s.known;
    if (s.known) total += s.total();
  }
  if (!any_known) {
    std::string why;
    for (const Sized& s : sized) {
      why += "; " + std::string(backend_name(s.planned.backend)) + ": " + s.reason;
    }
    std::cerr << "arbiter footprint: error: no backend can hold this shape (" << where << ")"
              << (sized.empty() ? std::string("; the tables allow no backend here") : why) << "\n";
    return kExitFailed;
  }
  const bool over = budget && total > *budget;

  if (vm["json"].as<bool>()) {
    std::string out;
    JsonObject o(out);
    o.str("topology", describe_topology(request, patterns));
    o.num("hidden", options.hidden);
    o.num("max_tokens", options.max_tokens);
    o.num("fused_cap_bytes", plan.fused_cap);
    std::string& list = o.key("workspaces");
    list += "[";
    for (std::size_t i = 0; i < sized.size(); ++i) {
      const Sized& s = sized[i];
      if (i) list += ",";
      JsonObject w(list);
      w.str("backend", backend_name(s.planned.backend));
      w.str("role", role_of(s.planned, plan, *policy));
      w.num("max_message_bytes_asked", s.planned.spec.max_message_bytes);
      w.boolean("known", s.known);
      if (s.known) {
        w.num("device_bytes", s.figure.device_bytes);
        w.num("host_bytes", s.figure.host_bytes);
        w.num("shared_bytes", s.figure.shared_bytes);
        w.num("total_bytes", s.total());
        std::string& caps = w.key("largest_call_bytes");
        JsonObject c(caps);
        for (int a = 0; a < ARBITER_ALGORITHM_COUNT; ++a) {
          if (s.figure.max_message_bytes[a] == kAnySize) {
            c.null(kAlgorithms[a]);  // any size
          } else {
            c.num(kAlgorithms[a], s.figure.max_message_bytes[a]);
          }
        }
        c.close();
        w.str("note", s.figure.note ? s.figure.note : "");
      } else {
        w.str("reason", s.reason);
      }
      w.close();
    }
    list += "]";
    o.num("total_bytes", total);
    if (budget) {
      o.num("budget_bytes", *budget);
      o.boolean("within_budget", !over);
    } else {
      o.null("budget_bytes");
      o.null("within_budget");
    }
    o.close();
    std::cout << out << "\n";
  } else {
    std::cout << "footprint per rank: " << where << "\n";
    if (plan.fused_cap > 0) {
      const std::uint64_t token = Request::message_bytes_of(1, options.hidden, options.dtype);
      std::cout << "fused cap: " << format_size(plan.fused_cap) << " (" << plan.fused_cap / token
                << " tokens); larger calls run unfused on the fallback\n";
    } else {
      std::cout << "fused cap: none (nothing is fused here; every call runs on the fallback)\n";
    }
    for (const Sized& s : sized) {
      std::cout << "  " << backend_name(s.planned.backend) << " ("
                << role_of(s.planned, plan, *policy) << ", sized for "
                << format_size(s.planned.spec.max_message_bytes) << "): ";
      if (!s.known) {
        std::cout << "unknown, " << s.reason << "\n";
        continue;
      }
      std::cout << format_size(s.total()) << " = device " << format_size(s.figure.device_bytes)
                << " + host " << format_size(s.figure.host_bytes) << " + shared "
                << format_size(s.figure.shared_bytes) << "; largest call:";
      const char* separator = " ";
      for (int a = 0; a < ARBITER_ALGORITHM_COUNT; ++a) {
        if (s.figure.max_message_bytes[a] == 0) continue;
        std::cout << separator << kAlgorithms[a] << " " << size_text(s.figure.max_message_bytes[a]);
        separator = ", ";
      }
      std::cout << "\n";
      if (s.figure.note && *s.figure.note) std::cout << "    " << s.figure.note << "\n";
    }
    std::cout << "total: " << format_size(total) << " (" << total << " bytes)"
              << (budget ? ", budget " + format_size(*budget) : std::string()) << "\n";
  }
  if (over) {
    std::string parts;
    for (const Sized& s : sized) {
      if (!s.known) continue;
      parts += (parts.empty() ? "" : ", ") + std::string(backend_name(s.planned.backend)) + " " +
               format_size(s.total());
    }
    // Only the knobs that shrink this figure: --max-tokens sizes the
    // fallback alone, and the fused cap matters only where a call fuses.
    CommunicatorOptions one_token = options;
    one_token.max_tokens = 1;
    std::uint64_t total_at_one_token = 0;
    for (const PlannedWorkspace& w :
         plan_workspaces(*policy, one_token, request.world_size).workspaces) {
      if (!w.allowed) continue;
      const Sized s = size_one(registry, w);
      if (s.known) total_at_one_token += s.total();
    }
    std::string fix;
    if (plan.fused_cap > 0) fix += "lower the tables' fused cap, or ";
    if (total_at_one_token < total) fix += "give a smaller --max-tokens, or ";
    std::cerr << "arbiter footprint: error: the workspaces take " << format_size(total)
              << " per rank (" << parts << "), " << format_size(total - *budget)
              << " over --budget " << format_size(*budget) << " (" << fix << "raise the budget)\n";
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace arbiter::cli
