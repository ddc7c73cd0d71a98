// abort() on the fused GPU modules (trtllm, mnnvl) in loopback mode: a
// kernel waiting on a rank that never launched returns once the host aborts
// (its poll reads the abort flag in host-mapped memory), without a CUDA
// error (no trap: the context stays usable); every later run() returns
// ARBITER_ABORTED at once; teardown after abort waits on no peer; device
// memory is back afterwards; and a new group on the same context runs.
// One-shot and two-shot (the Lamport poll and the barrier), 2 virtual ranks;
// on trtllm also both on registered inputs (the registered barrier, whose
// abort release rewrites the call's key too).
// Prints the figures (time from abort() to the stream's end, memory).
//
// Exits 77 (ctest: skipped) without a CUDA device. No Boost.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "arbiter_backend.h"
#include "gpu_check.h"
#include "loopback_group.h"
#include "module.h"

namespace {

namespace test = arbiter::test;
using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kHidden = 4096;
constexpr std::uint32_t kTokens = 8;
constexpr int kRanks = 2;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::size_t free_device_memory() {
  std::size_t free = 0;
  std::size_t total = 0;
  cudaMemGetInfo(&free, &total);
  return free;
}

const arbiter_backend_faults_v1_t* faults_of(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  const auto* faults = static_cast<const arbiter_backend_faults_v1_t*>(
      dlsym(handle, ARBITER_BACKEND_FAULTS_SYMBOL_V1));
  dlclose(handle);  // BackendModule keeps it loaded
  return faults;
}

arbiter_workspace_spec spec_for() {
  arbiter_workspace_spec spec{};
  spec.world_size = kRanks;
  spec.device = 0;
  spec.nodes = 1;
  spec.max_tokens = 64;
  spec.hidden = kHidden;
  spec.dtype = ARBITER_DTYPE_BF16;
  spec.pattern_mask = 1u << ARBITER_PATTERN_ALLREDUCE;
  spec.max_message_bytes = std::uint64_t{64} * kHidden * 2;
  spec.timeout_ms = 20000;
  return spec;
}

struct Buffers {
  void* input = nullptr;
  void* output = nullptr;
  Buffers() {
    cudaMalloc(&input, std::size_t{kTokens} * kHidden * 2);
    cudaMalloc(&output, std::size_t{kTokens} * kHidden * 2);
    cudaMemset(input, 0, std::size_t{kTokens} * kHidden * 2);
  }
  ~Buffers() {
    cudaFree(input);
    cudaFree(output);
  }
  arbiter_allreduce_args args(arbiter_algorithm algorithm) const {
    arbiter_allreduce_args a{};
    a.pattern = ARBITER_PATTERN_ALLREDUCE;
    a.dtype = ARBITER_DTYPE_BF16;
    a.algorithm = algorithm;
    a.tokens = kTokens;
    a.hidden = kHidden;
    a.input = input;
    a.allreduce_out = output;
    return a;
  }
};

// One module, one algorithm, on copied or (with `memory`) registered
// inputs: see the file's comment.
void abort_case(const std::string& name, const arbiter_backend_v1_t& api,
                const arbiter_backend_faults_v1_t& faults, arbiter_algorithm algorithm,
                const arbiter_backend_memory_v2_t* memory, test::Watchdog& watchdog) {
  const std::string where = name +
                            (algorithm == ARBITER_ALGORITHM_ONESHOT ? " one-shot" : " two-shot") +
                            (memory != nullptr ? " registered" : "");
  cudaDeviceSynchronize();
  const std::size_t free_before = free_device_memory();
  double returned_ms = -1;
  double teardown_ms = -1;
  {
    watchdog.arm(where + ": creation and a normal call", std::chrono::seconds(120));
    auto owned = std::make_unique<test::LoopbackGroup>(api, spec_for());
    test::LoopbackGroup& group = *owned;
    if (!ARBITER_CHECK(group.ok(), where, "creation: " << group.error())) return;
    std::vector<Buffers> buffers(kRanks);
    std::vector<arbiter_allreduce_args> args;
    for (const Buffers& b : buffers) args.push_back(b.args(algorithm));
    std::string error;
    if (memory != nullptr) {
      // The inputs in registered memory (zeros, as Buffers' are); the
      // workspaces free it when the group goes.
      std::vector<void*> parts;
      const std::uint64_t bytes = std::uint64_t{kTokens} * kHidden * 2;
      if (!ARBITER_CHECK(group.alloc_registered(*memory, bytes, &parts, &error) == ARBITER_OK,
                         where, "alloc: " << error)) {
        return;
      }
      for (int r = 0; r < kRanks; ++r) {
        cudaMemset(parts[r], 0, bytes);
        args[r].input = parts[r];
      }
      cudaDeviceSynchronize();
    }
    const auto run_one = [&](int r) {
      return memory != nullptr
                 ? memory->run_registered(group.workspace(r), &args[r], group.stream(r))
                 : api.run(group.workspace(r), &args[r], group.stream(r));
    };
    const std::int32_t normal =
        memory != nullptr ? group.run_registered(*memory, args, &error) : group.run(args, &error);
    ARBITER_CHECK(normal == ARBITER_OK, where, "normal call: " << error);
    ARBITER_CHECK(group.wait(std::chrono::seconds(30), &error), where, "normal call: " << error);

    // Rank 0 alone: its kernel waits for rank 1, which never launches.
    watchdog.arm(where + ": a kernel waiting on a rank that never launched, then abort()",
                 std::chrono::seconds(60));
    ARBITER_CHECK(run_one(0) == ARBITER_OK, where, "rank 0's call: " << api.last_error());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ARBITER_CHECK(cudaStreamQuery(group.stream(0)) == cudaErrorNotReady, where,
                  "rank 0's kernel did not wait for rank 1 (the test proves nothing)");
    const auto aborted_at = Clock::now();
    faults.abort(group.workspace(0));
    cudaError_t e = cudaErrorNotReady;
    while ((e = cudaStreamQuery(group.stream(0))) == cudaErrorNotReady &&
           ms_since(aborted_at) < 10000) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    returned_ms = ms_since(aborted_at);
    ARBITER_CHECK(e == cudaSuccess, where,
                  "after abort() the stream ended with " << cudaGetErrorString(e)
                                                         << " (a trap poisons the context)");
    ARBITER_CHECK(returned_ms <= 100.0, where,
                  "the waiting kernel returned " << returned_ms << " ms after abort()");

    // Every later call refused at once.
    const auto refused = Clock::now();
    ARBITER_CHECK(run_one(0) == ARBITER_ABORTED, where,
                  "a call after abort(): " << api.last_error());
    ARBITER_CHECK(std::string(api.last_error()).find("aborted") != std::string::npos, where,
                  "message: " << api.last_error());
    ARBITER_CHECK(ms_since(refused) < 5.0, where,
                  "the refusal took " << ms_since(refused) << " ms");

    // The runtime aborts every workspace after a fault; then teardown is local.
    faults.abort(group.workspace(1));
    watchdog.arm(where + ": teardown after abort()", std::chrono::seconds(30));
    const auto teardown = Clock::now();
    owned.reset();
    teardown_ms = ms_since(teardown);
    ARBITER_CHECK(teardown_ms < 2000.0, where,
                  "teardown after abort() took " << teardown_ms << " ms (it waits on no peer)");
  }
  cudaDeviceSynchronize();
  const std::size_t free_after = free_device_memory();
  watchdog.disarm();
  // cudaFree returns memory to the device at once; allow the runtime 4 MiB of its own.
  ARBITER_CHECK(free_after + (std::size_t{4} << 20) >= free_before, where,
                "device memory not back: " << (free_before >> 20) << " MiB free before, "
                                           << (free_after >> 20) << " MiB after");
  test::print_line(
      "figure: " + where + ": a kernel waiting on a rank that never launched returned " +
      std::to_string(returned_ms) + " ms after abort(); teardown " + std::to_string(teardown_ms) +
      " ms; free device memory " + std::to_string(free_before >> 20) + " MiB before creation, " +
      std::to_string(free_after >> 20) + " MiB after teardown");
}

}  // namespace

