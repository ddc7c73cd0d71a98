#include "bench_sweep.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "arbiter/size.h"

namespace arbiter::cli::bench {
namespace {

std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t comma = text.find(',', begin);
    std::string item = text.substr(begin, comma == std::string::npos ? comma : comma - begin);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty()) throw UsageError{"--" + flag + " '" + text + "' has an empty item"};
    items.push_back(std::move(item));
    if (comma == std::string::npos) return items;
    begin = comma + 1;
  }
}

std::uint64_t whole(const std::string& flag, const std::string& text, std::uint64_t low,
                    std::uint64_t high) {
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < low ||
      v > high) {
    throw UsageError{"--" + flag + ": '" + text + "' is not a whole number in " +
                     std::to_string(low) + ".." + std::to_string(high)};
  }
  return v;
}

// "1,4,16" or "1:8192" (powers of two times the first) or a mix.
std::vector<std::uint32_t> count_list(const std::string& flag, const std::string& text) {
  std::vector<std::uint32_t> out;
  for (const std::string& item : split_list(flag, text)) {
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos) {
      out.push_back(static_cast<std::uint32_t>(whole(flag, item, 1, 1u << 30)));
      continue;
    }
    const std::uint64_t from = whole(flag, item.substr(0, colon), 1, 1u << 30);
    const std::uint64_t to = whole(flag, item.substr(colon + 1), 1, 1u << 30);
    if (from > to) throw UsageError{"--" + flag + ": '" + item + "' runs backwards"};
    for (std::uint64_t v = from; v <= to; v *= 2) out.push_back(static_cast<std::uint32_t>(v));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

template <class T>
std::vector<T> name_list(const std::string& flag, const std::string& text,
                         Parsed<T> (*parse)(std::string_view)) {
  std::vector<T> out;
  for (const std::string& item : split_list(flag, text)) {
    Parsed<T> p = parse(item);
    if (!p) throw UsageError{"--" + flag + ": " + p.error};
    if (std::find(out.begin(), out.end(), *p.value) == out.end()) out.push_back(*p.value);
  }
  return out;
}

std::uint64_t size_item(const std::string& text) {
  Parsed<std::uint64_t> s = parse_size(text, false);
  if (!s) throw UsageError{"--sizes: " + s.error};
  return *s.value;
}

}  // namespace

void add_options(po::options_description& desc) {
  desc.add_options()(
      "tokens", po::value<std::string>(),
      "token counts: a list (1,4,16) and/or powers of two (1:8192); default CPU 1:256 in steps "
      "of x4, GPU 1:8192")("sizes", po::value<std::string>(),
                           "instead of --tokens: message sizes FROM:TO (FROM, 2 x FROM, ... up to "
                           "TO bytes, e.g. 8KiB:64MiB), as whole token counts per hidden size")(
      "hidden", po::value<std::string>()->default_value("4096"), "hidden sizes, a list")(
      "dtype", po::value<std::string>()->default_value("bf16"), "dtypes: fp16, bf16, fp32")(
      "pattern", po::value<std::string>()->default_value("residual_rmsnorm"),
      "patterns: allreduce, residual_rmsnorm, residual_rmsnorm_fp8, residual_rmsnorm_fp4")(
      "residual-replicated", po::bool_switch(),
      "every rank passes the same residual: the residual patterns' calls carry "
      "ARBITER_RUN_RESIDUAL_REPLICATED")(
      "registered", po::bool_switch(),
      "measure every option a second time with the call's input and outputs in registered "
      "memory (rows say buffers registered)")("warmup", po::value<std::string>(),
                                              "untimed trials first (default 2)")(
      "trials", po::value<std::string>(), "timed trials per point (default CPU 5, GPU 20)")(
      "iterations", po::value<std::string>(),
      "calls per trial (default CPU 4, GPU 10; one CUDA graph per trial on GPUs)")(
      "output,o", po::value<std::string>(), "write the CSV here (default: stdout of rank 0)")(
      "nodes", po::value<std::string>(), "hosts the ranks span (default: the hosts they run on)")(
      "nvlink-domain", po::bool_switch(), "multi-node: all ranks share one NVLink domain (MNNVL)")(
      "multicast", po::bool_switch(), "NVLink multicast usable on all ranks")(
      "timeout", po::value<std::string>()->default_value("60"),
      "seconds any collective step may wait for the other ranks")(
      "progress", po::bool_switch(), "a progress bar on stderr even when it is not a terminal")(
      "device", po::value<std::string>()->default_value("auto"),
      "auto (the GPU LOCAL_RANK when there is one), cpu or gpu");
}

