// `arbiter tune` and `arbiter plot` as operators run them: the report, an
// overlay that `arbiter validate` accepts, exit codes, and messages that name
// the file and line at fault.
#define BOOST_TEST_MODULE tools_tune
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "run_command.h"

using namespace arbiter::test;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

int count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (std::size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

std::string fixture(const std::string& name) { return shell_quote(data_path("tune/" + name)); }

CommandResult run_arbiter(const std::string& args) { return run_command(arbiter_command(args)); }

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A scratch folder per test case, removed at the end.
struct Scratch {
  fs::path dir;
  Scratch() {
    dir =
        fs::temp_directory_path() / ("arbiter_tune_cli_" + std::to_string(getpid()) + "_" +
                                     boost::unit_test::framework::current_test_case().p_name.get());
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(tune_reports_caps_and_regret_and_writes_a_valid_overlay) {
  Scratch s;
  const std::string out = s.path("site.yaml");
  const CommandResult r = run_arbiter("tune " + fixture("crossover.csv") + " -o " + out);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "capability 100, world size 4, 1 node, residual_rmsnorm, bf16\n"),
             r.output);
  BOOST_TEST(contains(r.output,
                      "  fusion cap:   4 MiB (fused lost at 8 MiB: 118 us against "
                      "100 us for nccl native unfused)\n"),
             r.output);
  BOOST_TEST(contains(r.output, "  one-shot cap: 256 KiB (one-shot lost at 512 KiB"), r.output);
  BOOST_TEST(contains(r.output, "  current tables:   mean 30.0%, worst 97.0% at 4 MiB\n"),
             r.output);
  BOOST_TEST(contains(r.output, "  with the overlay: mean 0.0%, worst 0.0%\n"), r.output);
  // A row of the regret table: 8 MiB, best nccl, the tables two-shot, 18%.
  BOOST_TEST(contains(r.output,
                      "8 MiB   nccl native unfused, 100 us   trtllm twoshot fused, "
                      "118 us    18.0%"),
             r.output);
  BOOST_TEST(contains(r.output, "wrote " + out + ": 1 fusion cell, 1 one-shot cell"), r.output);

  const CommandResult v = run_arbiter("validate " + shell_quote(out));
  BOOST_TEST(v.exit_code == 0, v.output);
  BOOST_TEST(v.output == out + ": valid\n");
  // Loaded as a site file, it removes the regret it measured.
  const CommandResult again = run_arbiter("tune " + fixture("crossover.csv") + " --config " + out +
                                          " -o " + s.path("2.yaml"));
  BOOST_TEST(again.exit_code == 0, again.output);
  BOOST_TEST(contains(again.output, "  current tables:   mean 0.0%, worst 0.0%\n"), again.output);
}

BOOST_AUTO_TEST_CASE(every_accepted_fixture_gives_an_overlay_that_validates) {
  Scratch s;
  for (const std::string& files :
       {fixture("crossover.csv"), fixture("noisy.csv"), fixture("duplicates_agree.csv"),
        fixture("no_baseline.csv"), fixture("skipped.csv"), fixture("dtypes.csv"),
        fixture("published_vllm22086_h100_tp2.csv"), fixture("gb300_ws16_vllm46392.csv"),
        fixture("crossover.csv") + " " + fixture("noisy.csv") + " " +
            fixture("gb300_ws16_vllm46392.csv") + " " + fixture("mixed_a.csv")}) {
    BOOST_TEST_CONTEXT(files) {
      const std::string out = s.path("o.yaml");
      const CommandResult r = run_arbiter("tune " + files + " --margin 5% -o " + out);
      BOOST_TEST(r.exit_code == 0, r.output);
      const CommandResult v = run_arbiter("validate " + shell_quote(out));
      BOOST_TEST(v.exit_code == 0, v.output);
      BOOST_TEST(!contains(v.output, "warning"), v.output);
    }
  }
}

BOOST_AUTO_TEST_CASE(without_o_the_overlay_is_the_only_thing_on_stdout) {
  Scratch s;
  const std::string out = s.path("stdout.yaml");
  // run_command() folds stderr into stdout: redirect both inside a subshell.
  const CommandResult r =
      run_command("(" + arbiter_command("tune " + fixture("noisy.csv")) + " > " + shell_quote(out) +
                  " 2> " + shell_quote(s.path("err")) + ")");
  BOOST_TEST(r.exit_code == 0, r.output);
  const std::string yaml = read_file(out);
  BOOST_TEST(yaml.starts_with("# Written by `arbiter tune`"), yaml);
  BOOST_TEST(contains(yaml, "max: 512KiB}"), yaml);
  BOOST_TEST(contains(read_file(s.path("err")), "fusion cap:   4 MiB (fused lost at 8 MiB"));
  BOOST_TEST(run_arbiter("validate " + shell_quote(out)).exit_code == 0);
}

BOOST_AUTO_TEST_CASE(the_margin_moves_the_cap) {
  Scratch s;
  const CommandResult r =
      run_arbiter("tune " + fixture("crossover.csv") + " --margin 20 -o " + s.path("o.yaml"));
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "  fusion cap:   8 MiB (fused lost at 16 MiB"), r.output);
  BOOST_TEST(contains(read_file(s.path("o.yaml")), "notes: \"margin 20%"));
}

