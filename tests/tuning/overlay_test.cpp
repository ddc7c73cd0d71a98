// The overlay `arbiter tune` writes: cells keyed so that a measurement
// changes only what it measured, a file the validator accepts without a
// warning, and provenance that says where the numbers came from.
#define BOOST_TEST_MODULE tuning_overlay
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "arbiter/size.h"
#include "arbiter/tuning/overlay.h"
#include "tune_data.h"

using namespace arbiter;
using namespace arbiter::tuning;
using namespace arbiter::test;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

Overlay overlay_of(const TuneData& data, double margin = 0) {
  OverlayOptions options;
  options.margin_pct = margin;
  options.date = "2025-01-01";
  return make_overlay(data.grouping.groups, data.files, options);
}

Decision decide(const Policy& p, std::uint32_t cap, std::uint32_t ws, std::uint32_t nodes,
                Pattern pattern, std::uint64_t bytes, bool mnnvl_topology = false) {
  Request r;
  r.capability = Capability::sm(static_cast<std::uint16_t>(cap));
  r.world_size = ws;
  r.nodes = nodes;
  r.nvlink_domain = true;
  r.multicast = mnnvl_topology;
  r.pattern = pattern;
  r.message_bytes = bytes;
  return p.decide(r);
}

// Every diagnostic of `yaml` validated as a site file, from a real file.
std::vector<Diagnostic> validate_text(const std::string& yaml) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("arbiter_overlay_test_" + std::to_string(getpid()) + ".yaml");
  std::ofstream(path) << yaml;
  std::vector<Diagnostic> d = validate_file(path.string(), /*over_default=*/true);
  std::filesystem::remove(path);
  return d;
}

