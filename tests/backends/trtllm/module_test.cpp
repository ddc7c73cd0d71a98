// The trtllm module loads and answers anywhere, a machine without a GPU
// driver included: it exports only its ABI entries (v1, its companions and the
// v2 registered-memory one), never pulls in libcuda or a
// shared libcudart, and reports why it cannot run instead of failing to load
// or hanging its peers. The checks are shared with the other GPU modules
// (support/module_checks.h).
#define BOOST_TEST_MODULE backends_trtllm_module
#include <boost/test/unit_test.hpp>

#include "arbiter_backend.h"
#include "module_checks.h"

namespace test = arbiter::test;

BOOST_AUTO_TEST_CASE(loads_with_dlopen_without_libcuda_or_a_shared_cudart) {
  test::check_loads_without_cuda_libraries("trtllm");
}

BOOST_AUTO_TEST_CASE(exports_abi_v1_named_trtllm) { test::check_exports_abi_v1("trtllm"); }

BOOST_AUTO_TEST_CASE(exports_no_symbol_but_the_abi_entries) {
  test::check_exports_only_the_v1_entry("trtllm", /*registered_memory=*/true);
}

BOOST_AUTO_TEST_CASE(probe_says_why_it_cannot_run) {
  test::check_probe_says_why_it_cannot_run("trtllm", [](const arbiter_backend_caps& caps) {
    BOOST_TEST((caps.flags & ARBITER_CAPS_SINGLE_NODE_ONLY) != 0u);
  });
}

BOOST_AUTO_TEST_CASE(probe_turns_away_cpu_ranks) {
  test::check_probe_turns_away_cpu_ranks("trtllm");
}

BOOST_AUTO_TEST_CASE(entry_points_reject_null_arguments) {
  test::check_null_arguments_are_rejected("trtllm");
}

// Creation is collective: where it cannot work, it fails on every rank, the
// same way, promptly, and hands out no workspace.
BOOST_AUTO_TEST_CASE(workspace_creation_fails_on_every_rank_together) {
  test::check_creation_fails_on_every_rank("trtllm", {2, 4});
}