BOOST_AUTO_TEST_CASE(multi_node_groups_need_the_topology_flags) {
  Scratch s;
  const std::string args =
      "tune " + fixture("gb300_ws16_vllm46392.csv") + " -o " + s.path("o.yaml");
  const CommandResult plain = run_arbiter(args);
  BOOST_TEST(plain.exit_code == 0, plain.output);
  BOOST_TEST(contains(plain.output, "  fusion cap:   65534 KiB ~ 63.998 MiB (fused lost at"),
             plain.output);
  BOOST_TEST(!contains(plain.output, "one-shot cap"), plain.output);
  BOOST_TEST(contains(plain.output, "note: no fused backend was eligible"), plain.output);
  BOOST_TEST(contains(plain.output, "  current tables:   mean 20.3%, worst 50.0% at 3584 KiB"),
             plain.output);
  const CommandResult mnnvl = run_arbiter(args + " --nvlink-domain --multicast");
  BOOST_TEST(mnnvl.exit_code == 0, mnnvl.output);
  BOOST_TEST(contains(mnnvl.output, "  current tables:   mean 0.0%, worst 0.0%\n"), mnnvl.output);
  BOOST_TEST(!contains(mnnvl.output, "note: no fused backend"), mnnvl.output);
}

BOOST_AUTO_TEST_CASE(arbiter_backends_narrows_the_current_tables) {
  Scratch s;
  const CommandResult r =
      run_command(std::string("env -u ARBITER_CONFIG ARBITER_BACKENDS=nccl ") + ARBITER_BIN +
                  " tune " + fixture("crossover.csv") + " -o " + s.path("o.yaml"));
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(
      contains(r.output, "64 KiB   trtllm oneshot fused, 8 us    nccl native unfused, 20 us"),
      r.output);
}

// -o naming an input replaced the measurements with the overlay (tune) or
// the chart (plot), with success.
BOOST_AUTO_TEST_CASE(an_output_that_is_an_input_is_refused_and_the_input_kept) {
  Scratch s;
  const std::string input = s.path("results.csv");
  fs::copy_file(data_path("tune/crossover.csv"), input);
  const auto before = fs::file_size(input);
  for (const char* command : {"tune ", "plot "}) {
    const CommandResult r = run_arbiter(std::string(command) + input + " -o " + input);
    BOOST_TEST(r.exit_code == 2, r.output);
    BOOST_TEST(contains(r.output, "is the input"), r.output);
    BOOST_TEST(fs::file_size(input) == before);
  }
}

