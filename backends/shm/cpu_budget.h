// How many CPUs the ranks of one host can run on at once: what the wait
// policy's default (wait_policy.h) asks before it lets a waiting rank keep
// its core. Two limits count:
//   - the affinity mask (sched_getaffinity: taskset, numactl, a launcher's
//     binding). Ranks bound to one CPU each still have a CPU each, so the
//     ranks' masks are united across the group, not counted one by one;
//   - the CPU quota of the process's cgroup (v2 cpu.max, v1
//     cpu.cfs_quota_us over cpu.cfs_period_us; the lowest on the path to
//     the root), in whole CPUs: a container limited to 2 CPUs on a 64-core
//     host has 2, though its mask shows 64.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace arbiter::shm {

// A set of CPUs, as sched_getaffinity reports them (up to 1024).
struct CpuMask {
  std::array<std::uint64_t, 16> words{};

  std::uint32_t count() const;
  void unite(const CpuMask& other);
};

// The CPUs this thread may run on; empty when the kernel will not say.
CpuMask own_cpu_mask();

// The CPU quota of the cgroup at `self_cgroup` (the text of
// /proc/self/cgroup) under the cgroup mount `root`, in whole CPUs rounded
// down (at least 1); 0 when there is no quota or it cannot be read.
std::uint32_t cgroup_cpu_limit(const std::string& root, const std::string& self_cgroup);

// The same for this process (/sys/fs/cgroup, /proc/self/cgroup).
std::uint32_t own_cgroup_cpu_limit();

// One rank's share: where it may run, and its cgroup's quota (0: none).
struct CpuBudget {
  CpuMask mask;
  std::uint32_t quota_cpus = 0;
  std::uint32_t reserved = 0;
};

// This process's budget.
CpuBudget own_cpu_budget();

// How many CPUs `ranks` budgets give a group on one host: the union of the
// masks, capped by the lowest quota (ranks of one container share its
// quota); 0 when no mask is known.
std::uint32_t group_cpus(const std::vector<CpuBudget>& ranks);

}  // namespace arbiter::shm
