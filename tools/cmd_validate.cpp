// arbiter validate: check table files alone and layered over the default.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "cli.h"

namespace arbiter::cli {

int cmd_validate(const Args& args) {
  po::options_description desc("arbiter validate options");
  desc.add_options()("file", po::value<std::vector<std::string>>(), "table files")(
      "standalone", po::bool_switch(),
      "check each file as a complete table, not as a site layer over the default")(
      "layered", po::bool_switch(),
      "also check the FILEs as one stack, in order, as ARBITER_CONFIG=A:B layers them (cells "
      "of two files may conflict only there)")("quiet,q", po::bool_switch(), "print only problems")(
      "help,h", "this help");
  po::positional_options_description positional;
  positional.add("file", -1);
  po::variables_map vm = parse(args, desc, &positional);
  if (vm.count("help")) {
    std::cout << "usage: arbiter validate FILE...   (a FILE may be preset:NAME)\n"
                 "       arbiter validate            (the ARBITER_CONFIG stack with\n"
                 "                                    ARBITER_BACKENDS, as every consumer of\n"
                 "                                    this environment loads it: the verdict\n"
                 "                                    is the stack's)\n"
                 "exit 0: every file is valid; 1: some file is not; 2: usage error, or a file\n"
                 "that cannot be read\n\n"
              << desc;
    return kExitOk;
  }
  const bool over_default = !vm["standalone"].as<bool>();
  bool layered = vm["layered"].as<bool>();
  const bool from_environment = !vm.count("file");
  // Read once: the files checked alone and the stack are the same ones.
  const LoadOptions environment =
      from_environment ? LoadOptions::from_environment() : LoadOptions{};
  std::vector<std::string> files;
  if (!from_environment) {
    files = vm["file"].as<std::vector<std::string>>();
  } else {
    // What every consumer of this environment loads: ARBITER_CONFIG's files
    // alone, then as the stack they make.
    files = environment.site_files;
    if (files.empty() && !environment.backends_env) {
      throw UsageError{
          "give at least one table file (or set ARBITER_CONFIG or ARBITER_BACKENDS to check what "
          "this environment loads)"};
    }
    layered = true;
  }
  int invalid = 0, unreadable = 0;
  // From the environment the verdict is the stack's, as every consumer
  // loads it: a file may lack what a later one supplies (a threshold rule's
  // oneshot_max_total), so its errors alone wait for the stack's verdict.
  std::vector<std::pair<std::string, std::vector<Diagnostic>>> invalid_alone;
  for (const std::string& path : files) {
    std::error_code ec;
    const bool preset = path.rfind(kPresetPrefix, 0) == 0;  // embedded: nothing to open
    // Checked without opening it: a FIFO (a table piped in) has one
    // reading only, which the load below must get.
    if (!preset && std::filesystem::is_directory(path, ec)) {
      std::cerr << path << ": error: is a directory (hint: give the path of a table file)\n";
      ++unreadable;
      continue;
    }
    if (!preset && ::access(path.c_str(), R_OK) != 0) {
      std::cerr << path << ": error: cannot read the file: " << std::strerror(errno)
                << " (hint: give the path of a table file)\n";
      ++unreadable;
      continue;
    }
    const std::vector<Diagnostic> diagnostics = validate_file(path, over_default);
    if (from_environment && files.size() > 1 && has_errors(diagnostics)) {
      invalid_alone.emplace_back(path, diagnostics);
      continue;
    }
    for (const Diagnostic& d : diagnostics) std::cerr << d.to_string() << "\n";
    if (has_errors(diagnostics)) {
      ++invalid;
    } else if (!vm["quiet"].as<bool>()) {
      std::cout << path << ": valid\n";
    }
  }
  auto print_all = [](const std::vector<Diagnostic>& diagnostics) {
    for (const Diagnostic& d : diagnostics) std::cerr << d.to_string() << "\n";
  };
  if (unreadable > 0) {
    for (const auto& [path, diagnostics] : invalid_alone) print_all(diagnostics);
    return kExitUsage;
  }
  // From the environment, ARBITER_BACKENDS counts too, as for every
  // consumer: a name it gets wrong fails every load, even over one file.
  const bool backends_set = from_environment && environment.backends_env.has_value();
  if (layered && invalid == 0 && (files.size() > 1 || backends_set)) {
    std::string stack;
    for (const std::string& f : files) stack += (stack.empty() ? "" : ":") + f;
    if (backends_set) stack += " with ARBITER_BACKENDS=" + *environment.backends_env;
    if (files.empty()) stack = "unset," + stack;  // the default tables alone
    LoadOptions options = environment;
    options.with_default = over_default;
    options.site_files = files;
    const LoadResult r = Policy::load(options);
    // A file deferred above: its warnings stand either way; its errors are
    // a note where the stack completes it, and the stack's own otherwise
    // (they come again below, from the stack).
    for (const auto& [path, diagnostics] : invalid_alone) {
      std::string first;
      for (const Diagnostic& d : diagnostics) {
        if (d.severity != Severity::kError) {
          std::cerr << d.to_string() << "\n";
        } else if (first.empty()) {
          first = d.to_string();
        }
      }
      if (r.policy) {
        std::cerr << "note: " << path << " is not valid alone (" << first
                  << "), but the stack completes it\n";
      }
    }
    // Each file's warnings were printed above; the stack adds its errors.
    for (const Diagnostic& d : r.diagnostics) {
      if (d.severity == Severity::kError) std::cerr << d.to_string() << "\n";
    }
    if (!r.policy) {
      std::cerr << (backends_set || !invalid_alone.empty()
                        ? "error: this environment's tables do not load (ARBITER_CONFIG="
                        : "error: each file is valid alone, but not layered in this "
                          "order (ARBITER_CONFIG=")
                << stack << ")\n";
      return kExitFailed;
    }
    if (!vm["quiet"].as<bool>()) std::cout << "layered (ARBITER_CONFIG=" << stack << "): valid\n";
  }
  return invalid == 0 ? kExitOk : kExitFailed;
}

}  // namespace arbiter::cli
