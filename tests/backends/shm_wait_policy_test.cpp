// How the shm module's ranks wait (backends/shm/wait_policy.h): the
// variable's values, the default's rule (spin while every rank has a CPU of
// its own, else yield), and how many CPUs a group has (cpu_budget.h): the
// ranks' united affinity masks, capped by a cgroup CPU quota read from a
// cgroup tree (v2 and v1, built here in a temporary folder).
#define BOOST_TEST_MODULE backends_shm_wait_policy
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cpu_budget.h"
#include "wait_policy.h"

namespace fs = std::filesystem;
using arbiter::shm::cgroup_cpu_limit;
using arbiter::shm::choose_wait_policy;
using arbiter::shm::CpuBudget;
using arbiter::shm::CpuMask;
using arbiter::shm::group_cpus;
using arbiter::shm::resolve_wait_policy;
using arbiter::shm::WaitPolicy;
using arbiter::shm::WaitRequest;

namespace {

// A cgroup mount in a temporary folder, removed at the end.
struct FakeCgroups {
  fs::path root = fs::temp_directory_path() / ("arbiter-cgroups-" + std::to_string(getpid()));
  FakeCgroups() { fs::create_directories(root); }
  ~FakeCgroups() { fs::remove_all(root); }
  void write(const std::string& file, const std::string& text) const {
    const fs::path path = root / file;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  std::uint32_t limit(const std::string& self_cgroup) const {
    return cgroup_cpu_limit(root.string(), self_cgroup);
  }
};

CpuMask cpus(std::initializer_list<int> list) {
  CpuMask mask;
  for (const int cpu : list) mask.words[cpu / 64] |= std::uint64_t{1} << (cpu % 64);
  return mask;
}

CpuBudget budget(CpuMask mask, std::uint32_t quota = 0) {
  CpuBudget b;
  b.mask = mask;
  b.quota_cpus = quota;
  return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(the_variable)

BOOST_AUTO_TEST_CASE(unset_empty_and_auto_ask_for_the_default) {
  for (const char* text : {static_cast<const char*>(nullptr), "", "auto"}) {
    WaitRequest request = WaitRequest::kSpin;
    BOOST_TEST(choose_wait_policy(text, &request).ok());
    BOOST_TEST((request == WaitRequest::kAuto));
  }
  WaitRequest request = WaitRequest::kAuto;
  BOOST_TEST(choose_wait_policy("yield", &request).ok());
  BOOST_TEST((request == WaitRequest::kYield));
  BOOST_TEST(choose_wait_policy("spin", &request).ok());
  BOOST_TEST((request == WaitRequest::kSpin));
}

BOOST_AUTO_TEST_CASE(an_unknown_value_names_the_variable_and_every_choice) {
  WaitRequest request = WaitRequest::kAuto;
  const auto status = choose_wait_policy("Spin", &request);
  BOOST_TEST(!status.ok());
  BOOST_TEST(status.message() ==
             "ARBITER_SHM_WAIT='Spin' is not a wait policy; use auto (the default), yield or "
             "spin, or unset it");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(the_default)

BOOST_AUTO_TEST_CASE(spins_while_every_rank_has_a_cpu_and_yields_when_oversubscribed) {
  BOOST_TEST((resolve_wait_policy(WaitRequest::kAuto, 2, 2) == WaitPolicy::kSpin));
  BOOST_TEST((resolve_wait_policy(WaitRequest::kAuto, 2, 64) == WaitPolicy::kSpin));
  BOOST_TEST((resolve_wait_policy(WaitRequest::kAuto, 8, 8) == WaitPolicy::kSpin));
  BOOST_TEST((resolve_wait_policy(WaitRequest::kAuto, 3, 2) == WaitPolicy::kYield));
  BOOST_TEST((resolve_wait_policy(WaitRequest::kAuto, 8, 2) == WaitPolicy::kYield));
  // Nothing known about the CPUs: the choice that never starves a peer.
  BOOST_TEST((resolve_wait_policy(WaitRequest::kAuto, 2, 0) == WaitPolicy::kYield));
}

BOOST_AUTO_TEST_CASE(an_explicit_choice_holds_whatever_the_cpus) {
  BOOST_TEST((resolve_wait_policy(WaitRequest::kYield, 2, 64) == WaitPolicy::kYield));
  BOOST_TEST((resolve_wait_policy(WaitRequest::kSpin, 8, 2) == WaitPolicy::kSpin));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(the_group_cpus)

BOOST_AUTO_TEST_CASE(ranks_bound_to_a_cpu_each_count_every_cpu) {
  // mpirun binds 2 ranks to a core each: each mask holds one CPU.
  BOOST_TEST(group_cpus({budget(cpus({0})), budget(cpus({1}))}) == 2u);
  // Both bound to the same CPU: one.
  BOOST_TEST(group_cpus({budget(cpus({3})), budget(cpus({3}))}) == 1u);
  // Past the first word of the mask.
  BOOST_TEST(group_cpus({budget(cpus({0, 1, 2, 3})), budget(cpus({64, 130, 1023}))}) == 7u);
}

BOOST_AUTO_TEST_CASE(the_lowest_quota_caps_the_union) {
  const CpuMask host = cpus({0, 1, 2, 3, 4, 5, 6, 7});
  BOOST_TEST(group_cpus({budget(host, 2), budget(host, 2)}) == 2u);
  BOOST_TEST(group_cpus({budget(host, 0), budget(host, 3)}) == 3u);
  BOOST_TEST(group_cpus({budget(host, 16), budget(host, 0)}) == 8u);  // above the mask
  BOOST_TEST(group_cpus({budget(CpuMask{}), budget(CpuMask{})}) == 0u);
}

BOOST_AUTO_TEST_CASE(this_process_may_run_somewhere) {
  BOOST_TEST(arbiter::shm::own_cpu_mask().count() >= 1u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cgroup_quota)

BOOST_AUTO_TEST_CASE(v2_takes_the_lowest_limit_on_the_path_to_the_root) {
  FakeCgroups cg;
  cg.write("cpu.max", "max 100000\n");
  cg.write("job/cpu.max", "250000 100000\n");
  cg.write("job/step/cpu.max", "max 100000\n");
  BOOST_TEST(cg.limit("0::/job/step\n") == 2u);  // 2.5 CPUs, rounded down
  cg.write("job/step/cpu.max", "50000 100000\n");
  BOOST_TEST(cg.limit("0::/job/step\n") == 1u);  // half a CPU: at least one
  cg.write("job/cpu.max", "max 100000\n");
  cg.write("job/step/cpu.max", "999999999999999 1000\n");  // far above any host
  BOOST_TEST(cg.limit("0::/job/step\n") == 4294967295u);
}

BOOST_AUTO_TEST_CASE(v2_without_a_quota_or_any_file_has_no_limit) {
  FakeCgroups cg;
  BOOST_TEST(cg.limit("0::/job\n") == 0u);
  cg.write("job/cpu.max", "max 100000\n");
  BOOST_TEST(cg.limit("0::/job\n") == 0u);
  cg.write("job/cpu.max", "garbage\n");
  BOOST_TEST(cg.limit("0::/job\n") == 0u);
  BOOST_TEST(cg.limit("") == 0u);
}

BOOST_AUTO_TEST_CASE(a_path_the_mount_does_not_show_ends_at_its_root) {
  // A container without a cgroup namespace: /proc/self/cgroup names the
  // host's path; the mount's root is the container's own cgroup.
  FakeCgroups cg;
  cg.write("cpu.max", "400000 100000\n");
  BOOST_TEST(cg.limit("0::/kubepods/burstable/pod1/abc\n") == 4u);
}

BOOST_AUTO_TEST_CASE(v1_reads_the_cpu_controller_under_its_mount_names) {
  FakeCgroups cg;
  cg.write("cpu,cpuacct/job/cpu.cfs_quota_us", "-1\n");
  cg.write("cpu,cpuacct/job/cpu.cfs_period_us", "100000\n");
  cg.write("cpu,cpuacct/cpu.cfs_quota_us", "300000\n");
  cg.write("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const std::string self = "12:memory:/job\n4:cpu,cpuacct:/job\n0::/\n";
  BOOST_TEST(cg.limit(self) == 3u);
  cg.write("cpu,cpuacct/job/cpu.cfs_quota_us", "150000\n");
  BOOST_TEST(cg.limit(self) == 1u);
}

BOOST_AUTO_TEST_CASE(v1_cpuacct_alone_is_not_the_cpu_controller) {
  FakeCgroups cg;
  cg.write("cpu/job/cpu.cfs_quota_us", "100000\n");
  cg.write("cpu/job/cpu.cfs_period_us", "100000\n");
  BOOST_TEST(cg.limit("3:cpuacct:/job\n") == 0u);
  BOOST_TEST(cg.limit("3:cpu:/job\n") == 1u);
}

BOOST_AUTO_TEST_CASE(v1_and_v2_together_take_the_lower) {
  // A hybrid host: v1 controllers beside v2 at unified/.
  FakeCgroups cg;
  cg.write("cpu/cpu.cfs_quota_us", "600000\n");
  cg.write("cpu/cpu.cfs_period_us", "100000\n");
  cg.write("unified/job/cpu.max", "200000 100000\n");
  BOOST_TEST(cg.limit("1:cpu:/\n0::/job\n") == 2u);
}

BOOST_AUTO_TEST_SUITE_END()
