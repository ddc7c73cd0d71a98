// Which CPU each rank of `arbiter launch` is pinned to: --cpu-affinity or
// ARBITER_CPU_AFFINITY. Off by default; see docs/backends.md (`arbiter launch --cpu-affinity`).
#pragma once

#include <string>
#include <vector>

namespace arbiter::cli {

// The CPUs this process may run on, in ascending order (sched_getaffinity).
std::vector<int> allowed_cpus();

// One CPU per rank (rank r at index r), or empty for no pinning. `text`:
//   "none" or ""   no pinning (the default)
//   "spread"       rank r on the r-th allowed CPU, wrapping around
//   "0,2,4-7"      rank r on the r-th CPU of the list, wrapping around
// Throws UsageError naming `source` (the flag or the variable) when the text
// is malformed or names a CPU outside `allowed`.
std::vector<int> cpus_for_ranks(const std::string& text, const std::string& source, int ranks,
                                const std::vector<int>& allowed);

// "0-3,8" for {0, 1, 2, 3, 8}.
std::string cpu_list_text(const std::vector<int>& cpus);

}  // namespace arbiter::cli
