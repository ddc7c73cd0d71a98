#include "cli.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "arbiter/size.h"

namespace arbiter::cli {

namespace {

// The first argument holding a Boost.Program_options placeholder such as
// %value% or %original_token%, or nullptr.
const std::string* placeholder_argument(const Args& args) {
  for (const std::string& a : args) {
    for (std::size_t open = a.find('%'); open != std::string::npos;) {
      const std::size_t close = a.find('%', open + 1);
      if (close == std::string::npos) break;
      bool name = close > open + 1;
      for (std::size_t i = open + 1; i < close && name; ++i) {
        name = std::islower(static_cast<unsigned char>(a[i])) || a[i] == '_';
      }
      if (name) return &a;
      open = close;
    }
  }
  return nullptr;
}

}  // namespace

void validate(boost::any& out, const std::vector<std::string>& values, Count*, int) {
  po::validators::check_first_occurrence(out);
  const std::string& text = po::validators::get_single_string(values);
  std::uint32_t n = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, n);
  if (text.empty() || error != std::errc() || at != end) {
    throw po::invalid_option_value(text);
  }
  out = Count{n};
}

std::ostream& operator<<(std::ostream& out, const Count& c) { return out << c.value; }

po::variables_map parse(const Args& args, const po::options_description& desc,
                        const po::positional_options_description* positional) {
  po::variables_map vm;
  try {
    po::command_line_parser parser(args);
    parser.options(desc).style(po::command_line_style::default_style &
                               ~po::command_line_style::allow_guessing);
    // Without positionals a command takes none: a stray word (a table
    // file without --config, say) is an error, not silently ignored.
    const po::positional_options_description none;
    parser.positional(positional ? *positional : none);
    po::store(parser.run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    // Boost's what() replaces each %placeholder% in its message with the
    // offending argument, in a loop that never ends (while the message
    // grows) when that argument contains the placeholder itself. Found by
    // fuzzing: `arbiter decide --x%original_token%` hung. Say it without
    // what() then, before anything below calls it.
    if (const std::string* bad = placeholder_argument(args)) {
      throw UsageError{"cannot parse the arguments: '" + *bad +
                       "' is not an option or value this command takes"};
    }
    if (dynamic_cast<const po::too_many_positional_options_error*>(&e) != nullptr) {
      if (positional != nullptr) {
        throw UsageError{"too many bare words (file names) for this command"};
      }
      throw UsageError{std::string("this command takes no bare words, only options") +
                       (desc.find_nothrow("config", false) != nullptr
                            ? ": a table file goes after --config"
                            : "")};
    }
    if (dynamic_cast<const po::invalid_option_value*>(&e) != nullptr) {
      // Only Count's validate() throws it here.
      throw UsageError{std::string(e.what()) + ": a whole number from 0 to 4294967295 is expected"};
    }
    throw UsageError{e.what()};
  }
  return vm;
}

std::string write_error(const std::string& path, const char* what) {
  const int error = errno;
  return path + ": error: cannot write the " + what +
         (error != 0 ? std::string(": ") + std::strerror(error) : std::string()) +
         " (hint: the folder must exist and be writable)";
}

void add_config_option(po::options_description& desc) {
  std::string presets;
  for (const std::string& name : preset_names()) presets += (presets.empty() ? "" : ", ") + name;
  desc.add_options()("config", po::value<std::vector<std::string>>()->composing(),
                     "site table layered over the default (repeatable; "
                     "replaces ARBITER_CONFIG; preset:NAME names a preset)")(
      "preset", po::value<std::string>(),
      ("upstream table layered over the default, under the site tables: " + presets).c_str());
}

LoadOptions load_options(const po::variables_map& vm) {
  LoadOptions options = LoadOptions::from_environment();
  if (vm.count("config")) {
    options.site_files = vm["config"].as<std::vector<std::string>>();
  }
  if (vm.count("preset")) {
    options.site_files.insert(options.site_files.begin(),
                              std::string(kPresetPrefix) + vm["preset"].as<std::string>());
  }
  return options;
}

std::optional<Policy> load_policy(const po::variables_map& vm) {
  LoadResult result = Policy::load(load_options(vm));
  for (const Diagnostic& d : result.diagnostics) {
    std::cerr << d.to_string() << "\n";
  }
  return std::move(result.policy);
}

void add_request_options(po::options_description& desc, RequestKind kind) {
  auto add = desc.add_options();
  add("capability", po::value<std::string>(),
      "SM capability: 103, 10.3, sm_103, or cpu (required)");
  add("world-size", po::value<Count>(), "ranks in the all-reduce (required)");
  add("nodes", po::value<Count>()->default_value(Count{1}, "1"), "hosts the ranks span");
  add("nvlink-domain", po::bool_switch(), "multi-node: all ranks share one NVLink domain (MNNVL)");
  add("no-nvlink", po::bool_switch(), "single node without NVLink peer access");
  add("multicast", po::bool_switch(), "NVLink multicast usable on all ranks");
  add("dtype", po::value<std::string>()->default_value("bf16"), "fp16 | bf16 | fp32");
  if (kind == RequestKind::kWorkspaces) {
    add("pattern", po::value<std::string>(),
        "the patterns the communicator is created for, a comma list of allreduce, "
        "residual_rmsnorm, residual_rmsnorm_fp8, residual_rmsnorm_fp4 (default: every "
        "pattern, as a communicator with default options)");
    return;
  }
  add("pattern", po::value<std::string>()->default_value("residual_rmsnorm"),
      "allreduce | residual_rmsnorm | residual_rmsnorm_fp8 | residual_rmsnorm_fp4");
  add("residual-replicated", po::bool_switch(),
      "every rank passes the same residual (a residual pattern's "
      "ARBITER_RUN_RESIDUAL_REPLICATED)");
  add("registered", po::bool_switch(),
      "the call's input lies in registered memory (comm.empty(), alloc_registered): the "
      "backend reads it in place");
  if (kind == RequestKind::kCall) {
    add("bytes", po::value<std::string>(),
        "per-rank message size: 524288, 512KiB, 64MiB (a plain number is bytes)");
    add("tokens", po::value<Count>(), "tokens in the call (with --hidden)");
    add("hidden", po::value<Count>(), "hidden size (with --tokens)");
  }
}

void refuse_output_over_input(const std::string& output, const std::vector<std::string>& inputs) {
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (std::filesystem::equivalent(output, input, ec)) {
      throw UsageError{"-o " + output + " is the input " + input +
                       ": writing it would replace the results it is made from; write elsewhere"};
    }
  }
}

