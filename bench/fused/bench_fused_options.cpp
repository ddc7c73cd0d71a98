// Command line of arbiter-bench-fused; see bench_fused_options.h.
#include "bench_fused_options.h"

#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "bench_fused_kernels.h"

namespace arbiter::bench {
namespace {

template <typename T>
bool parse_list(const std::string& text, std::vector<T>* out) {
  out->clear();
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    try {
      std::size_t used = 0;
      const long long value = std::stoll(text.substr(begin, end - begin), &used);
      if (used != end - begin || value <= 0) return false;
      out->push_back(static_cast<T>(value));
    } catch (const std::exception&) {
      return false;
    }
    begin = end + 1;
  }
  return !out->empty();
}

// Known backend names, each once, in kFusedBackends order.
bool parse_backends(const std::string& text, std::vector<std::string>* out) {
  std::vector<std::string> named;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string name = text.substr(begin, end - begin);
    if (std::find(kFusedBackends.begin(), kFusedBackends.end(), name) == kFusedBackends.end()) {
      std::fprintf(stderr, "error: --backend: unknown backend '%s' (trtllm, mnnvl)\n",
                   name.c_str());
      return false;
    }
    named.push_back(name);
    begin = end + 1;
  }
  out->clear();
  for (const std::string& b : kFusedBackends) {
    if (std::find(named.begin(), named.end(), b) != named.end()) out->push_back(b);
  }
  return !out->empty();
}

}  // namespace

bool parse_bytes(const std::string& text, std::uint64_t* out) {
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  const std::string unit = text.substr(used);
  std::uint64_t scale = 1;
  if (unit == "K" || unit == "KiB" || unit == "k") {
    scale = kKiB;
  } else if (unit == "M" || unit == "MiB") {
    scale = kMiB;
  } else if (unit == "G" || unit == "GiB") {
    scale = 1024 * kMiB;
  } else if (!unit.empty() && unit != "B") {
    return false;
  }
  *out = value * scale;
  return value != 0;
}

std::string format_bytes(std::uint64_t bytes) {
  char text[64];
  if (bytes >= kMiB && bytes % kMiB == 0) {
    std::snprintf(text, sizeof text, "%" PRIu64 " MiB", bytes / kMiB);
  } else if (bytes >= kKiB && bytes % kKiB == 0) {
    std::snprintf(text, sizeof text, "%" PRIu64 " KiB", bytes / kKiB);
  } else if (bytes >= kMiB) {
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / kMiB);
  } else if (bytes >= kKiB) {
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / kKiB);
  } else {
    std::snprintf(text, sizeof text, "%" PRIu64 " B", bytes);
  }
  return text;
}

void print_usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: arbiter-bench-fused [options]\n"
      "  --backend LIST     fused modules to measure: trtllm, mnnvl; default both\n"
      "  --ws LIST          world sizes (virtual ranks on one GPU), default 2,4,8\n"
      "  --hidden LIST      hidden sizes, default 7168,8192\n"
      "  --min BYTES        smallest per-rank message, default 16KiB\n"
      "  --max BYTES        largest per-rank message (and the workspaces'), default 64MiB\n"
      "  --trials N         timed trials per point (median, p10, p90), default 7\n"
      "  --quick            smoke run: hidden 7168, every 8th size, 3 trials\n"
      "                     (options given explicitly still apply)\n"
      "  --csv PATH         write the CSV there instead of stdout\n"
      "  --device N         CUDA device, default 0\n"
      "  --budget SECONDS   start no new point after this long; 0: no limit (default)\n"
      "  --hang-timeout S   a GPU wait longer than this is a hung kernel: exit 2 (default 30)\n"
      "  --no-graphs        time plain launches instead of CUDA graphs\n"
      "  --no-check         do not compare fused outputs with the baseline's\n");
}

bool parse_options(int argc, char** argv, Options* o) {
  bool quick = false;
  bool hidden_given = false;
  bool trials_given = false;
  for (int i = 0; i < argc; ++i) o->command_line += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](std::string* out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", arg.c_str());
        return false;
      }
      *out = argv[++i];
      return true;
    };
    std::string v;
    const auto bad = [&] {
      std::fprintf(stderr, "error: bad value for %s: '%s'\n", arg.c_str(), v.c_str());
      return false;
    };
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      std::exit(0);
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--no-graphs") {
      o->graphs = false;
    } else if (arg == "--no-check") {
      o->check = false;
    } else if (arg == "--backend") {
      if (!value(&v)) return false;
      if (!parse_backends(v, &o->backends)) return false;
    } else if (arg == "--ws") {
      if (!value(&v)) return false;
      if (!parse_list(v, &o->world_sizes)) return bad();
      for (int ws : o->world_sizes) {
        if (ws < 1 || ws > kMaxBenchRanks) {
          std::fprintf(stderr, "error: --ws %d: 1 to %d ranks\n", ws, kMaxBenchRanks);
          return false;
        }
      }
    } else if (arg == "--hidden") {
      if (!value(&v)) return false;
      if (!parse_list(v, &o->hiddens)) return bad();
      hidden_given = true;
      for (std::uint32_t h : o->hiddens) {
        if (h % 8 != 0) {
          std::fprintf(stderr, "error: --hidden %u: a multiple of 8 (16-byte bf16 rows)\n", h);
          return false;
        }
      }
    } else if (arg == "--min") {
      if (!value(&v)) return false;
      if (!parse_bytes(v, &o->min_bytes)) return bad();
    } else if (arg == "--max") {
      if (!value(&v)) return false;
      if (!parse_bytes(v, &o->max_bytes)) return bad();
    } else if (arg == "--trials") {
      if (!value(&v)) return false;
      o->trials = std::atoi(v.c_str());
      trials_given = true;
      if (o->trials < 1) return bad();
    } else if (arg == "--csv") {
      if (!value(&v)) return false;
      o->csv = v;
    } else if (arg == "--device") {
      if (!value(&v)) return false;
      o->device = std::atoi(v.c_str());
    } else if (arg == "--budget") {
      if (!value(&v)) return false;
      o->budget_s = std::atof(v.c_str());
    } else if (arg == "--hang-timeout") {
      if (!value(&v)) return false;
      o->hang_timeout_s = std::atof(v.c_str());
      if (o->hang_timeout_s <= 0) return bad();
    } else {
      std::fprintf(stderr, "error: unknown option %s\n", arg.c_str());
      return false;
    }
  }
  if (o->min_bytes > o->max_bytes) {
    std::fprintf(stderr, "error: --min is above --max\n");
    return false;
  }
  if (quick) {
    o->size_step = 8;
    if (!hidden_given) o->hiddens = {7168};
    if (!trials_given) o->trials = 3;
  }
  return true;
}

}  // namespace arbiter::bench
