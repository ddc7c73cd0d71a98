// The nccl module loads and answers anywhere, a machine without a GPU driver
// included: it exports only its v1 entry, never pulls in libcuda or a shared
// libcudart, and reports why it cannot run instead of failing to load.
#define BOOST_TEST_MODULE backends_nccl_module
#include <boost/test/unit_test.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/common/arch_coverage.h"
#include "arbiter_backend.h"
#include "module.h"
#include "module_checks.h"
#include "run_command.h"
#include "thread_oob.h"

namespace {

using arbiter::test::NcclModule;

using arbiter::test::has_cuda_driver;

arbiter_workspace_spec spec_for(int rank, int world_size) {
  arbiter_workspace_spec spec{};
  spec.world_size = world_size;
  spec.rank = rank;
  spec.device = 0;
  spec.nodes = 1;
  spec.max_tokens = 128;
  spec.hidden = 2880;
  spec.dtype = ARBITER_DTYPE_BF16;
  spec.pattern_mask = 1u << ARBITER_PATTERN_RESIDUAL_RMSNORM;
  spec.max_message_bytes = 1 << 20;
  spec.timeout_ms = 10000;
  return spec;
}

}  // namespace

BOOST_AUTO_TEST_CASE(loads_with_dlopen_without_libcuda_or_a_shared_cudart) {
  arbiter::test::check_loads_without_cuda_libraries("nccl");
}

BOOST_AUTO_TEST_CASE(exports_abi_v1_named_nccl) {
  NcclModule module;
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const arbiter_backend_v1_t& api = *module.api();
  BOOST_TEST(api.abi_version == 1u);
  BOOST_TEST(std::string(api.name) == "nccl");
  BOOST_TEST(api.probe != nullptr);
  BOOST_TEST(api.workspace_create != nullptr);
  BOOST_TEST(api.run != nullptr);
  BOOST_TEST(api.workspace_destroy != nullptr);
  BOOST_TEST(api.last_error != nullptr);
  BOOST_TEST(api.last_error() != nullptr);
}

BOOST_AUTO_TEST_CASE(exports_no_symbol_but_the_v1_entry) {
  arbiter::test::check_exports_only_the_v1_entry("nccl");
}

BOOST_AUTO_TEST_CASE(probe_says_why_it_cannot_run) {
  NcclModule module;
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const arbiter_backend_v1_t& api = *module.api();
  arbiter_probe_args args{ARBITER_DEVICE_GPU, 0};
  arbiter_backend_caps caps{};
  const int32_t status = api.probe(&args, &caps);
  const std::string reason = api.last_error();
  BOOST_TEST_MESSAGE("probe: status " << status << ", last_error \"" << reason << "\"");
  if (!has_cuda_driver()) {
    BOOST_TEST(status == ARBITER_UNAVAILABLE);
    BOOST_CHECK_MESSAGE(reason.find("driver") != std::string::npos, "reason: " << reason);
    return;
  }
  // A driver is installed: either a device answers or the reason is given.
  if (status == ARBITER_OK) {
    BOOST_TEST(caps.device_kind == ARBITER_DEVICE_GPU);
    BOOST_TEST(caps.capability >= 70u);
    BOOST_TEST(caps.world_size_mask == ~uint64_t{3});
    BOOST_TEST(caps.dtype_mask == 0x7u);
    // No FP4; the norm patterns only where the kernel was built for the device.
    BOOST_TEST((caps.pattern_mask == 0x7u || caps.pattern_mask == 0x1u));
    BOOST_TEST(caps.algorithm_mask == (1u << ARBITER_ALGORITHM_NATIVE));
    BOOST_TEST(caps.flags == 0u);
  } else {
    BOOST_TEST(status == ARBITER_UNAVAILABLE);
    BOOST_TEST(!reason.empty());
  }
}

