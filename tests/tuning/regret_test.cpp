// Regret: the option the tables choose against the best measured, with
// expected values computed by hand from the fixtures.
#define BOOST_TEST_MODULE tuning_regret
#include <boost/test/tools/floating_point_comparison.hpp>
#include <boost/test/unit_test.hpp>

#include "arbiter/size.h"
#include "arbiter/tuning/overlay.h"
#include "arbiter/tuning/regret.h"
#include "tune_data.h"

using namespace arbiter;
using namespace arbiter::tuning;
using namespace arbiter::test;
namespace tt = boost::test_tools;

namespace {

std::string overlay_of(const TuneData& data, double margin = 0) {
  OverlayOptions options;
  options.margin_pct = margin;
  options.date = "2025-01-01";
  return make_overlay(data.grouping.groups, data.files, options).yaml;
}

}  // namespace

BOOST_AUTO_TEST_CASE(crossover_regret_of_the_default_tables) {
  const auto data = load_fixtures({"crossover.csv"});
  const Regret r = regret(tables_with(), data->only_group(), TopologyFlags{});
  BOOST_TEST_REQUIRE(r.points.size() == 9u);
  // Default (100, 4): fused up to 32 MiB, one-shot up to 4 MiB.
  const double expected[] = {
      0, 0, 0, 10.0, 100.0 * 11 / 27, 75.0, 100.0 * 64 / 66, 18.0, 100.0 * 5 / 17};
  for (std::size_t i = 0; i < 9; ++i) {
    BOOST_TEST_CONTEXT(format_size(r.points[i].bytes)) {
      BOOST_TEST_REQUIRE(r.points[i].regret_pct.has_value());
      BOOST_TEST(*r.points[i].regret_pct == expected[i], tt::tolerance(1e-9));
    }
  }
  BOOST_TEST(r.points[3].chosen == "trtllm oneshot fused");
  BOOST_TEST(*r.points[3].chosen_us == 22.0);
  BOOST_TEST(r.points[3].best == "trtllm twoshot fused");
  BOOST_TEST(r.points[3].best_us == 20.0);
  BOOST_TEST(r.points[7].chosen == "trtllm twoshot fused");
  BOOST_TEST(r.points[7].best == "nccl native unfused");
  BOOST_TEST(r.not_measured == 0);
  BOOST_TEST(*r.mean_pct == 30.013578046257788, tt::tolerance(1e-9));
  BOOST_TEST(*r.worst_pct == 100.0 * 64 / 66, tt::tolerance(1e-9));
  BOOST_TEST(r.worst_bytes == 4 * kMiB);
}

BOOST_AUTO_TEST_CASE(the_tuned_overlay_removes_the_crossover_regret) {
  const auto data = load_fixtures({"crossover.csv"});
  const Regret r = regret(tables_with(overlay_of(*data)), data->only_group(), TopologyFlags{});
  BOOST_TEST(*r.mean_pct == 0.0);
  BOOST_TEST(*r.worst_pct == 0.0);
  BOOST_TEST(r.points[3].chosen == "trtllm twoshot fused");  // 512 KiB: above 256 KiB
  BOOST_TEST(r.points[6].chosen == "trtllm twoshot fused");  // 4 MiB: the cap, inclusive
  BOOST_TEST(r.points[7].chosen == "nccl native unfused");   // 8 MiB
  BOOST_TEST(r.points[7].chosen_measured == "nccl native unfused");
}

BOOST_AUTO_TEST_CASE(noisy_data_keeps_some_regret_after_tuning) {
  const auto data = load_fixtures({"noisy.csv"});
  const Group& g = data->only_group();
  // Default (103, 8): fused and one-shot up to 2 MiB.
  const Regret before = regret(tables_with(), g, TopologyFlags{});
  BOOST_TEST(*before.mean_pct == (100.0 * 3 / 28 + 100.0 * 19 / 36 + 100.0 * 4 / 58) / 7,
             tt::tolerance(1e-9));
  BOOST_TEST(*before.worst_pct == 100.0 * 19 / 36, tt::tolerance(1e-9));
  BOOST_TEST(before.worst_bytes == 2 * kMiB);
  // Tuned: fused up to 4 MiB, one-shot up to 512 KiB. Only 1 MiB costs
  // anything (two-shot, 29 us against 28 us unfused): a cap that stopped
  // there would leave 2 and 4 MiB unfused, 40 / 36 and 62 / 58.
  const Regret after = regret(tables_with(overlay_of(*data)), g, TopologyFlags{});
  BOOST_TEST(*after.mean_pct == 100.0 * 1 / 28 / 7, tt::tolerance(1e-9));
  BOOST_TEST(*after.worst_pct == 100.0 * 1 / 28, tt::tolerance(1e-9));
  BOOST_TEST(after.worst_bytes == 1 * kMiB);
  // A 5% margin takes the 1 MiB loss in as well: the same cap.
  const Regret margin = regret(tables_with(overlay_of(*data, 5)), g, TopologyFlags{});
  BOOST_TEST(*margin.worst_pct == 100.0 * 1 / 28, tt::tolerance(1e-9));
  BOOST_TEST(margin.worst_bytes == 1 * kMiB);
}

