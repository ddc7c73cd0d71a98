// The trtllm module loads and answers anywhere, a machine without a GPU
// driver included: it exports only its v1 entry, never pulls in libcuda or a
// shared libcudart, and reports why it cannot run instead of failing to load
// or hanging its peers.
#define BOOST_TEST_MODULE backends_trtllm_module
#include <boost/test/unit_test.hpp>

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "arbiter_backend.h"
#include "module.h"
#include "run_command.h"
#include "thread_oob.h"

namespace {

using arbiter::test::BackendModule;

std::string trtllm_module_path() { return arbiter::test::module_path("trtllm"); }

bool has_cuda_driver() {
  void* cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (cuda == nullptr) return false;
  dlclose(cuda);
  return true;
}

std::vector<std::string> loaded_objects() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name ? info->dlpi_name
                                                                               : "");
        return 0;
      },
      &names);
  return names;
}

arbiter_workspace_spec spec_for(int rank, int world_size) {
  arbiter_workspace_spec spec{};
  spec.world_size = world_size;
  spec.rank = rank;
  spec.device = 0;
  spec.nodes = 1;
  spec.max_tokens = 128;
  spec.hidden = 2880;
  spec.dtype = ARBITER_DTYPE_BF16;
  spec.pattern_mask = 0xFu;
  spec.max_message_bytes = 128 * 2880 * 2;
  spec.timeout_ms = 10000;
  return spec;
}

// workspace_create on `world_size` threads of one ThreadGroup; how each rank
// came back, and how long the slowest took.
struct Creation {
  std::vector<int32_t> status;
  std::vector<std::string> reason;
  std::vector<arbiter_workspace*> workspace;
  std::chrono::milliseconds elapsed{0};
};

Creation create_on_threads(const arbiter_backend_v1_t& api, int world_size) {
  arbiter::test::ThreadGroup group(world_size);
  Creation c;
  c.status.assign(world_size, -1);
  c.reason.assign(world_size, "");
  c.workspace.assign(world_size, nullptr);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      const arbiter_oob oob = group.oob(r);
      const arbiter_workspace_spec spec = spec_for(r, world_size);
      c.status[r] = api.workspace_create(&oob, &spec, &c.workspace[r]);
      c.reason[r] = api.last_error();
    });
  }
  for (auto& t : threads) t.join();
  c.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  return c;
}

