#include "cpu_budget.h"

#include <sched.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

namespace arbiter::shm {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// "/a/b/c" -> "/a/b/c", "/a/b", "/a", "": a limit anywhere on the way up
// binds. Inside a container without a cgroup namespace the path names the
// host's hierarchy, which the mount does not show; the walk then ends at
// the mount's root, the container's own cgroup.
std::vector<std::string> path_and_ancestors(std::string path) {
  std::vector<std::string> out;
  while (!path.empty() && path.back() == '/') path.pop_back();
  for (;;) {
    out.push_back(path);
    if (path.empty()) return out;
    const std::size_t slash = path.rfind('/');
    path.resize(slash == std::string::npos ? 0 : slash);
  }
}

// A quota in CPUs from `quota` and `period` microseconds; 0 when none.
double quota_cpus(long long quota, long long period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<double>(quota) / static_cast<double>(period);
}

// cgroup v2: cpu.max holds "max PERIOD" or "QUOTA PERIOD".
double v2_limit(const std::string& dir) {
  std::istringstream line(read_file(dir + "/cpu.max"));
  std::string quota;
  long long period = 0;
  if (!(line >> quota >> period) || quota == "max") return 0;
  try {
    return quota_cpus(std::stoll(quota), period);
  } catch (...) {
    return 0;
  }
}

// cgroup v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
double v1_limit(const std::string& dir) {
  std::istringstream quota_text(read_file(dir + "/cpu.cfs_quota_us"));
  std::istringstream period_text(read_file(dir + "/cpu.cfs_period_us"));
  long long quota = 0;
  long long period = 0;
  if (!(quota_text >> quota) || !(period_text >> period)) return 0;
  return quota_cpus(quota, period);
}

// The lowest limit over `mounts` x the path's ancestors; 0 when none.
template <class Limit>
double lowest_limit(const std::vector<std::string>& mounts, const std::string& path, Limit limit) {
  double lowest = 0;
  for (const std::string& mount : mounts) {
    for (const std::string& dir : path_and_ancestors(path)) {
      const double cpus = limit(mount + dir);
      if (cpus > 0 && (lowest == 0 || cpus < lowest)) lowest = cpus;
    }
  }
  return lowest;
}

}  // namespace

std::uint32_t CpuMask::count() const {
  std::uint32_t n = 0;
  for (const std::uint64_t word : words) n += static_cast<std::uint32_t>(std::popcount(word));
  return n;
}

void CpuMask::unite(const CpuMask& other) {
  for (std::size_t i = 0; i < words.size(); ++i) words[i] |= other.words[i];
}

CpuMask own_cpu_mask() {
  CpuMask mask;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return mask;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpu < static_cast<int>(mask.words.size() * 64); ++cpu) {
    if (CPU_ISSET(cpu, &set)) mask.words[cpu / 64] |= std::uint64_t{1} << (cpu % 64);
  }
  return mask;
}

std::uint32_t cgroup_cpu_limit(const std::string& root, const std::string& self_cgroup) {
  // Lines of /proc/self/cgroup: "ID:CONTROLLERS:PATH"; v2's is "0::PATH".
  double lowest = 0;
  std::istringstream lines(self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    const std::size_t first = line.find(':');
    const std::size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    double cpus = 0;
    if (controllers.empty()) {
      // v2: mounted at the root, or at unified/ beside v1 (hybrid hosts).
      cpus = lowest_limit({root, root + "/unified"}, path, v2_limit);
    } else {
      std::istringstream names(controllers);
      std::string name;
      bool has_cpu = false;
      while (std::getline(names, name, ',')) has_cpu = has_cpu || name == "cpu";
      if (!has_cpu) continue;
      cpus = lowest_limit({root + "/cpu", root + "/cpu,cpuacct", root + "/cpuacct,cpu"}, path,
                          v1_limit);
    }
    if (cpus > 0 && (lowest == 0 || cpus < lowest)) lowest = cpus;
  }
  if (lowest == 0) return 0;
  // At least one CPU; at most what a 32-bit count holds (a quota far above
  // any host is as good as none).
  return static_cast<std::uint32_t>(std::clamp(std::floor(lowest), 1.0, 4294967295.0));
}

std::uint32_t own_cgroup_cpu_limit() {
  return cgroup_cpu_limit("/sys/fs/cgroup", read_file("/proc/self/cgroup"));
}

CpuBudget own_cpu_budget() {
  CpuBudget budget;
  budget.mask = own_cpu_mask();
  budget.quota_cpus = own_cgroup_cpu_limit();
  return budget;
}

std::uint32_t group_cpus(const std::vector<CpuBudget>& ranks) {
  CpuMask all;
  std::uint32_t quota = 0;
  for (const CpuBudget& rank : ranks) {
    all.unite(rank.mask);
    if (rank.quota_cpus > 0 && (quota == 0 || rank.quota_cpus < quota)) quota = rank.quota_cpus;
  }
  const std::uint32_t cpus = all.count();
  return quota > 0 && quota < cpus ? quota : cpus;
}

}  // namespace arbiter::shm
