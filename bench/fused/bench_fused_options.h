// Command line of arbiter-bench-fused: what to sweep (backends, world
// sizes, hidden sizes, message sizes), how to time it, where the CSV goes.
// Also the byte-size notation it reads and prints ("16KiB", "1.50 MiB").
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace arbiter::bench {

inline constexpr std::uint64_t kKiB = 1024;
inline constexpr std::uint64_t kMiB = 1024 * kKiB;

// The fused modules the benchmark knows, in the order it runs them.
inline const std::vector<std::string> kFusedBackends = {"trtllm", "mnnvl"};

struct Options {
  std::vector<std::string> backends = kFusedBackends;
  std::vector<int> world_sizes{2, 4, 8};
  std::vector<std::uint32_t> hiddens{7168, 8192};
  std::uint64_t min_bytes = 16 * kKiB;
  std::uint64_t max_bytes = 64 * kMiB;
  std::uint64_t size_step = 2;
  int trials = 7;
  int device = 0;
  bool graphs = true;
  bool check = true;
  double budget_s = 0;         // 0: no limit
  double hang_timeout_s = 30;  // one wait on the GPU
  std::string csv;             // empty: stdout
  std::string command_line;
};

// Fills *o from argv; on a bad command line prints why to stderr and
// returns false. --help prints the usage and exits 0.
bool parse_options(int argc, char** argv, Options* o);

void print_usage(std::FILE* to);

// "16KiB", "64M", "4096", "1GiB" (units K/KiB/k, M/MiB, G/GiB, B or none).
// false on anything else, and on 0.
bool parse_bytes(const std::string& text, std::uint64_t* out);

// "16 KiB", "1.50 MiB", "14336 B".
std::string format_bytes(std::uint64_t bytes);

}  // namespace arbiter::bench
