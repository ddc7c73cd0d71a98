// arbiter plugins: every backend module found, its ABI version, and whether
// it is available here or why not; then the backends this build does not
// carry, and why.
#include <iostream>
#include <vector>

#include "arbiter/json_writer.h"
#include "arbiter/registry.h"
#include "cli.h"

namespace arbiter::cli {
namespace {

// A search path entry that cannot be searched (a typo, a folder this user
// cannot read) fails every communicator: said on stderr, exit 1.
int search_path_errors(const Registry& registry) {
  for (const SearchPathError& e : registry.search_errors()) {
    std::cerr << "arbiter plugins: error: ARBITER_PLUGIN_PATH entry '" << e.place
              << "': " << e.reason << "\n";
  }
  if (registry.search_errors().empty()) return kExitOk;
  std::cerr << "(fix the entry or remove it: communicators refuse to be created while it "
               "stands, since the modules it was meant to supply would be missing)\n";
  return kExitFailed;
}

}  // namespace

int cmd_plugins(const Args& args) {
  po::options_description desc("arbiter plugins options");
  desc.add_options()("json", po::bool_switch(), "print a JSON array")("help,h", "this help");
  po::variables_map vm = parse(args, desc);
  if (vm.count("help")) {
    std::cout << "usage: arbiter plugins [--json]\n"
                 "Searches ARBITER_PLUGIN_PATH (':'-separated folders or files), then "
              << Registry::default_plugin_folder()
              << "\nexit 0; 1 when an ARBITER_PLUGIN_PATH entry cannot be searched (it does not "
                 "exist or cannot be read)\n\n"
              << desc;
    return kExitOk;
  }
  // Ask every module about both kinds of rank (this program does not know
  // which the user runs): available when it serves either.
  DiscoverOptions gpu = DiscoverOptions::from_environment();
  DiscoverOptions cpu = gpu;
  cpu.probe = {ARBITER_DEVICE_CPU, -1};
  const Registry for_gpu = Registry::discover(gpu);
  const Registry for_cpu = Registry::discover(cpu);
  std::vector<ModuleInfo> modules = for_gpu.modules();
  for (ModuleInfo& m : modules) {
    for (const ModuleInfo& c : for_cpu.modules()) {
      if (c.path != m.path || m.available) continue;
      // Available for CPU ranks; or shadowed there by a module that serves
      // them, which says more than this module's GPU probe failing.
      if (c.available || c.reason.starts_with("shadowed by")) m = c;
    }
  }
  auto kind = [](const ModuleInfo& m) -> std::string {
    return m.caps.device_kind == ARBITER_DEVICE_CPU ? "cpu" : "gpu";
  };
  std::vector<AbsentModule> absent;
  for (const AbsentModule& a : Registry::not_built()) {
    bool found = false;
    for (const ModuleInfo& m : modules) found = found || m.name == a.name;
    if (!found) absent.push_back(a);
  }
  if (vm["json"].as<bool>()) {
    std::string out = "[";
    bool first = true;
    for (const ModuleInfo& m : modules) {
      if (!first) out += ",";
      first = false;
      JsonObject o(out);
      o.str("name", m.name);
      o.str("path", m.path);
      o.num("abi_version", m.abi_version);
      // ABI v2: the module allocates registered memory (zero-copy calls).
      o.boolean("registered_memory", m.memory != nullptr);
      // It sizes its workspaces without a device (`arbiter footprint`).
      o.boolean("footprint", m.footprint != nullptr);
      if (m.build.empty()) {
        o.null("build");  // no faults companion: a module built before it
      } else {
        o.str("build", m.build);
      }
      o.boolean("available", m.available);
      if (m.available) {
        o.str("device", kind(m));
        o.null("reason");
      } else {
        o.null("device");
        o.str("reason", m.reason);
      }
      if (m.dependency.empty()) {
        o.null("dependency");
      } else {
        o.str("dependency", m.dependency);
      }
      o.close();
    }
    for (const AbsentModule& a : absent) {
      if (!first) out += ",";
      first = false;
      JsonObject o(out);
      o.str("name", a.name);
      o.null("path");
      o.num("abi_version", 0);
      o.boolean("registered_memory", false);
      o.boolean("footprint", false);
      o.boolean("available", false);
      o.null("device");
      o.str("reason", a.reason);
      o.null("dependency");
      o.close();
    }
    std::cout << out << "]\n";
    return search_path_errors(for_gpu);
  }
  if (modules.empty()) {
    std::cout << "no backend modules found (searched ARBITER_PLUGIN_PATH and "
              << Registry::default_plugin_folder() << ")\n";
  }
  for (const ModuleInfo& m : modules) {
    // ABI 0: never opened (shadowed, or not a module file name).
    std::cout << m.name << (m.abi_version != 0 ? "  ABI v" + std::to_string(m.abi_version) : "")
              << (m.memory != nullptr ? " (registered memory)" : "") << "  "
              << (m.available ? "available (" + kind(m) + " ranks)" : "unavailable: " + m.reason)
              << (m.build.empty() ? "" : "  build " + m.build) << "  (" << m.path << ")";
    if (!m.dependency.empty()) std::cout << "  [" << m.dependency << "]";
    std::cout << "\n";
  }
  for (const AbsentModule& a : absent) std::cout << a.name << "  " << a.reason << "\n";
  return search_path_errors(for_gpu);
}

}  // namespace arbiter::cli