// A header that repeats a column: each row's field count was compared with
// the header's distinct names, so every row was said to have one too many.
BOOST_AUTO_TEST_CASE(a_repeated_header_column_is_the_only_error) {
  Scratch s;
  const std::string file = s.path("repeated.csv");
  std::ofstream(file) << "capability,world_size,nodes,dtype,hidden,num_tokens,bytes,pattern,"
                         "backend,algorithm,fused,latency_us,latency_us\n"
                         "90,2,1,bf16,4096,1,8192,residual_rmsnorm,nccl,native,0,10,10\n";
  const CommandResult r = run_arbiter("tune " + file);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "column latency_us appears twice"), r.output);
  BOOST_TEST(!contains(r.output, "the row has"), r.output);
}

BOOST_AUTO_TEST_CASE(refused_results_exit_1_name_the_rows_and_write_nothing) {
  Scratch s;
  struct Case {
    std::string files;
    std::string message;
  };
  const Case cases[] = {
      {fixture("duplicates_disagree.csv"),
       "duplicates_disagree.csv:6: error: capability 90, world size 2, 1 node, residual_rmsnorm, "
       "bf16: trtllm oneshot fused at 512 KiB: duplicate rows disagree"},
      {fixture("mixed_a.csv") + " " + fixture("mixed_b.csv"), "rows name different devices"},
      {fixture("single_size.csv"),
       "single_size.csv:3: error: capability 100, world size 2, 1 "
       "node, residual_rmsnorm, bf16: only one message size"},
      {fixture("bad_missing_column.csv"),
       "bad_missing_column.csv:2: error: header: missing column latency_us"},
      {fixture("bad_number.csv"),
       "bad_number.csv:14: error: column latency_us: \"abc\" is not a number"},
      {fixture("bad_capability.csv"),
       "bad_capability.csv:5: error: column capability: unknown capability 'sm_90a'"},
      {fixture("crossover.csv") + " " + fixture("bad_number.csv"), "bad_number.csv:14: error:"},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.files) {
      const std::string out = s.path("never.yaml");
      const CommandResult r = run_arbiter("tune " + c.files + " -o " + out);
      BOOST_TEST(r.exit_code == 1, r.output);
      BOOST_TEST(contains(r.output, c.message), r.output);
      BOOST_TEST(contains(r.output, "nothing written"), r.output);
      BOOST_TEST(!fs::exists(out));
      const CommandResult p = run_arbiter("plot " + c.files + " -o " + s.path("never.svg"));
      BOOST_TEST(p.exit_code == 1, p.output);
      BOOST_TEST(contains(p.output, c.message), p.output);
      BOOST_TEST(!fs::exists(s.path("never.svg")));
    }
  }
}

BOOST_AUTO_TEST_CASE(skipped_rows_are_noted) {
  Scratch s;
  const CommandResult r = run_arbiter("tune " + fixture("skipped.csv") + " -o " + s.path("o.yaml"));
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "skipped.csv:9: note: row skipped (status skipped: workspace"),
             r.output);
  BOOST_TEST(contains(r.output, "skipped.csv:10: note: row skipped (no latency_us)"), r.output);
  BOOST_TEST(contains(r.output, "trtllm oneshot fused (not measured)"), r.output);
  BOOST_TEST(contains(r.output, "(1 size not measured, left out)"), r.output);
}

BOOST_AUTO_TEST_CASE(usage_errors_exit_2) {
  Scratch s;
  for (const std::string& args :
       {std::string("tune"), "tune --margin abc " + fixture("crossover.csv"),
        "tune --margin -1 " + fixture("crossover.csv"),
        "tune --margin 101 " + fixture("crossover.csv"),
        "tune --frobnicate " + fixture("crossover.csv"), "tune " + fixture("no_such.csv"),
        "tune " + shell_quote(data_path("tune")),
        "tune " + fixture("crossover.csv") + " " + fixture("crossover.csv"),
        "plot " + fixture("crossover.csv"), std::string("plot -o ") + s.path("x.svg")}) {
    BOOST_TEST_CONTEXT(args) {
      const CommandResult r = run_arbiter(args);
      BOOST_TEST(r.exit_code == 2, r.output);
    }
  }
}

