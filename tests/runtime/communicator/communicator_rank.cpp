// One rank of the communicator tests, run through `arbiter launch`. Modes:
//   sizes        fused and fallback calls on several sizes and dtypes,
//                checked against the reference and across ranks
//   slices       a communicator whose fallback workspace is smaller than a
//                call: the call still runs (in slices) and is right
//   fingerprint  rank 1 restricts ARBITER_BACKENDS: creation must fail on
//                every rank, naming the mismatch
//   run_on       calls forced onto a backend and algorithm (what `arbiter
//                bench` times): right where the policy would choose
//                otherwise, above the fused cap once fused_workspace_bytes
//                sizes the workspace, and refused with the reason, on every
//                rank alike, where the backend cannot take the call
//   defaults     options left at their defaults (every pattern asked for):
//                creation succeeds at any world size, 1 included, and every
//                dtype and CPU pattern runs right; NVFP4, which no CPU
//                backend runs, is refused on every rank with the reason
//   patterns     a communicator asked for residual_rmsnorm only refuses a
//                plain all-reduce, naming what it was created for
//   agreement    rank 1 asks for another hidden size: creation fails on
//                every rank, naming the field, the rank and both values
// Prints "rank R: OK" and exits 0 when the mode's expectations hold.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "arbiter/bootstrap.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/reference.h"
#include "arbiter/communicator.h"

namespace {

using arbiter::common::load_element;

std::vector<std::uint8_t> make_input(int seed, std::size_t count, arbiter_dtype dtype) {
  const std::size_t elt = arbiter::common::dtype_size(dtype);
  std::vector<std::uint8_t> v(count * elt);
  std::uint32_t state = 2654435761u * static_cast<std::uint32_t>(seed + 7);
  for (std::size_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    const float value = static_cast<float>(static_cast<int>(state >> 9) % 2001 - 1000) / 400.0f;
    arbiter::common::store_element(v.data(), i, dtype, value);
  }
  return v;
}

std::uint64_t hash(const std::vector<std::uint8_t>& v) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::uint8_t b : v) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

struct Case {
  arbiter_pattern pattern;
  arbiter_dtype dtype;
  std::uint32_t tokens;
  std::uint32_t hidden;
};

// A call forced past the policy (Communicator::run_on).
struct Forced {
  arbiter::Backend backend;
  arbiter::Algorithm algorithm;
};

