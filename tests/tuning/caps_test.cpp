// Grouping measurements and deriving caps: crossovers found at measured
// sizes only, noise that stops a cap, margins, duplicates, and the data that
// is refused.
#define BOOST_TEST_MODULE tuning_caps
#include <boost/test/unit_test.hpp>

#include "arbiter/size.h"
#include "arbiter/tuning/groups.h"
#include "tune_data.h"

using namespace arbiter;
using namespace arbiter::tuning;
using namespace arbiter::test;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A group at 256 KiB .. 1 MiB: fused one-shot and an nccl baseline with the
// given latencies.
std::string two_option_csv(const double fused[3], const double unfused[3]) {
  std::string csv = kHeader;
  const int tokens[] = {32, 64, 128};
  for (int i = 0; i < 3; ++i) {
    const std::string shape = "100,8,1,bf16,4096," + std::to_string(tokens[i]) + "," +
                              std::to_string(tokens[i] * 8192) + ",residual_rmsnorm,";
    csv += shape + "trtllm,oneshot,1," + std::to_string(fused[i]) + "\n";
    csv += shape + "nccl,native,0," + std::to_string(unfused[i]) + "\n";
  }
  return csv;
}

}  // namespace

BOOST_AUTO_TEST_CASE(groups_are_keyed_by_topology_pattern_and_dtype) {
  const auto data = load_fixtures({"crossover.csv", "noisy.csv", "dtypes.csv"});
  BOOST_TEST(data->grouping.refusals.empty());
  BOOST_TEST_REQUIRE(data->grouping.groups.size() == 4u);  // dtypes.csv holds two
  const Group& g = data->grouping.groups[0];               // sorted: capability 100 first
  BOOST_TEST(g.key.to_string() == "capability 100, world size 4, 1 node, residual_rmsnorm, bf16");
  BOOST_TEST(g.curves.size() == 3u);
  BOOST_TEST(g.sizes.size() == 9u);
  BOOST_TEST(g.device == "NVIDIA B200");
  BOOST_TEST(data->grouping.groups[3].key.to_string() ==
             "capability 103, world size 8, 1 node, allreduce, fp16");
  BOOST_TEST(data->grouping.groups[3].device == "NVIDIA B300");  // the device column
}

BOOST_AUTO_TEST_CASE(known_crossovers_give_the_fusion_and_one_shot_caps) {
  const auto data = load_fixtures({"crossover.csv"});
  const Group& g = data->only_group();
  const Cap fusion = fusion_cap(g, 0);
  BOOST_TEST((fusion.kind == Cap::Kind::kBytes));
  BOOST_TEST(fusion.bytes == 4 * kMiB);
  BOOST_TEST(fusion.lost_at == 8 * kMiB);
  BOOST_TEST(fusion.lost_us == 118.0);
  BOOST_TEST(fusion.winner_us == 100.0);
  BOOST_TEST(fusion.winner == "nccl native unfused");
  BOOST_TEST(fusion.compared.size() == 9u);
  BOOST_TEST(fusion.text() ==
             "4 MiB (fused lost at 8 MiB: 118 us against 100 us for nccl native unfused)");

  const Cap oneshot = oneshot_cap(g, 0);
  BOOST_TEST((oneshot.kind == Cap::Kind::kBytes));
  BOOST_TEST(oneshot.bytes == 256 * kKiB);
  BOOST_TEST(oneshot.lost_at == 512 * kKiB);
  BOOST_TEST(oneshot.winner == "trtllm twoshot fused");
}