BOOST_AUTO_TEST_CASE(help_and_the_command_list) {
  const CommandResult tune = run_arbiter("tune --help");
  BOOST_TEST(tune.exit_code == 0);
  BOOST_TEST(contains(tune.output, "usage: arbiter tune RESULTS.csv..."));
  BOOST_TEST(contains(tune.output, "--margin"));
  BOOST_TEST(contains(tune.output, "--config"));
  const CommandResult plot = run_arbiter("plot --help");
  BOOST_TEST(plot.exit_code == 0);
  BOOST_TEST(contains(plot.output, "usage: arbiter plot RESULTS.csv..."));
  const CommandResult list = run_arbiter("--help");
  BOOST_TEST(contains(list.output, "\n  tune "));
  BOOST_TEST(contains(list.output, "\n  plot "));
}

BOOST_AUTO_TEST_CASE(plot_writes_one_polyline_per_option) {
  Scratch s;
  const std::string out = s.path("chart.svg");
  const CommandResult r = run_arbiter("plot " + fixture("crossover.csv") + " " +
                                      fixture("no_baseline.csv") + " -o " + out);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "wrote " + out + ": 2 panels"), r.output);
  const std::string svg = read_file(out);
  BOOST_TEST(svg.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg "));
  BOOST_TEST(svg.ends_with("</svg>\n"));
  BOOST_TEST(count(svg, "<polyline ") == 3 + 2);
  BOOST_TEST(count(svg, "<g id=\"panel-") == 2);
  BOOST_TEST(contains(svg, "tables default: "), svg.substr(0, 2000));

  // The caps of given tables.
  const std::string site = s.path("site.yaml");
  BOOST_TEST(run_arbiter("tune " + fixture("crossover.csv") + " -o " + site).exit_code == 0);
  BOOST_TEST(run_arbiter("plot " + fixture("crossover.csv") + " --config " + site + " -o " + out)
                 .exit_code == 0);
  const std::string tuned = read_file(out);
  BOOST_TEST(contains(tuned, ">fusion cap 4 MiB</text>"));
  BOOST_TEST(contains(tuned, ">one-shot cap 256 KiB</text>"));
  BOOST_TEST(contains(tuned, "tables default + " + site));
}

BOOST_AUTO_TEST_CASE(an_overlay_that_conflicts_with_the_given_tables_exits_1) {
  // A site cell keyed by pattern and dtype is as specific as the tuned cell
  // keyed by nodes and pattern, and a call can match both: the overlay is
  // written (it is valid alone) but does not load over these tables.
  Scratch s;
  const std::string site = s.path("site.yaml");
  std::ofstream(site) << "format: 1\nfusion:\n  - {capability: 100, world_size: 4, pattern: "
                         "residual_rmsnorm, dtype: bf16, max: 8MiB}\n";
  const std::string out = s.path("o.yaml");
  const CommandResult r =
      run_arbiter("tune " + fixture("crossover.csv") + " --config " + site + " -o " + out);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "the overlay does not load over the current tables"), r.output);
  BOOST_TEST(contains(r.output, "conflicts with the equally specific cell"), r.output);
  BOOST_TEST(contains(r.output, "hint: the overlay replaces a site file tune wrote before"),
             r.output);
  BOOST_TEST(!contains(r.output, "with the overlay:"), r.output);
  BOOST_TEST(run_arbiter("validate " + shell_quote(out)).exit_code == 0);
}