std::string text_of(const std::vector<Diagnostic>& diagnostics) {
  std::string s;
  for (const Diagnostic& d : diagnostics) s += d.to_string() + "\n";
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(crossover_cells_are_keyed_by_pattern) {
  const auto data = load_fixtures({"crossover.csv"});
  const Overlay o = overlay_of(*data);
  BOOST_TEST_REQUIRE(o.fusion.size() == 1u);
  BOOST_TEST(o.fusion[0].capability.code() == 100);
  BOOST_TEST(o.fusion[0].world_size == 4u);
  // Keyed nodes: 1, so that a one-node measurement leaves multi-node calls alone.
  BOOST_TEST(o.fusion[0].nodes == 1u);
  BOOST_TEST((o.fusion[0].pattern == Pattern::kResidualRmsnorm));
  BOOST_TEST(!o.fusion[0].off);
  BOOST_TEST(o.fusion[0].bytes == 4 * kMiB);
  BOOST_TEST_REQUIRE(o.oneshot.size() == 1u);
  BOOST_TEST(o.oneshot[0].bytes == 256 * kKiB);
  BOOST_TEST(o.notes.empty());
  BOOST_TEST(
      contains(
          o.yaml,
          "\nfusion:\n"
          "  # capability 100, world size 4, 1 node, residual_rmsnorm\n"
          "  # bf16 measured: fusion cap 4 MiB (fused lost at 8 MiB: 118 us against "
          "100 us for nccl native unfused)\n"
          "  - {capability: 100, world_size: 4, nodes: 1, pattern: residual_rmsnorm, max: 4MiB}\n"),
      o.yaml);
  BOOST_TEST(contains(o.yaml,
                      "\noneshot:\n  cells:\n"
                      "    # capability 100, world size 4, 1 node, residual_rmsnorm\n"),
             o.yaml);
  BOOST_TEST(contains(o.yaml,
                      "    - {capability: 100, world_size: 4, pattern: residual_rmsnorm, max: "
                      "256KiB}\n"),
             o.yaml);
  BOOST_TEST(contains(o.yaml, "\nformat: 1\n"));
}

BOOST_AUTO_TEST_CASE(provenance_names_the_sources_device_date_and_margin) {
  const auto data = load_fixtures({"crossover.csv", "noisy.csv"});
  const Overlay o = overlay_of(*data, 2.5);
  BOOST_TEST(contains(o.yaml, "provenance:\n  source: \"benchmark results "), o.yaml);
  BOOST_TEST(contains(o.yaml, "crossover.csv, "), o.yaml);
  BOOST_TEST(contains(o.yaml, "noisy.csv\"\n"), o.yaml);
  BOOST_TEST(contains(o.yaml, "  measured_on: \"NVIDIA B200; NVIDIA B300\"\n"), o.yaml);
  BOOST_TEST(contains(o.yaml, "  date: \"2025-08-01\"\n"), o.yaml);  // from `# date:`
  BOOST_TEST(contains(o.yaml, "  tool: \"arbiter tune "), o.yaml);
  BOOST_TEST(contains(o.yaml, "  notes: \"margin 2.5%: "), o.yaml);
  BOOST_TEST(contains(o.yaml, "  driver: \"570.86\"\n"), o.yaml);
  BOOST_TEST(contains(o.yaml, "  nccl: \"2.26.2\"\n"), o.yaml);  // from `# nccl_version:`
  const auto undated = load_fixtures({"noisy.csv"});
  BOOST_TEST(contains(overlay_of(*undated).yaml, "  date: \"2025-01-01\"\n"));
}

BOOST_AUTO_TEST_CASE(the_overlay_validates_without_a_warning) {
  const auto data =
      load_fixtures({"crossover.csv", "noisy.csv", "no_baseline.csv", "skipped.csv", "dtypes.csv",
                     "published_vllm22086_h100_tp2.csv", "gb300_ws16_vllm46392.csv"});
  BOOST_TEST(data->grouping.refusals.empty());
  for (double margin : {0.0, 5.0, 50.0}) {
    BOOST_TEST_CONTEXT("margin " << margin) {
      const Overlay o = overlay_of(*data, margin);
      const std::vector<Diagnostic> d = validate_text(o.yaml);
      BOOST_TEST(d.empty(), text_of(d) << o.yaml);
    }
  }
}

BOOST_AUTO_TEST_CASE(one_patterns_measurement_leaves_the_others_alone) {
  const auto data = load_fixtures({"crossover.csv"});
  const Policy tuned = tables_with(overlay_of(*data).yaml);
  const Policy defaults = tables_with();
  const auto rms = Pattern::kResidualRmsnorm;
  BOOST_TEST(decide(tuned, 100, 4, 1, rms, 4 * kMiB).fused);
  BOOST_TEST((decide(tuned, 100, 4, 1, rms, 4 * kMiB).algorithm == Algorithm::kTwoshot));
  BOOST_TEST((decide(tuned, 100, 4, 1, rms, 256 * kKiB).algorithm == Algorithm::kOneshot));
  BOOST_TEST(!decide(tuned, 100, 4, 1, rms, 4 * kMiB + 1).fused);
  // The default cell (100, 4) = 32 MiB still holds for the other patterns.
  for (Pattern other : {Pattern::kAllreduce, Pattern::kResidualRmsnormFp8}) {
    BOOST_TEST(decide(tuned, 100, 4, 1, other, 32 * kMiB).fused);
    BOOST_TEST((decide(tuned, 100, 4, 1, other, 4 * kMiB).algorithm ==
                decide(defaults, 100, 4, 1, other, 4 * kMiB).algorithm));
  }
}

BOOST_AUTO_TEST_CASE(multi_node_cells_are_keyed_by_nodes) {
  const auto data = load_fixtures({"gb300_ws16_vllm46392.csv"});
  const Overlay o = overlay_of(*data);
  BOOST_TEST_REQUIRE(o.fusion.size() == 1u);
  BOOST_TEST(o.oneshot.empty());
  BOOST_TEST(contains(o.yaml,
                      "- {capability: 103, world_size: 16, nodes: 4, pattern: allreduce, "
                      "max: 65534KiB}\n"),
             o.yaml);
  const Policy tuned = tables_with(o.yaml);
  const std::uint64_t cap = 4681ull * 7168 * 2;
  BOOST_TEST(decide(tuned, 103, 16, 4, Pattern::kAllreduce, cap, true).fused);
  BOOST_TEST(!decide(tuned, 103, 16, 4, Pattern::kAllreduce, cap + 1, true).fused);
  // Other node counts and patterns keep the default 64 MiB.
  BOOST_TEST(decide(tuned, 103, 16, 2, Pattern::kAllreduce, 64 * kMiB, true).fused);
  BOOST_TEST(decide(tuned, 103, 16, 4, Pattern::kResidualRmsnorm, 64 * kMiB, true).fused);
}

BOOST_AUTO_TEST_CASE(dtypes_that_disagree_write_the_smaller_cap_and_say_so) {
  const auto data = load_fixtures({"dtypes.csv"});
  BOOST_TEST(data->grouping.groups.size() == 2u);
  const Overlay o = overlay_of(*data);
  BOOST_TEST_REQUIRE(o.fusion.size() == 1u);
  BOOST_TEST(o.fusion[0].bytes == 512 * kKiB);
  BOOST_TEST(contains(o.yaml, "  # fp16 measured: fusion cap 512 KiB"), o.yaml);
  BOOST_TEST(contains(o.yaml, "  # bf16 measured: fusion cap 1 MiB"), o.yaml);
  BOOST_TEST(contains(o.yaml,
                      "  # the dtypes disagree: the smaller cap (fp16) is written, since the "
                      "tables are not keyed by dtype\n"),
             o.yaml);
  BOOST_TEST(!contains(o.yaml, ", dtype: "), o.yaml);  // no dtype keys
  BOOST_TEST(std::count_if(o.notes.begin(), o.notes.end(), [](const std::string& n) {
               return contains(n, "the dtypes measured give different fusion caps");
             }) == 1);
}

BOOST_AUTO_TEST_CASE(without_a_baseline_only_the_one_shot_cell_is_written) {
  const auto data = load_fixtures({"no_baseline.csv"});
  const Overlay o = overlay_of(*data);
  BOOST_TEST(o.fusion.empty());
  BOOST_TEST_REQUIRE(o.oneshot.size() == 1u);
  BOOST_TEST(o.oneshot[0].bytes == 1 * kMiB);
  BOOST_TEST((o.oneshot[0].pattern == Pattern::kResidualRmsnormFp8));
  BOOST_TEST(!contains(o.yaml, "\nfusion:"));
  BOOST_TEST_REQUIRE(o.notes.size() == 1u);
  BOOST_TEST(contains(o.notes[0], "no fusion cell (bf16: no unfused option was measured"),
             o.notes[0]);
  BOOST_TEST(contains(o.yaml, "# Not written, or changed:\n#   capability 107"), o.yaml);
}

BOOST_AUTO_TEST_CASE(a_one_shot_cap_above_the_fusion_cap_is_lowered_to_it) {
  const auto data = load_fixtures({"published_vllm22086_h100_tp2.csv"});
  const Overlay o = overlay_of(*data);
  BOOST_TEST_REQUIRE(o.oneshot.size() == 1u);
  BOOST_TEST(o.oneshot[0].bytes == 512 * kKiB);
  BOOST_TEST(contains(o.oneshot[0].comment, "lowered to the fusion cap 512 KiB"));
  BOOST_TEST_REQUIRE(o.notes.size() == 1u);
  BOOST_TEST(contains(o.notes[0], "one-shot cap 1 MiB lowered to the fusion cap 512 KiB"));
}

BOOST_AUTO_TEST_CASE(fusion_losing_everywhere_writes_off) {
  const auto data = parse_csv(std::string(kHeader) +
                              "90,8,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,12\n"
                              "90,8,1,bf16,4096,32,262144,allreduce,nccl,native,0,10\n"
                              "90,8,1,bf16,4096,64,524288,allreduce,trtllm,oneshot,1,15\n"
                              "90,8,1,bf16,4096,64,524288,allreduce,nccl,native,0,16\n");
  const Overlay o = overlay_of(*data);
  BOOST_TEST_REQUIRE(o.fusion.size() == 1u);
  BOOST_TEST(o.fusion[0].off);
  BOOST_TEST(contains(o.yaml, "pattern: allreduce, max: off}"), o.yaml);
  BOOST_TEST(validate_text(o.yaml).empty());
  const Decision d = decide(tables_with(o.yaml), 90, 8, 1, Pattern::kAllreduce, 4096);
  BOOST_TEST(!d.fused);
  BOOST_TEST((d.reason == Reason::kFusionOff));
}

BOOST_AUTO_TEST_CASE(two_shot_winning_from_the_smallest_size_writes_no_one_shot_cell) {
  const auto data = parse_csv(std::string(kHeader) +
                              "90,8,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,12\n"
                              "90,8,1,bf16,4096,32,262144,allreduce,trtllm,twoshot,1,10\n"
                              "90,8,1,bf16,4096,64,524288,allreduce,trtllm,oneshot,1,15\n"
                              "90,8,1,bf16,4096,64,524288,allreduce,trtllm,twoshot,1,11\n");
  const Overlay o = overlay_of(*data);
  BOOST_TEST(o.oneshot.empty());
  BOOST_TEST(std::any_of(o.notes.begin(), o.notes.end(), [](const std::string& n) {
    return contains(n, "no one-shot cell: bf16 one-shot cap off") &&
           contains(n, "a one-shot cell cannot say off");
  }));
}

BOOST_AUTO_TEST_CASE(free_text_from_the_results_is_escaped) {
  const std::string csv = "# device: GPU \"X\" \\ v2\t\xff\n# date: 2025-02-03\n" +
                          std::string(kHeader) +
                          "90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10\n"
                          "90,2,1,bf16,4096,32,262144,allreduce,nccl,native,0,12\n"
                          "90,2,1,bf16,4096,64,524288,allreduce,trtllm,oneshot,1,14\n"
                          "90,2,1,bf16,4096,64,524288,allreduce,nccl,native,0,13\n";
  const auto data = parse_csv(csv, "we:ird\n\"name\".csv");
  const Overlay o = overlay_of(*data);
  BOOST_TEST(contains(o.yaml, "measured_on: \"GPU \\\"X\\\" \\\\ v2 ?\"\n"), o.yaml);
  BOOST_TEST(contains(o.yaml, "source: \"benchmark results we:ird \\\"name\\\".csv\"\n"), o.yaml);
  const std::vector<Diagnostic> d = validate_text(o.yaml);
  BOOST_TEST(d.empty(), text_of(d) << o.yaml);
}

// On cpu, shm reads a one-shot cell before its threshold: each group's
// split is a cell of its own (one threshold for every world size made a
// 2-rank call run two-shot where 2 ranks measured one-shot winning), and
// the threshold is left to the world sizes not measured.
BOOST_AUTO_TEST_CASE(cpu_splits_are_one_shot_cells_per_world_size) {
  const auto data = parse_csv(std::string(kHeader) +
                              // ws 2: one-shot wins to 128 KiB, loses at 256 KiB
                              "cpu,2,1,bf16,1024,32,65536,residual_rmsnorm,shm,oneshot,1,10\n"
                              "cpu,2,1,bf16,1024,32,65536,residual_rmsnorm,shm,twoshot,1,12\n"
                              "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,oneshot,1,20\n"
                              "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,twoshot,1,21\n"
                              "cpu,2,1,bf16,1024,128,262144,residual_rmsnorm,shm,oneshot,1,50\n"
                              "cpu,2,1,bf16,1024,128,262144,residual_rmsnorm,shm,twoshot,1,40\n"
                              // ws 4: wins at 32 KiB, loses at 64 KiB
                              "cpu,4,1,bf16,1024,16,32768,residual_rmsnorm,shm,oneshot,1,10\n"
                              "cpu,4,1,bf16,1024,16,32768,residual_rmsnorm,shm,twoshot,1,15\n"
                              "cpu,4,1,bf16,1024,32,65536,residual_rmsnorm,shm,oneshot,1,30\n"
                              "cpu,4,1,bf16,1024,32,65536,residual_rmsnorm,shm,twoshot,1,20\n");
  const Overlay o = overlay_of(*data);
  BOOST_TEST(o.thresholds.empty());
  BOOST_TEST(!contains(o.yaml, "\nbackends:"), o.yaml);
  BOOST_TEST_REQUIRE(o.oneshot.size() == 2u);
  BOOST_TEST(contains(o.yaml,
                      "    - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, max: "
                      "128KiB}\n"),
             o.yaml);
  BOOST_TEST(contains(o.yaml,
                      "    - {capability: cpu, world_size: 4, pattern: residual_rmsnorm, max: "
                      "32KiB}\n"),
             o.yaml);
  BOOST_TEST(validate_text(o.yaml).empty(), text_of(validate_text(o.yaml)));
  const Policy tuned = tables_with(o.yaml);
  auto algorithm = [&](std::uint32_t ws, std::uint64_t bytes) {
    Request r;
    r.capability = Capability::cpu();
    r.world_size = ws;
    r.message_bytes = bytes;
    return tuned.decide(r).algorithm;
  };
  BOOST_TEST((algorithm(4, 32 * kKiB) == Algorithm::kOneshot));
  BOOST_TEST((algorithm(4, 64 * kKiB) == Algorithm::kTwoshot));
  BOOST_TEST((algorithm(2, 128 * kKiB) == Algorithm::kOneshot));  // as measured at 2 ranks
  BOOST_TEST((algorithm(2, 256 * kKiB) == Algorithm::kTwoshot));
  // 8 ranks were not measured: the default threshold (256 KiB) still rules.
  BOOST_TEST((algorithm(8, 32 * kKiB) == Algorithm::kOneshot));
  BOOST_TEST((algorithm(8, 64 * kKiB) == Algorithm::kTwoshot));
}

// mnnvl (GPU) takes one one-shot threshold for every world size, bytes x
// world size: the smallest split x world size over the groups, so one-shot
// runs only where every group measured it winning.
BOOST_AUTO_TEST_CASE(threshold_backends_get_the_smallest_split_times_world_size) {
  const auto data = parse_csv(std::string(kHeader) +
                              // ws 2: one-shot wins to 128 KiB, loses at 256 KiB -> 256 KiB
                              "100,2,2,bf16,1024,32,65536,residual_rmsnorm,mnnvl,oneshot,1,10\n"
                              "100,2,2,bf16,1024,32,65536,residual_rmsnorm,mnnvl,twoshot,1,12\n"
                              "100,2,2,bf16,1024,64,131072,residual_rmsnorm,mnnvl,oneshot,1,20\n"
                              "100,2,2,bf16,1024,64,131072,residual_rmsnorm,mnnvl,twoshot,1,21\n"
                              "100,2,2,bf16,1024,128,262144,residual_rmsnorm,mnnvl,oneshot,1,50\n"
                              "100,2,2,bf16,1024,128,262144,residual_rmsnorm,mnnvl,twoshot,1,40\n"
                              // ws 4: wins at 32 KiB, loses at 64 KiB -> 128 KiB
                              "100,4,2,bf16,1024,16,32768,residual_rmsnorm,mnnvl,oneshot,1,10\n"
                              "100,4,2,bf16,1024,16,32768,residual_rmsnorm,mnnvl,twoshot,1,15\n"
                              "100,4,2,bf16,1024,32,65536,residual_rmsnorm,mnnvl,oneshot,1,30\n"
                              "100,4,2,bf16,1024,32,65536,residual_rmsnorm,mnnvl,twoshot,1,20\n");
  const Overlay o = overlay_of(*data);
  BOOST_TEST_REQUIRE(o.thresholds.size() == 1u);
  BOOST_TEST(o.thresholds[0].backend == "mnnvl");
  BOOST_TEST(o.thresholds[0].bytes == 128 * kKiB);
  BOOST_TEST(contains(o.thresholds[0].comment,
                      "world size 2, 2 nodes, residual_rmsnorm, bf16: "
                      "one-shot split 128 KiB"));
  BOOST_TEST(contains(o.thresholds[0].comment, "-> x 4 = 128 KiB"));
  BOOST_TEST(contains(o.yaml, "backends:\n  mnnvl:\n"), o.yaml);
  BOOST_TEST(contains(o.yaml, "    oneshot_max_total: 128KiB\n"), o.yaml);
  BOOST_TEST(validate_text(o.yaml).empty(), text_of(validate_text(o.yaml)));
  const Policy tuned = tables_with(o.yaml);
  auto algorithm = [&](std::uint32_t ws, std::uint64_t bytes) {
    Request r;
    r.capability = Capability::sm(100);
    r.world_size = ws;
    r.nodes = 2;
    r.nvlink_domain = r.multicast = true;
    r.message_bytes = bytes;
    return tuned.decide(r).algorithm;
  };
  BOOST_TEST((algorithm(4, 32 * kKiB) == Algorithm::kOneshot));
  BOOST_TEST((algorithm(4, 64 * kKiB) == Algorithm::kTwoshot));
  BOOST_TEST((algorithm(2, 64 * kKiB) == Algorithm::kOneshot));
  // Measured winning at 2 ranks, but one threshold serves every world size.
  BOOST_TEST((algorithm(2, 128 * kKiB) == Algorithm::kTwoshot));
}

BOOST_AUTO_TEST_CASE(one_shot_losing_from_the_smallest_size_writes_no_threshold) {
  const auto data = parse_csv(std::string(kHeader) +
                              "100,4,2,bf16,1024,16,32768,allreduce,mnnvl,oneshot,1,20\n"
                              "100,4,2,bf16,1024,16,32768,allreduce,mnnvl,twoshot,1,15\n"
                              "100,4,2,bf16,1024,32,65536,allreduce,mnnvl,oneshot,1,30\n"
                              "100,4,2,bf16,1024,32,65536,allreduce,mnnvl,twoshot,1,20\n"
                              // cpu: a one-shot cell cannot say off either
                              "cpu,4,1,bf16,1024,16,32768,allreduce,shm,oneshot,1,20\n"
                              "cpu,4,1,bf16,1024,16,32768,allreduce,shm,twoshot,1,15\n"
                              "cpu,4,1,bf16,1024,32,65536,allreduce,shm,oneshot,1,30\n"
                              "cpu,4,1,bf16,1024,32,65536,allreduce,shm,twoshot,1,20\n");
  const Overlay o = overlay_of(*data);
  BOOST_TEST(o.thresholds.empty());
  BOOST_TEST(o.oneshot.empty());
  BOOST_TEST(!contains(o.yaml, "\nbackends:"), o.yaml);
  BOOST_TEST(std::any_of(o.notes.begin(), o.notes.end(), [](const std::string& n) {
    return contains(n, "mnnvl: no oneshot_max_total: capability 100, world size 4, 2 nodes") &&
           contains(n, "its split is off, two-shot at every compared size");
  }));
  BOOST_TEST(std::any_of(o.notes.begin(), o.notes.end(), [](const std::string& n) {
    return contains(n, "capability cpu, world size 4, 1 node, allreduce: no one-shot cell") &&
           contains(n, "a one-shot cell cannot say off");
  }));
}

namespace {

Algorithm cpu_algorithm(const Policy& p, std::uint32_t ws, std::uint64_t bytes, bool replicated) {
  Request r;
  r.capability = Capability::cpu();
  r.world_size = ws;
  r.pattern = Pattern::kResidualRmsnorm;
  r.residual_replicated = replicated;
  r.message_bytes = bytes;
  return p.decide(r).algorithm;
}

}  // namespace

// A split measured with a replicated residual holds for such calls only: on
// cpu it is a one-shot cell keyed residual: replicated, and shm's
// oneshot_max_total (every call's) comes from the other groups alone.
BOOST_AUTO_TEST_CASE(a_replicated_cpu_split_is_a_keyed_one_shot_cell_not_the_threshold) {
  const auto data = load_fixtures({"replicated_cpu.csv"});
  const Overlay o = overlay_of(*data);
  BOOST_TEST(o.notes.empty());
  BOOST_TEST(o.thresholds.empty());
  BOOST_TEST_REQUIRE(o.oneshot.size() == 2u);  // the distinct group's, unkeyed, and this one
  BOOST_TEST(o.oneshot[0].capability.is_cpu());
  BOOST_TEST(o.oneshot[0].world_size == 2u);
  BOOST_TEST(!o.oneshot[0].residual.has_value());
  BOOST_TEST(o.oneshot[0].bytes == 128 * kKiB);
  BOOST_TEST((o.oneshot[1].residual == Residual::kReplicated));
  BOOST_TEST(o.oneshot[1].bytes == 8 * kKiB);
  BOOST_TEST(contains(o.yaml,
                      "    # capability cpu, world size 2, 1 node, residual_rmsnorm, residual "
                      "replicated\n"
                      "    # bf16 measured: shm one-shot split 8 KiB (one-shot lost at 32 KiB"),
             o.yaml);
  BOOST_TEST(contains(o.yaml,
                      "    - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, residual: "
                      "replicated, max: 8KiB}\n"),
             o.yaml);
  // Fusion: one cell per group, the replicated one keyed.
  BOOST_TEST_REQUIRE(o.fusion.size() == 2u);
  BOOST_TEST(contains(o.yaml,
                      "  - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, "
                      "max: 512KiB}\n"),
             o.yaml);
  BOOST_TEST(contains(o.yaml,
                      "  - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, "
                      "residual: replicated, max: 512KiB}\n"),
             o.yaml);
  BOOST_TEST(!contains(o.yaml, "\nbackends:"), o.yaml);

  // It loads without a warning, and decides as measured.
  const std::vector<Diagnostic> d = validate_text(o.yaml);
  BOOST_TEST(d.empty(), text_of(d) << o.yaml);
  const Policy tuned = tables_with(o.yaml);
  BOOST_TEST((cpu_algorithm(tuned, 2, 8 * kKiB, true) == Algorithm::kOneshot));
  BOOST_TEST((cpu_algorithm(tuned, 2, 8 * kKiB + 2, true) == Algorithm::kTwoshot));
  BOOST_TEST((cpu_algorithm(tuned, 2, 32 * kKiB, true) == Algorithm::kTwoshot));
  // Calls without the promise take the distinct cell: one-shot to 128 KiB at 2 ranks.
  BOOST_TEST((cpu_algorithm(tuned, 2, 32 * kKiB, false) == Algorithm::kOneshot));
  BOOST_TEST((cpu_algorithm(tuned, 2, 128 * kKiB, false) == Algorithm::kOneshot));
  BOOST_TEST((cpu_algorithm(tuned, 2, 128 * kKiB + 2, false) == Algorithm::kTwoshot));
  // Other world sizes have no cell: the default threshold, replicated or not.
  BOOST_TEST((cpu_algorithm(tuned, 4, 32 * kKiB, true) == Algorithm::kOneshot));
}

// Only replicated groups measured: the threshold is left as it is.
BOOST_AUTO_TEST_CASE(replicated_groups_alone_write_no_threshold) {
  const auto data =
      parse_csv(std::string(kHeader).insert(std::string(kHeader).size() - 1, ",residual") +
                "cpu,4,1,bf16,1024,16,32768,residual_rmsnorm,shm,oneshot,1,10,replicated\n"
                "cpu,4,1,bf16,1024,16,32768,residual_rmsnorm,shm,twoshot,1,15,replicated\n"
                "cpu,4,1,bf16,1024,32,65536,residual_rmsnorm,shm,oneshot,1,30,replicated\n"
                "cpu,4,1,bf16,1024,32,65536,residual_rmsnorm,shm,twoshot,1,20,replicated\n");
  const Overlay o = overlay_of(*data);
  BOOST_TEST(o.thresholds.empty());
  BOOST_TEST(!contains(o.yaml, "\nbackends:"), o.yaml);
  BOOST_TEST_REQUIRE(o.oneshot.size() == 1u);
  BOOST_TEST(o.oneshot[0].bytes == 32 * kKiB);
  BOOST_TEST(contains(o.yaml,
                      "{capability: cpu, world_size: 4, pattern: residual_rmsnorm, "
                      "residual: replicated, max: 32KiB}"),
             o.yaml);
  BOOST_TEST(validate_text(o.yaml).empty(), text_of(validate_text(o.yaml)));
}

// Two-shot winning from the smallest compared size: no cell below a measured
// size is invented, and the threshold is not touched either; a note says so.
BOOST_AUTO_TEST_CASE(a_replicated_split_that_is_off_writes_a_note) {
  const auto data =
      parse_csv(std::string(kHeader).insert(std::string(kHeader).size() - 1, ",residual") +
                "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,oneshot,1,20,replicated\n"
                "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,twoshot,1,15,replicated\n"
                "cpu,2,1,bf16,1024,32,65536,residual_rmsnorm,shm,oneshot,1,30,replicated\n"
                "cpu,2,1,bf16,1024,32,65536,residual_rmsnorm,shm,twoshot,1,20,replicated\n");
  const Overlay o = overlay_of(*data);
  BOOST_TEST(o.oneshot.empty());
  BOOST_TEST(o.thresholds.empty());
  BOOST_TEST_REQUIRE(o.notes.size() == 2u);  // and no fusion cell: no baseline
  BOOST_TEST(std::any_of(o.notes.begin(), o.notes.end(), [](const std::string& n) {
    return contains(n,
                    "capability cpu, world size 2, 1 node, residual_rmsnorm, residual replicated: "
                    "no one-shot cell: bf16 shm one-shot split off") &&
           contains(n, "a one-shot cell cannot say off");
  }));
  BOOST_TEST(validate_text(o.yaml).empty(), text_of(validate_text(o.yaml)));
}

// On GPUs no cell keys a threshold backend's split by the residual: a note.
BOOST_AUTO_TEST_CASE(a_replicated_mnnvl_split_is_a_note) {
  const auto data =
      parse_csv(std::string(kHeader).insert(std::string(kHeader).size() - 1, ",residual") +
                "100,4,1,bf16,4096,32,262144,residual_rmsnorm,mnnvl,oneshot,1,10,replicated\n"
                "100,4,1,bf16,4096,32,262144,residual_rmsnorm,mnnvl,twoshot,1,12,replicated\n"
                "100,4,1,bf16,4096,64,524288,residual_rmsnorm,mnnvl,oneshot,1,20,replicated\n"
                "100,4,1,bf16,4096,64,524288,residual_rmsnorm,mnnvl,twoshot,1,15,replicated\n");
  const Overlay o = overlay_of(*data);
  BOOST_TEST(o.thresholds.empty());
  BOOST_TEST(o.oneshot.empty());
  BOOST_TEST(std::any_of(o.notes.begin(), o.notes.end(), [](const std::string& n) {
    return contains(n, "residual replicated: mnnvl one-shot split 256 KiB") &&
           contains(n, "not written");
  }));
  BOOST_TEST(validate_text(o.yaml).empty(), text_of(validate_text(o.yaml)));
}

// Calls measured in registered memory are a group of their own whose cells
// are keyed `buffers: registered` (and, for a residual pattern, by the
// residual even when distinct, so that they never conflict with a replicated
// group's cells): shm's split becomes a cpu one-shot cell, never the
// threshold, which comes from the copied group alone.
BOOST_AUTO_TEST_CASE(registered_groups_write_cells_keyed_by_their_buffers) {
  const std::string header =
      std::string(kHeader).insert(std::string(kHeader).size() - 1, ",buffers");
  const std::string copied =
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,oneshot,1,10,copied\n"
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,twoshot,1,15,copied\n"
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,native,0,20,copied\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,oneshot,1,40,copied\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,twoshot,1,30,copied\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,native,0,50,copied\n";
  // Registered: one-shot wins at both sizes.
  const std::string registered =
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,oneshot,1,5,registered\n"
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,twoshot,1,9,registered\n"
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,native,0,20,registered\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,oneshot,1,45,registered\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,twoshot,1,60,registered\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,native,0,70,registered\n";
  const auto alone = parse_csv(header + copied);
  const auto with = parse_csv(header + copied + registered);
  BOOST_TEST_REQUIRE(alone->grouping.groups.size() == 1u);
  BOOST_TEST_REQUIRE(with->grouping.groups.size() == 2u);
  const Group& reg = with->grouping.groups[1];
  BOOST_TEST(reg.key.registered);
  BOOST_TEST(reg.key.to_string() ==
             "capability cpu, world size 2, 1 node, residual_rmsnorm, bf16, registered buffers");

  const Overlay a = overlay_of(*alone);
  const Overlay b = overlay_of(*with);
  BOOST_TEST(b.notes.empty());
  BOOST_TEST(b.thresholds.empty());
  BOOST_TEST_REQUIRE(b.fusion.size() == 2u);
  BOOST_TEST(contains(b.yaml,
                      "  - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, "
                      "max: 128KiB}\n"),
             b.yaml);
  BOOST_TEST(contains(b.yaml,
                      "  - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, "
                      "residual: distinct, buffers: registered, max: 128KiB}\n"),
             b.yaml);
  // The copied split (32 KiB) unkeyed, the registered one keyed.
  BOOST_TEST_REQUIRE(a.oneshot.size() == 1u);
  BOOST_TEST(a.oneshot[0].bytes == 32 * kKiB);
  BOOST_TEST_REQUIRE(b.oneshot.size() == 2u);
  BOOST_TEST(!b.oneshot[0].buffers.has_value());
  BOOST_TEST(b.oneshot[0].bytes == 32 * kKiB);
  BOOST_TEST((b.oneshot[1].buffers == BufferKind::kRegistered));
  BOOST_TEST((b.oneshot[1].residual == Residual::kDistinct));
  BOOST_TEST(contains(b.yaml,
                      "    - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, "
                      "residual: distinct, buffers: registered, max: 128KiB}\n"),
             b.yaml);

  // It loads without a warning, and decides as measured.
  const std::vector<Diagnostic> d = validate_text(b.yaml);
  BOOST_TEST(d.empty(), text_of(d) << b.yaml);
  const Policy tuned = tables_with(b.yaml);
  Request r;
  r.capability = Capability::cpu();
  r.world_size = 2;
  r.pattern = Pattern::kResidualRmsnorm;
  r.message_bytes = 128 * kKiB;
  BOOST_TEST((tuned.decide(r).algorithm == Algorithm::kTwoshot));
  r.buffers_registered = true;
  BOOST_TEST((tuned.decide(r).algorithm == Algorithm::kOneshot));
  // A registered call with a replicated residual is keyed by neither cell:
  // the default tables' own cell for it (512 KiB at 2 ranks) decides.
  r.residual_replicated = true;
  BOOST_TEST((tuned.decide(r).algorithm == Algorithm::kOneshot));
}

// A replicated, registered group measured without an unfused option has no
// fusion cell of its own: its one-shot cell is checked against the fusion
// cell that covers its calls (the replicated one, else the unkeyed one),
// never against the registered distinct cell, which does not cover them.
BOOST_AUTO_TEST_CASE(a_replicated_registered_split_is_checked_against_the_cell_covering_it) {
  const std::string header =
      std::string(kHeader).insert(std::string(kHeader).size() - 1, ",residual,buffers");
  const auto data = parse_csv(
      header +
      // copied, distinct: fused to 128 KiB
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,oneshot,1,10,distinct,copied\n"
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,native,0,20,distinct,copied\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,oneshot,1,40,distinct,copied\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,native,0,50,distinct,copied\n"
      // registered, distinct: fused to 32 KiB only
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,oneshot,1,10,distinct,registered\n"
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,native,0,20,distinct,registered\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,oneshot,1,60,distinct,registered\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,native,0,50,distinct,registered\n"
      // registered, replicated: one-shot wins to 128 KiB, no unfused measured
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,oneshot,1,5,replicated,registered\n"
      "cpu,2,1,bf16,1024,16,32768,residual_rmsnorm,shm,twoshot,1,9,replicated,registered\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,oneshot,1,30,replicated,registered\n"
      "cpu,2,1,bf16,1024,64,131072,residual_rmsnorm,shm,twoshot,1,40,replicated,registered\n");
  const Overlay o = overlay_of(*data);
  BOOST_TEST_REQUIRE(o.oneshot.size() == 1u);
  BOOST_TEST((o.oneshot[0].residual == Residual::kReplicated));
  BOOST_TEST((o.oneshot[0].buffers == BufferKind::kRegistered));
  BOOST_TEST(o.oneshot[0].bytes == 128 * kKiB);
  BOOST_TEST(!contains(o.oneshot[0].comment, "lowered"), o.oneshot[0].comment);
  const std::vector<Diagnostic> d = validate_text(o.yaml);
  BOOST_TEST(d.empty(), text_of(d) << o.yaml);
}