// Runs one call and checks it; "" when right on this rank and equal on all.
// With `forced`, runs it through run_on() instead; `status` (if given)
// receives the call's status.
std::string run_case(arbiter::Bootstrap& boot, arbiter::Communicator& comm, const Case& c,
                     std::string* decision, const Forced* forced = nullptr,
                     arbiter_status* status = nullptr) {
  const std::size_t count = std::size_t{c.tokens} * c.hidden;
  std::vector<std::vector<std::uint8_t>> inputs;
  for (int r = 0; r < boot.world_size(); ++r) inputs.push_back(make_input(r, count, c.dtype));
  const auto residual = make_input(1000, count, c.dtype);
  const auto gamma = make_input(2000, c.hidden, c.dtype);
  const std::size_t bytes = count * arbiter::common::dtype_size(c.dtype);
  std::vector<std::uint8_t> out(bytes), residual_out(bytes), norm_out(bytes);
  arbiter_allreduce_args a{};
  a.pattern = c.pattern;
  a.dtype = c.dtype;
  a.tokens = c.tokens;
  a.hidden = c.hidden;
  a.input = inputs[static_cast<std::size_t>(boot.rank())].data();
  a.eps = 1e-6f;
  a.weight_bias = c.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM ? 1.0f : 0.0f;  // Gemma
  if (c.pattern == ARBITER_PATTERN_ALLREDUCE) {
    a.allreduce_out = out.data();
  } else {
    a.residual_in = residual.data();
    a.residual_out = residual_out.data();
    a.gamma = gamma.data();
    a.norm_out = norm_out.data();
  }
  const auto result = forced ? comm.run_on(forced->backend, forced->algorithm, a, nullptr)
                             : comm.allreduce_fusion(a, nullptr);
  const auto& d = result.decision;
  *decision = std::string(arbiter::backend_name(d.backend)) + " " +
              std::string(arbiter::algorithm_name(d.algorithm)) + (d.fused ? " fused" : " unfused");
  if (status) *status = result.status;
  if (result.status != ARBITER_OK)
    return "status " + std::to_string(result.status) + ": " + result.error;
  arbiter::common::ReferenceCase rc;
  rc.pattern = c.pattern;
  rc.dtype = c.dtype;
  rc.tokens = c.tokens;
  rc.hidden = c.hidden;
  for (const auto& in : inputs) rc.inputs.push_back(in.data());
  rc.residual_in = residual.data();
  rc.gamma = gamma.data();
  rc.eps = a.eps;
  rc.weight_bias = a.weight_bias;
  const auto ref = arbiter::common::compute_reference(rc);
  std::string problem;
  if (c.pattern == ARBITER_PATTERN_ALLREDUCE) {
    problem = arbiter::common::check_output(out.data(), c.dtype, ref.sum, ref.sum_bound, c.hidden,
                                            "allreduce_out");
  } else {
    problem = arbiter::common::check_output(residual_out.data(), c.dtype, ref.residual,
                                            ref.residual_bound, c.hidden, "residual_out");
    if (problem.empty()) {
      problem = arbiter::common::check_output(norm_out.data(), c.dtype, ref.norm, ref.norm_bound,
                                              c.hidden, "norm_out");
    }
  }
  const std::uint64_t mine = hash(out) ^ hash(norm_out) * 3 ^ hash(residual_out) * 5;
  std::vector<std::uint64_t> all(static_cast<std::size_t>(boot.world_size()));
  if (!boot.allgather(&mine, all.data(), sizeof mine, std::chrono::seconds(60)).ok()) {
    return "allgather of result hashes failed";
  }
  for (std::uint64_t h : all) {
    if (h != all[0] && problem.empty()) problem = "ranks hold different bits";
  }
  return problem;
}

arbiter::CommunicatorOptions cpu_options(std::uint32_t max_tokens, std::uint32_t hidden,
                                         arbiter::Dtype dtype) {
  arbiter::CommunicatorOptions o;
  o.capability = arbiter::Capability::cpu();
  o.max_tokens = max_tokens;
  o.hidden = hidden;
  o.dtype = dtype;
  o.timeout = std::chrono::seconds(60);
  return o;
}

// Bytes of arbiter's /dev/shm objects this process maps (/proc/self/maps).
std::uint64_t shm_bytes_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::uint64_t total = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm/arbiter-shm-") == std::string::npos) continue;
    unsigned long long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &begin, &end) == 2) total += end - begin;
  }
  return total;
}