// Results measured with and without a replicated residual (the residual
// column): the replicated group's shm split becomes a one-shot cell keyed
// residual: replicated, the threshold comes from the other group, and
// `arbiter decide --residual-replicated` then picks two-shot above the cell.
BOOST_AUTO_TEST_CASE(a_replicated_residual_gets_its_own_one_shot_cell) {
  Scratch s;
  const std::string out = s.path("site.yaml");
  const CommandResult r = run_arbiter("tune " + fixture("replicated_cpu.csv") + " -o " + out);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "capability cpu, world size 2, 1 node, residual_rmsnorm, bf16\n"),
             r.output);
  BOOST_TEST(contains(r.output,
                      "capability cpu, world size 2, 1 node, residual_rmsnorm, bf16, residual "
                      "replicated\n"),
             r.output);
  BOOST_TEST(contains(r.output, "  shm one-shot split: 128 KiB (one-shot lost at 512 KiB"),
             r.output);
  BOOST_TEST(contains(r.output, "for shm twoshot fused); a one-shot cell\n"), r.output);
  BOOST_TEST(contains(r.output,
                      "  shm one-shot split: 8 KiB (one-shot lost at 32 KiB: 30 us against 25 us "
                      "for shm twoshot fused); a one-shot cell keyed residual: replicated\n"),
             r.output);
  // The default tables run replicated calls one-shot to 128 KiB; the overlay does not.
  BOOST_TEST(contains(r.output, "  current tables:   mean 13.3%, worst 33.3% at 128 KiB\n"),
             r.output);
  BOOST_TEST(count(r.output, "  with the overlay: mean 0.0%, worst 0.0%\n") == 2, r.output);
  // Fused won at every size measured, and the default cpu cap (64 MiB) is
  // larger: no fusion cell lowers it to 512 KiB without a measured loss.
  BOOST_TEST(contains(r.output,
                      "note: capability cpu, world size 2, 1 node, residual_rmsnorm: no fusion "
                      "cell: fused won at every size compared, up to the largest measured (512 "
                      "KiB), and the current cap 64 MiB is no lower, so it stays (measure larger "
                      "sizes to move it)\n"),
             r.output);
  BOOST_TEST(contains(r.output,
                      "wrote " + out + ": 0 fusion cells, 2 one-shot cells, 0 one-shot thresholds"),
             r.output);
  const std::string yaml = read_file(out);
  BOOST_TEST(contains(yaml,
                      "    - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, residual: "
                      "replicated, max: 8KiB}\n"),
             yaml);
  BOOST_TEST(contains(yaml,
                      "    - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, max: "
                      "128KiB}\n"),
             yaml);
  const CommandResult v = run_arbiter("validate " + shell_quote(out));
  BOOST_TEST(v.exit_code == 0, v.output);
  BOOST_TEST(v.output == out + ": valid\n");

  auto decide = [&](const std::string& flags) {
    const CommandResult d =
        run_arbiter("decide --capability cpu --world-size 2 " + flags + " --config " + out);
    BOOST_TEST(d.exit_code == 0, d.output);
    return d.output;
  };
  const std::string above = decide("--bytes 16KiB --residual-replicated");
  BOOST_TEST(above.starts_with("shm twoshot fused"), above);
  const std::string at = decide("--bytes 8KiB --residual-replicated");
  BOOST_TEST(at.starts_with("shm oneshot fused"), at);
  // Without the promise the unkeyed cell decides: one-shot to 128 KiB at 2 ranks.
  const std::string distinct = decide("--bytes 16KiB");
  BOOST_TEST(distinct.starts_with("shm oneshot fused"), distinct);
}

