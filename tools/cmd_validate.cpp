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
      "quiet,q", po::bool_switch(), "print only problems")("help,h", "this help");
  po::positional_options_description positional;
  positional.add("file", -1);
  po::variables_map vm = parse(args, desc, &positional);
  if (vm.count("help")) {
    std::cout << "usage: arbiter validate FILE...   (a FILE may be preset:NAME)\n"
                 "exit 0: every file is valid; 1: some file is not; 2: usage error, or a file\n"
                 "that cannot be read\n\n"
              << desc;
    return kExitOk;
  }
  if (!vm.count("file")) throw UsageError{"give at least one table file"};
  const bool over_default = !vm["standalone"].as<bool>();
  int invalid = 0, unreadable = 0;
  for (const std::string& path : vm["file"].as<std::vector<std::string>>()) {
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
    for (const Diagnostic& d : diagnostics) std::cerr << d.to_string() << "\n";
    if (has_errors(diagnostics)) {
      ++invalid;
    } else if (!vm["quiet"].as<bool>()) {
      std::cout << path << ": valid\n";
    }
  }
  if (unreadable > 0) return kExitUsage;
  return invalid == 0 ? kExitOk : kExitFailed;
}

}  // namespace arbiter::cli
