// The mnnvl module on one GPU in loopback mode (N virtual ranks in this
// process, one stream each; the module then uses plain allocations and no
// multicast mapping, its kernels storing to every peer in turn), through its
// ABI as the host drives it, against the common CPU reference
// (arbiter/common/reference.h). Exits 77 (ctest: skipped) with the reason
// where there is no CUDA device.
//
// The suite itself (support/fused_gpu_suite.h) is shared with trtllm: for
// world sizes 2, 4, 8 and 16 and every dtype, one workspace group runs every
// pattern over hidden 2880 and 7168 and tokens 1, 9, 127, 998 and 2048,
// one-shot and two-shot, and checks outputs against the reference
// (FP8/NVFP4 dequantised), bits across ranks and between algorithms,
// refusals, -0.0 and negative-subnormal inputs (the GB200 sentinel hang),
// 10,000 back-to-back calls and CUDA-graph replays. What is mnnvl's own:
//  - one-shot runs while tokens x hidden x world size x element size fits
//    one of the three Lamport buffers (max_message_bytes(ONESHOT), a
//    world-size-th of a buffer) and is refused with that reason above it;
//    the sweep's large shapes hit both sides of that line;
//  - two-shot runs for any token count (fewer tokens than ranks included)
//    up to max_message_bytes, and refuses rows wider than the workspace's
//    when their scatter rows would not fit;
//  - both algorithms send +0.0 for -0.0 and sum in fp32 in rank order, so
//    their bits agree everywhere, zero signs included;
//  - probe: world sizes 2..63, multicast and NVLink needed, not single-node.
// The expected capacities are computed here from the layout the module
// documents (workspace_layout.h), not taken from its header.
//
// No Boost: this builds and runs where only CUDA is installed.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/common/launch_config.h"
#include "arbiter_backend.h"
#include "fused_gpu_suite.h"
#include "gpu_check.h"
#include "loopback_group.h"

