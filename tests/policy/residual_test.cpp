// The replicated residual as a table key: cells keyed by `residual:` match
// only calls that say so, the most specific cell wins, conflicts and keys
// that can never match are errors at file:line:col, and cpu one-shot cells
// steer shm's one-shot/two-shot split.
#define BOOST_TEST_MODULE policy_residual
#include <boost/test/unit_test.hpp>

#include "print.h"
#include "site_yaml.h"

#include "arbiter/policy.h"
#include "arbiter/size.h"

using namespace arbiter;
using namespace arbiter::test;

namespace {

Request cpu(std::uint32_t ws, std::uint64_t bytes, bool replicated,
            Pattern pattern = Pattern::kResidualRmsnorm) {
  Request r;
  r.capability = Capability::cpu();
  r.world_size = ws;
  r.pattern = pattern;
  r.residual_replicated = replicated;
  r.message_bytes = bytes;
  return r;
}

Request h100(std::uint32_t ws, std::uint64_t bytes, bool replicated, Pattern pattern) {
  Request r = cpu(ws, bytes, replicated, pattern);
  r.capability = Capability::sm(90);
  return r;
}

// decide() and explain() agree, and the decision is the one expected.
void check(const Policy& p, const Request& r, Backend backend, Algorithm algorithm) {
  const Decision fast = p.decide(r);
  const Decision slow = p.explain(r);
  BOOST_TEST(fast.backend == backend);
  BOOST_TEST(fast.algorithm == algorithm);
  BOOST_TEST(slow.backend == fast.backend);
  BOOST_TEST(slow.algorithm == fast.algorithm);
  BOOST_TEST(slow.cap == fast.cap);
  BOOST_TEST(slow.oneshot_origin == fast.oneshot_origin);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_residual_keyed_fusion_cell_applies_only_to_replicated_calls) {
  const Policy p = must_load(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: 90, world_size: 2, pattern: residual_rmsnorm, residual: replicated, "
      "max: 128MiB}\n");
  // The default cell (64 MiB) still covers the distinct residual.
  const std::uint64_t size = 100 * kMiB;
  BOOST_TEST(!p.decide(h100(2, size, false, Pattern::kResidualRmsnorm)).fused);
  BOOST_TEST(p.decide(h100(2, size, true, Pattern::kResidualRmsnorm)).fused);
  BOOST_TEST(p.explain(h100(2, size, true, Pattern::kResidualRmsnorm)).fused);
  BOOST_TEST(p.decide(h100(2, size, true, Pattern::kResidualRmsnorm)).cap == 128 * kMiB);
  // Other residual patterns are not keyed by this cell.
  BOOST_TEST(!p.decide(h100(2, size, true, Pattern::kResidualRmsnormFp8)).fused);
}

BOOST_AUTO_TEST_CASE(a_residual_key_never_matches_allreduce_even_when_the_flag_is_set) {
  const Policy p = must_load(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: 90, world_size: 2, residual: replicated, max: 128MiB}\n");
  const std::uint64_t size = 100 * kMiB;
  BOOST_TEST(p.decide(h100(2, size, true, Pattern::kResidualRmsnormFp8)).fused);
  BOOST_TEST(!p.decide(h100(2, size, true, Pattern::kAllreduce)).fused);
  BOOST_TEST(!p.explain(h100(2, size, true, Pattern::kAllreduce)).fused);
}

BOOST_AUTO_TEST_CASE(the_most_specific_cell_wins_with_residual_counting_as_a_key) {
  const Policy p = must_load(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: 90, world_size: 4, residual: replicated, max: 8MiB}\n"
      "  - {capability: 90, world_size: 4, residual: replicated, dtype: bf16, max: 16MiB}\n"
      "  - {capability: 90, world_size: 4, residual: distinct, max: 1MiB}\n");
  BOOST_TEST(p.decide(h100(4, 1, true, Pattern::kResidualRmsnorm)).cap == 16 * kMiB);
  Request fp16 = h100(4, 1, true, Pattern::kResidualRmsnorm);
  fp16.dtype = Dtype::kFp16;
  BOOST_TEST(p.decide(fp16).cap == 8 * kMiB);
  BOOST_TEST(p.decide(h100(4, 1, false, Pattern::kResidualRmsnorm)).cap == 1 * kMiB);
  BOOST_TEST(p.explain(h100(4, 1, false, Pattern::kResidualRmsnorm)).cap == 1 * kMiB);
  // allreduce has no residual: the default cell (2 MiB) applies.
  BOOST_TEST(p.decide(h100(4, 1, true, Pattern::kAllreduce)).cap == 2 * kMiB);
}

