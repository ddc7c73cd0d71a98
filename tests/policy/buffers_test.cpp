// Registered buffers as a table key: cells keyed by `buffers:` match only
// calls whose input is (or is not) registered, the most specific cell wins,
// conflicts and unknown values are errors at file:line:col, a cell keyed
// registered below capability 90 (no module registers memory there) is a
// warning, and cpu one-shot cells steer shm's split for
// registered calls before its threshold.
#define BOOST_TEST_MODULE policy_buffers
#include <boost/test/unit_test.hpp>

#include "print.h"
#include "site_yaml.h"

#include "arbiter/policy.h"
#include "arbiter/size.h"

using namespace arbiter;
using namespace arbiter::test;

namespace {

Request cpu(std::uint32_t ws, std::uint64_t bytes, bool registered,
            Pattern pattern = Pattern::kResidualRmsnorm) {
  Request r;
  r.capability = Capability::cpu();
  r.world_size = ws;
  r.pattern = pattern;
  r.buffers_registered = registered;
  r.message_bytes = bytes;
  return r;
}

// decide() and explain() agree, and the decision is the one expected.
void check(const Policy& p, const Request& r, Algorithm algorithm, std::uint64_t cap) {
  const Decision fast = p.decide(r);
  const Decision slow = p.explain(r);
  BOOST_TEST(fast.backend == Backend::kShm);
  BOOST_TEST(fast.algorithm == algorithm);
  BOOST_TEST(fast.cap == cap);
  BOOST_TEST(slow.backend == fast.backend);
  BOOST_TEST(slow.algorithm == fast.algorithm);
  BOOST_TEST(slow.cap == fast.cap);
  BOOST_TEST(slow.oneshot_origin == fast.oneshot_origin);
}

}  // namespace

// The defaults: shm one-shot for registered residual_rmsnorm calls to 16 MiB
// at 2 ranks and 2 MiB at 4, and with a replicated residual to 256 KiB at 2
// ranks (measured); other calls keep the threshold.
BOOST_AUTO_TEST_CASE(the_default_tables_run_registered_calls_one_shot_where_measured) {
  const Policy p = Policy::load_or_throw(LoadOptions{});
  check(p, cpu(2, 16 * kMiB, true), Algorithm::kOneshot, 64 * kMiB);
  check(p, cpu(2, 16 * kMiB + 2, true), Algorithm::kTwoshot, 64 * kMiB);
  check(p, cpu(4, 2 * kMiB, true), Algorithm::kOneshot, 64 * kMiB);
  check(p, cpu(4, 2 * kMiB + 4, true), Algorithm::kTwoshot, 64 * kMiB);
  check(p, cpu(8, 1 * kMiB, true), Algorithm::kTwoshot, 64 * kMiB);
  // Ordinary memory: the 256 KiB total threshold.
  check(p, cpu(2, 128 * kKiB, false), Algorithm::kOneshot, 64 * kMiB);
  check(p, cpu(2, 128 * kKiB + 2, false), Algorithm::kTwoshot, 64 * kMiB);
  // Not measured: other patterns keep it too.
  check(p, cpu(2, 1 * kMiB, true, Pattern::kAllreduce), Algorithm::kTwoshot, 64 * kMiB);
  // A replicated residual in registered buffers: one-shot to 256 KiB at 2
  // ranks; at 4, the threshold (64 KiB per rank).
  Request replicated = cpu(2, 256 * kKiB, true);
  replicated.residual_replicated = true;
  check(p, replicated, Algorithm::kOneshot, 64 * kMiB);
  replicated.message_bytes = 256 * kKiB + 2;
  check(p, replicated, Algorithm::kTwoshot, 64 * kMiB);
  replicated.world_size = 4;
  replicated.message_bytes = 64 * kKiB + 4;
  check(p, replicated, Algorithm::kTwoshot, 64 * kMiB);
  const Decision d = p.explain(cpu(2, 1 * kMiB, true));
  const std::string text = p.explain_text(cpu(2, 1 * kMiB, true), d);
  BOOST_TEST(text.find("registered buffers") != std::string::npos, text);
  BOOST_TEST(text.find("one-shot cell (capability cpu, world size 2, pattern residual_rmsnorm, "
                       "residual distinct, buffers registered) = 16 MiB") != std::string::npos,
             text);
  const std::string json = p.decision_json(cpu(2, 1 * kMiB, true), d);
  BOOST_TEST(json.find("\"buffers_registered\":true") != std::string::npos, json);
}

BOOST_AUTO_TEST_CASE(a_buffers_keyed_cpu_oneshot_cell_sets_shms_split_for_registered_calls) {
  const Policy p = must_load(
      "format: 1\n"
      "provenance: {source: test}\n"
      "oneshot:\n"
      "  default: oneshot\n"
      "  cells:\n"
      "    - {capability: cpu, world_size: 2, buffers: registered, max: 2MiB}\n");
  // Registered allreduce (no more specific cell): one-shot to 2 MiB.
  check(p, cpu(2, 2 * kMiB, true, Pattern::kAllreduce), Algorithm::kOneshot, 64 * kMiB);
  check(p, cpu(2, 2 * kMiB + 2, true, Pattern::kAllreduce), Algorithm::kTwoshot, 64 * kMiB);
  check(p, cpu(2, 1 * kMiB, false, Pattern::kAllreduce), Algorithm::kTwoshot, 64 * kMiB);
  // The default's more specific cell still decides registered residual_rmsnorm.
  check(p, cpu(2, 4 * kMiB, true), Algorithm::kOneshot, 64 * kMiB);
  const Decision d = p.explain(cpu(2, 1 * kMiB, true, Pattern::kAllreduce));
  BOOST_TEST(d.oneshot_origin != kNoOrigin);
  const std::string text = p.explain_text(cpu(2, 1 * kMiB, true, Pattern::kAllreduce), d);
  BOOST_TEST(text.find("one-shot cell (capability cpu, world size 2, buffers registered)") !=
                 std::string::npos,
             text);
}