int main() {
  test::prepare_loopback_environment();
  test::require_device_or_skip();
  test::Watchdog watchdog;
  int ran = 0;
  for (const char* name : {"trtllm", "mnnvl"}) {
    test::BackendModule module(name);
    if (module.api() == nullptr) {
      test::print_line(std::string("SKIP ") + name + ": " + module.error());
      continue;
    }
    const arbiter_backend_faults_v1_t* faults = faults_of(module.path());
    if (!ARBITER_CHECK(faults != nullptr && faults->abort != nullptr, name,
                       "the module has no arbiter_backend_v1_faults with abort()")) {
      continue;
    }
    arbiter_probe_args probe{ARBITER_DEVICE_GPU, 0};
    arbiter_backend_caps caps{};
    if (module.api()->probe(&probe, &caps) != ARBITER_OK) {
      test::print_line(std::string("SKIP ") + name + ": " + module.api()->last_error());
      continue;
    }
    for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
      abort_case(name, *module.api(), *faults, algorithm, nullptr, watchdog);
      // Registered inputs where the module has the memory companion (trtllm).
      if (module.memory() != nullptr) {
        abort_case(name, *module.api(), *faults, algorithm, module.memory(), watchdog);
      }
    }
    // The context is healthy: a new group runs a normal call.
    watchdog.arm(std::string(name) + ": a new group after the aborts", std::chrono::seconds(120));
    {
      test::LoopbackGroup group(*module.api(), spec_for());
      ARBITER_CHECK(group.ok(), name, "a new group after abort: " << group.error());
      if (group.ok()) {
        std::vector<Buffers> buffers(kRanks);
        std::vector<arbiter_allreduce_args> args;
        for (const Buffers& b : buffers) args.push_back(b.args(ARBITER_ALGORITHM_ONESHOT));
        std::string error;
        ARBITER_CHECK(
            group.run(args, &error) == ARBITER_OK && group.wait(std::chrono::seconds(30), &error),
            name, "a call on a new group after abort: " << error);
      }
    }
    watchdog.disarm();
    ++ran;
  }
  if (ran == 0) {
    std::printf("SKIP: neither trtllm nor mnnvl runs on this device\n");
    return test::kSkipExitCode;
  }
  return test::finish("backends_abort_gpu_test");
}
