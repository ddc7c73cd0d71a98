// The mnnvl module loads and answers anywhere, a machine without a GPU
// driver included: it exports only its v1 entry, never pulls in libcuda or a
// shared libcudart (driver calls go through cudaGetDriverEntryPointByVersion),
// and reports why it cannot run instead of failing to load or hanging its
// peers. The checks every GPU module passes are shared
// (support/module_checks.h); the mnnvl-specific ones follow them.
#define BOOST_TEST_MODULE backends_mnnvl_module
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <string>

#include "arbiter_backend.h"
#include "module.h"
#include "module_checks.h"

namespace test = arbiter::test;

namespace {

bool contains(const std::string& text, const std::string& words) {
  return text.find(words) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(loads_with_dlopen_without_libcuda_or_a_shared_cudart) {
  test::check_loads_without_cuda_libraries("mnnvl");
}

BOOST_AUTO_TEST_CASE(exports_abi_v1_named_mnnvl) { test::check_exports_abi_v1("mnnvl"); }

BOOST_AUTO_TEST_CASE(exports_no_symbol_but_the_abi_entries) {
  test::check_exports_only_the_v1_entry("mnnvl");
}

// Where a device answers: world sizes 2..63 (all ABI v1 can say), fp16,
// bf16 and fp32, one-shot and two-shot, multicast and NVLink needed, and
// not single-node only (an NVLink domain spans nodes).
BOOST_AUTO_TEST_CASE(probe_says_why_it_cannot_run) {
  test::check_probe_says_why_it_cannot_run("mnnvl", [](const arbiter_backend_caps& caps) {
    BOOST_TEST(caps.device_kind == ARBITER_DEVICE_GPU);
    BOOST_TEST(caps.world_size_mask == ~std::uint64_t{3});
    BOOST_TEST(caps.dtype_mask == 0x7u);
    BOOST_TEST(caps.algorithm_mask == 0x3u);
    BOOST_TEST((caps.pattern_mask & 0x7u) == 0x7u);
    BOOST_TEST((caps.flags & ARBITER_CAPS_NEEDS_MULTICAST) != 0u);
    BOOST_TEST((caps.flags & ARBITER_CAPS_NEEDS_NVLINK) != 0u);
    BOOST_TEST((caps.flags & ARBITER_CAPS_SINGLE_NODE_ONLY) == 0u);
  });
}

BOOST_AUTO_TEST_CASE(probe_turns_away_cpu_ranks) {
  test::check_probe_turns_away_cpu_ranks("mnnvl");
}

BOOST_AUTO_TEST_CASE(entry_points_reject_null_arguments) {
  test::check_null_arguments_are_rejected("mnnvl");
}

// An oob without broadcast (rank 0 broadcasts the multicast handle) is
// refused before any exchange.
BOOST_AUTO_TEST_CASE(an_oob_without_broadcast_is_rejected) {
  test::BackendModule module("mnnvl");
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  test::ThreadGroup group(1);
  arbiter_oob oob = group.oob(0);
  oob.broadcast = nullptr;
  const arbiter_workspace_spec spec = test::small_spec(0, 1);
  arbiter_workspace* out = nullptr;
  BOOST_TEST(module.api()->workspace_create(&oob, &spec, &out) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(out == nullptr);
  BOOST_TEST(contains(module.api()->last_error(), "oob"));
}

// Creation is collective: where it cannot work, it fails on every rank, the
// same way, promptly, and hands out no workspace.
BOOST_AUTO_TEST_CASE(workspace_creation_fails_on_every_rank_together) {
  test::check_creation_fails_on_every_rank("mnnvl", {2, 4, 8});
}

// World size 1 is no all-reduce: refused with the range, driver or not (the
// spec is checked before the device).
BOOST_AUTO_TEST_CASE(world_size_one_is_refused_with_the_range) {
  test::BackendModule module("mnnvl");
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const test::Creation c = test::create_on_threads(*module.api(), 1, test::small_spec);
  BOOST_TEST(c.status[0] == ARBITER_UNSUPPORTED);
  BOOST_TEST(c.workspace[0] == nullptr);
  BOOST_CHECK_MESSAGE(contains(c.reason[0], "2..64"), "reason: " << c.reason[0]);
  if (c.status[0] == ARBITER_OK) test::destroy_on_threads(*module.api(), c);
}

// One rank whose spec disagrees with the oob group (a rendezvous over the
// wrong group, DP > 1) fails with INVALID_ARGUMENT naming both; every other
// rank fails too, promptly, instead of waiting for it.
BOOST_AUTO_TEST_CASE(a_spec_that_disagrees_with_the_oob_fails_every_rank) {
  test::BackendModule module("mnnvl");
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const test::SpecFor spec_for = [](int rank, int world_size) {
    arbiter_workspace_spec spec = test::small_spec(rank, world_size);
    if (rank == 1) spec.world_size = 2 * world_size;
    return spec;
  };
  const int size = 4;
  const test::Creation c = test::create_on_threads(*module.api(), size, spec_for);
  BOOST_TEST(c.elapsed.count() < spec_for(0, size).timeout_ms / 2);
  for (int r = 0; r < size; ++r) {
    BOOST_TEST_CONTEXT("rank " << r << ": \"" << c.reason[r] << "\"") {
      BOOST_TEST(c.status[r] != ARBITER_OK);
      BOOST_TEST(c.workspace[r] == nullptr);
      BOOST_TEST(!c.reason[r].empty());
    }
  }
  BOOST_TEST(c.status[1] == ARBITER_INVALID_ARGUMENT);
  BOOST_CHECK_MESSAGE(contains(c.reason[1], "the oob group says rank 1 of 4"),
                      "reason: " << c.reason[1]);
}