BOOST_AUTO_TEST_CASE(a_margin_lets_fused_lose_by_that_much) {
  const auto data = load_fixtures({"crossover.csv"});
  const Group& g = data->only_group();
  // At 8 MiB two-shot takes 118 us against 100 us; at 16 MiB 220 against 170.
  BOOST_TEST(fusion_cap(g, 5).bytes == 4 * kMiB);
  BOOST_TEST(fusion_cap(g, 17.9).bytes == 4 * kMiB);
  BOOST_TEST(fusion_cap(g, 18).bytes == 8 * kMiB);
  BOOST_TEST(fusion_cap(g, 20).bytes == 8 * kMiB);
  BOOST_TEST(fusion_cap(g, 30).bytes == 16 * kMiB);
  BOOST_TEST(contains(fusion_cap(g, 30).text(), "fused won at every compared size"));
  // One-shot 22 us against two-shot 20 us at 512 KiB: 10% slower.
  BOOST_TEST(oneshot_cap(g, 10).bytes == 512 * kKiB);
}

BOOST_AUTO_TEST_CASE(a_small_loss_among_wins_stays_inside_the_cap) {
  const auto data = load_fixtures({"noisy.csv"});
  const Group& g = data->only_group();
  const Cap fusion = fusion_cap(g, 0);
  // Fused loses at 1 MiB by 1/28 and wins again at 2 and 4 MiB by 4/36 and
  // 4/58: one cap at 4 MiB costs less than one at 512 KiB.
  BOOST_TEST(fusion.bytes == 4 * kMiB);
  BOOST_TEST(fusion.lost_at == 8 * kMiB);
  BOOST_TEST(fusion.lost_inside == std::vector<std::uint64_t>{1 * kMiB});
  BOOST_TEST(fusion.text() ==
             "4 MiB (fused lost at 8 MiB: 104 us against 95 us for nccl native unfused; kept "
             "where it lost at 1 MiB, as one cap fits the wins around it better)");
  BOOST_TEST(fusion_cap(g, 5).bytes == 4 * kMiB);  // 29 <= 1.05 x 28
  BOOST_TEST(fusion_cap(g, 5).lost_inside.empty());
  BOOST_TEST(oneshot_cap(g, 0).bytes == 512 * kKiB);
  BOOST_TEST(oneshot_cap(g, 5).bytes == 512 * kKiB);  // 31 > 1.05 x 29
}

BOOST_AUTO_TEST_CASE(ties_go_to_fused) {
  // Published H100 numbers: 10 us fused against 10 us unfused at 512 KiB.
  const auto data = load_fixtures({"published_vllm22086_h100_tp2.csv"});
  const Group& g = data->only_group();
  BOOST_TEST(g.curves.size() == 4u);
  const Cap fusion = fusion_cap(g, 0);
  BOOST_TEST(fusion.bytes == 512 * kKiB);
  BOOST_TEST(fusion.winner == "baseline native_compiled unfused");
  const Cap oneshot = oneshot_cap(g, 0);
  BOOST_TEST(oneshot.bytes == 1 * kMiB);  // two-shot not measured at 2 MiB
  BOOST_TEST(oneshot.compared.size() == 2u);

  const auto gb300 = load_fixtures({"gb300_ws16_vllm46392.csv"});
  const Cap tie = fusion_cap(gb300->only_group(), 0);
  BOOST_TEST(tie.bytes == 4681ull * 7168 * 2);  // "64 MiB": 63.998 MiB, measured
  BOOST_TEST(tie.text().starts_with("65534 KiB ~ 63.998 MiB (fused lost at 131068 KiB"),
             tie.text());
}

BOOST_AUTO_TEST_CASE(a_loss_within_noise_at_the_smallest_size_does_not_turn_fusion_off) {
  // A field report: at margin 0, 2.8% lost at the smallest size made the cap
  // `off`, and the tuned tables then left every larger size unfused where
  // fused won by 1.4-1.7x.
  const double fused[] = {10.28, 14, 18}, unfused[] = {10, 20, 30};
  const auto data = parse_csv(two_option_csv(fused, unfused));
  const Cap cap = fusion_cap(data->only_group(), 0);
  BOOST_TEST((cap.kind == Cap::Kind::kBytes));
  BOOST_TEST(cap.bytes == 1 * kMiB);
  BOOST_TEST(cap.lost_at == 0u);
  BOOST_TEST(cap.text() ==
             "1 MiB (the largest compared size; kept where it lost at 256 KiB, as one cap fits "
             "the wins around it better; nothing is known above)");
}

