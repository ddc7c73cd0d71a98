// What the shm backend's Boost.Test suites share: the module dlopen'ed from
// the plugin folder, groups of forked rank processes that must all succeed
// and leave nothing in /dev/shm, and workspace specs.
#pragma once

#include <dirent.h>
#include <dlfcn.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "arbiter_backend.h"
#include "fork_ranks.h"

namespace arbiter::test::shm_harness {

inline constexpr std::int64_t kTimeoutMs = 20000;

inline void* shm_module_handle() {
  static void* handle = [] {
    void* h = dlopen(ARBITER_PLUGIN_DIR "/libarbiter-shm.so", RTLD_NOW | RTLD_LOCAL);
    BOOST_TEST_REQUIRE(h != nullptr, "dlopen: " << dlerror());
    return h;
  }();
  return handle;
}

inline const arbiter_backend_v1_t& shm() {
  static const arbiter_backend_v1_t* module = [] {
    void* symbol = dlsym(shm_module_handle(), ARBITER_BACKEND_SYMBOL_V1);
    BOOST_TEST_REQUIRE(symbol != nullptr);
    return static_cast<const arbiter_backend_v1_t*>(symbol);
  }();
  return *module;
}

// The module's faults companion (abort, build).
inline const arbiter_backend_faults_v1_t& shm_faults() {
  static const arbiter_backend_faults_v1_t* faults = [] {
    void* symbol = dlsym(shm_module_handle(), ARBITER_BACKEND_FAULTS_SYMBOL_V1);
    BOOST_TEST_REQUIRE(symbol != nullptr);
    return static_cast<const arbiter_backend_faults_v1_t*>(symbol);
  }();
  return *faults;
}

// The module's registered-memory companion (ABI v2).
inline const arbiter_backend_memory_v2_t& shm_memory() {
  static const arbiter_backend_memory_v2_t* memory = [] {
    void* symbol = dlsym(shm_module_handle(), ARBITER_BACKEND_MEMORY_SYMBOL_V2);
    BOOST_TEST_REQUIRE(symbol != nullptr);
    return static_cast<const arbiter_backend_memory_v2_t*>(symbol);
  }();
  return *memory;
}

inline std::set<std::string> shm_entries() {
  std::set<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) {
      if (std::strncmp(entry->d_name, "arbiter-shm-", 12) == 0) names.insert(entry->d_name);
    }
    closedir(dir);
  }
  return names;
}

// Runs `body` as `ranks` processes; every rank must succeed and no shared
// memory object may be left in /dev/shm afterwards.
inline void run_group(int ranks, const arbiter::test::RankBody& body, int limit_seconds = 120,
                      bool preempt = false) {
  shm();  // load once in the parent; the children inherit it
  const std::set<std::string> before = shm_entries();
  const std::vector<std::string> results =
      run_ranks(ranks, std::chrono::seconds(limit_seconds), body, preempt);
  for (int rank = 0; rank < ranks; ++rank) {
    BOOST_TEST(results[rank] == "", "rank " << rank << " of " << ranks << ": " << results[rank]);
  }
  for (const std::string& name : shm_entries()) {
    BOOST_TEST(before.count(name) == 1u, "left behind: /dev/shm/" << name);
  }
}

inline arbiter_workspace_spec make_spec(const arbiter_oob& oob, arbiter_dtype dtype,
                                        std::uint64_t max_bytes,
                                        std::int64_t timeout_ms = kTimeoutMs) {
  arbiter_workspace_spec spec{};
  spec.world_size = oob.size;
  spec.rank = oob.rank;
  spec.device = -1;
  spec.nodes = 1;
  spec.hidden = 0;
  spec.dtype = dtype;
  spec.pattern_mask = 0x7;
  spec.max_message_bytes = max_bytes;
  spec.timeout_ms = timeout_ms;
  return spec;
}

// A plain all-reduce of tokens x hidden elements of `dtype`, input to output.
inline arbiter_allreduce_args allreduce_args(arbiter_dtype dtype, arbiter_algorithm algorithm,
                                             std::uint32_t tokens, std::uint32_t hidden,
                                             const void* input, void* output) {
  arbiter_allreduce_args args{};
  args.pattern = ARBITER_PATTERN_ALLREDUCE;
  args.dtype = dtype;
  args.algorithm = algorithm;
  args.tokens = tokens;
  args.hidden = hidden;
  args.input = input;
  args.allreduce_out = output;
  return args;
}

inline const char* dtype_name(arbiter_dtype dtype) {
  return dtype == ARBITER_DTYPE_FP32 ? "fp32" : dtype == ARBITER_DTYPE_BF16 ? "bf16" : "fp16";
}

inline const char* algorithm_name(arbiter_algorithm algorithm) {
  return algorithm == ARBITER_ALGORITHM_ONESHOT   ? "oneshot"
         : algorithm == ARBITER_ALGORITHM_TWOSHOT ? "twoshot"
                                                  : "native";
}

}  // namespace arbiter::test::shm_harness