arbiter::Registry cpu_registry() {
  arbiter::DiscoverOptions d = arbiter::DiscoverOptions::from_environment();
  d.probe = {ARBITER_DEVICE_CPU, -1};
  return arbiter::Registry::discover(d);
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "sizes";
  if (mode == "fingerprint" && std::getenv("RANK") && std::string(std::getenv("RANK")) == "1") {
    setenv("ARBITER_BACKENDS", "nccl,shm", 1);  // a different allowed set: other tables
  }
  arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment();
  const arbiter::Policy policy = arbiter::Policy::from_environment();
  const arbiter::Registry registry = cpu_registry();
  int failures = 0;
  auto report = [&](const std::string& what, const std::string& decision,
                    const std::string& problem) {
    if (!problem.empty()) ++failures;
    if (boot.rank() == 0 || !problem.empty()) {
      std::printf("%s: %s: %s\n", what.c_str(), decision.c_str(),
                  problem.empty() ? "ok" : problem.c_str());
    }
  };
  if (mode == "sizes") {
    for (arbiter::Dtype dtype :
         {arbiter::Dtype::kBf16, arbiter::Dtype::kFp16, arbiter::Dtype::kFp32}) {
      arbiter::Communicator comm(*boot.oob(), policy, registry, cpu_options(1000, 7168, dtype));
      const auto adt = static_cast<arbiter_dtype>(dtype);
      // The tests' cpu rows (cpu_cap_4mib.yaml over the defaults): fused up
      // to 4 MiB; the defaults' shm one-shot while bytes x ranks
      // <= 256 KiB. 1 token of 2880 (bf16 5.6 KiB): one-shot at 2..8 ranks;
      // 13 and 36 tokens of 7168 (182 and 504 KiB): two-shot; 1000 tokens of
      // 7168 (14 MiB): above the cap, unfused.
      for (Case c : {Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, adt, 1, 2880},
                     Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, adt, 13, 7168},
                     Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, adt, 36, 7168},
                     Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, adt, 1000, 7168},
                     Case{ARBITER_PATTERN_ALLREDUCE, adt, 7, 2880},
                     Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, adt, 7, 2880}}) {
        std::string decision;
        const std::string problem = run_case(boot, comm, c, &decision);
        report(std::string(arbiter::dtype_name(dtype)) + " tokens " + std::to_string(c.tokens) +
                   " hidden " + std::to_string(c.hidden),
               decision, problem);
      }
    }
  } else if (mode == "slices") {
    // Declared largest call: 2 tokens, so the shm workspace holds the 4 MiB
    // fused cap; the call below is 1200 tokens (9.4 MiB), above the cap and
    // above the workspace: it runs unfused, in slices.
    arbiter::Communicator comm(*boot.oob(), policy, registry,
                               cpu_options(2, 4096, arbiter::Dtype::kBf16));
    std::string decision;
    const std::string problem =
        run_case(boot, comm, Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_DTYPE_BF16, 1200, 4096},
                 &decision);
    report("1200 tokens through a 4 MiB workspace", decision, problem);
    if (decision != "shm native unfused") {
      ++failures;
      std::printf("expected the unfused fallback, got %s\n", decision.c_str());
    }
  } else if (mode == "run_on") {
    using arbiter::Algorithm;
    using arbiter::Backend;
    // Declared largest call: 2 tokens, so without fused_workspace_bytes the
    // shm workspace holds only the 4 MiB fused cap of the tests' cpu row.
    arbiter::CommunicatorOptions sized = cpu_options(2, 4096, arbiter::Dtype::kBf16);
    sized.fused_workspace_bytes = 6 * 1024 * 1024;
    arbiter::Communicator plain(*boot.oob(), policy, registry,
                                cpu_options(2, 4096, arbiter::Dtype::kBf16));
    arbiter::Communicator comm(*boot.oob(), policy, registry, sized);
    struct Expect {
      const char* what;
      arbiter::Communicator* comm;
      Case c;
      Forced forced;
      const char* decision;
      const char* refusal;  // nullptr: must run and be right
    };
    const auto bf16 = ARBITER_DTYPE_BF16;
    const auto norm = ARBITER_PATTERN_RESIDUAL_RMSNORM;
    const Expect cases[] = {
        // 36 x 7168 bf16 (504 KiB): the policy takes two-shot; forced one-shot.
        {"one-shot where the policy takes two-shot",
         &comm,
         {norm, bf16, 36, 7168},
         {Backend::kShm, Algorithm::kOneshot},
         "shm oneshot fused",
         nullptr},
        // 1 token: the policy takes one-shot; forced two-shot (empty slices).
        {"two-shot of one token",
         &comm,
         {ARBITER_PATTERN_ALLREDUCE, bf16, 1, 2880},
         {Backend::kShm, Algorithm::kTwoshot},
         "shm twoshot fused",
         nullptr},
        // 640 x 4096 bf16 = 5 MiB, above the 4 MiB cap: fused only because
        // fused_workspace_bytes sized the workspace for it.
        {"fused above the cap",
         &comm,
         {norm, bf16, 640, 4096},
         {Backend::kShm, Algorithm::kTwoshot},
         "shm twoshot fused",
         nullptr},
        {"unfused fallback",
         &comm,
         {norm, bf16, 640, 4096},
         {Backend::kShm, Algorithm::kNative},
         "shm native unfused",
         nullptr},
        // shm streams any size through its fixed slots: fused still runs.
        {"fused above a default workspace (streamed)",
         &plain,
         {norm, bf16, 640, 4096},
         {Backend::kShm, Algorithm::kOneshot},
         "shm oneshot fused",
         nullptr},
        {"unfused above a default workspace (slices)",
         &plain,
         {norm, bf16, 640, 4096},
         {Backend::kShm, Algorithm::kNative},
         "shm native unfused",
         nullptr},
        {"a GPU backend on CPU ranks",
         &comm,
         {norm, bf16, 4, 4096},
         {Backend::kTrtllm, Algorithm::kOneshot},
         "trtllm oneshot fused",
         "trtllm has no workspace: not a candidate here"},
        {"a pattern the module refuses",
         &comm,
         {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, bf16, 4, 4096},
         {Backend::kShm, Algorithm::kOneshot},
         "shm oneshot fused",
         "shm's workspace does not run residual_rmsnorm_fp4 (NVFP4)"},
    };
    for (const Expect& e : cases) {
      std::string decision;
      arbiter_status status = ARBITER_OK;
      std::string problem = run_case(boot, *e.comm, e.c, &decision, &e.forced, &status);
      if (decision != e.decision) problem = "ran as " + decision + ", expected " + e.decision;
      if (e.refusal) {
        const bool refused =
            status == ARBITER_UNSUPPORTED && problem.find(e.refusal) != std::string::npos;
        if (refused) std::printf("%s: refused: %s\n", e.what, problem.c_str());
        problem = refused ? ""
                          : "expected a refusal naming '" + std::string(e.refusal) +
                                "', got: " + (problem.empty() ? "ok" : problem);
      }
      report(e.what, decision, problem);
    }
  } else if (mode == "defaults") {
    for (arbiter::Dtype dtype :
         {arbiter::Dtype::kBf16, arbiter::Dtype::kFp16, arbiter::Dtype::kFp32}) {
      arbiter::CommunicatorOptions o;  // defaults, but for what a CPU rank must say
      o.capability = arbiter::Capability::cpu();
      o.hidden = 2880;
      o.dtype = dtype;
      arbiter::Communicator comm(*boot.oob(), policy, registry, o);
      const auto adt = static_cast<arbiter_dtype>(dtype);
      for (Case c : {Case{ARBITER_PATTERN_ALLREDUCE, adt, 3, 2880},
                     Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, adt, 1, 2880},
                     Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, adt, 40, 2880}}) {
        std::string decision;
        const std::string problem = run_case(boot, comm, c, &decision);
        report(std::string(arbiter::dtype_name(dtype)) + " " +
                   std::string(arbiter::pattern_name(static_cast<arbiter::Pattern>(c.pattern))) +
                   " tokens " + std::to_string(c.tokens),
               decision, problem);
      }
      // Every rank refuses alike, before anything runs.
      std::string decision;
      arbiter_status status = ARBITER_OK;
      const std::string problem =
          run_case(boot, comm, Case{ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, adt, 2, 2880}, &decision,
                   nullptr, &status);
      const bool refused =
          status == ARBITER_UNSUPPORTED &&
          problem.find("no backend can run this residual_rmsnorm_fp4 (NVFP4) call") !=
              std::string::npos &&
          problem.find("on capability cpu") != std::string::npos &&
          problem.find("shm: does not run residual_rmsnorm_fp4 (NVFP4)") != std::string::npos;
      if (refused) std::printf("[rank %d] nvfp4: refused: %s\n", boot.rank(), problem.c_str());
      report("nvfp4", decision, refused ? "" : "expected a refusal, got: " + problem);
    }
  } else if (mode == "patterns") {
    arbiter::CommunicatorOptions o = cpu_options(16, 1024, arbiter::Dtype::kFp32);
    o.pattern_mask = 1u << ARBITER_PATTERN_RESIDUAL_RMSNORM;
    arbiter::Communicator comm(*boot.oob(), policy, registry, o);
    std::string decision;
    report("asked for", decision,
           run_case(boot, comm, Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_DTYPE_FP32, 4, 1024},
                    &decision));
    arbiter_status status = ARBITER_OK;
    const std::string problem =
        run_case(boot, comm, Case{ARBITER_PATTERN_ALLREDUCE, ARBITER_DTYPE_FP32, 4, 1024},
                 &decision, nullptr, &status);
    const bool refused = status == ARBITER_UNSUPPORTED &&
                         problem.find("created for residual_rmsnorm only") != std::string::npos;
    if (refused)
      std::printf("[rank %d] not asked for: refused: %s\n", boot.rank(), problem.c_str());
    report("not asked for", decision, refused ? "" : "expected a refusal, got: " + problem);
  } else if (mode == "registered") {
    // comm.alloc_registered(): a registered input gives the bits of the same
    // call on ordinary memory (one-shot and two-shot sizes), and misuse is
    // refused with a clear error.
    const auto bf16 = arbiter::Dtype::kBf16;
    arbiter::Communicator comm(*boot.oob(), policy, registry, cpu_options(512, 1024, bf16));
    arbiter::Communicator other(*boot.oob(), policy, registry, cpu_options(512, 1024, bf16));
    const std::uint64_t bytes = 512 * 1024 * 2;
    void* area = nullptr;
    void* foreign = nullptr;
    auto expect = [&](bool ok, const std::string& what) {
      if (!ok) {
        std::printf("rank %d: %s\n", boot.rank(), what.c_str());
        ++failures;
      }
    };
    auto r = comm.alloc_registered(bytes, &area);
    expect(r.status == ARBITER_OK, "alloc_registered: " + r.error);
    r = other.alloc_registered(4096, &foreign);
    expect(r.status == ARBITER_OK, "alloc_registered (other): " + r.error);
    auto* registered = static_cast<std::uint16_t*>(area);
    std::vector<std::uint16_t> plain(bytes / 2), out_a(bytes / 2), out_b(bytes / 2);
    for (std::size_t i = 0; i < plain.size(); ++i) {
      plain[i] = static_cast<std::uint16_t>(0x3C00 + (i * 7 + boot.rank() * 3) % 200);
      registered[i] = plain[i];
    }
    for (std::uint32_t tokens : {1u, 3u, 64u, 512u}) {
      arbiter_allreduce_args a{};
      a.pattern = ARBITER_PATTERN_ALLREDUCE;
      a.dtype = ARBITER_DTYPE_BF16;
      a.tokens = tokens;
      a.hidden = 1024;
      a.input = plain.data();
      a.allreduce_out = out_a.data();
      r = comm.allreduce_fusion(a, nullptr);
      expect(r.status == ARBITER_OK, "plain call: " + r.error);
      a.input = registered;
      a.allreduce_out = out_b.data();
      r = comm.allreduce_fusion(a, nullptr);
      expect(r.status == ARBITER_OK, "registered call: " + r.error);
      expect(std::memcmp(out_a.data(), out_b.data(), std::size_t{tokens} * 2048) == 0,
             "registered and plain calls differ at " + std::to_string(tokens) + " tokens");
    }
    arbiter_allreduce_args a{};
    a.pattern = ARBITER_PATTERN_ALLREDUCE;
    a.dtype = ARBITER_DTYPE_BF16;
    a.tokens = 2;
    a.hidden = 1024;
    a.allreduce_out = out_a.data();
    a.input = registered + 511 * 1024;  // the last token and one past the end
    r = comm.allreduce_fusion(a, nullptr);
    expect(r.status == ARBITER_INVALID_ARGUMENT &&
               r.error.find("crosses the end") != std::string::npos,
           "a view crossing the end: " + r.error);
    a.input = foreign;
    r = comm.allreduce_fusion(a, nullptr);
    expect(r.status == ARBITER_INVALID_ARGUMENT &&
               r.error.find("another communicator") != std::string::npos,
           "another communicator's memory: " + r.error);
    r = comm.free_registered(registered + 1024);
    expect(r.status == ARBITER_INVALID_ARGUMENT, "freeing a view: " + r.error);
    r = comm.free_registered(area);
    expect(r.status == ARBITER_OK, "free: " + r.error);
    r = comm.free_registered(area);
    expect(r.status == ARBITER_INVALID_ARGUMENT, "a second free: " + r.error);
    // Still usable, and `foreign` freed by its communicator's destructor.
    a.input = plain.data();
    r = comm.allreduce_fusion(a, nullptr);
    expect(r.status == ARBITER_OK, "a call after free: " + r.error);

    // The check mode compares where each rank's input lies, so that a GPU
    // module, which reads the peers' inputs at this rank's offset and checks
    // nothing on the host, never runs such a call: another offset on rank 1,
    // then ordinary memory on rank 1, are refused on every rank (by the
    // check mode, before shm's own check), and a matching call then runs.
    arbiter::CommunicatorOptions checked_options = cpu_options(512, 1024, bf16);
    checked_options.check_calls = true;
    arbiter::Communicator checked(*boot.oob(), policy, registry, checked_options);
    void* checked_area = nullptr;
    r = checked.alloc_registered(8192, &checked_area);
    expect(r.status == ARBITER_OK, "alloc_registered (checked): " + r.error);
    std::memcpy(checked_area, plain.data(), 8192);
    auto* checked_input = static_cast<std::uint16_t*>(checked_area);
    a.tokens = 1;
    a.input = checked_input + (boot.rank() == 1 ? 1024 : 0);
    r = checked.allreduce_fusion(a, nullptr);
    expect(r.status == ARBITER_MISMATCH &&
               r.error.find("check mode: call 0 differs across ranks in the input's memory: rank "
                            "1 has registered allocation #0 at offset 2048, rank 0 has "
                            "registered allocation #0 at offset 0") != std::string::npos,
           "another offset on rank 1: status " + std::to_string(r.status) + ": " + r.error);
    a.input = boot.rank() == 1 ? static_cast<const void*>(plain.data()) : checked_input;
    r = checked.allreduce_fusion(a, nullptr);
    expect(r.status == ARBITER_MISMATCH &&
               r.error.find("rank 1 has unregistered memory") != std::string::npos,
           "ordinary memory on rank 1: status " + std::to_string(r.status) + ": " + r.error);
    a.input = checked_input;
    a.allreduce_out = out_b.data();
    r = checked.allreduce_fusion(a, nullptr);
    expect(r.status == ARBITER_OK, "a matching registered call in check mode: " + r.error);

    // Tables keyed `buffers: registered` see where the input lies: one-shot
    // cell of 2 KiB for registered calls, so a 4 KiB registered call runs
    // two-shot while the same call on ordinary memory keeps the threshold
    // (one-shot). Same sums either way. (A fusion cell too: the defaults
    // have none at 3 ranks.)
    const std::string ws = std::to_string(boot.world_size());
    arbiter::LoadOptions keyed_tables;
    keyed_tables.overrides.yaml("keyed.yaml",
                                "format: 1\nprovenance: {source: test}\n"
                                "fusion:\n  - {capability: cpu, world_size: " +
                                    ws +
                                    ", max: 64MiB}\n"
                                    "oneshot:\n  cells:\n    - {capability: cpu, world_size: " +
                                    ws + ", buffers: registered, max: 2KiB}\n");
    const arbiter::Policy keyed_policy = arbiter::Policy::load_or_throw(keyed_tables);
    arbiter::Communicator keyed(*boot.oob(), keyed_policy, registry, cpu_options(512, 1024, bf16));
    void* keyed_area = nullptr;
    r = keyed.alloc_registered(4096, &keyed_area);
    expect(r.status == ARBITER_OK, "alloc_registered (keyed): " + r.error);
    std::memcpy(keyed_area, plain.data(), 4096);
    a.tokens = 2;
    a.input = plain.data();
    a.allreduce_out = out_a.data();
    r = keyed.allreduce_fusion(a, nullptr);
    expect(r.status == ARBITER_OK && r.decision.algorithm == arbiter::Algorithm::kOneshot,
           "a 4 KiB call on ordinary memory under the keyed tables: expected one-shot, got " +
               std::string(arbiter::algorithm_name(r.decision.algorithm)) + "; " + r.error);
    a.input = keyed_area;
    a.allreduce_out = out_b.data();
    r = keyed.allreduce_fusion(a, nullptr);
    expect(r.status == ARBITER_OK && r.decision.algorithm == arbiter::Algorithm::kTwoshot,
           "a 4 KiB registered call under the keyed tables: expected two-shot, got " +
               std::string(arbiter::algorithm_name(r.decision.algorithm)) + "; " + r.error);
    expect(std::memcmp(out_a.data(), out_b.data(), 4096) == 0,
           "the keyed registered call's sum differs from the plain call's");
  } else if (mode == "agreement") {
    try {
      const std::uint32_t hidden = boot.rank() == 1 ? 2048 : 1024;
      arbiter::Communicator comm(*boot.oob(), policy, registry,
                                 cpu_options(16, hidden, arbiter::Dtype::kBf16));
      std::printf("rank %d: created a communicator with mismatched hidden sizes\n", boot.rank());
      return 1;
    } catch (const arbiter::CommunicatorError& e) {
      std::printf("rank %d: refused: %s\n", boot.rank(), e.what());
      if (std::string(e.what()).find("ranks differ in hidden: rank 1 has 2048, rank 0 has 1024") ==
          std::string::npos) {
        return 1;
      }
    }
  } else if (mode == "footprint") {
    // The communicator's figure is what shm actually mapped: the /dev/shm
    // object every rank maps whole, and nothing else.
    arbiter::Communicator comm(*boot.oob(), policy, registry,
                               cpu_options(1000, 7168, arbiter::Dtype::kBf16));
    const std::vector<arbiter::WorkspaceFootprint> figures = comm.footprint();
    const std::uint64_t mapped = shm_bytes_mapped();
    std::string problem;
    if (figures.size() != 1 || figures[0].backend != arbiter::Backend::kShm) {
      problem = "expected one figure, for shm; got " + std::to_string(figures.size());
    } else if (const arbiter::WorkspaceFootprint& f = figures[0]; !f.known) {
      problem = "shm's footprint is unknown";
    } else if (f.shared_bytes != mapped || f.device_bytes != 0 || f.host_bytes != 0) {
      problem = "figure device " + std::to_string(f.device_bytes) + " host " +
                std::to_string(f.host_bytes) + " shared " + std::to_string(f.shared_bytes) +
                ", but " + std::to_string(mapped) + " bytes of /dev/shm are mapped";
    } else if (f.max_message_bytes[0] != UINT64_MAX || f.max_message_bytes[2] != UINT64_MAX) {
      problem = "shm streams any message, but its figure caps one";
    } else if (comm.footprint_of(arbiter::Backend::kShm).shared_bytes != mapped ||
               comm.footprint_of(arbiter::Backend::kNccl).known) {
      problem = "footprint_of() disagrees with footprint()";
    } else {
      std::printf("[rank %d] footprint: shared %llu bytes, mapped %llu\n", boot.rank(),
                  static_cast<unsigned long long>(f.shared_bytes),
                  static_cast<unsigned long long>(mapped));
    }
    report("footprint", "shm", problem);
  } else if (mode == "fingerprint") {
    try {
      arbiter::Communicator comm(*boot.oob(), policy, registry,
                                 cpu_options(16, 1024, arbiter::Dtype::kBf16));
      std::printf("rank %d: created a communicator with mismatched tables\n", boot.rank());
      return 1;
    } catch (const arbiter::CommunicatorError& e) {
      std::printf("rank %d: refused: %s\n", boot.rank(), e.what());
      if (std::string(e.what()).find("tuning tables differ across ranks") == std::string::npos) {
        return 1;
      }
    }
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  if (failures == 0) std::printf("rank %d: OK\n", boot.rank());
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "communicator_rank: %s\n", e.what());
  return 1;
}
