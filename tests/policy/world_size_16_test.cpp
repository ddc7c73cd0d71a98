// World size 16: GB200/GB300 NVL72 runs it as 4 nodes x 4 GPUs in one NVLink
// domain. The default tables fuse it on mnnvl up to 64 MiB inclusive.
#define BOOST_TEST_MODULE policy_world_size_16
#include <boost/test/unit_test.hpp>

#include "print.h"

#include "arbiter/policy.h"
#include "arbiter/size.h"

using namespace arbiter;

namespace {

Request nvl72(int capability, std::uint64_t bytes) {
  Request r;
  r.capability = Capability::sm(static_cast<std::uint16_t>(capability));
  r.world_size = 16;
  r.nodes = 4;
  r.nvlink_domain = true;
  r.multicast = true;
  r.message_bytes = bytes;
  return r;
}

Policy load(std::optional<std::string> backends_env = std::nullopt) {
  LoadOptions o;
  o.backends_env = std::move(backends_env);
  return Policy::load_or_throw(o);
}

bool trace_has(const Decision& d, Rule rule) {
  for (const TraceEntry& e : d.trace) {
    if (e.rule == rule) return true;
  }
  return false;
}

}  // namespace

BOOST_AUTO_TEST_CASE(blackwell_nvl72_fuses_on_mnnvl_up_to_64_mib_inclusive) {
  const Policy p = load();
  for (int cap : {100, 103}) {
    BOOST_TEST_CONTEXT("capability " << cap) {
      const Decision at = p.explain(nvl72(cap, 64 * kMiB));
      BOOST_TEST(at.fused);
      BOOST_TEST(at.backend == Backend::kMnnvl);
      BOOST_TEST(at.cap == 64 * kMiB);
      const Decision above = p.decide(nvl72(cap, 64 * kMiB + 1));
      BOOST_TEST(!above.fused);
      BOOST_TEST(above.backend == Backend::kNccl);
      BOOST_TEST(above.reason == Reason::kAboveCap);
      BOOST_TEST(*p.max_fused_bytes(nvl72(cap, 0)) == 64 * kMiB);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_oneshot_table_is_never_consulted_across_nodes) {
  const Policy p = load();
  for (std::uint64_t bytes : {std::uint64_t{1024}, 64 * kKiB, 64 * kKiB + 2, 32 * kMiB}) {
    const Decision d = p.explain(nvl72(103, bytes));
    BOOST_TEST(d.backend == Backend::kMnnvl);
    BOOST_TEST(!trace_has(d, Rule::kOneshotCell));
    BOOST_TEST(!trace_has(d, Rule::kOneshotDefault));
    BOOST_TEST(trace_has(d, Rule::kOneshotThreshold));
    BOOST_TEST(d.oneshot_origin == kNoOrigin);
  }
  // mnnvl's own rule: one-shot while bytes x 16 <= 1 MiB, i.e. bytes <= 64 KiB.
  BOOST_TEST(p.decide(nvl72(103, 64 * kKiB)).algorithm == Algorithm::kOneshot);
  BOOST_TEST(p.decide(nvl72(103, 64 * kKiB + 1)).algorithm == Algorithm::kTwoshot);
}

BOOST_AUTO_TEST_CASE(hopper_at_world_size_16_falls_back_with_the_reason) {
  const Policy p = load();
  const Request r = nvl72(90, 1024);
  const Decision d = p.explain(r);
  BOOST_TEST(!d.fused);
  BOOST_TEST(d.backend == Backend::kNccl);
  BOOST_TEST(d.reason == Reason::kNoFusionCell);
  const std::string text = p.explain_text(r, d);
  BOOST_TEST(text.find("no fusion entry for capability 90, world size 16") != std::string::npos,
             text);
  BOOST_TEST(!p.max_fused_bytes(r).has_value());
}

BOOST_AUTO_TEST_CASE(trtllm_is_never_chosen_across_nodes) {
  const Policy p = load("trtllm,nccl");
  for (int cap : {100, 103}) {
    for (std::uint64_t bytes : {std::uint64_t{1}, 1 * kMiB, 64 * kMiB}) {
      const Decision d = p.explain(nvl72(cap, bytes));
      BOOST_TEST(d.backend == Backend::kNccl);
      BOOST_TEST(!d.fused);
      BOOST_TEST(d.reason == Reason::kNoEligibleBackend);
    }
  }
  // Even with trtllm first in a site's multi-node list, it is single-node only.
  LoadOptions o;
  o.overrides.yaml("site.yaml", "format: 1\npreference: {multi_node: [trtllm, mnnvl]}\n");
  const Policy q = Policy::load_or_throw(o);
  const Decision d = q.explain(nvl72(103, 1024));
  BOOST_TEST(d.backend == Backend::kMnnvl);
  BOOST_TEST(q.explain_text(nvl72(103, 1024), d).find("single-node backend") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(without_multicast_or_nvlink_domain_it_falls_back) {
  const Policy p = load();
  Request r = nvl72(103, 1024);
  r.multicast = false;
  BOOST_TEST(p.decide(r).backend == Backend::kNccl);
  BOOST_TEST(!p.max_fused_bytes(r).has_value());
  r = nvl72(103, 1024);
  r.nvlink_domain = false;
  BOOST_TEST(p.decide(r).backend == Backend::kNccl);
}

BOOST_AUTO_TEST_CASE(world_sizes_6_and_12_fall_back) {
  const Policy p = load();
  for (std::uint32_t ws : {6u, 12u}) {
    for (std::uint32_t nodes : {1u, 2u, 3u}) {
      Request r = nvl72(103, 1024);
      r.world_size = ws;
      r.nodes = nodes;
      const Decision d = p.decide(r);
      BOOST_TEST(d.backend == Backend::kNccl);
      BOOST_TEST(d.reason == Reason::kNoFusionCell);
    }
  }
}