namespace {

namespace test = arbiter::test;
using test::Call;
using test::GroupInfo;
using test::OversizedCall;

// A one-shot call is refused with this, and a two-shot call over capacity
// or with scatter rows beyond the area with these (guards.h).
constexpr const char* kOneshotTooLarge =
    "one-shot needs tokens x hidden x world size x element size <= the buffer";
constexpr const char* kTwoshotTooLarge = "exceeds the workspace's two-shot capacity";
constexpr const char* kScatterTooWide = "two-shot scatters world size x ceil(tokens / world size)";

std::uint64_t round_up(std::uint64_t value, std::uint64_t to) { return (value + to - 1) / to * to; }

// One rank's workspace as the module documents it: three buffers, each a
// scatter area (M + ws rows, 128-byte aligned) and a broadcast area (M).
struct Layout {
  std::uint64_t message = 0;  // M: bytes one rank sends in one call, two-shot
  std::uint64_t scatter = 0;
  std::uint64_t buffer = 0;
  std::uint64_t oneshot = 0;  // a world-size-th of one buffer, in 16-byte units
};

Layout layout_of(const GroupInfo& g) {
  const std::uint64_t row = std::uint64_t{g.max_hidden} * g.element_size();
  Layout l;
  l.message = std::min<std::uint64_t>(g.max_message_bytes, std::uint64_t{g.max_tokens} * row);
  l.scatter = round_up(l.message + static_cast<std::uint64_t>(g.world_size) * row, 128);
  l.buffer = l.scatter + round_up(l.message, 128);
  l.oneshot = l.buffer / static_cast<std::uint64_t>(g.world_size) / 16 * 16;
  return l;
}

std::uint64_t twoshot_scatter_bytes(int world_size, std::uint32_t tokens, std::uint64_t row) {
  const auto ws = static_cast<std::uint64_t>(world_size);
  return ws * ((tokens + ws - 1) / ws) * row;
}

std::optional<std::string> expected_refusal(const GroupInfo& g, const Call& c) {
  if (std::optional<std::string> nvfp4 = test::nvfp4_refusal(g, c)) return nvfp4;
  const Layout l = layout_of(g);
  if (c.algorithm == ARBITER_ALGORITHM_ONESHOT) {
    if (c.bytes() > l.oneshot) return std::string(kOneshotTooLarge);
    return std::nullopt;
  }
  if (c.bytes() > l.message) return std::string(kTwoshotTooLarge);
  if (twoshot_scatter_bytes(c.world_size, c.tokens, c.row_bytes()) > l.scatter) {
    return std::string(kScatterTooWide);
  }
  return std::nullopt;
}

std::uint64_t expected_capacity(const GroupInfo& g, arbiter_algorithm algorithm) {
  const Layout l = layout_of(g);
  return algorithm == ARBITER_ALGORITHM_ONESHOT ? l.oneshot : l.message;
}

// Just above each algorithm's capacity at the widest and a narrow hidden
// size, and, where one exists, a two-shot call within M whose rows are wider
// than the workspace's so its scatter rows (ws x ceil(T / ws) of them) run
// past the scatter area.
std::vector<OversizedCall> oversized_calls(const GroupInfo& g) {
  const Layout l = layout_of(g);
  std::vector<OversizedCall> calls;
  for (std::uint32_t hidden : {g.max_hidden, 2880u}) {
    const std::uint64_t row = std::uint64_t{hidden} * g.element_size();
    calls.push_back(
        {ARBITER_ALGORITHM_ONESHOT, {static_cast<std::uint32_t>(l.oneshot / row) + 1, hidden}});
    calls.push_back(
        {ARBITER_ALGORITHM_TWOSHOT, {static_cast<std::uint32_t>(l.message / row) + 1, hidden}});
  }
  const auto ws = static_cast<std::uint64_t>(g.world_size);
  const std::uint32_t vector = arbiter::common::vector_elements(g.dtype);
  for (std::uint32_t hidden = g.max_hidden + vector; hidden <= arbiter::common::max_hidden(g.dtype);
       hidden += vector) {
    const std::uint64_t row = std::uint64_t{hidden} * g.element_size();
    std::uint64_t tokens = l.message / row;  // the most that fit M ...
    if (tokens < 1) break;
    tokens -= (tokens - 1) % ws;  // ... with tokens % ws == 1: the most padding rows
    if ((tokens + ws - 1) * row > l.scatter) {
      calls.push_back({ARBITER_ALGORITHM_TWOSHOT, {static_cast<std::uint32_t>(tokens), hidden}});
      break;
    }
  }
  return calls;
}

}  // namespace

int main() {
  test::prepare_loopback_environment();
  test::FusedSuite suite;
  suite.backend = "mnnvl";
  suite.test_name = "backends_mnnvl_gpu_test";
  suite.world_sizes = {2, 4, 8, 16};
  suite.dtypes = {ARBITER_DTYPE_FP16, ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP32};
  // 2880: CTAs whose thread count is not a multiple of 32.
  suite.hiddens = {2880, 7168};
  // 1 and 9: fewer tokens than ranks (two-shot ranks that own none); 998 and
  // 2048: one-shot refused where ws x message overflows a buffer (from world
  // size 4 at hidden 7168, 8 at 2880), so both sides of that line are run.
  suite.token_counts = {1, 9, 127, 998, 2048};
  suite.max_tokens = 2048;
  suite.max_hidden = 7168;
  suite.back_to_back = {9, 2880};  // fewer tokens than ranks at ws 16
  suite.graph = {16, 2880};
  suite.salted = {20, 7168};
  suite.zero_sign_exact = true;
  suite.capacity = expected_capacity;
  suite.refusal = expected_refusal;
  suite.oversized = oversized_calls;
  suite.world_size_mask = ~std::uint64_t{3};  // 2..63: all ABI v1 can say
  suite.flags_set = ARBITER_CAPS_NEEDS_MULTICAST | ARBITER_CAPS_NEEDS_NVLINK;
  suite.flags_clear = ARBITER_CAPS_SINGLE_NODE_ONLY;  // an NVLink domain spans nodes
  return test::run_fused_suite(suite);
}