std::uint64_t size_flag(const std::string& flag, const std::string& text) {
  Parsed<std::uint64_t> s = parse_size(text, /*plain_is_mib=*/false);
  if (!s) throw UsageError{"--" + flag + ": " + s.error};
  return *s.value;
}

Request read_request(const po::variables_map& vm, RequestKind kind) {
  Request r;
  if (!vm.count("capability")) throw UsageError{"--capability is required"};
  if (!vm.count("world-size")) throw UsageError{"--world-size is required"};
  Parsed<Capability> cap = parse_capability(vm["capability"].as<std::string>());
  if (!cap) throw UsageError{"--capability: " + cap.error};
  r.capability = *cap.value;
  r.world_size = vm["world-size"].as<Count>().value;
  if (r.world_size < 1) {
    throw UsageError{"--world-size 0: a group has at least 1 rank"};
  }
  r.nodes = vm["nodes"].as<Count>().value;
  if (r.nodes < 1 || r.nodes > r.world_size) {
    throw UsageError{"--nodes " + std::to_string(r.nodes) +
                     " must be between 1 and the world size " + std::to_string(r.world_size)};
  }
  const bool domain = vm["nvlink-domain"].as<bool>();
  const bool no_nvlink = vm["no-nvlink"].as<bool>();
  if (domain && no_nvlink) {
    throw UsageError{"--nvlink-domain and --no-nvlink contradict each other"};
  }
  // One node: NVLink is assumed unless --no-nvlink. Across nodes: only with
  // --nvlink-domain.
  r.nvlink_domain = r.nodes == 1 ? !no_nvlink : domain;
  r.multicast = vm["multicast"].as<bool>();
  Parsed<Dtype> dtype = parse_dtype(vm["dtype"].as<std::string>());
  if (!dtype) throw UsageError{"--dtype: " + dtype.error};
  r.dtype = *dtype.value;
  if (kind == RequestKind::kWorkspaces) return r;
  Parsed<Pattern> pattern = parse_pattern(vm["pattern"].as<std::string>());
  if (!pattern) throw UsageError{"--pattern: " + pattern.error};
  r.pattern = *pattern.value;
  r.residual_replicated = vm["residual-replicated"].as<bool>();
  if (r.residual_replicated && r.pattern == Pattern::kAllreduce) {
    throw UsageError{
        "--residual-replicated: pattern allreduce has no residual; drop the flag or give a "
        "residual pattern such as --pattern residual_rmsnorm"};
  }
  r.buffers_registered = vm["registered"].as<bool>();
  if (kind != RequestKind::kCall) return r;

  const bool bytes = vm.count("bytes") > 0;
  const bool tokens = vm.count("tokens") > 0;
  const bool hidden = vm.count("hidden") > 0;
  if (bytes && (tokens || hidden)) {
    throw UsageError{"give either --bytes or --tokens with --hidden, not both"};
  }
  if (bytes) {
    r.message_bytes = size_flag("bytes", vm["bytes"].as<std::string>());
  } else if (tokens && hidden) {
    r.tokens = vm["tokens"].as<Count>().value;
    r.hidden = vm["hidden"].as<Count>().value;
    if (r.tokens == 0 || r.hidden == 0) throw UsageError{"--tokens and --hidden must be positive"};
    r.message_bytes = Request::message_bytes_of(r.tokens, r.hidden, r.dtype);
    if (r.message_bytes > kMaxSizeBytes) {
      throw UsageError{"--tokens " + std::to_string(r.tokens) + " x --hidden " +
                       std::to_string(r.hidden) + " x " + std::to_string(element_size(r.dtype)) +
                       " bytes is above 1 TiB per rank, which is not a plausible message size"};
    }
  } else {
    throw UsageError{"give the message size: --bytes SIZE, or --tokens T --hidden H"};
  }
  return r;
}