BOOST_AUTO_TEST_CASE(equally_specific_overlapping_residual_cells_are_a_conflict_at_file_line_col) {
  const LoadResult r = load_yaml(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: 90, world_size: 2, residual: replicated, max: 8MiB}\n"
      "  - {capability: 90, world_size: 2, dtype: bf16, max: 16MiB}\n");
  BOOST_TEST(!r.policy.has_value());
  const std::string m = messages(r.diagnostics);
  BOOST_TEST(m.find("site.yaml:5:5") != std::string::npos, m);
  BOOST_TEST(m.find("residual replicated") != std::string::npos, m);
  BOOST_TEST(m.find("a call can match both") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(replicated_and_distinct_cells_do_not_conflict) {
  const Policy p = must_load(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: 90, world_size: 2, residual: replicated, max: 8MiB}\n"
      "  - {capability: 90, world_size: 2, residual: distinct, max: 16MiB}\n");
  BOOST_TEST(p.decide(h100(2, 1, true, Pattern::kResidualRmsnorm)).cap == 8 * kMiB);
  BOOST_TEST(p.decide(h100(2, 1, false, Pattern::kResidualRmsnorm)).cap == 16 * kMiB);
}

BOOST_AUTO_TEST_CASE(the_same_residual_keys_twice_is_an_error) {
  const LoadResult r = load_yaml(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: 90, world_size: 2, residual: replicated, max: 8MiB}\n"
      "  - {capability: 90, world_size: 2, residual: replicated, max: 4MiB}\n");
  BOOST_TEST(!r.policy.has_value());
  const std::string m = messages(r.diagnostics);
  BOOST_TEST(m.find("site.yaml:5:5") != std::string::npos, m);
  BOOST_TEST(m.find("defined twice") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(a_residual_key_with_pattern_allreduce_is_rejected_at_its_line) {
  const LoadResult r = load_yaml(
      "format: 1\n"
      "provenance: {source: test}\n"
      "oneshot:\n"
      "  default: oneshot\n"
      "  cells:\n"
      "    - {capability: 90, world_size: 2, pattern: allreduce, residual: replicated, max: 1}\n");
  BOOST_TEST(!r.policy.has_value());
  const std::string m = messages(r.diagnostics);
  BOOST_TEST(m.find("site.yaml:6:7") != std::string::npos, m);
  BOOST_TEST(m.find("pattern allreduce has no residual") != std::string::npos, m);
  BOOST_TEST(m.find("drop 'residual'") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(an_unknown_residual_value_names_the_known_ones) {
  const LoadResult r = load_yaml(
      "format: 1\n"
      "provenance: {source: test}\n"
      "fusion:\n"
      "  - {capability: 90, world_size: 2, residual: shared, max: 8MiB}\n");
  BOOST_TEST(!r.policy.has_value());
  const std::string m = messages(r.diagnostics);
  BOOST_TEST(m.find("site.yaml:4:47") != std::string::npos, m);
  BOOST_TEST(m.find("shared") != std::string::npos, m);
  BOOST_TEST(m.find("replicated") != std::string::npos, m);
  BOOST_TEST(m.find("distinct") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(a_cpu_oneshot_cell_sets_shms_split_before_its_threshold) {
  const Policy p = must_load(
      "format: 1\n"
      "provenance: {source: test}\n"
      "oneshot:\n"
      "  default: oneshot\n"
      "  cells:\n"
      "    - {capability: cpu, world_size: 2, residual: replicated, max: 2KiB}\n");
  // Replicated: two-shot above 2 KiB; distinct: the 256 KiB total
  // threshold still applies (one-shot to 128 KiB per rank at 2 ranks).
  check(p, cpu(2, 4 * kKiB, true), Backend::kShm, Algorithm::kTwoshot);
  check(p, cpu(2, 4 * kKiB, false), Backend::kShm, Algorithm::kOneshot);
  check(p, cpu(2, 200 * kKiB, false), Backend::kShm, Algorithm::kTwoshot);
  check(p, cpu(2, 4 * kKiB, true, Pattern::kAllreduce), Backend::kShm, Algorithm::kOneshot);
  check(p, cpu(4, 4 * kKiB, true), Backend::kShm, Algorithm::kOneshot);
  const Decision d = p.explain(cpu(2, 4 * kKiB, true));
  BOOST_TEST(d.oneshot_origin != kNoOrigin);
  const std::string text = p.explain_text(cpu(2, 4 * kKiB, true), d);
  BOOST_TEST(text.find("residual replicated") != std::string::npos, text);
  BOOST_TEST(text.find("one-shot cell (capability cpu, world size 2, residual replicated)") !=
                 std::string::npos,
             text);
}

BOOST_AUTO_TEST_CASE(the_flag_on_a_gpu_threshold_backend_changes_nothing_without_a_cell) {
  // mnnvl's threshold ignores GPU one-shot cells (those are trtllm's caps).
  const Policy p = Policy::load_or_throw(LoadOptions{});
  Request r = h100(16, 256 * kKiB, true, Pattern::kResidualRmsnorm);
  r.capability = Capability::sm(100);
  r.nodes = 4;
  r.multicast = true;
  const Decision with = p.decide(r);
  r.residual_replicated = false;
  const Decision without = p.decide(r);
  BOOST_TEST(with.backend == without.backend);
  BOOST_TEST(with.algorithm == without.algorithm);
}
