// The trtllm module on one GPU in loopback mode (N virtual ranks, one stream
// each), through its ABI as the host drives it, against the common CPU
// reference (arbiter/common/reference.h). Exits 77 (ctest: skipped) with the
// reason where there is no CUDA device.
//
// The suite itself (support/fused_gpu_suite.h) is shared with the other
// fused modules: for every world size (2, 4, 8, 16) and dtype, one workspace
// group runs every pattern over a grid of hidden sizes and token counts,
// one-shot and two-shot, checks outputs against the reference, bits across
// ranks and between algorithms, refusals, sentinel-like inputs, 10,000
// back-to-back calls and CUDA-graph replays. What is trtllm's own:
//  - the workspace holds max_message_bytes per call for either algorithm;
//  - two-shot needs tokens >= world size (refused below it);
//  - one-shot sends +0.0 for -0.0 and two-shot does not, so where every rank
//    sends -0.0 the two may differ in the sign of a zero sum;
//  - probe says single node only.
//
// No Boost: this builds and runs where only CUDA is installed.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arbiter_backend.h"
#include "fused_gpu_suite.h"
#include "gpu_check.h"
#include "loopback_group.h"

namespace {

namespace test = arbiter::test;
using test::Call;
using test::GroupInfo;
using test::OversizedCall;

// The fragment of the message run() must refuse `c` with ("" when only the
// status is known), or nothing when it must run. In the order the guards
// check them.
std::optional<std::string> expected_refusal(const GroupInfo& g, const Call& c) {
  if (std::optional<std::string> nvfp4 = test::nvfp4_refusal(g, c)) return nvfp4;
  if (c.bytes() > g.max_message_bytes) return std::string();
  if (c.algorithm == ARBITER_ALGORITHM_TWOSHOT &&
      c.tokens < static_cast<std::uint32_t>(c.world_size)) {
    return std::string("two-shot needs tokens >= world size");
  }
  return std::nullopt;
}

std::vector<OversizedCall> oversized_calls(const GroupInfo& g) {
  std::vector<OversizedCall> calls;
  for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
    calls.push_back({algorithm, {g.max_tokens + 1, g.max_hidden}});
    calls.push_back(
        {algorithm,
         {static_cast<std::uint32_t>(g.max_message_bytes / (1024 * g.element_size())) + 1, 1024}});
  }
  return calls;
}

}  // namespace

int main() {
  test::prepare_loopback_environment();
  test::FusedSuite suite;
  suite.backend = "trtllm";
  suite.test_name = "backends_trtllm_gpu_test";
  suite.world_sizes = {2, 4, 8, 16};
  suite.dtypes = {ARBITER_DTYPE_FP16, ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP32};
  // 2880: CTAs whose thread count is not a multiple of 32.
  suite.hiddens = {1024, 2880, 4096, 7168, 8192};
  // 1 and 7: fewer tokens than ranks (two-shot refused at larger world sizes).
  suite.token_counts = {1, 7, 128, 1000};
  suite.max_tokens = 1000;
  suite.max_hidden = 8192;
  suite.back_to_back = {32, 4096};
  suite.graph = {16, 2880};
  suite.salted = {20, 4096};  // >= every world size: two-shot runs too
  // Every algorithm stores a sum that rounds to -0.0 as +0.0 (the shared
  // epilogue), so one-shot and two-shot agree on zero signs too.
  suite.zero_sign_exact = true;
  suite.capacity = [](const GroupInfo& g, arbiter_algorithm) { return g.max_message_bytes; };
  suite.refusal = expected_refusal;
  suite.oversized = oversized_calls;
  suite.world_size_mask = (std::uint64_t{1} << 2) | (std::uint64_t{1} << 4) |
                          (std::uint64_t{1} << 8) | (std::uint64_t{1} << 16);
  suite.flags_set = ARBITER_CAPS_SINGLE_NODE_ONLY;
  return test::run_fused_suite(suite);
}