// A site that caps fusion below a default one-shot cell meant to: no
// warning. A site's own one-shot cell above the cap in force still warns.
BOOST_AUTO_TEST_CASE(only_a_one_shot_cell_its_own_file_made_pointless_is_a_warning) {
  const LoadResult lowered = load_yaml(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: cpu, world_size: 2, max: 1MiB}\n");
  BOOST_TEST(lowered.policy.has_value());
  BOOST_TEST(lowered.diagnostics.empty(), messages(lowered.diagnostics));
  const LoadResult own = load_yaml(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: cpu, world_size: 2, max: 1MiB}\n"
      "oneshot:\n"
      "  cells:\n"
      "    - {capability: cpu, world_size: 2, buffers: registered, max: 2MiB}\n");
  BOOST_TEST(own.policy.has_value());
  const std::string m = messages(own.diagnostics);
  BOOST_TEST(m.find("site.yaml:7:7: warning: one-shot cap 2 MiB") != std::string::npos, m);
  BOOST_TEST(m.find("default.yaml") == std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(the_most_specific_cell_wins_with_buffers_counting_as_a_key) {
  const Policy p = must_load(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: cpu, world_size: 4, buffers: registered, max: 8MiB}\n"
      "  - {capability: cpu, world_size: 4, buffers: registered, pattern: allreduce, "
      "max: 16MiB}\n"
      "  - {capability: cpu, world_size: 4, buffers: copied, max: 1MiB}\n");
  check(p, cpu(4, 1, true), Algorithm::kOneshot, 8 * kMiB);
  check(p, cpu(4, 1, true, Pattern::kAllreduce), Algorithm::kOneshot, 16 * kMiB);
  check(p, cpu(4, 1, false), Algorithm::kOneshot, 1 * kMiB);
  // Above its cap a registered call is not fused.
  BOOST_TEST(!p.decide(cpu(4, 8 * kMiB + 2, true)).fused);
  BOOST_TEST(!p.explain(cpu(4, 8 * kMiB + 2, true)).fused);
}

BOOST_AUTO_TEST_CASE(equally_specific_overlapping_buffers_cells_are_a_conflict_at_file_line_col) {
  const LoadResult r = load_yaml(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: cpu, world_size: 2, residual: replicated, max: 8MiB}\n"
      "  - {capability: cpu, world_size: 2, buffers: registered, max: 16MiB}\n");
  BOOST_TEST(!r.policy.has_value());
  const std::string m = messages(r.diagnostics);
  BOOST_TEST(m.find("site.yaml:5:5") != std::string::npos, m);
  BOOST_TEST(m.find("buffers registered") != std::string::npos, m);
  BOOST_TEST(m.find("a call can match both") != std::string::npos, m);

  // Registered and copied never overlap; neither do a distinct residual and
  // a replicated one, which is how `arbiter tune` keys registered cells.
  const Policy p = must_load(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: cpu, world_size: 2, buffers: registered, max: 8MiB}\n"
      "  - {capability: cpu, world_size: 2, buffers: copied, max: 16MiB}\n"
      "  - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, residual: replicated, "
      "max: 4MiB}\n"
      "  - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, residual: distinct, "
      "buffers: registered, max: 2MiB}\n");
  Request replicated = cpu(2, 1, true);
  replicated.residual_replicated = true;
  BOOST_TEST(p.decide(replicated).cap == 4 * kMiB);
  BOOST_TEST(p.decide(cpu(2, 1, true)).cap == 2 * kMiB);
  BOOST_TEST(p.decide(cpu(2, 1, false)).cap == 16 * kMiB);
  BOOST_TEST(p.decide(cpu(2, 1, true, Pattern::kAllreduce)).cap == 8 * kMiB);
  BOOST_TEST(p.decide(cpu(2, 1, false, Pattern::kAllreduce)).cap == 16 * kMiB);
}

BOOST_AUTO_TEST_CASE(an_unknown_buffers_value_names_the_known_ones) {
  const LoadResult r = load_yaml(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: cpu, world_size: 2, buffers: pinned, max: 8MiB}\n");
  BOOST_TEST(!r.policy.has_value());
  const std::string m = messages(r.diagnostics);
  BOOST_TEST(m.find("site.yaml:4:47") != std::string::npos, m);
  BOOST_TEST(m.find("pinned") != std::string::npos, m);
  BOOST_TEST(m.find("registered") != std::string::npos, m);
  BOOST_TEST(m.find("copied") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(a_registered_cell_below_capability_90_is_a_warning_and_the_tables_load) {
  const LoadResult r = load_yaml(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: 80, world_size: 2, buffers: registered, max: 8MiB}\n"
      "  - {capability: 90, world_size: 2, buffers: registered, max: 8MiB}\n");
  BOOST_TEST(r.policy.has_value());
  const std::string m = messages(r.diagnostics);
  BOOST_TEST(m.find("site.yaml:4:5: warning") != std::string::npos, m);
  BOOST_TEST(m.find("never applies on capability 80") != std::string::npos, m);
  // trtllm registers memory from capability 90 on: that cell is meaningful.
  BOOST_TEST(m.find("site.yaml:5:") == std::string::npos, m);
}
