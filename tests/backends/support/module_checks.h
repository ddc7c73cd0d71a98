// Checks every GPU backend module must pass on any machine, a machine
// without a GPU driver included, shared by the module suites
// (tests/backends/<name>/module_test.cpp). Each suite names its own test
// cases and calls these with the module's name and what it expects:
//
//   BOOST_AUTO_TEST_CASE(exports_abi_v1_named_mnnvl) { check_exports_abi_v1("mnnvl"); }
//
// A module passes when it loads with dlopen() without pulling in libcuda or
// a shared libcudart, exports only its v1 entry, says why it cannot run
// (probe: ARBITER_UNAVAILABLE with "no CUDA driver" where there is none),
// turns CPU ranks away, rejects NULL arguments, and fails workspace
// creation on every rank together, promptly and with a reason.
//
// Boost.Test: for the Boost suites only (the GPU tests use gpu_check.h).
#pragma once

#include <dlfcn.h>
#include <link.h>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "arbiter_backend.h"
#include "module.h"
#include "run_command.h"
#include "thread_oob.h"

namespace arbiter::test {

inline bool has_cuda_driver() {
  void* cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (cuda == nullptr) return false;
  dlclose(cuda);
  return true;
}

// The shared objects mapped into this process.
inline std::vector<std::string> loaded_objects() {
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

// The module loads with dlopen() and brings neither libcuda (it must load
// where there is no driver) nor a shared libcudart (it links the static one).
inline void check_loads_without_cuda_libraries(const std::string& name) {
  const std::vector<std::string> before = loaded_objects();
  BackendModule module(name);
  BOOST_REQUIRE_MESSAGE(module.loaded(), "dlopen " << module.path() << ": " << module.error());
  for (const std::string& object : loaded_objects()) {
    if (std::find(before.begin(), before.end(), object) != before.end()) continue;
    BOOST_TEST_MESSAGE("loaded with the module: " << object);
    BOOST_CHECK_MESSAGE(object.find("libcuda.so") == std::string::npos, object);
    BOOST_CHECK_MESSAGE(object.find("libcudart.so") == std::string::npos, object);
  }
}

// The v1 entry carries `name` and every entry point a GPU module needs.
inline void check_exports_abi_v1(const std::string& name) {
  BackendModule module(name);
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const arbiter_backend_v1_t& api = *module.api();
  BOOST_TEST(api.abi_version == 1u);
  BOOST_REQUIRE(api.name != nullptr);
  BOOST_TEST(std::string(api.name) == name);
  BOOST_TEST(api.probe != nullptr);
  BOOST_TEST(api.workspace_create != nullptr);
  BOOST_TEST(api.run != nullptr);
  BOOST_TEST(api.workspace_destroy != nullptr);
  BOOST_TEST(api.last_error != nullptr);
  // Optional in the ABI, but a fused module's capacity is finite: the host
  // must be able to ask for it.
  BOOST_TEST(api.max_message_bytes != nullptr);
  if (api.last_error != nullptr) BOOST_TEST(api.last_error() != nullptr);
}

// `nm -D --defined-only` lists the ABI entries and nothing else
// (arbiter_backend_v1 and its faults companion, arbiter_backend_v1_faults,
// whose build string is set and whose abort() exists): the module's CUDA
// runtime, kernels and helpers stay private.
// With `registered_memory`, the module also exports the ABI v2 memory
// companion, which refuses NULL arguments with a message.
inline void check_exports_only_the_v1_entry(const std::string& name,
                                            bool registered_memory = false) {
  const std::string path = module_path(name);
  const auto result = run_command("nm -D --defined-only " + shell_quote(path));
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
  std::vector<std::string> want{"arbiter_backend_v1", "arbiter_backend_v1_faults",
                                "arbiter_backend_v1_footprint"};
  if (registered_memory) want.push_back(ARBITER_BACKEND_MEMORY_SYMBOL_V2);
  BOOST_TEST(symbols == want);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  BOOST_REQUIRE(handle != nullptr);
  const auto* faults = static_cast<const arbiter_backend_faults_v1_t*>(
      dlsym(handle, ARBITER_BACKEND_FAULTS_SYMBOL_V1));
  BOOST_REQUIRE(faults != nullptr);
  BOOST_TEST(faults->faults_version == 1u);
  BOOST_TEST((faults->module_version != nullptr && *faults->module_version != '\0'));
  BOOST_TEST(faults->abort != nullptr);
  const auto* memory = static_cast<const arbiter_backend_memory_v2_t*>(
      dlsym(handle, ARBITER_BACKEND_MEMORY_SYMBOL_V2));
  BOOST_TEST((memory != nullptr) == registered_memory);
  if (memory != nullptr) {
    BOOST_TEST(memory->memory_version == 2u);
    BOOST_TEST(memory->alignment >= 16u);
    BOOST_TEST((memory->alignment & (memory->alignment - 1)) == 0u);
    const auto* api =
        static_cast<const arbiter_backend_v1_t*>(dlsym(handle, ARBITER_BACKEND_SYMBOL_V1));
    BOOST_REQUIRE(api != nullptr);
    void* local = reinterpret_cast<void*>(16);
    BOOST_TEST(memory->alloc(nullptr, 64, &local) == ARBITER_INVALID_ARGUMENT);
    BOOST_TEST(std::strlen(api->last_error()) > 0u);
    BOOST_TEST(memory->free(nullptr, local) == ARBITER_INVALID_ARGUMENT);
    arbiter_allreduce_args args{};
    BOOST_TEST(memory->run_registered(nullptr, &args, nullptr) == ARBITER_INVALID_ARGUMENT);
  }
  dlclose(handle);
}

// probe(GPU 0): without a driver, ARBITER_UNAVAILABLE with "no CUDA driver".
// Where a driver is installed the GPU tests check the answer; here only
// that it is one the ABI allows, and `check_caps` runs on an OK answer.
inline void check_probe_says_why_it_cannot_run(
    const std::string& name, const std::function<void(const arbiter_backend_caps&)>& check_caps) {
  BackendModule module(name);
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const arbiter_backend_v1_t& api = *module.api();
  arbiter_probe_args args{ARBITER_DEVICE_GPU, 0};
  arbiter_backend_caps caps{};
  const std::int32_t status = api.probe(&args, &caps);
  const std::string reason = api.last_error();
  BOOST_TEST_MESSAGE(name << " probe: status " << status << ", last_error \"" << reason << "\"");
  if (has_cuda_driver()) {
    BOOST_TEST_MESSAGE("a CUDA driver is installed: the no-driver answer is not checked");
    BOOST_TEST((status == ARBITER_OK || status == ARBITER_UNAVAILABLE));
    if (status == ARBITER_UNAVAILABLE) BOOST_TEST(!reason.empty());
    if (status == ARBITER_OK) check_caps(caps);
    return;
  }
  BOOST_TEST(status == ARBITER_UNAVAILABLE);
  BOOST_CHECK_MESSAGE(reason.find("no CUDA driver") != std::string::npos, "reason: " << reason);
}

// A CPU rank is not served, with a reason.
inline void check_probe_turns_away_cpu_ranks(const std::string& name) {
  BackendModule module(name);
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  arbiter_probe_args args{ARBITER_DEVICE_CPU, -1};
  arbiter_backend_caps caps{};
  BOOST_TEST(module.api()->probe(&args, &caps) == ARBITER_UNAVAILABLE);
  BOOST_TEST(std::strlen(module.api()->last_error()) > 0u);
}

// NULL where the ABI wants a pointer: ARBITER_INVALID_ARGUMENT with a reason
// (never a crash); destroying NULL and asking a NULL workspace its capacity
// are harmless.
inline void check_null_arguments_are_rejected(const std::string& name) {
  BackendModule module(name);
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
  arbiter_workspace* out = nullptr;
  BOOST_TEST(api.workspace_create(nullptr, nullptr, &out) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(out == nullptr);
  BOOST_TEST(std::strlen(api.last_error()) > 0u);
  if (api.max_message_bytes != nullptr) {
    BOOST_TEST(api.max_message_bytes(nullptr, ARBITER_ALGORITHM_ONESHOT) == 0u);
  }
  api.workspace_destroy(nullptr);  // harmless
}

// The spec rank `rank` of `world_size` passes to workspace_create.
using SpecFor = std::function<arbiter_workspace_spec(int rank, int world_size)>;

// A bf16 spec for hidden 2880 (CTAs that are not a multiple of 32 threads),
// 128 tokens, every pattern, a 10 s deadline.
inline arbiter_workspace_spec small_spec(int rank, int world_size) {
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

// workspace_create on `size` threads of one ThreadGroup (the oob's size;
// each rank's spec from spec_for): how each rank came back, and how long
// the slowest took.
struct Creation {
  std::vector<std::int32_t> status;
  std::vector<std::string> reason;
  std::vector<arbiter_workspace*> workspace;
  std::chrono::milliseconds elapsed{0};
};

inline Creation create_on_threads(const arbiter_backend_v1_t& api, int size,
                                  const SpecFor& spec_for) {
  ThreadGroup group(size);
  Creation c;
  c.status.assign(size, -1);
  c.reason.assign(size, "");
  c.workspace.assign(size, nullptr);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      const arbiter_oob oob = group.oob(r);
      const arbiter_workspace_spec spec = spec_for(r, size);
      c.status[r] = api.workspace_create(&oob, &spec, &c.workspace[r]);
      c.reason[r] = api.last_error();
    });
  }
  for (auto& t : threads) t.join();
  c.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  return c;
}

// Destroys what create_on_threads made (collective: one thread per rank).
inline void destroy_on_threads(const arbiter_backend_v1_t& api, const Creation& c) {
  std::vector<std::thread> threads;
  for (arbiter_workspace* w : c.workspace) {
    threads.emplace_back([&api, w] { api.workspace_destroy(w); });
  }
  for (auto& t : threads) t.join();
}

// Where creation cannot work every rank fails the same way, with a reason
// and no workspace, and none waits for a peer that gave up (so well within
// the oob timeout). `expected` is the status every rank must return, or -1
// for any failure. Returns false when every rank succeeded instead (then
// the workspaces are destroyed and nothing else is checked).
inline bool check_creation_fails_together(const arbiter_backend_v1_t& api, int size,
                                          const SpecFor& spec_for, std::int32_t expected) {
  const Creation c = create_on_threads(api, size, spec_for);
  for (int r = 0; r < size; ++r) {
    BOOST_TEST_MESSAGE(api.name << " ws " << size << " rank " << r << ": status " << c.status[r]
                                << " \"" << c.reason[r] << "\"");
  }
  BOOST_TEST_MESSAGE("ws " << size << ": returned after " << c.elapsed.count() << " ms");
  if (std::all_of(c.status.begin(), c.status.end(),
                  [](std::int32_t s) { return s == ARBITER_OK; })) {
    destroy_on_threads(api, c);
    return false;
  }
  // Half the oob timeout: a rank that waited for a missing peer would take it all.
  BOOST_TEST(c.elapsed.count() < spec_for(0, size).timeout_ms / 2);
  for (int r = 0; r < size; ++r) {
    BOOST_TEST_CONTEXT(api.name << " ws " << size << " rank " << r) {
      BOOST_TEST(c.status[r] != ARBITER_OK);
      BOOST_TEST(c.status[r] == c.status[0]);
      BOOST_TEST(!c.reason[r].empty());
      BOOST_TEST(c.workspace[r] == nullptr);
      if (expected >= 0) BOOST_TEST(c.status[r] == expected);
    }
  }
  return true;
}

// Creation is collective: where it cannot work (no driver here), it fails on
// every rank together, ARBITER_UNAVAILABLE where there is no driver. With a
// driver the ranks may succeed together (a GPU machine): then they are
// destroyed and the failure path is not exercised.
inline void check_creation_fails_on_every_rank(const std::string& name,
                                               const std::vector<int>& world_sizes) {
  BackendModule module(name);
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  const std::int32_t expected = has_cuda_driver() ? -1 : ARBITER_UNAVAILABLE;
  for (int ws : world_sizes) {
    if (!check_creation_fails_together(*module.api(), ws, small_spec, expected)) {
      BOOST_TEST_MESSAGE(
          "a CUDA driver is installed and every rank created its workspace; "
          "the failure path is not exercised here");
    }
  }
}

}  // namespace arbiter::test
