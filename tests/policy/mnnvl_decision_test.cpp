// What a multi-node NVLink job (GB300 NVL72: 4 nodes x 4 GPUs, one NVLink
// domain) gets from the default tables: mnnvl fused when every rank has
// multicast, NCCL unfused -- saying why -- when one does not. Checked
// through the library and through the arbiter program operators run.
#define BOOST_TEST_MODULE policy_mnnvl_decision
#include <boost/test/unit_test.hpp>

#include <string>

#include "json.h"
#include "print.h"
#include "run_command.h"

#include "arbiter/policy.h"
#include "arbiter/size.h"

using namespace arbiter;
using namespace arbiter::test;

namespace {

Request gb300_nvl72(bool multicast, std::uint64_t bytes) {
  Request r;
  r.capability = Capability::sm(103);
  r.world_size = 16;
  r.nodes = 4;
  r.nvlink_domain = true;
  r.multicast = multicast;
  r.message_bytes = bytes;
  return r;
}

const TraceEntry* find(const Decision& d, Rule rule, Backend backend) {
  for (const TraceEntry& e : d.trace) {
    if (e.rule == rule && e.backend == backend) return &e;
  }
  return nullptr;
}

bool contains(const std::string& text, const std::string& words) {
  return text.find(words) != std::string::npos;
}

const std::string kDecide = "decide --capability 103 --world-size 16 --nodes 4 --nvlink-domain ";

}  // namespace

BOOST_AUTO_TEST_CASE(with_multicast_a_1_mib_call_is_fused_on_mnnvl) {
  const Policy p = Policy::load_or_throw(LoadOptions{});
  const Decision d = p.explain(gb300_nvl72(true, 1 * kMiB));
  BOOST_TEST(d.backend == Backend::kMnnvl);
  BOOST_TEST(d.fused);
  BOOST_TEST(d.reason == Reason::kFused);
  BOOST_TEST(d.cap == 64 * kMiB);
  // 1 MiB x 16 ranks is above mnnvl's 1 MiB one-shot threshold.
  BOOST_TEST(d.algorithm == Algorithm::kTwoshot);
  const TraceEntry* check = find(d, Rule::kBackendCheck, Backend::kMnnvl);
  BOOST_REQUIRE(check != nullptr);
  BOOST_TEST(check->verdict == static_cast<std::uint8_t>(Ineligible::kEligible));
  BOOST_TEST(*p.max_fused_bytes(gb300_nvl72(true, 0)) == 64 * kMiB);
  // Up to the default cap, inclusive.
  BOOST_TEST(p.decide(gb300_nvl72(true, 64 * kMiB)).backend == Backend::kMnnvl);
  BOOST_TEST(p.decide(gb300_nvl72(true, 64 * kMiB)).fused);
}

BOOST_AUTO_TEST_CASE(without_multicast_it_is_nccl_unfused_and_says_why) {
  const Policy p = Policy::load_or_throw(LoadOptions{});
  const Request r = gb300_nvl72(false, 1 * kMiB);
  const Decision d = p.explain(r);
  BOOST_TEST(d.backend == Backend::kNccl);
  BOOST_TEST(!d.fused);
  BOOST_TEST(d.algorithm == Algorithm::kNative);
  // The fusion cell applied; no fused backend could take the call.
  BOOST_TEST(d.reason == Reason::kNoEligibleBackend);
  BOOST_TEST(d.cap == 64 * kMiB);
  const TraceEntry* check = find(d, Rule::kBackendCheck, Backend::kMnnvl);
  BOOST_REQUIRE(check != nullptr);
  BOOST_TEST(check->verdict == static_cast<std::uint8_t>(Ineligible::kMulticast));
  const std::string text = p.explain_text(r, d);
  BOOST_TEST(contains(text, "mnnvl: needs NVLink multicast on all ranks"), text);
  BOOST_TEST(contains(text, "fallback: nccl"), text);
  // Nothing is fused, so there is no fused size to build a workspace for.
  BOOST_TEST(!p.max_fused_bytes(gb300_nvl72(false, 0)).has_value());
  // decide() (no trace) agrees with explain().
  BOOST_TEST(p.decide(r).same_choice(d));
}

BOOST_AUTO_TEST_CASE(the_cli_decides_mnnvl_fused_with_multicast) {
  CommandResult r = run_command(arbiter_command(kDecide + "--multicast --bytes 1MiB"));
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "mnnvl twoshot fused"), r.output);
  r = run_command(arbiter_command(kDecide + "--multicast --bytes 1MiB --json"));
  BOOST_TEST(r.exit_code == 0, r.output);
  const Json j = JsonReader::parse(r.output);
  BOOST_TEST(j["backend"].string == "mnnvl");
  BOOST_TEST(j["algorithm"].string == "twoshot");
  BOOST_TEST(j["fused"].boolean);
  BOOST_TEST(j["reason"].string == "fused");
  BOOST_TEST(j["cap"].number == "67108864");
  BOOST_TEST(j["max_fused_bytes"].number == "67108864");
  BOOST_TEST(j["request"]["multicast"].boolean);
}

BOOST_AUTO_TEST_CASE(the_cli_falls_back_to_nccl_without_multicast_and_explains_it) {
  CommandResult r = run_command(arbiter_command(kDecide + "--bytes 1MiB --explain"));
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "nccl native unfused"), r.output);
  BOOST_TEST(contains(r.output, "mnnvl: needs NVLink multicast on all ranks"), r.output);
  BOOST_TEST(contains(r.output, "fallback: nccl"), r.output);
  r = run_command(arbiter_command(kDecide + "--bytes 1MiB --json"));
  BOOST_TEST(r.exit_code == 0, r.output);
  const Json j = JsonReader::parse(r.output);
  BOOST_TEST(j["backend"].string == "nccl");
  BOOST_TEST(!j["fused"].boolean);
  BOOST_TEST(j["reason"].string == "no_eligible_backend");
  BOOST_TEST((j["max_fused_bytes"].kind == Json::Kind::kNull));
}