// The fusion cap weighs the fused option the tables run. mnnvl two-shot
// beats nccl at every size, but on one node the default tables run trtllm,
// whose two-shot loses from 2 MiB: the cap was 16 MiB (the best fused option
// of any backend), and the overlay ran trtllm where nccl is faster.
BOOST_AUTO_TEST_CASE(the_fusion_cap_weighs_the_fused_option_the_tables_run) {
  Scratch s;
  const std::string out = s.path("site.yaml");
  CommandResult r = run_arbiter("tune " + fixture("other_fused_backend.csv") + " -o " + out);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output,
                      "  fusion cap:   1 MiB (fused lost at 2 MiB: 60 us against 50 us for nccl "
                      "native unfused)\n"),
             r.output);
  BOOST_TEST(contains(r.output,
                      "      2 MiB   mnnvl twoshot fused, 40 us    trtllm oneshot "
                      "fused, 75 us     87.5%   nccl native unfused, 50 us     25.0%"),
             r.output);
  BOOST_TEST(contains(r.output, "  with the overlay: mean 16.7%, worst 36.4% at 1 MiB\n"),
             r.output);
  BOOST_TEST(contains(
      read_file(out),
      "  - {capability: 100, world_size: 4, nodes: 1, pattern: residual_rmsnorm, max: 1MiB}"));

  // Under a preset that runs mnnvl on one node (given multicast), mnnvl's
  // curve is what the tables run: 16 MiB, and the report's "with the
  // overlay" is the preset with the overlay (it was the default's).
  r = run_arbiter("tune " + fixture("other_fused_backend.csv") +
                  " --preset vllm-main-2026-08-13 --multicast -o " + out);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output,
                      "  fusion cap:   16 MiB (fused won at every compared size, 512 KiB "
                      ".. 16 MiB (6 sizes); nothing is known above)\n"),
             r.output);
  BOOST_TEST(count(r.output, "mean 0.0%, worst 0.0% (3 sizes not measured, left out)\n") == 2,
             r.output);
  BOOST_TEST(!contains(r.output, "trtllm twoshot fused, 4"), r.output);
}

// mnnvl takes one one-shot threshold for every world size: the 4-rank split
// (32 KiB x 4) makes 2-rank calls above 64 KiB two-shot, which loses to the
// baseline. The 2-rank cap was 2 MiB (one-shot's curve); it is 64 KiB.
BOOST_AUTO_TEST_CASE(the_fusion_cap_follows_the_threshold_the_overlay_writes) {
  Scratch s;
  const std::string out = s.path("site.yaml");
  const CommandResult r = run_arbiter("tune " + fixture("shared_threshold_mnnvl.csv") +
                                      " --nvlink-domain --multicast -o " + out);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output,
                      "  fusion cap:   64 KiB (fused lost at 128 KiB: 292 us against 228 us for "
                      "nccl native unfused)\n"),
             r.output);
  BOOST_TEST(contains(r.output, "  with the overlay: mean 62.5%, worst 100.0% at 128 KiB\n"),
             r.output);
  const std::string yaml = read_file(out);
  BOOST_TEST(contains(yaml,
                      "{capability: 100, world_size: 2, nodes: 2, pattern: "
                      "residual_rmsnorm, max: 64KiB}"),
             yaml);
  // 4 ranks: fused won to the largest size measured; the current 32 MiB stays.
  BOOST_TEST(!contains(yaml, "{capability: 100, world_size: 4, nodes: 2"), yaml);
  BOOST_TEST(contains(r.output,
                      "note: capability 100, world size 4, 2 nodes, residual_rmsnorm: "
                      "no fusion cell: fused won at every size compared, up to the largest "
                      "measured (2 MiB), and the current cap 32 MiB is no lower"),
             r.output);
  BOOST_TEST(contains(yaml, "    oneshot_max_total: 128KiB\n"), yaml);
}