Settings read_settings(const po::variables_map& vm) {
  Settings s;
  if (vm.count("tokens") && vm.count("sizes")) {
    throw UsageError{"give --tokens or --sizes, not both"};
  }
  if (vm.count("tokens")) s.tokens = count_list("tokens", vm["tokens"].as<std::string>());
  if (vm.count("sizes")) {
    const std::string text = vm["sizes"].as<std::string>();
    const std::size_t colon = text.find(':');
    if (colon == std::string::npos) {
      throw UsageError{"--sizes: '" + text + "' is not FROM:TO (e.g. 8KiB:64MiB)"};
    }
    const std::uint64_t from = size_item(text.substr(0, colon));
    const std::uint64_t to = size_item(text.substr(colon + 1));
    if (from > to) throw UsageError{"--sizes: '" + text + "' runs backwards"};
    s.sizes = {from, to};
  }
  s.hidden = count_list("hidden", vm["hidden"].as<std::string>());
  s.dtypes = name_list<Dtype>("dtype", vm["dtype"].as<std::string>(), parse_dtype);
  s.patterns = name_list<Pattern>("pattern", vm["pattern"].as<std::string>(), parse_pattern);
  // A size sweep measures whole tokens, none above TO: a shape whose one
  // token is larger has nothing to measure (it measured one token anyway).
  if (s.sizes) {
    for (Dtype dtype : s.dtypes) {
      for (std::uint32_t hidden : s.hidden) {
        const std::uint64_t row = Request::message_bytes_of(1, hidden, dtype);
        if (row > s.sizes->second) {
          throw UsageError{"--sizes: up to " + format_size(s.sizes->second) +
                           ", but one token of hidden " + std::to_string(hidden) + " " +
                           std::string(dtype_name(dtype)) + " is " + format_size(row) +
                           "; raise TO, or measure a smaller hidden size"};
        }
      }
    }
  }
  s.residual_replicated = vm["residual-replicated"].as<bool>();
  if (s.residual_replicated && std::all_of(s.patterns.begin(), s.patterns.end(),
                                           [](Pattern p) { return p == Pattern::kAllreduce; })) {
    throw UsageError{
        "--residual-replicated: pattern allreduce has no residual; drop the flag or give a "
        "residual pattern such as --pattern residual_rmsnorm"};
  }
  s.registered = vm["registered"].as<bool>();
  auto count = [&](const char* flag, std::uint64_t low) -> std::optional<int> {
    if (!vm.count(flag)) return std::nullopt;
    return static_cast<int>(whole(flag, vm[flag].as<std::string>(), low, 100000));
  };
  s.warmup = count("warmup", 0);
  s.trials = count("trials", 1);
  s.iterations = count("iterations", 1);
  if (vm.count("output")) s.output = vm["output"].as<std::string>();
  if (vm.count("nodes")) {
    s.nodes = static_cast<std::uint32_t>(whole("nodes", vm["nodes"].as<std::string>(), 1, 1024));
  }
  s.nvlink_domain = vm["nvlink-domain"].as<bool>();
  s.multicast = vm["multicast"].as<bool>();
  {
    const std::string text = vm["timeout"].as<std::string>();
    double seconds = 0;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || !(seconds > 0) ||
        seconds > 7 * 24 * 3600.0) {
      throw UsageError{"--timeout: '" + text + "' is not a number of seconds above 0"};
    }
    s.timeout = std::chrono::milliseconds(static_cast<long long>(std::ceil(seconds * 1000)));
  }
  s.progress = vm["progress"].as<bool>();
  const std::string device = vm["device"].as<std::string>();
  if (device == "auto") {
    s.device = DeviceChoice::kAuto;
  } else if (device == "cpu") {
    s.device = DeviceChoice::kCpu;
  } else if (device == "gpu") {
    s.device = DeviceChoice::kGpu;
  } else {
    throw UsageError{"--device: '" + device + "' is not auto, cpu or gpu"};
  }
  return s;
}