BOOST_AUTO_TEST_CASE(fused_losing_at_the_smallest_size_is_off) {
  const double fused[] = {12, 14, 20}, unfused[] = {11, 15, 18};
  const auto data = parse_csv(two_option_csv(fused, unfused));
  const Cap cap = fusion_cap(data->only_group(), 0);
  BOOST_TEST((cap.kind == Cap::Kind::kOff));
  BOOST_TEST(cap.lost_at == 256 * kKiB);
  BOOST_TEST(cap.text().starts_with("off (fused lost at the smallest compared size, 256 KiB"));
  // Within a 10% margin it is not.
  BOOST_TEST(fusion_cap(data->only_group(), 10).bytes == 512 * kKiB);
}

BOOST_AUTO_TEST_CASE(a_group_without_an_unfused_option_has_no_fusion_cap) {
  const auto data = load_fixtures({"no_baseline.csv"});
  const Group& g = data->only_group();
  const Cap fusion = fusion_cap(g, 0);
  BOOST_TEST((fusion.kind == Cap::Kind::kNone));
  BOOST_TEST(fusion.text().starts_with("none (no unfused option was measured"), fusion.text());
  const Cap oneshot = oneshot_cap(g, 0);
  BOOST_TEST(oneshot.bytes == 1 * kMiB);
  BOOST_TEST(oneshot.lost_at == 2 * kMiB);
}

BOOST_AUTO_TEST_CASE(the_one_shot_split_is_for_single_node_trtllm_only) {
  const auto gb300 = load_fixtures({"gb300_ws16_vllm46392.csv"});
  const Cap multi = oneshot_cap(gb300->only_group(), 0);
  BOOST_TEST((multi.kind == Cap::Kind::kNone));
  BOOST_TEST(contains(multi.why, "single-node trtllm only"));
  const auto agree = load_fixtures({"duplicates_agree.csv"});
  BOOST_TEST(oneshot_cap(agree->only_group(), 0).why ==
             "trtllm one-shot and two-shot were not both measured");
  const auto skipped = load_fixtures({"skipped.csv"});
  BOOST_TEST(oneshot_cap(skipped->only_group(), 0).why ==
             "trtllm one-shot and two-shot were never measured at one size");
  BOOST_TEST(fusion_cap(skipped->only_group(), 0).bytes == 512 * kKiB);
}

BOOST_AUTO_TEST_CASE(duplicates_that_agree_are_combined_by_their_median) {
  const auto data = load_fixtures({"duplicates_agree.csv"});
  const Group& g = data->only_group();
  const Curve* one = g.curve(Option{"trtllm", "oneshot", true});
  const Curve* nccl = g.curve(Option{"nccl", "native", false});
  BOOST_TEST_REQUIRE(one);
  BOOST_TEST_REQUIRE(nccl);
  BOOST_TEST(one->at(256 * kKiB)->rows.size() == 3u);
  BOOST_TEST(one->at(256 * kKiB)->latency_us == 11.0);   // 10, 12, 11
  BOOST_TEST(one->at(512 * kKiB)->latency_us == 15.0);   // 14, 15, 27: the mean would lose
  BOOST_TEST(nccl->at(512 * kKiB)->latency_us == 17.5);  // 17, 18
  BOOST_TEST(one->at(1 * kMiB)->latency_us == 25.0);
  BOOST_TEST(fusion_cap(g, 0).bytes == 512 * kKiB);
}

BOOST_AUTO_TEST_CASE(duplicates_that_disagree_wildly_are_refused_naming_the_rows) {
  const auto data = load_fixtures({"duplicates_disagree.csv"});
  BOOST_TEST(data->grouping.groups.empty());
  BOOST_TEST_REQUIRE(data->grouping.refusals.size() == 1u);
  const Diagnostic& d = data->grouping.refusals[0];
  BOOST_TEST(d.line == 6u);
  BOOST_TEST(contains(d.message, "trtllm oneshot fused at 512 KiB: duplicate rows disagree"),
             d.message);
  BOOST_TEST(contains(d.message, "14 us at "), d.message);
  BOOST_TEST(contains(d.message, "duplicates_disagree.csv:6"), d.message);
  BOOST_TEST(contains(d.message, "30 us at "), d.message);
  BOOST_TEST(contains(d.message, "duplicates_disagree.csv:7"), d.message);
  BOOST_TEST(contains(d.message, "2.14x the fastest, more than 2x"), d.message);
}