BOOST_AUTO_TEST_CASE(an_unfused_decision_maps_to_the_best_unfused_row) {
  const auto data = load_fixtures({"published_vllm22086_h100_tp2.csv"});
  const Group& g = data->only_group();
  const Regret before = regret(tables_with(), g, TopologyFlags{});
  BOOST_TEST(*before.mean_pct == (100.0 * 4 / 12 + 100.0 * 13 / 17) / 3, tt::tolerance(1e-9));
  BOOST_TEST(*before.worst_pct == 100.0 * 13 / 17, tt::tolerance(1e-9));
  const Regret after = regret(tables_with(overlay_of(*data)), g, TopologyFlags{});
  BOOST_TEST_REQUIRE(after.points.size() == 3u);
  BOOST_TEST(after.points[1].chosen == "nccl native unfused");
  // The benchmark called the unfused path "baseline": the best one stands for it.
  BOOST_TEST(after.points[1].chosen_measured == "baseline native_compiled unfused");
  BOOST_TEST(*after.points[1].chosen_us == 12.0);
  BOOST_TEST(*after.mean_pct == 0.0);
}

BOOST_AUTO_TEST_CASE(a_choice_that_was_not_measured_is_left_out_of_the_mean) {
  const auto data = load_fixtures({"skipped.csv"});
  const Regret r = regret(tables_with(), data->only_group(), TopologyFlags{});
  BOOST_TEST_REQUIRE(r.points.size() == 3u);
  // 1 MiB: the tables choose trtllm one-shot, whose row was skipped.
  BOOST_TEST(r.points[2].chosen == "trtllm oneshot fused");
  BOOST_TEST(!r.points[2].chosen_us.has_value());
  BOOST_TEST(!r.points[2].regret_pct.has_value());
  BOOST_TEST(r.not_measured == 1);
  BOOST_TEST(*r.mean_pct == 0.0);
}

BOOST_AUTO_TEST_CASE(multi_node_groups_use_the_topology_flags) {
  const auto data = load_fixtures({"gb300_ws16_vllm46392.csv"});
  const Group& g = data->only_group();
  const Request plain = request_at(g, g.sizes.front(), TopologyFlags{});
  BOOST_TEST(plain.nodes == 4u);
  BOOST_TEST(!plain.nvlink_domain);
  BOOST_TEST(!plain.multicast);
  BOOST_TEST(plain.tokens == 256u);
  BOOST_TEST(plain.hidden == 7168u);
  // Without an NVLink domain and multicast mnnvl is not eligible: nccl runs.
  const Regret without = regret(tables_with(), g, TopologyFlags{});
  BOOST_TEST(without.points[0].chosen == "nccl native unfused");
  BOOST_TEST((without.points[0].decision.reason == Reason::kNoEligibleBackend));
  BOOST_TEST(*without.mean_pct == (50.0 + 37.5 + 100.0 * 25 / 85 + 18.75 + 100.0 * 20 / 300) / 7,
             tt::tolerance(1e-9));
  const Regret with = regret(tables_with(), g, TopologyFlags{true, true});
  BOOST_TEST(with.points[0].chosen == "mnnvl twoshot fused");
  BOOST_TEST(*with.mean_pct == 0.0);
}

BOOST_AUTO_TEST_CASE(the_request_takes_the_fewest_tokens_measured_at_a_size) {
  const auto data = load_fixtures({"duplicates_agree.csv"});
  const Request r = request_at(data->only_group(), 256 * kKiB, TopologyFlags{});
  BOOST_TEST(r.tokens == 16u);  // hidden 8192 rather than 4096
  BOOST_TEST(r.hidden == 8192u);
  BOOST_TEST(r.nvlink_domain);  // one node: NVLink, as `arbiter decide` assumes
  BOOST_TEST(r.message_bytes == 256 * kKiB);
  BOOST_TEST((r.pattern == Pattern::kResidualRmsnorm));
}

BOOST_AUTO_TEST_CASE(allowed_backends_of_the_current_tables_count) {
  // ARBITER_BACKENDS=nccl: nothing fused may run.
  const auto data = load_fixtures({"crossover.csv"});
  LoadOptions options;
  options.backends_env = "nccl";
  const Policy nccl_only = Policy::load_or_throw(options);
  const Regret r = regret(nccl_only, data->only_group(), TopologyFlags{});
  BOOST_TEST(r.points[0].chosen == "nccl native unfused");
  BOOST_TEST(*r.points[0].regret_pct == 150.0, tt::tolerance(1e-9));  // 20 us against 8
  BOOST_TEST(*r.points[8].regret_pct == 0.0);
}
