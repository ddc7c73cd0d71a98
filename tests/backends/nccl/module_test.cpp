// The nccl module loads and answers anywhere, a machine without a GPU driver
// included: it exports only its v1 entry, never pulls in libcuda or a shared
// libcudart, and reports why it cannot run instead of failing to load. Its
// host-side rules (arbiter/nccl/call_rules.h: what probe() offers, the
// scratch, which calls run() admits) are checked here directly, with
// buffers at addresses that are never dereferenced.
#define BOOST_TEST_MODULE backends_nccl_module
#include <boost/test/unit_test.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/common/arch_coverage.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/nccl/call_rules.h"
#include "arbiter_backend.h"
#include "guard_args.h"
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

BOOST_AUTO_TEST_CASE(exports_no_symbol_but_the_abi_entries) {
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
    BOOST_TEST(caps.world_size_mask == ~uint64_t{1});
    BOOST_TEST(caps.dtype_mask == 0x7u);
    // The norm patterns only where the kernel was built for the device,
    // NVFP4 also from capability 100 on.
    BOOST_TEST(caps.pattern_mask == arbiter::nccl::patterns_for(caps.capability, "90a,100a,103a"));
    BOOST_TEST(caps.algorithm_mask == (1u << ARBITER_ALGORITHM_NATIVE));
    BOOST_TEST(caps.flags == ARBITER_CAPS_RESIDUAL_OPTIONAL);
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

// ------------------------------------------------------------ host-side rules

namespace {

namespace nccl = arbiter::nccl;
using arbiter::test::guard_buffer;

constexpr uint32_t kAllPatterns = 0xFu;
constexpr uint32_t kNoFp4 = 0x7u;

// A workspace whose ranks all run every pattern, on devices of `capability`.
nccl::CallRules rules_for(uint32_t capability) {
  nccl::CallRules w;
  w.pattern_mask = kAllPatterns;
  w.capability = capability;
  w.min_capability = capability;
  w.kernel_archs = "90a,100a";
  w.device_patterns = nccl::patterns_for(capability, w.kernel_archs);
  return w;
}

// A valid NVFP4 call for the nccl backend (native algorithm).
arbiter_allreduce_args fp4_args(uint32_t tokens = 300, uint32_t hidden = 7168) {
  arbiter_allreduce_args a =
      arbiter::test::valid_guard_args(tokens, hidden, ARBITER_DTYPE_BF16, ARBITER_ALGORITHM_NATIVE);
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  return a;
}

// Checks that `a` is refused under `w` with `code` and `words` in the message.
void check_refused(const nccl::CallRules& w, const arbiter_allreduce_args& a, int32_t code,
                   const std::string& words) {
  const arbiter::common::Status s = nccl::check_call(w, a);
  BOOST_TEST(s.code() == code, "status " << s.code() << " (" << s.message() << ")");
  BOOST_CHECK_MESSAGE(s.message().find(words) != std::string::npos,
                      "message \"" << s.message() << "\" lacks \"" << words << "\"");
}

}  // namespace

// A TP=1 job runs the fallback on a one-rank communicator.
BOOST_AUTO_TEST_CASE(world_sizes_from_1_to_63_are_offered) {
  BOOST_TEST((nccl::kWorldSizeMask & 1u) == 0u);  // bit 0: world size 0
  for (int w = 1; w < 64; ++w) {
    BOOST_TEST_INFO("world size " << w);
    BOOST_TEST(((nccl::kWorldSizeMask >> w) & 1u) == 1u);
  }
}

// NVFP4 needs capability >= 100 and a kernel compiled for an architecture
// from 100 on: PTX for compute_90 runs on a B200 but traps in the NVFP4 path.
BOOST_AUTO_TEST_CASE(nvfp4_is_offered_only_from_capability_100_with_a_kernel_for_it) {
  using nccl::patterns_for;
  BOOST_TEST(patterns_for(90, "90a,100a") == kNoFp4);
  BOOST_TEST(patterns_for(100, "90a,100a") == kAllPatterns);
  BOOST_TEST(patterns_for(103, "90a,100a") == 0x1u);  // no kernel at all: NCCL only
  BOOST_TEST(patterns_for(103, "90a,100a,103a") == kAllPatterns);
  BOOST_TEST(patterns_for(103, "90a,100f") == kAllPatterns);  // the family
  BOOST_TEST(patterns_for(100, "90") == kNoFp4);              // compute_90 PTX only
  BOOST_TEST(patterns_for(100, "90,100-virtual") == kAllPatterns);
  BOOST_TEST(patterns_for(120, "100") == kAllPatterns);  // compute_100 PTX, JIT-compiled
  BOOST_TEST(patterns_for(100, "90-real,100-real") == kAllPatterns);
  BOOST_TEST(patterns_for(89, "80") == kNoFp4);
  BOOST_TEST(patterns_for(90, "") == kNoFp4);  // an unknown build: by capability alone
  BOOST_TEST(patterns_for(100, "") == kAllPatterns);
  BOOST_TEST(patterns_for(100, "native") == kAllPatterns);
  BOOST_TEST(patterns_for(90, "native") == kNoFp4);
}

BOOST_AUTO_TEST_CASE(an_nvfp4_call_is_admitted_on_capability_100) {
  const nccl::CallRules w = rules_for(100);
  for (arbiter_dtype dtype : {ARBITER_DTYPE_FP16, ARBITER_DTYPE_BF16}) {
    for (uint32_t flags : {0u, unsigned{ARBITER_RUN_NVFP4_LINEAR_SCALES}}) {
      arbiter_allreduce_args a = fp4_args();
      a.dtype = dtype;
      a.flags = flags;
      const arbiter::common::Status s = nccl::check_call(w, a);
      BOOST_TEST(s.ok(), "dtype " << dtype << " flags " << flags << ": " << s.message());
    }
  }
  // Without the optional outputs (residual_out too, as the ABI allows and
  // the fused modules take: the epilogue keeps x in the scratch), and vLLM's
  // in-place layout.
  arbiter_allreduce_args bare = fp4_args();
  bare.allreduce_out = nullptr;
  bare.norm_out = nullptr;
  bare.residual_out = nullptr;
  BOOST_TEST(nccl::check_call(w, bare).ok(), nccl::check_call(w, bare).message());
  arbiter_allreduce_args in_place = fp4_args();
  in_place.allreduce_out = nullptr;
  in_place.norm_out = const_cast<void*>(in_place.input);
  in_place.residual_out = const_cast<void*>(in_place.residual_in);
  BOOST_TEST(nccl::check_call(w, in_place).ok(), nccl::check_call(w, in_place).message());
}

// DESIGN.md section 6: FP4 on SM90 is refused, never run as a no-op.
BOOST_AUTO_TEST_CASE(nvfp4_is_refused_below_capability_100_on_any_rank) {
  check_refused(rules_for(90), fp4_args(), ARBITER_UNSUPPORTED,
                "NVFP4 needs capability >= 100 (this device is 90)");
  nccl::CallRules mixed = rules_for(100);
  mixed.min_capability = 90;  // a peer runs on an H100
  mixed.device_patterns &= nccl::patterns_for(90, mixed.kernel_archs);
  check_refused(mixed, fp4_args(), ARBITER_UNSUPPORTED,
                "NVFP4 needs capability >= 100 on every rank (a peer's device is 90)");
  nccl::CallRules no_kernel = rules_for(103);  // built for 90a,100a only
  check_refused(no_kernel, fp4_args(), ARBITER_UNSUPPORTED,
                "no epilogue kernel for the device of this rank or a peer (built for 90a,100a)");
}

BOOST_AUTO_TEST_CASE(nvfp4_calls_get_the_fused_modules_checks) {
  const nccl::CallRules w = rules_for(100);
  struct Bad {
    void (*edit)(arbiter_allreduce_args&);
    int32_t code;
    const char* words;
  };
  const Bad bad[] = {
      {[](arbiter_allreduce_args& a) { a.dtype = ARBITER_DTYPE_FP32; }, ARBITER_UNSUPPORTED,
       "NVFP4 needs fp16 or bf16 input"},
      {[](arbiter_allreduce_args& a) { a.hidden = 2888; }, ARBITER_UNSUPPORTED,
       "NVFP4 needs hidden % 16 == 0 (hidden is 2888)"},
      {[](arbiter_allreduce_args& a) { a.scale_out = nullptr; }, ARBITER_INVALID_ARGUMENT,
       "scale_out is NULL"},
      {[](arbiter_allreduce_args& a) { a.quant_out = nullptr; }, ARBITER_INVALID_ARGUMENT,
       "quant_out is NULL"},
      {[](arbiter_allreduce_args& a) { a.scale = nullptr; }, ARBITER_INVALID_ARGUMENT,
       "scale is NULL"},
      {[](arbiter_allreduce_args& a) { a.gamma = nullptr; }, ARBITER_INVALID_ARGUMENT,
       "gamma is NULL"},
      {[](arbiter_allreduce_args& a) { a.input = guard_buffer(0) + 8; }, ARBITER_INVALID_ARGUMENT,
       "input is not 16-byte aligned"},
      {[](arbiter_allreduce_args& a) { a.norm_out = guard_buffer(5) + 2; },
       ARBITER_INVALID_ARGUMENT, "norm_out is not 16-byte aligned"},
      {[](arbiter_allreduce_args& a) { a.quant_out = guard_buffer(6) + 2; },
       ARBITER_INVALID_ARGUMENT, "quant_out is not 4-byte aligned"},
      // 300 tokens swizzled: 3 row tiles of 128 x 448 scale factors.
      {[](arbiter_allreduce_args& a) { a.scale_out = guard_buffer(6) + 300 * 7168 / 2 - 1; },
       ARBITER_INVALID_ARGUMENT, "scale_out overlaps quant_out"},
      {[](arbiter_allreduce_args& a) { a.scale_out = const_cast<void*>(a.residual_in); },
       ARBITER_INVALID_ARGUMENT, "scale_out overlaps residual_in"},
      {[](arbiter_allreduce_args& a) { a.eps = -1.0f; }, ARBITER_INVALID_ARGUMENT,
       "must be finite and >= 0"},
      {[](arbiter_allreduce_args& a) { a.algorithm = ARBITER_ALGORITHM_ONESHOT; },
       ARBITER_UNSUPPORTED, "only native"},
  };
  for (const Bad& b : bad) {
    arbiter_allreduce_args a = fp4_args();
    b.edit(a);
    BOOST_TEST_CONTEXT(b.words) { check_refused(w, a, b.code, b.words); }
  }
  // The swizzled layout pads rows to 128: scale_out ends past the linear size.
  arbiter_allreduce_args padded = fp4_args(300, 7168);
  const size_t linear = arbiter::common::linear_scale_bytes(300, 448);
  const size_t swizzled = arbiter::common::swizzled_128x4_bytes(300, 448);
  BOOST_TEST(swizzled > linear);
  padded.quant_out = static_cast<char*>(padded.scale_out) + linear;
  check_refused(w, padded, ARBITER_INVALID_ARGUMENT, "overlaps");
  padded.flags = ARBITER_RUN_NVFP4_LINEAR_SCALES;
  BOOST_TEST(nccl::check_call(w, padded).ok(), nccl::check_call(w, padded).message());
}

// The other norm patterns keep taking element-aligned buffers (the kernel
// then works element by element), and what the workspace lacks is refused.
BOOST_AUTO_TEST_CASE(other_patterns_and_the_workspace_mask_are_checked_as_before) {
  const nccl::CallRules w = rules_for(90);
  arbiter_allreduce_args fp8 = fp4_args(33, 2880);
  fp8.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  fp8.input = guard_buffer(0) + 2;
  fp8.quant_out = guard_buffer(6) + 1;
  BOOST_TEST(nccl::check_call(w, fp8).ok(), nccl::check_call(w, fp8).message());
  arbiter_allreduce_args no_x = fp8;
  no_x.residual_out = nullptr;
  BOOST_TEST(nccl::check_call(w, no_x).ok(), nccl::check_call(w, no_x).message());
  fp8.input = guard_buffer(0) + 1;
  check_refused(w, fp8, ARBITER_INVALID_ARGUMENT,
                "input is not aligned to its element size (2 bytes)");

  nccl::CallRules narrow = rules_for(100);
  narrow.pattern_mask =
      (1u << ARBITER_PATTERN_ALLREDUCE) | (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM);
  check_refused(narrow, fp4_args(), ARBITER_UNSUPPORTED,
                "pattern residual_rmsnorm_fp4 is not in the workspace's pattern_mask (3)");
  arbiter_allreduce_args unknown = fp4_args();
  unknown.pattern = static_cast<arbiter_pattern>(4);
  check_refused(w, unknown, ARBITER_UNSUPPORTED, "pattern 4 is not supported");
  arbiter_allreduce_args norm = fp4_args();
  norm.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  norm.norm_out = nullptr;
  check_refused(w, norm, ARBITER_INVALID_ARGUMENT, "norm_out is NULL");
}

// Every norm pattern gets a scratch, so a workspace for NVFP4 alone can
// chunk; the smallest is 16 MiB (the GPU suite forces chunks with it).
BOOST_AUTO_TEST_CASE(a_workspace_for_nvfp4_gets_a_scratch) {
  arbiter_workspace_spec spec = spec_for(0, 1);
  spec.pattern_mask = 1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  BOOST_TEST(nccl::scratch_bytes_for(spec) == nccl::kMinScratchBytes);
  spec.pattern_mask = 0;  // every pattern
  BOOST_TEST(nccl::scratch_bytes_for(spec) == nccl::kMinScratchBytes);
  spec.pattern_mask = 1u << ARBITER_PATTERN_ALLREDUCE;
  BOOST_TEST(nccl::scratch_bytes_for(spec) == 0u);
  spec.pattern_mask = 1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  spec.max_message_bytes = uint64_t{64} << 20;
  BOOST_TEST(nccl::scratch_bytes_for(spec) == uint64_t{64} << 20);
}

// Unknown pattern bits are refused before any CUDA call, so on any machine.
BOOST_AUTO_TEST_CASE(workspace_create_refuses_unknown_pattern_bits) {
  NcclModule module;
  BOOST_REQUIRE_MESSAGE(module.api() != nullptr, module.error());
  arbiter::test::ThreadGroup group(1);
  const arbiter_oob oob = group.oob(0);
  arbiter_workspace_spec spec = spec_for(0, 1);
  spec.pattern_mask = 0x1Fu;
  arbiter_workspace* ws = nullptr;
  BOOST_TEST(module.api()->workspace_create(&oob, &spec, &ws) == ARBITER_UNSUPPORTED);
  const std::string reason = module.api()->last_error();
  BOOST_CHECK_MESSAGE(reason.find("pattern_mask 31 asks for patterns this backend does not "
                                  "implement") != std::string::npos,
                      "reason: " << reason);
  BOOST_TEST(ws == nullptr);
}