// Without a driver every rank fails the same way, with a reason, and none
// waits for a peer that gave up (so well within the oob timeout). With one
// (a GPU machine) the ranks may succeed together: then they are destroyed.
void check_creation_fails_together(const arbiter_backend_v1_t& api, int world_size) {
  const Creation c = create_on_threads(api, world_size);
  for (int r = 0; r < world_size; ++r) {
    BOOST_TEST_MESSAGE("ws " << world_size << " rank " << r << ": status " << c.status[r] << " \""
                             << c.reason[r] << "\"");
  }
  BOOST_TEST_MESSAGE("ws " << world_size << ": returned after " << c.elapsed.count() << " ms");
  const bool all_ok =
      std::all_of(c.status.begin(), c.status.end(), [](int32_t s) { return s == ARBITER_OK; });
  if (has_cuda_driver() && all_ok) {
    BOOST_TEST_MESSAGE(
        "a CUDA driver is installed and every rank created its workspace; "
        "the failure path is not exercised here");
    std::vector<std::thread> threads;
    for (int r = 0; r < world_size; ++r) {
      threads.emplace_back([&, r] { api.workspace_destroy(c.workspace[r]); });
    }
    for (auto& t : threads) t.join();
    return;
  }
  // Half the oob timeout: a rank that waited for a missing peer would take it all.
  BOOST_TEST(c.elapsed.count() < spec_for(0, world_size).timeout_ms / 2);
  for (int r = 0; r < world_size; ++r) {
    BOOST_TEST_CONTEXT("ws " << world_size << " rank " << r) {
      BOOST_TEST(c.status[r] != ARBITER_OK);
      BOOST_TEST(c.status[r] == c.status[0]);
      BOOST_TEST(!c.reason[r].empty());
      BOOST_TEST(c.workspace[r] == nullptr);
      if (!has_cuda_driver()) BOOST_TEST(c.status[r] == ARBITER_UNAVAILABLE);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(loads_with_dlopen_without_libcuda_or_a_shared_cudart) {
  const std::vector<std::string> before = loaded_objects();
  BackendModule module("trtllm");
  BOOST_REQUIRE_MESSAGE(module.loaded(),
                        "dlopen " << trtllm_module_path() << ": " << module.error());
  for (const std::string& name : loaded_objects()) {
    if (std::find(before.begin(), before.end(), name) != before.end()) continue;
    BOOST_TEST_MESSAGE("loaded with the module: " << name);
    BOOST_CHECK_MESSAGE(name.find("libcuda.so") == std::string::npos, name);
    BOOST_CHECK_MESSAGE(name.find("libcudart.so") == std::string::npos, name);
  }
}

BOOST_AUTO_TEST_CASE(exports_abi_v1_named_trtllm) {
  BackendModule module("trtllm");
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const arbiter_backend_v1_t& api = *module.api();
  BOOST_TEST(api.abi_version == 1u);
  BOOST_REQUIRE(api.name != nullptr);
  BOOST_TEST(std::string(api.name) == "trtllm");
  BOOST_TEST(api.probe != nullptr);
  BOOST_TEST(api.workspace_create != nullptr);
  BOOST_TEST(api.run != nullptr);
  BOOST_TEST(api.workspace_destroy != nullptr);
  BOOST_TEST(api.last_error != nullptr);
  // Optional in the ABI, but this module's capacity is finite: the host must
  // be able to ask for it.
  BOOST_TEST(api.max_message_bytes != nullptr);
  if (api.last_error != nullptr) BOOST_TEST(api.last_error() != nullptr);
}

BOOST_AUTO_TEST_CASE(exports_no_symbol_but_the_v1_entry) {
  const auto result = arbiter::test::run_command("nm -D --defined-only " +
                                                 arbiter::test::shell_quote(trtllm_module_path()));
  BOOST_REQUIRE_MESSAGE(result.exit_code == 0, "nm failed: " << result.output);
  std::vector<std::string> symbols;
  std::string line;
  for (char c : result.output + "\n") {
    if (c != '\n') {
      line += c;
      continue;
    }
    if (!line.empty()) symbols.push_back(line.substr(line.rfind(' ') + 1));
    line.clear();
  }
  BOOST_TEST_INFO("nm -D --defined-only:\n" << result.output);
  BOOST_TEST(symbols == std::vector<std::string>{"arbiter_backend_v1"});
}

BOOST_AUTO_TEST_CASE(probe_says_why_it_cannot_run) {
  BackendModule module("trtllm");
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const arbiter_backend_v1_t& api = *module.api();
  arbiter_probe_args args{ARBITER_DEVICE_GPU, 0};
  arbiter_backend_caps caps{};
  const int32_t status = api.probe(&args, &caps);
  const std::string reason = api.last_error();
  BOOST_TEST_MESSAGE("probe: status " << status << ", last_error \"" << reason << "\"");
  if (has_cuda_driver()) {
    // Checked by the GPU test where a device answers; here only that the
    // answer is one of the two the ABI allows.
    BOOST_TEST_MESSAGE("a CUDA driver is installed: the no-driver answer is not checked");
    BOOST_TEST((status == ARBITER_OK || status == ARBITER_UNAVAILABLE));
    if (status == ARBITER_UNAVAILABLE) BOOST_TEST(!reason.empty());
    if (status == ARBITER_OK) BOOST_TEST((caps.flags & ARBITER_CAPS_SINGLE_NODE_ONLY) != 0u);
    return;
  }
  BOOST_TEST(status == ARBITER_UNAVAILABLE);
  BOOST_CHECK_MESSAGE(reason.find("no CUDA driver") != std::string::npos, "reason: " << reason);
}

BOOST_AUTO_TEST_CASE(probe_turns_away_cpu_ranks) {
  BackendModule module("trtllm");
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  arbiter_probe_args args{ARBITER_DEVICE_CPU, -1};
  arbiter_backend_caps caps{};
  BOOST_TEST(module.api()->probe(&args, &caps) == ARBITER_UNAVAILABLE);
  BOOST_TEST(std::strlen(module.api()->last_error()) > 0u);
}

BOOST_AUTO_TEST_CASE(entry_points_reject_null_arguments) {
  BackendModule module("trtllm");
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const arbiter_backend_v1_t& api = *module.api();
  arbiter_backend_caps caps{};
  BOOST_TEST(api.probe(nullptr, &caps) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::strlen(api.last_error()) > 0u);
  arbiter_probe_args args{ARBITER_DEVICE_GPU, 0};
  BOOST_TEST(api.probe(&args, nullptr) == ARBITER_INVALID_ARGUMENT);
  arbiter_allreduce_args run_args{};
  BOOST_TEST(api.run(nullptr, &run_args, nullptr) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::strlen(api.last_error()) > 0u);
  api.workspace_destroy(nullptr);  // harmless
}

// Creation is collective: where it cannot work, it fails on every rank, the
// same way, promptly, and hands out no workspace.
BOOST_AUTO_TEST_CASE(workspace_creation_fails_on_every_rank_together) {
  BackendModule module("trtllm");
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  check_creation_fails_together(*module.api(), 2);
  check_creation_fails_together(*module.api(), 4);
}