// On cpu each world size's shm split is a one-shot cell of its own, which
// shm reads before its one threshold: the 2-rank calls keep one-shot where 2
// ranks measured it winning (one threshold from the 4-rank split made them
// two-shot, 62.5% slower on average than the best measured).
BOOST_AUTO_TEST_CASE(cpu_splits_are_one_shot_cells_per_world_size) {
  Scratch s;
  const std::string out = s.path("site.yaml");
  const CommandResult r = run_arbiter("tune " + fixture("shared_threshold_cpu.csv") + " -o " + out);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(count(r.output, "  with the overlay: mean 0.0%, worst 0.0%\n") == 2, r.output);
  BOOST_TEST(contains(r.output,
                      "  shm one-shot split: 32 KiB (one-shot lost at 64 KiB: 178 us "
                      "against 65 us for shm twoshot fused); a one-shot cell\n"),
             r.output);
  const std::string yaml = read_file(out);
  BOOST_TEST(contains(yaml,
                      "    - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, "
                      "max: 2MiB}\n"),
             yaml);
  BOOST_TEST(contains(yaml,
                      "    - {capability: cpu, world_size: 4, pattern: residual_rmsnorm, "
                      "max: 32KiB}\n"),
             yaml);
  BOOST_TEST(!contains(yaml, "\nbackends:"), yaml);
  // Fused won at every size measured, under the 64 MiB cpu cap: kept.
  BOOST_TEST(contains(r.output,
                      "note: capability cpu, world size 4, 1 node, residual_rmsnorm: "
                      "no fusion cell: fused won at every size compared, up to the largest "
                      "measured (2 MiB), and the current cap 64 MiB is no lower"),
             r.output);
  BOOST_TEST(contains(r.output, "wrote " + out +
                                    ": 0 fusion cells, 2 one-shot cells, 0 one-shot "
                                    "thresholds"),
             r.output);
}

// A one-node group's cell is keyed nodes: 1. Unkeyed, a one-node replicated
// cell and a 2-node cell were equally specific and both matched a 2-node
// replicated call: the overlay conflicted with itself (exit 1, nothing
// usable), and a one-node measurement changed multi-node decisions no one
// measured.
BOOST_AUTO_TEST_CASE(one_node_cells_leave_multi_node_calls_alone) {
  Scratch s;
  const std::string out = s.path("site.yaml");
  CommandResult r = run_arbiter("tune " + fixture("one_and_two_nodes.csv") +
                                " --nvlink-domain --multicast -o " + out);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(!contains(r.output, "does not load"), r.output);
  const std::string yaml = read_file(out);
  BOOST_TEST(contains(yaml,
                      "  - {capability: 100, world_size: 4, nodes: 1, pattern: "
                      "residual_rmsnorm, residual: replicated, max: 512KiB}\n"),
             yaml);
  BOOST_TEST(contains(yaml,
                      "  - {capability: 100, world_size: 4, nodes: 2, pattern: "
                      "residual_rmsnorm, max: 1MiB}\n"),
             yaml);
  // A 3-node replicated call was measured by no one: the default cell still
  // decides it (the one-node cell used to, at 512 KiB).
  r = run_arbiter(
      "decide --capability 100 --world-size 4 --nodes 3 --nvlink-domain --multicast "
      "--residual-replicated --bytes 1MiB --explain --config " +
      out);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "(default)]\n  4. 1 MiB <= cap"), r.output);
  BOOST_TEST(contains(r.output, "decision: mnnvl"), r.output);
}

// The current cap stays only where it is what the calls get and every dtype
// won to the end: a replicated group under a plain cell this overlay writes
// gets its own cell (it was "kept", and replicated calls then got the plain
// 128 KiB cell), and one dtype's win does not hide another's measured loss.
BOOST_AUTO_TEST_CASE(the_current_cap_stays_only_where_every_call_would_get_it) {
  Scratch s;
  const std::string out = s.path("site.yaml");
  const CommandResult r = run_arbiter("tune " + fixture("keep_rules_cpu.csv") + " -o " + out);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(!contains(r.output, "no fusion cell"), r.output);
  BOOST_TEST(count(r.output, "  with the overlay: mean 0.0%, worst 0.0%\n") == 3, r.output);
  const std::string yaml = read_file(out);
  for (const char* cell :
       {"  - {capability: cpu, world_size: 2, pattern: allreduce, max: 1MiB}\n",
        "  - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, max: 128KiB}\n",
        "  - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, residual: replicated, "
        "max: 1MiB}\n"}) {
    BOOST_TEST(contains(yaml, cell), cell << yaml);
  }
}