BOOST_AUTO_TEST_CASE(exactly_twice_as_slow_is_still_a_duplicate) {
  const std::string shape = "90,2,1,bf16,4096,32,262144,allreduce,";
  const std::string shape2 = "90,2,1,bf16,4096,64,524288,allreduce,";
  const auto data = parse_csv(std::string(kHeader) + shape + "trtllm,oneshot,1,10\n" + shape +
                              "trtllm,oneshot,1,20\n" + shape2 + "trtllm,oneshot,1,12\n");
  BOOST_TEST(data->grouping.refusals.empty());
  BOOST_TEST(data->only_group().curves[0].points[0].latency_us == 15.0);
}

BOOST_AUTO_TEST_CASE(a_group_fed_by_two_devices_is_refused) {
  BOOST_TEST(load_fixtures({"mixed_a.csv"})->grouping.refusals.empty());
  BOOST_TEST(load_fixtures({"mixed_b.csv"})->grouping.refusals.empty());
  const auto data = load_fixtures({"mixed_a.csv", "mixed_b.csv"});
  BOOST_TEST(data->grouping.groups.empty());
  BOOST_TEST_REQUIRE(data->grouping.refusals.size() == 1u);
  const std::string& m = data->grouping.refusals[0].message;
  BOOST_TEST(contains(m, "rows name different devices"), m);
  BOOST_TEST(contains(m, "\"NVIDIA H100 80GB HBM3\" ("), m);
  BOOST_TEST(contains(m, "mixed_a.csv:5"), m);
  BOOST_TEST(contains(m, "\"NVIDIA H200\" ("), m);
  BOOST_TEST(contains(m, "mixed_b.csv:5"), m);
}

BOOST_AUTO_TEST_CASE(a_device_column_that_changes_within_a_file_is_refused) {
  const std::string header =
      std::string(kHeader).insert(std::string(kHeader).size() - 1, ",device");
  const auto data = parse_csv(header +
                              "90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10,A\n"
                              "90,2,1,bf16,4096,64,524288,allreduce,trtllm,oneshot,1,12,B\n");
  BOOST_TEST(data->grouping.refusals.size() == 1u);
  // Rows without a device do not conflict with rows that have one.
  const auto unknown = parse_csv(header +
                                 "90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10,A\n"
                                 "90,2,1,bf16,4096,64,524288,allreduce,trtllm,oneshot,1,12,\n");
  BOOST_TEST(unknown->grouping.refusals.empty());
  BOOST_TEST(unknown->only_group().device == "A");
}

BOOST_AUTO_TEST_CASE(a_single_size_is_refused) {
  const auto data = load_fixtures({"single_size.csv"});
  BOOST_TEST(data->grouping.groups.empty());
  BOOST_TEST_REQUIRE(data->grouping.refusals.size() == 1u);
  BOOST_TEST(data->grouping.refusals[0].line == 3u);
  BOOST_TEST(data->grouping.refusals[0].message ==
             "capability 100, world size 2, 1 node, residual_rmsnorm, bf16: only one message "
             "size was measured (1 MiB); caps need at least 2");
}

BOOST_AUTO_TEST_CASE(a_refused_group_leaves_the_others) {
  const auto data = load_fixtures({"crossover.csv", "single_size.csv"});
  BOOST_TEST(data->grouping.groups.size() == 1u);
  BOOST_TEST(data->grouping.refusals.size() == 1u);
}

