// Pieces every `arbiter` subcommand shares: exit codes, option parsing
// helpers, loading the policy from --config / the environment, and reading
// a Request from the command line.
#pragma once

#include <boost/program_options.hpp>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/policy.h"

namespace arbiter::cli {

namespace po = boost::program_options;

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // invalid table, decisions differ, ...
inline constexpr int kExitUsage = 2;   // bad flags, unreadable input

// Thrown for bad command lines; main() prints it and exits 2.
struct UsageError {
  std::string message;
};

using Args = std::vector<std::string>;

// A whole number flag, 0 .. 2^32 - 1. Boost reads "-1" into an unsigned by
// wrapping it (to 4294967295), so these flags parse through their own
// validate() instead, which refuses a sign, a fraction and an overflow.
struct Count {
  std::uint32_t value = 0;
};
void validate(boost::any& out, const std::vector<std::string>& values, Count*, int);
std::ostream& operator<<(std::ostream& out, const Count& c);

// Parses args against desc (+ positionals). Throws UsageError.
po::variables_map parse(const Args& args, const po::options_description& desc,
                        const po::positional_options_description* positional = nullptr);

// "PATH: error: cannot write the WHAT: REASON" for an ofstream that failed,
// with errno's reason when the library set one. Call it right after the
// failure (errno changes).
std::string write_error(const std::string& path, const char* what);

// Adds --config FILE... (repeatable) and --preset NAME.
void add_config_option(po::options_description& desc);

// The layers those options name: default <- --preset <- (--config files,
// else ARBITER_CONFIG), with ARBITER_BACKENDS.
LoadOptions load_options(const po::variables_map& vm);

// Loads load_options(vm). Prints diagnostics to stderr; nullopt on errors.
std::optional<Policy> load_policy(const po::variables_map& vm);

// What the request flags describe: one call (with or without its size), or
// the workspaces of a communicator, which serve a set of patterns and every
// residual and buffer kind.
enum class RequestKind { kCall, kCallWithoutSize, kWorkspaces };

// Adds the request flags: --capability, --world-size, --nodes,
// --nvlink-domain, --no-nvlink, --multicast, --dtype, --pattern (for
// kWorkspaces a comma list, default every pattern), and for calls
// --residual-replicated, --registered and (kCall) --bytes / --tokens / --hidden.
void add_request_options(po::options_description& desc, RequestKind kind);

// Builds the Request; throws UsageError naming the flag at fault. For
// kWorkspaces the pattern is left at its default: read_pattern_set() reads it.
Request read_request(const po::variables_map& vm, RequestKind kind);

// --pattern of kWorkspaces: a mask of patterns (bit 1 << Pattern), every one
// when the flag is not given (as a communicator with default options).
std::uint32_t read_pattern_set(const po::variables_map& vm);

// "capability 103, world size 16, nodes 4, NVLink domain, multicast, bf16, ..."
// `patterns`, when given, stands where the request's pattern would.
std::string describe_topology(const Request& r, const std::string& patterns = "");

// Parses a size flag; a plain number is bytes. Throws UsageError.
std::uint64_t size_flag(const std::string& flag, const std::string& text);

// UsageError when `output` is one of `inputs` (the same file by any path):
// written first, it would replace the measurements it is made from.
void refuse_output_over_input(const std::string& output, const std::vector<std::string>& inputs);

// "mnnvl twoshot fused (cap 64 MiB)" or "nccl native unfused (above cap)".
std::string decision_summary(const Decision& d);

// "bytes <= 64 KiB", "64 KiB < bytes <= 64 MiB", "bytes > 64 MiB": the band
// [first, last] within a sweep over [from, to].
std::string band_text(std::uint64_t first, std::uint64_t last, std::uint64_t from,
                      std::uint64_t to);

int cmd_decide(const Args& args);
int cmd_validate(const Args& args);
int cmd_show(const Args& args);
int cmd_sweep(const Args& args);
int cmd_diff(const Args& args);
int cmd_launch(const Args& args);
int cmd_plugins(const Args& args);
int cmd_footprint(const Args& args);

}  // namespace arbiter::cli
