// Every cell of the embedded default tables, at the cap (fused) and one byte
// above (fallback), and the one-shot/two-shot split at its cap.
#define BOOST_TEST_MODULE policy_default_tables
#include <boost/test/unit_test.hpp>

#include "print.h"

#include "arbiter/policy.h"
#include "arbiter/size.h"

using namespace arbiter;

namespace {

const Policy& defaults() {
  static const Policy p = Policy::load_or_throw(LoadOptions{});
  return p;
}

Request single_node(int cap, std::uint32_t ws, std::uint64_t bytes) {
  Request r;
  r.capability = Capability::sm(static_cast<std::uint16_t>(cap));
  r.world_size = ws;
  r.message_bytes = bytes;
  return r;
}

struct Cap {
  int capability;
  std::uint32_t world_size;
  std::uint64_t bytes;
};

// DESIGN.md section 3, the single-node cells (ws 16 is multi-node, tested
// in world_size_16_test).
const Cap kFusion[] = {
    {90, 2, 64 * kMiB},  {90, 4, 2 * kMiB},   {90, 8, kMiB / 2},   {100, 2, 64 * kMiB},
    {100, 4, 32 * kMiB}, {100, 8, 1 * kMiB},  {103, 2, 64 * kMiB}, {103, 4, 64 * kMiB},
    {103, 8, 2 * kMiB},  {107, 2, 64 * kMiB}, {107, 4, 64 * kMiB}, {107, 8, 2 * kMiB},
};
const Cap kOneshot[] = {
    {90, 2, 32 * kMiB}, {90, 4, 2 * kMiB},   {90, 8, kMiB / 2},   {100, 2, 32 * kMiB},
    {100, 4, 4 * kMiB}, {100, 8, 1 * kMiB},  {103, 2, 32 * kMiB}, {103, 4, 4 * kMiB},
    {103, 8, 2 * kMiB}, {107, 2, 32 * kMiB}, {107, 4, 4 * kMiB},  {107, 8, 2 * kMiB},
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_fusion_cell_is_inclusive_at_its_cap) {
  for (const Cap& c : kFusion) {
    BOOST_TEST_CONTEXT("capability " << c.capability << " ws " << c.world_size) {
      const Decision at = defaults().decide(single_node(c.capability, c.world_size, c.bytes));
      BOOST_TEST(at.fused);
      BOOST_TEST(at.backend == Backend::kTrtllm);
      BOOST_TEST(at.cap == c.bytes);
      const Decision above =
          defaults().decide(single_node(c.capability, c.world_size, c.bytes + 1));
      BOOST_TEST(!above.fused);
      BOOST_TEST(above.backend == Backend::kNccl);
      BOOST_TEST(above.algorithm == Algorithm::kNative);
      BOOST_TEST(above.reason == Reason::kAboveCap);
      BOOST_TEST(*defaults().max_fused_bytes(single_node(c.capability, c.world_size, 0)) ==
                 c.bytes);
    }
  }
}

BOOST_AUTO_TEST_CASE(every_oneshot_cell_splits_inclusively) {
  for (const Cap& c : kOneshot) {
    BOOST_TEST_CONTEXT("capability " << c.capability << " ws " << c.world_size) {
      const Decision at = defaults().decide(single_node(c.capability, c.world_size, c.bytes));
      BOOST_TEST(at.backend == Backend::kTrtllm);
      BOOST_TEST(at.algorithm == Algorithm::kOneshot);
      const Decision above =
          defaults().decide(single_node(c.capability, c.world_size, c.bytes + 1));
      // Above the one-shot cap: two-shot while still fused, else the fallback.
      if (above.fused) {
        BOOST_TEST(above.algorithm == Algorithm::kTwoshot);
      } else {
        BOOST_TEST(above.backend == Backend::kNccl);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(half_mib_is_the_integer_524288) {
  const Decision d = defaults().decide(single_node(90, 8, 524288));
  BOOST_TEST(d.cap == 524288u);
  BOOST_TEST(d.fused);
  BOOST_TEST(!defaults().decide(single_node(90, 8, 524289)).fused);
}

BOOST_AUTO_TEST_CASE(uncovered_world_sizes_fall_back) {
  for (std::uint32_t ws : {3u, 6u, 12u, 32u, 1000u}) {
    BOOST_TEST_CONTEXT("ws " << ws) {
      const Decision d = defaults().explain(single_node(100, ws, 1024));
      BOOST_TEST(!d.fused);
      BOOST_TEST(d.backend == Backend::kNccl);
      BOOST_TEST(d.reason == Reason::kNoFusionCell);
      BOOST_TEST(!defaults().max_fused_bytes(single_node(100, ws, 0)).has_value());
      const std::string text = defaults().explain_text(single_node(100, ws, 1024), d);
      BOOST_TEST(text.find("no fusion entry for capability 100, world size " +
                           std::to_string(ws)) != std::string::npos,
                 text);
    }
  }
}

BOOST_AUTO_TEST_CASE(unknown_gpu_capabilities_fall_back) {
  for (int cap : {80, 89, 120, 121}) {
    const Decision d = defaults().decide(single_node(cap, 8, 1024));
    BOOST_TEST(d.backend == Backend::kNccl);
    BOOST_TEST(d.reason == Reason::kNoFusionCell);
  }
}

BOOST_AUTO_TEST_CASE(fp4_is_never_fused_on_hopper) {
  Request r = single_node(90, 4, 1024);
  r.pattern = Pattern::kResidualRmsnormFp4;
  Decision d = defaults().explain(r);
  BOOST_TEST(!d.fused);
  BOOST_TEST(d.backend == Backend::kNccl);
  BOOST_TEST(d.reason == Reason::kNoEligibleBackend);
  BOOST_TEST(defaults().explain_text(r, d).find("needs capability >= 100") != std::string::npos);
  r.capability = Capability::sm(100);
  BOOST_TEST(defaults().decide(r).backend == Backend::kTrtllm);
}

BOOST_AUTO_TEST_CASE(two_shot_needs_as_many_tokens_as_ranks) {
  // 90/ws2: one-shot cap 32 MiB, fusion cap 64 MiB. 10 tokens of 4 MiB
  // (bf16, hidden 2 Mi) = 40 MiB: above the one-shot cap, tokens >= 2.
  Request r = Request::with_tokens(Capability::sm(90), 2, 10, 2 * 1024 * 1024, Dtype::kBf16,
                                   Pattern::kResidualRmsnorm);
  BOOST_TEST(defaults().decide(r).algorithm == Algorithm::kTwoshot);
  // 1 token of 40 MiB: two-shot would need 2 tokens; it stays one-shot.
  r = Request::with_tokens(Capability::sm(90), 2, 1, 40 * 1024 * 1024 / 2, Dtype::kBf16,
                           Pattern::kResidualRmsnorm);
  const Decision d = defaults().explain(r);
  BOOST_TEST(d.fused);
  BOOST_TEST(d.algorithm == Algorithm::kOneshot);
  BOOST_TEST(defaults().explain_text(r, d).find("stays oneshot") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(cpu_ranks_get_host_backends_only) {
  for (std::uint32_t ws : {2u, 4u, 8u}) {
    BOOST_TEST_CONTEXT("cpu ws " << ws) {
      Request r;
      r.capability = Capability::cpu();
      r.world_size = ws;
      r.message_bytes = 64 * kMiB;  // the cap, inclusive
      Decision d = defaults().decide(r);
      BOOST_TEST(d.backend == Backend::kShm);
      BOOST_TEST(d.fused);
      BOOST_TEST(d.cap == 64 * kMiB);
      BOOST_TEST(d.algorithm == Algorithm::kTwoshot);
      // One-shot while bytes x world size <= 256 KiB.
      r.message_bytes = 256 * kKiB / ws;
      BOOST_TEST(defaults().decide(r).algorithm == Algorithm::kOneshot);
      r.message_bytes = 256 * kKiB / ws + 1;
      BOOST_TEST(defaults().decide(r).algorithm == Algorithm::kTwoshot);
      r.message_bytes = 64 * kMiB + 1;
      d = defaults().decide(r);
      BOOST_TEST(d.backend == Backend::kShm);
      BOOST_TEST(!d.fused);
      BOOST_TEST(d.algorithm == Algorithm::kNative);
    }
  }
  // A CPU world size without a cell: the unfused shm path.
  Request odd;
  odd.capability = Capability::cpu();
  odd.world_size = 3;
  odd.message_bytes = 64;
  BOOST_TEST(defaults().decide(odd).backend == Backend::kShm);
  BOOST_TEST(!defaults().decide(odd).fused);
  // No GPU capability ever gets shm, whatever the size.
  for (int cap : {90, 100, 103, 107, 120}) {
    for (std::uint32_t ws : {2u, 4u, 8u, 16u}) {
      for (std::uint64_t bytes : {std::uint64_t{1}, 64 * kMiB, kGiB}) {
        Request g = single_node(cap, ws, bytes);
        BOOST_TEST(defaults().decide(g).backend != Backend::kShm);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(no_nvlink_on_one_node_falls_back) {
  Request r = single_node(100, 4, 1024);
  r.nvlink_domain = false;
  const Decision d = defaults().decide(r);
  BOOST_TEST(d.backend == Backend::kNccl);
  BOOST_TEST(d.reason == Reason::kNoEligibleBackend);
  BOOST_TEST(!defaults().max_fused_bytes(r).has_value());
}

BOOST_AUTO_TEST_CASE(explain_and_decide_agree) {
  for (const Cap& c : kFusion) {
    for (std::uint64_t bytes : {std::uint64_t{1}, c.bytes / 3, c.bytes, c.bytes + 1}) {
      const Request r = single_node(c.capability, c.world_size, bytes);
      const Decision a = defaults().decide(r);
      const Decision b = defaults().explain(r);
      BOOST_TEST(a.same_choice(b));
      BOOST_TEST(a.cap == b.cap);
      BOOST_TEST(a.trace.size() == 0);
      BOOST_TEST(b.trace.size() > 3);
    }
  }
}