// Calls measured with a replicated residual are a group of their own: their
// crossover differs, and the tables key cells by it.
BOOST_AUTO_TEST_CASE(a_replicated_residual_is_a_group_of_its_own) {
  const auto data = load_fixtures({"replicated_cpu.csv"});
  BOOST_TEST(data->grouping.refusals.empty());
  BOOST_TEST_REQUIRE(data->grouping.groups.size() == 2u);
  const Group& distinct = data->grouping.groups[0];  // sorted: distinct first
  const Group& replicated = data->grouping.groups[1];
  BOOST_TEST((distinct.key.residual == Residual::kDistinct));
  BOOST_TEST(!distinct.key.replicated());
  BOOST_TEST(replicated.key.replicated());
  BOOST_TEST(distinct.key.to_string() ==
             "capability cpu, world size 2, 1 node, residual_rmsnorm, bf16");
  BOOST_TEST(replicated.key.to_string() ==
             "capability cpu, world size 2, 1 node, residual_rmsnorm, bf16, residual replicated");
  // Each group has its own split: 128 KiB without, 8 KiB with.
  BOOST_TEST(split_cap(distinct, "shm", 0).bytes == 128 * kKiB);
  BOOST_TEST(split_cap(replicated, "shm", 0).bytes == 8 * kKiB);
  BOOST_TEST(split_cap(replicated, "shm", 0).lost_at == 32 * kKiB);
  // allreduce has no residual.
  const auto allreduce = parse_csv(std::string(kHeader) +
                                   "cpu,2,1,bf16,4096,1,8192,allreduce,shm,oneshot,1,10\n"
                                   "cpu,2,1,bf16,4096,2,16384,allreduce,shm,oneshot,1,12\n");
  BOOST_TEST(!allreduce->only_group().key.residual.has_value());
}

// With the option the tables run: its curve alone is weighed, sizes where it
// was not measured are left out, and a choice never measured gives no cap
// (rather than one from an option the tables would not run).
BOOST_AUTO_TEST_CASE(the_fusion_cap_weighs_the_option_the_tables_run) {
  const auto data = load_fixtures({"other_fused_backend.csv"});
  const Group& g = data->only_group();
  BOOST_TEST(fusion_cap(g, 0).bytes == 16 * kMiB);  // mnnvl's curve, the best fused
  const FusedRun trtllm = [](std::uint64_t b) -> std::optional<Option> {
    return Option{"trtllm", b <= 256 * kKiB ? "oneshot" : "twoshot", true};
  };
  const Cap cap = fusion_cap(g, 0, trtllm);
  BOOST_TEST((cap.kind == Cap::Kind::kBytes));
  BOOST_TEST(cap.bytes == 1 * kMiB);
  BOOST_TEST(cap.lost_at == 2 * kMiB);
  BOOST_TEST(cap.lost_us == 60.0);

  const FusedRun gaps = [](std::uint64_t b) -> std::optional<Option> {
    if (b == 2 * kMiB) return Option{"mnnvl", "oneshot", true};  // never measured
    return Option{"trtllm", "twoshot", true};
  };
  const Cap skipped = fusion_cap(g, 0, gaps);
  BOOST_TEST(skipped.compared.size() == 8u);
  BOOST_TEST(skipped.bytes == 1 * kMiB);
  BOOST_TEST(skipped.lost_at == 4 * kMiB);

  const FusedRun unmeasured = [](std::uint64_t) -> std::optional<Option> {
    return Option{"mnnvl", "oneshot", true};
  };
  const Cap none = fusion_cap(g, 0, unmeasured);
  BOOST_TEST((none.kind == Cap::Kind::kNone));
  BOOST_TEST(none.why ==
             "the tables run mnnvl oneshot fused here, never measured at a size where an "
             "unfused option was; measure it");

  // No fused backend eligible (a multi-node group without --nvlink-domain):
  // the best fused option, as without `runs`.
  const FusedRun ineligible = [](std::uint64_t) { return std::optional<Option>{}; };
  BOOST_TEST(fusion_cap(g, 0, ineligible).bytes == 16 * kMiB);
}