std::uint32_t read_pattern_set(const po::variables_map& vm) {
  if (!vm.count("pattern")) return (1u << kPatternCount) - 1;
  const std::string text = vm["pattern"].as<std::string>();
  std::uint32_t mask = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);  // "a, b" as ARBITER_BACKENDS
    while (!item.empty() && item.back() == ' ') item.pop_back();
    Parsed<Pattern> pattern = parse_pattern(item);
    if (!pattern) throw UsageError{"--pattern: " + pattern.error + " (in '" + text + "')"};
    const std::uint32_t bit = 1u << static_cast<int>(*pattern.value);
    if (mask & bit)
      throw UsageError{"--pattern: '" + item + "' is named twice (in '" + text + "')"};
    mask |= bit;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return mask;
}

std::string describe_topology(const Request& r, const std::string& patterns) {
  std::string s = "capability " + capability_name(r.capability) + ", world size " +
                  std::to_string(r.world_size) + ", " + std::to_string(r.nodes) +
                  (r.nodes == 1 ? " node" : " nodes");
  if (!r.capability.is_cpu()) {
    s += r.nvlink_domain ? ", NVLink" : ", no NVLink";
    if (r.multicast) s += ", multicast";
  }
  s += ", " + std::string(dtype_name(r.dtype)) + ", " +
       (patterns.empty() ? std::string(pattern_name(r.pattern)) : patterns);
  if (r.residual_replicated) s += ", residual replicated";
  if (r.buffers_registered) s += ", registered buffers";
  return s;
}

std::string decision_summary(const Decision& d) {
  if (d.backend == Backend::kNone) return "no backend";
  std::string s = std::string(backend_name(d.backend)) + " " +
                  std::string(algorithm_name(d.algorithm)) + (d.fused ? " fused" : " unfused");
  switch (d.reason) {
    case Reason::kFused:
      break;
    case Reason::kNoFusionCell:
      s += " (no fusion entry)";
      break;
    case Reason::kFusionOff:
      s += " (fusion off)";
      break;
    case Reason::kAboveCap:
      s += " (above the cap)";
      break;
    case Reason::kNoEligibleBackend:
      s += " (no eligible fused backend)";
      break;
    case Reason::kNoBackend:
      s += " (fallback unavailable)";
      break;
    case Reason::kInvalidRequest:
      s += " (invalid request)";
      break;
  }
  return s;
}

std::string band_text(std::uint64_t first, std::uint64_t last, std::uint64_t from,
                      std::uint64_t to) {
  if (first == last) return "bytes = " + format_size(first);
  if (first <= from && last >= to) return "all sizes";
  if (first <= from) return "bytes <= " + format_size(last);
  if (last >= to) return "bytes > " + format_size(first - 1);
  return format_size(first - 1) + " < bytes <= " + format_size(last);
}

}  // namespace arbiter::cli