void resolve(Settings& s, DeviceKind kind) {
  const bool cpu = kind == DeviceKind::kCpu;
  if (s.tokens.empty() && !s.sizes) {
    if (cpu) {
      s.tokens = {1, 4, 16, 64, 256};  // 8 KiB .. 2 MiB at hidden 4096, bf16
    } else {
      for (std::uint32_t t = 1; t <= 8192; t *= 2) s.tokens.push_back(t);  // .. 64 MiB
    }
  }
  if (!s.warmup) s.warmup = 2;
  if (!s.trials) s.trials = cpu ? 5 : 20;
  if (!s.iterations) s.iterations = cpu ? 4 : 10;
}

std::vector<Point> make_sweep(const Settings& s) {
  std::vector<Point> points;
  for (Dtype dtype : s.dtypes) {
    for (Pattern pattern : s.patterns) {
      for (std::uint32_t hidden : s.hidden) {
        const std::uint64_t row = Request::message_bytes_of(1, hidden, dtype);
        std::vector<std::uint32_t> tokens = s.tokens;
        if (s.sizes) {
          tokens.clear();
          for (std::uint64_t b = s.sizes->first; b <= s.sizes->second; b *= 2) {
            const std::uint64_t t = std::max<std::uint64_t>(1, (b + row / 2) / row);
            if (t > (1u << 30) || t * row > s.sizes->second) break;  // none above TO
            if (tokens.empty() || tokens.back() != t)
              tokens.push_back(static_cast<std::uint32_t>(t));
          }
        }
        for (std::uint32_t t : tokens) {
          points.push_back({dtype, pattern, hidden, t, Request::message_bytes_of(t, hidden, dtype),
                            s.residual_replicated && pattern != Pattern::kAllreduce});
        }
      }
    }
  }
  return points;
}

std::string Option::label() const {
  return std::string(backend_name(backend)) + " " + std::string(algorithm_name(algorithm)) +
         (fused ? " fused" : " unfused") + (registered ? " registered" : "");
}

std::vector<Option> options_for(const Tables& tables, DeviceKind kind, bool registered) {
  std::vector<Backend> fused;
  const std::vector<Topology> topologies =
      kind == DeviceKind::kCpu ? std::vector<Topology>{Topology::kCpu}
                               : std::vector<Topology>{Topology::kSingleNode, Topology::kMultiNode};
  for (Topology t : topologies) {
    for (Backend b : tables.preference[static_cast<int>(t)]) {
      if (std::find(fused.begin(), fused.end(), b) == fused.end()) fused.push_back(b);
    }
  }
  const Backend fallback = tables.fallback[static_cast<int>(kind)];
  std::vector<Option> options;
  for (Backend b : fused) {
    if (tables.backends[static_cast<int>(b)].algorithm == AlgorithmRule::kNative) {
      if (b == fallback) continue;  // its native path is the unfused baseline below
      options.push_back({b, Algorithm::kNative, true});
    } else {
      options.push_back({b, Algorithm::kOneshot, true});
      options.push_back({b, Algorithm::kTwoshot, true});
    }
  }
  if (fallback != Backend::kNone) options.push_back({fallback, Algorithm::kNative, false});
  if (registered) {
    const std::size_t copied = options.size();
    for (std::size_t i = 0; i < copied; ++i) {
      Option o = options[i];
      o.registered = true;
      options.push_back(o);
    }
  }
  return options;
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double at = q * static_cast<double>(values.size() - 1);
  const auto low = static_cast<std::size_t>(std::floor(at));
  const std::size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (at - static_cast<double>(low));
}

}  // namespace arbiter::cli::bench