BOOST_AUTO_TEST_CASE(probe_turns_away_cpu_ranks) {
  NcclModule module;
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  arbiter_probe_args args{ARBITER_DEVICE_CPU, -1};
  arbiter_backend_caps caps{};
  BOOST_TEST(module.api()->probe(&args, &caps) == ARBITER_UNAVAILABLE);
  BOOST_TEST(std::string(module.api()->last_error()).find("GPU") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(entry_points_reject_null_arguments) {
  NcclModule module;
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const arbiter_backend_v1_t& api = *module.api();
  arbiter_backend_caps caps{};
  BOOST_TEST(api.probe(nullptr, &caps) == ARBITER_INVALID_ARGUMENT);
  arbiter_allreduce_args args{};
  BOOST_TEST(api.run(nullptr, &args, nullptr) == ARBITER_INVALID_ARGUMENT);
  arbiter::test::ThreadGroup group(1);
  const arbiter_oob oob = group.oob(0);
  const arbiter_workspace_spec spec = spec_for(0, 1);
  BOOST_TEST(api.workspace_create(&oob, &spec, nullptr) == ARBITER_INVALID_ARGUMENT);
  arbiter_workspace* ws = reinterpret_cast<arbiter_workspace*>(1);
  BOOST_TEST(api.workspace_create(nullptr, &spec, &ws) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(ws == nullptr);
  BOOST_TEST(api.workspace_create(&oob, nullptr, &ws) == ARBITER_INVALID_ARGUMENT);
  api.workspace_destroy(nullptr);
  BOOST_TEST(std::strlen(api.last_error()) > 0u);
}

// One rank's bad spec fails every rank, each with a reason, and none waits
// for NCCL (which would never be reached).
BOOST_AUTO_TEST_CASE(every_rank_fails_when_one_rank_cannot_start) {
  NcclModule module;
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const arbiter_backend_v1_t& api = *module.api();
  arbiter::test::ThreadGroup group(2);
  int32_t status[2] = {-1, -1};
  std::string reason[2];
  arbiter_workspace* ws[2] = {nullptr, nullptr};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const arbiter_oob oob = group.oob(r);
      arbiter_workspace_spec spec = spec_for(r, 2);
      if (r == 1) spec.rank = 5;  // disagrees with the oob group
      status[r] = api.workspace_create(&oob, &spec, &ws[r]);
      reason[r] = api.last_error();
    });
  }
  for (auto& t : threads) t.join();
  BOOST_TEST_MESSAGE("rank 0: " << status[0] << " \"" << reason[0] << "\"");
  BOOST_TEST_MESSAGE("rank 1: " << status[1] << " \"" << reason[1] << "\"");
  BOOST_TEST(status[1] == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(reason[1].find("spec says rank 5") != std::string::npos);
  BOOST_TEST(status[0] != ARBITER_OK);
  if (status[0] == ARBITER_PEER_FAILED) {
    BOOST_TEST(reason[0].find("rank 1") != std::string::npos);
  } else {
    BOOST_TEST(reason[0].find("other rank(s) failed too") != std::string::npos);
  }
  BOOST_TEST(ws[0] == nullptr);
  BOOST_TEST(ws[1] == nullptr);
}

BOOST_AUTO_TEST_CASE(creation_times_out_when_a_rank_never_arrives) {
  NcclModule module;
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  arbiter::test::ThreadGroup group(2);
  const arbiter_oob oob = group.oob(0);
  arbiter_workspace_spec spec = spec_for(0, 2);
  spec.timeout_ms = 200;
  arbiter_workspace* ws = nullptr;
  BOOST_TEST(module.api()->workspace_create(&oob, &spec, &ws) == ARBITER_TIMEOUT);
  const std::string reason = module.api()->last_error();
  BOOST_CHECK_MESSAGE(reason.find("rank(s) 1 did not arrive") != std::string::npos,
                      "reason: " << reason);
  BOOST_TEST(ws == nullptr);
}

// The norm patterns are offered only on devices the kernel runs on: an
// arch-specific build for Hopper and Blackwell runs on none of the others.
BOOST_AUTO_TEST_CASE(kernels_are_claimed_only_for_the_devices_they_were_built_for) {
  using arbiter::common::kernel_built_for;
  const char* shipped = "90a,100a,103a";
  BOOST_TEST(kernel_built_for(90, shipped));
  BOOST_TEST(kernel_built_for(100, shipped));
  BOOST_TEST(kernel_built_for(103, shipped));
  BOOST_TEST(!kernel_built_for(80, shipped));
  BOOST_TEST(!kernel_built_for(89, shipped));
  BOOST_TEST(!kernel_built_for(107, shipped));
  BOOST_TEST(!kernel_built_for(120, shipped));
  BOOST_TEST(kernel_built_for(120, "80"));  // PTX runs on later devices
  BOOST_TEST(!kernel_built_for(75, "80"));
  BOOST_TEST(kernel_built_for(86, "80-real"));  // SASS: same major, later minor
  BOOST_TEST(!kernel_built_for(90, "80-real"));
  BOOST_TEST(kernel_built_for(90, "80-virtual"));
  BOOST_TEST(kernel_built_for(103, "100f"));  // the family
  BOOST_TEST(!kernel_built_for(110, "100f"));
  BOOST_TEST(kernel_built_for(90, "all-major"));  // unknown spellings claim all
  BOOST_TEST(kernel_built_for(90, ""));
}
