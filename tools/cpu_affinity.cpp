// Parsing and checking rank pinning for `arbiter launch` (cpu_affinity.h).
#include "cpu_affinity.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "cli.h"
#include "ranges_text.h"

namespace arbiter::cli {

namespace {

// A non-negative decimal below CPU_SETSIZE, or -1.
int cpu_number(const std::string& text) {
  if (text.empty() || text.size() > 5) return -1;
  for (char c : text) {
    if (c < '0' || c > '9') return -1;
  }
  const int value = std::stoi(text);
  return value < CPU_SETSIZE ? value : -1;
}

}  // namespace

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    throw std::runtime_error(std::string("sched_getaffinity: ") + std::strerror(errno));
  }
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::string cpu_list_text(const std::vector<int>& cpus) { return ranges_text(cpus, ","); }

std::vector<int> cpus_for_ranks(const std::string& text, const std::string& source, int ranks,
                                const std::vector<int>& allowed) {
  if (text.empty() || text == "none") return {};
  const std::string where = source + " '" + text + "'";
  std::vector<int> list;
  if (text == "spread") {
    list = allowed;
  } else {
    std::size_t begin = 0;
    while (begin <= text.size()) {
      const std::size_t comma = std::min(text.find(',', begin), text.size());
      const std::string item = text.substr(begin, comma - begin);
      const std::size_t dash = item.find('-');
      const int first = cpu_number(item.substr(0, dash));
      const int last = dash == std::string::npos ? first : cpu_number(item.substr(dash + 1));
      if (first < 0 || last < first) {
        throw UsageError{where + ": '" + item +
                         "' is not a CPU or a range of CPUs (write none, spread, or a list "
                         "such as 0,2,4-7)"};
      }
      for (int cpu = first; cpu <= last; ++cpu) list.push_back(cpu);
      begin = comma + 1;
    }
    for (int cpu : list) {
      if (!std::binary_search(allowed.begin(), allowed.end(), cpu)) {
        throw UsageError{where + ": CPU " + std::to_string(cpu) +
                         " is not one this process may run on (allowed: " + cpu_list_text(allowed) +
                         ")"};
      }
    }
  }
  if (list.empty()) throw UsageError{where + ": no CPU to run on"};
  std::vector<int> per_rank(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) per_rank[r] = list[static_cast<std::size_t>(r) % list.size()];
  return per_rank;
}

}  // namespace arbiter::cli
