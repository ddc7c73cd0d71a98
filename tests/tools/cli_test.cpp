// The arbiter program as operators and scripts use it: decide (text,
// --explain, --json), show, sweep, diff, the environment, and exit codes.
#define BOOST_TEST_MODULE tools_cli
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <fstream>
#include <map>

#include "json.h"
#include "run_command.h"

using namespace arbiter::test;

namespace {

CommandResult run_arbiter(const std::string& args) { return run_command(arbiter_command(args)); }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

const std::string kNvl72 =
    "decide --capability 103 --world-size 16 --nodes 4 --nvlink-domain --multicast ";

}  // namespace

BOOST_AUTO_TEST_CASE(decide_json_has_the_documented_keys) {
  const CommandResult r = run_arbiter(kNvl72 + "--bytes 64MiB --json");
  BOOST_TEST(r.exit_code == 0, r.output);
  const Json j = JsonReader::parse(r.output);
  BOOST_TEST(j["backend"].string == "mnnvl");
  BOOST_TEST(j["algorithm"].string == "twoshot");
  BOOST_TEST((j["fused"].kind == Json::Kind::kBool && j["fused"].boolean));
  BOOST_TEST(j["max_fused_bytes"].is_integer());
  BOOST_TEST(j["max_fused_bytes"].number == "67108864");
  BOOST_TEST((j["trace"].kind == Json::Kind::kArray && j["trace"].array.size() >= 4));
  for (const Json& step : j["trace"].array) {
    BOOST_TEST(step.has("rule"));
    BOOST_TEST(step.has("text"));
    BOOST_TEST(step.has("origin"));
  }
  // The fusion cell's origin names the embedded file and its layer.
  bool saw_cell = false;
  for (const Json& step : j["trace"].array) {
    if (step["rule"].string != "fusion_cell") continue;
    saw_cell = true;
    BOOST_TEST(step["origin"]["file"].string == "default.yaml");
    BOOST_TEST(step["origin"]["layer"].string == "default");
    BOOST_TEST(step["origin"]["line"].is_integer());
  }
  BOOST_TEST(saw_cell);
}

// A site file named in Latin-1: its name reaches the JSON's origins. The
// raw byte made the document unreadable to a strict parser (Python's json).
BOOST_AUTO_TEST_CASE(json_output_is_utf8_whatever_the_file_names) {
  const std::string site = "cli_test_site-\xe9-\xc3\xa9.yaml";  // Latin-1 e, then UTF-8 e
  std::ofstream(site) << "format: 1\nfusion:\n  - {capability: 90, world_size: 8, max: 1}\n";
  const CommandResult r =
      run_arbiter("decide --config '" + site + "' --capability 90 --world-size 8 --bytes 1 --json");
  std::remove(site.c_str());
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "cli_test_site-\\ufffd-\xc3\xa9.yaml"), r.output);
  BOOST_TEST(!contains(r.output, "\xe9"), r.output);
  BOOST_TEST(JsonReader::parse(r.output)["fused"].boolean);
}

BOOST_AUTO_TEST_CASE(half_a_mib_is_the_integer_524288_in_json) {
  const CommandResult r =
      run_arbiter("decide --capability 90 --world-size 8 --bytes 0.5MiB --json");
  BOOST_TEST(r.exit_code == 0, r.output);
  const Json j = JsonReader::parse(r.output);
  BOOST_TEST(j["max_fused_bytes"].number == "524288");
  BOOST_TEST(j["cap"].number == "524288");
  BOOST_TEST(j["request"]["bytes"].number == "524288");
  BOOST_TEST(j["fused"].boolean);
  const Json above = JsonReader::parse(
      run_arbiter("decide --capability 90 --world-size 8 --bytes 524289 --json").output);
  BOOST_TEST(!above["fused"].boolean);
  BOOST_TEST(above["backend"].string == "nccl");
}

BOOST_AUTO_TEST_CASE(uncovered_world_sizes_print_null_max_fused_bytes) {
  const CommandResult r = run_arbiter(
      "decide --capability 90 --world-size 16 --nodes 4 "
      "--nvlink-domain --multicast --bytes 1KiB --json");
  BOOST_TEST(r.exit_code == 0, r.output);
  const Json j = JsonReader::parse(r.output);
  BOOST_TEST((j["max_fused_bytes"].kind == Json::Kind::kNull));
  BOOST_TEST(j["reason"].string == "no_fusion_cell");
  BOOST_TEST(j["backend"].string == "nccl");
}

BOOST_AUTO_TEST_CASE(explain_prints_the_reason_for_a_fallback) {
  const CommandResult r = run_arbiter(
      "decide --capability 90 --world-size 16 --nodes 4 "
      "--nvlink-domain --multicast --bytes 1KiB --explain");
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(contains(r.output, "no fusion entry for capability 90, world size 16"), r.output);
  BOOST_TEST(contains(r.output, "fallback: nccl"), r.output);
}

BOOST_AUTO_TEST_CASE(capability_spellings_decide_alike) {
  const std::string want =
      run_arbiter("decide --capability 103 --world-size 8 --bytes 1MiB").output;
  BOOST_TEST(contains(want, "trtllm oneshot fused"), want);
  for (const char* spelling : {"10.3", "sm_103", "sm103"}) {
    BOOST_TEST(
        run_arbiter(std::string("decide --capability ") + spelling + " --world-size 8 --bytes 1MiB")
            .output == want);
  }
}

BOOST_AUTO_TEST_CASE(tokens_and_hidden_give_the_size_and_the_token_count) {
  // 1 token x 40 MiB at ws 2 on 90: above the 32 MiB one-shot cap, but two-shot
  // needs 2 tokens: it stays one-shot.
  const CommandResult r = run_arbiter(
      "decide --capability 90 --world-size 2 --tokens 1 --hidden 20971520 --dtype bf16 --explain");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "trtllm oneshot fused"), r.output);
  BOOST_TEST(contains(r.output, "stays oneshot"), r.output);
}

// A TP=1 job asks too: one rank has no fusion cell, so the fallback runs the
// epilogue (nccl on GPUs, shm on CPUs, whose world_sizes include 1).
BOOST_AUTO_TEST_CASE(world_size_1_goes_to_the_fallback) {
  const CommandResult gpu = run_arbiter("decide --capability 90 --world-size 1 --bytes 4KiB");
  BOOST_TEST(gpu.exit_code == 0, gpu.output);
  BOOST_TEST(contains(gpu.output, "nccl native unfused"), gpu.output);
  const CommandResult cpu = run_arbiter("decide --capability cpu --world-size 1 --bytes 4KiB");
  BOOST_TEST(cpu.exit_code == 0, cpu.output);
  BOOST_TEST(contains(cpu.output, "shm native unfused"), cpu.output);
}

// In the tables a bare number is MiB, here it is bytes: a fraction copied
// from a table is refused with both readings, never taken as half a byte.
BOOST_AUTO_TEST_CASE(a_bare_fraction_for_bytes_is_refused_with_what_it_meant) {
  const CommandResult r = run_arbiter("decide --capability 90 --world-size 8 --bytes 0.5");
  BOOST_TEST(r.exit_code == 2, r.output);
  BOOST_TEST(contains(r.output, "--bytes: size '0.5': 0.5 what?"), r.output);
  BOOST_TEST(contains(r.output, "in the tables a bare number is MiB"), r.output);
  BOOST_TEST(contains(r.output, "write 0.5MiB or 524288"), r.output);
  // The same flag also reaches the benchmark sweep.
  const CommandResult sweep = run_arbiter("bench --sizes 0.5:2");
  BOOST_TEST(sweep.exit_code == 2, sweep.output);
  BOOST_TEST(contains(sweep.output, "0.5 what?"), sweep.output);
  // Whole bytes and sizes with units are what it takes.
  BOOST_TEST(run_arbiter("decide --capability 90 --world-size 8 --bytes 524288").exit_code == 0);
  BOOST_TEST(run_arbiter("decide --capability 90 --world-size 8 --bytes 0.5MiB").exit_code == 0);
}

BOOST_AUTO_TEST_CASE(bad_flags_are_usage_errors) {
  for (const char* args :
       {"decide --world-size 8 --bytes 1", "decide --capability 90 --bytes 1",
        "decide --capability sm_90a --world-size 8 --bytes 1",
        "decide --capability 90 --world-size 0 --bytes 1", "decide --capability 90 --world-size 8",
        "decide --capability 90 --world-size 8 --bytes 1 --tokens 2 --hidden 4",
        "decide --capability 90 --world-size 8 --bytes 64MB",
        "decide --capability 90 --world-size 8 --bytes 1 --dtype fp8",
        "decide --capability 90 --world-size 8 --bytes 1 --nodes 9",
        "decide --capability 90 --world-size 8 --bytes 1 --no-nvlink --nvlink-domain",
        "decide --capability 90 --world-size 8 --bytes 1 --frobnicate", "frobnicate", ""}) {
    BOOST_TEST_CONTEXT(args) {
      const CommandResult r = run_arbiter(args);
      BOOST_TEST(r.exit_code == 2, r.output);
      BOOST_TEST(!r.output.empty());
    }
  }
  BOOST_TEST(
      contains(run_arbiter("decide --capability 90 --world-size 8 --bytes 64MB").output, "binary"));
}

// Boost reads "-1" into an unsigned flag by wrapping it (world size
// 4294967295, hidden 4294963200, ...), and a command without positionals
// ignored a stray word (a table file without --config). Both are usage
// errors now, saying what was expected.
BOOST_AUTO_TEST_CASE(negative_counts_and_stray_words_are_usage_errors) {
  const std::string whole = "a whole number from 0 to 4294967295 is expected";
  for (const char* args :
       {"decide --capability cpu --world-size -4294967294 --bytes 1",
        "decide --capability cpu --world-size -1 --bytes 1",
        "decide --capability 90 --world-size 8 --bytes 1 --nodes -1",
        "decide --capability 90 --world-size 8 --tokens -4294967295 --hidden 8",
        "decide --capability 90 --world-size 8 --tokens 2 --hidden -4096",
        "decide --capability 90 --world-size 8.5 --bytes 1",
        "decide --capability 90 --world-size 4294967296 --bytes 1",
        "sweep --capability 90 --world-size -1",
        "footprint --capability cpu --world-size 2 --hidden -1",
        "footprint --capability cpu --world-size 2 --hidden 64 --max-tokens -1"}) {
    BOOST_TEST_CONTEXT(args) {
      const CommandResult r = run_arbiter(args);
      BOOST_TEST(r.exit_code == 2, r.output);
      BOOST_TEST(contains(r.output, whole), r.output);
    }
  }
  // Above the C ABI's int32: it reached the modules as world size -1.
  for (const char* args : {"footprint --capability cpu --world-size 4294967295 --hidden 7168",
                           "footprint --capability 90 --world-size 2147483648 --hidden 64"}) {
    const CommandResult r = run_arbiter(args);
    BOOST_TEST(r.exit_code == 2, r.output);
    BOOST_TEST(contains(r.output, "is above 2147483647, the most ranks the C ABI carries"),
               r.output);
    BOOST_TEST(!contains(r.output, "world size -1"), r.output);
  }
  for (const char* args : {"show configs/default.yaml",
                           "decide --capability 103 --world-size 8 --bytes 6MiB site.yaml",
                           "sweep --capability 90 --world-size 8 extra"}) {
    BOOST_TEST_CONTEXT(args) {
      const CommandResult r = run_arbiter(args);
      BOOST_TEST(r.exit_code == 2, r.output);
      BOOST_TEST(contains(r.output, "a table file goes after --config"), r.output);
    }
  }
  // plugins reads no tables: no hint of a --config it does not take.
  const CommandResult plugins = run_arbiter("plugins extra");
  BOOST_TEST(plugins.exit_code == 2, plugins.output);
  BOOST_TEST(contains(plugins.output, "takes no bare words, only options"), plugins.output);
  BOOST_TEST(!contains(plugins.output, "--config"), plugins.output);
  const CommandResult r = run_arbiter("diff preset:default preset:default preset:default");
  BOOST_TEST(r.exit_code == 2, r.output);
  // The largest count still parses.
  BOOST_TEST(run_arbiter("decide --capability cpu --world-size 4294967295 --bytes 1").exit_code ==
             0);
}

BOOST_AUTO_TEST_CASE(arbiter_backends_restricts_the_choice) {
  const std::string cmd = "env ARBITER_BACKENDS=trtllm,nccl " + std::string(ARBITER_BIN) + " " +
                          kNvl72 + "--bytes 1MiB";
  CommandResult r = run_command(cmd);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "nccl native unfused"), r.output);
  r = run_command("env ARBITER_BACKENDS=trtllm,nccll " + std::string(ARBITER_BIN) + " " + kNvl72 +
                  "--bytes 1MiB");
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "ARBITER_BACKENDS: error: unknown backend 'nccll'"), r.output);
}

BOOST_AUTO_TEST_CASE(arbiter_config_and_config_flag_apply_a_site_file) {
  const std::string site = data_path("good/gb300_nvl72_nodes.yaml");
  const std::string args = kNvl72 + "--pattern allreduce --bytes 9MiB";
  BOOST_TEST(contains(run_arbiter(args).output, "mnnvl twoshot fused"));
  CommandResult r = run_arbiter(args + " --config " + shell_quote(site));
  BOOST_TEST(contains(r.output, "nccl native unfused"), r.output);
  r = run_command("env ARBITER_CONFIG=" + shell_quote(site) + " " + ARBITER_BIN + " " + args);
  BOOST_TEST(contains(r.output, "nccl native unfused"), r.output);
  r = run_arbiter(args + " --config /nonexistent.yaml");
  BOOST_TEST(r.exit_code == 1);
  BOOST_TEST(contains(r.output, "/nonexistent.yaml: error: cannot open"), r.output);
}

// Two site files each valid alone whose cells conflict once layered: every
// consumer of ARBITER_CONFIG=a:b refuses the stack, and validate said both
// were valid. Now --layered, or validate without files under ARBITER_CONFIG,
// checks the stack as the consumers load it.
BOOST_AUTO_TEST_CASE(validate_checks_the_stack_that_arbiter_config_makes) {
  const std::string a = "cli_test_layer_a.yaml", b = "cli_test_layer_b.yaml";
  std::ofstream(a) << "format: 1\nfusion:\n  - {capability: 103, world_size: 8, dtype: bf16, "
                      "max: 8MiB}\n";
  std::ofstream(b) << "format: 1\nfusion:\n  - {capability: 103, world_size: 8, pattern: "
                      "allreduce, max: 16MiB}\n";
  CommandResult r = run_arbiter("validate " + a + " " + b);
  BOOST_TEST(r.exit_code == 0, r.output);  // each alone, as before
  r = run_arbiter("validate --layered " + a + " " + b);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, b + ":3:5: error:"), r.output);
  BOOST_TEST(contains(r.output, "conflicts"), r.output);
  BOOST_TEST(contains(r.output,
                      "each file is valid alone, but not layered in this order "
                      "(ARBITER_CONFIG=" +
                          a + ":" + b + ")"),
             r.output);
  const std::string bin = std::string(" ") + ARBITER_BIN + " validate";
  r = run_command("env -u ARBITER_BACKENDS ARBITER_CONFIG=" + a + ":" + b + bin);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "not layered in this order"), r.output);
  // A stack that holds is said to.
  r = run_command("env -u ARBITER_BACKENDS ARBITER_CONFIG=" + a + bin);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, a + ": valid"), r.output);
  // ARBITER_BACKENDS is part of what the environment loads: a name it gets
  // wrong fails every consumer, so validate says so too (it was ignored).
  r = run_command("env ARBITER_BACKENDS=shm,nccl,foo ARBITER_CONFIG=" + a + bin);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "ARBITER_BACKENDS: error: unknown backend 'foo'"), r.output);
  BOOST_TEST(contains(r.output, "(ARBITER_CONFIG=" + a + " with ARBITER_BACKENDS=shm,nccl,foo)"),
             r.output);
  r = run_command("env ARBITER_BACKENDS=shm,nccl ARBITER_CONFIG=" + a + bin);
  BOOST_TEST(r.exit_code == 0, r.output);
  // ARBITER_BACKENDS alone is something to check too (it was a usage error).
  r = run_command("env -u ARBITER_CONFIG ARBITER_BACKENDS=shm,foo" + bin);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "(ARBITER_CONFIG=unset, with ARBITER_BACKENDS=shm,foo)"), r.output);
  r = run_arbiter("validate");
  BOOST_TEST(r.exit_code == 2, r.output);
  BOOST_TEST(contains(r.output, "or set ARBITER_CONFIG"), r.output);
  // A file that lacks what a later one supplies: every consumer loads the
  // stack, and validate of the environment said it did not.
  std::ofstream(a) << "format: 1\nbackends: {trtllm: {algorithm: threshold}}\n";
  std::ofstream(b) << "format: 1\nbackends: {trtllm: {oneshot_max_total: 1MiB}}\n";
  r = run_command("env -u ARBITER_BACKENDS ARBITER_CONFIG=" + a + ":" + b + bin);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "note: " + a + " is not valid alone ("), r.output);
  BOOST_TEST(contains(r.output, "but the stack completes it"), r.output);
  BOOST_TEST(contains(r.output, "layered (ARBITER_CONFIG=" + a + ":" + b + "): valid"), r.output);
  r = run_command("env -u ARBITER_BACKENDS ARBITER_CONFIG=" + b + ":" + a + bin);
  BOOST_TEST(r.exit_code == 0, r.output);  // b's total still stands under a's rule
  r = run_command("env -u ARBITER_BACKENDS ARBITER_CONFIG=" + a + ":" + a + bin);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "has no oneshot_max_total"), r.output);
  // Said once (from the stack), not again from each file alone.
  std::ofstream(b) << "format: 1\nbogus: 1\n";
  r = run_command("env -u ARBITER_BACKENDS ARBITER_CONFIG=" + b + ":" + a + bin);
  BOOST_TEST(r.exit_code == 1, r.output);
  const std::string said = "unknown key 'bogus'";
  BOOST_TEST(r.output.find(said) != std::string::npos, r.output);
  BOOST_TEST(r.output.find(said) == r.output.rfind(said), r.output);
  BOOST_TEST(contains(r.output, "error: this environment's tables do not load"), r.output);
  std::remove(a.c_str());
  std::remove(b.c_str());
}

// A shared site file's provenance may hold an escape sequence (written as
// "\e]0;...\a" in YAML): show prints it as text, never to the terminal.
BOOST_AUTO_TEST_CASE(show_prints_control_characters_as_text) {
  const std::string site = "cli_test_show_escape.yaml";
  std::ofstream(site) << "format: 1\nprovenance: {source: \"a\\e]0;pwned\\a\\e[31mRED\\rX\"}\n";
  const CommandResult r = run_arbiter("show --config " + site);
  std::remove(site.c_str());
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "a\\x1b]0;pwned\\x07\\x1b[31mRED\\x0dX"), r.output);
  BOOST_TEST(!contains(r.output, "\x1b"), r.output);
  BOOST_TEST(!contains(r.output, "\r"), r.output);
}

BOOST_AUTO_TEST_CASE(show_prints_the_grids_and_marks_site_cells) {
  CommandResult r = run_arbiter("show");
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(contains(r.output, "ws=16"));
  BOOST_TEST(contains(r.output, "fingerprint"));
  BOOST_TEST(contains(r.output, "512 KiB"));
  BOOST_TEST(contains(r.output, "preference multi_node: [mnnvl]"));
  const std::string site = "cli_test_site.yaml";
  std::ofstream(site) << "format: 1\nfusion:\n  - {capability: 90, world_size: 4, max: 3}\n";
  r = run_arbiter("show --config " + site);
  BOOST_TEST(contains(r.output, "3 MiB*"), r.output);
  std::remove(site.c_str());
}

BOOST_AUTO_TEST_CASE(sweep_lists_each_band_once) {
  const CommandResult r =
      run_arbiter("sweep --capability 103 --world-size 16 --nodes 4 --nvlink-domain --multicast");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "bytes <= 64 KiB"), r.output);
  BOOST_TEST(contains(r.output, "mnnvl oneshot fused"), r.output);
  BOOST_TEST(contains(r.output, "64 KiB < bytes <= 64 MiB"), r.output);
  BOOST_TEST(contains(r.output, "mnnvl twoshot fused"), r.output);
  BOOST_TEST(contains(r.output, "bytes > 64 MiB"), r.output);
  BOOST_TEST(contains(r.output, "nccl native unfused (above the cap)"), r.output);
  // One node, capability 90, ws 8: oneshot up to 512 KiB, then NCCL.
  const CommandResult h = run_arbiter("sweep --capability 90 --world-size 8 --to 4MiB");
  BOOST_TEST(contains(h.output, "bytes <= 512 KiB"), h.output);
  BOOST_TEST(contains(h.output, "bytes > 512 KiB"), h.output);
}

BOOST_AUTO_TEST_CASE(diff_reports_changed_decisions_in_words) {
  const std::string def = std::string(ARBITER_TEST_DATA) + "/../../configs/default.yaml";
  CommandResult r = run_arbiter("diff " + def + " " + def);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "no decision differs"));
  r = run_arbiter("diff " + def + " " + data_path("good/gb300_nvl72_nodes.yaml"));
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "capability 103, world size 16, 4 nodes"), r.output);
  BOOST_TEST(contains(r.output, "allreduce, all dtypes"), r.output);
  BOOST_TEST(
      contains(r.output, "8 MiB < bytes <= 64 MiB: mnnvl twoshot fused  ->  nccl native unfused"),
      r.output);
  // Other patterns did not change: no line for them.
  BOOST_TEST(!contains(r.output, "residual_rmsnorm,"), r.output);
  r = run_arbiter("diff " + def + " /nonexistent.yaml");
  BOOST_TEST(r.exit_code == 2);
  r = run_arbiter("diff " + def);
  BOOST_TEST(r.exit_code == 2);
}

// Rules that matter only off the default topology, or for calls of fewer
// tokens than ranks, are seen too (diff once compared only NVLink jobs of
// unknown token count, and said "no decision differs" for these); a variant
// where the plain call's differences vanish is shown but not counted.
BOOST_AUTO_TEST_CASE(diff_sees_every_topology_and_calls_of_fewer_tokens_than_ranks) {
  struct Case {
    const char* yaml;
    const char* heading;
    const char* change;
  };
  const Case cases[] = {
      {"backends:\n  mnnvl: {needs_multicast: false}\n",
       "capability 90, world size 2, 2 nodes (NVLink domain, no multicast), allreduce",
       "bytes <= 512 KiB: nccl native unfused (no eligible fused backend)  ->  mnnvl oneshot "
       "fused"},
      {"backends:\n  trtllm: {needs_nvlink: false}\n",
       "capability 90, world size 2, 1 node (no NVLink), allreduce",
       "bytes <= 32 MiB: nccl native unfused (no eligible fused backend)  ->  trtllm oneshot "
       "fused"},
      // Multicast without NVLink: diff never tried it, and said "no decision
      // differs" where decide changed.
      {"backends:\n  mnnvl: {needs_nvlink: false}\n",
       "capability 90, world size 2, 1 node (no NVLink, multicast), allreduce",
       "bytes <= 512 KiB: nccl native unfused (no eligible fused backend)  ->  mnnvl oneshot "
       "fused"},
      {"backends:\n  trtllm: {twoshot_needs_tokens_ge_world_size: false}\n",
       "capability 100, world size 2, 1 node, all patterns, all dtypes, fewer tokens than ranks",
       "32 MiB < bytes <= 64 MiB: trtllm oneshot fused  ->  trtllm twoshot fused"},
  };
  const std::string site = "cli_test_diff_site.yaml";
  for (const Case& c : cases) {
    std::ofstream(site) << "format: 1\n" << c.yaml;
    const CommandResult r = run_arbiter("diff preset:default " + site);
    BOOST_TEST(r.exit_code == 1, c.yaml << r.output);
    BOOST_TEST(contains(r.output, std::string(c.heading)), r.output);
    BOOST_TEST(contains(r.output, std::string(c.change)), r.output);
  }
  // Each line's reason is its own: merged on the choice alone, the sizes
  // above the default cap (64 MiB) were labelled "no eligible fused backend".
  std::ofstream(site) << "format: 1\nbackends:\n  mnnvl: {needs_nvlink: false, needs_multicast: "
                         "false}\nfusion:\n  - {capability: 90, world_size: 2, max: 128}\n";
  {
    const CommandResult reasons = run_arbiter("diff preset:default " + site);
    BOOST_TEST(contains(reasons.output,
                        "    512 KiB < bytes <= 64 MiB: nccl native unfused (no eligible fused "
                        "backend)  ->  mnnvl twoshot fused\n    64 MiB < bytes <= 128 MiB: nccl "
                        "native unfused (above the cap)  ->  mnnvl twoshot fused\n"),
               reasons.output);
  }
  // Where multicast without NVLink decides as no NVLink does, it is not
  // listed again.
  std::ofstream(site) << "format: 1\nbackends:\n  trtllm: {needs_nvlink: false}\n";
  BOOST_TEST(!contains(run_arbiter("diff preset:default " + site).output, "NVLink, multicast"));
  // shm's threshold moves the copied call; registered calls decide by their
  // own one-shot cells, so for them the difference vanishes: shown, not
  // counted.
  std::ofstream(site) << "format: 1\nbackends:\n  shm: {oneshot_max_total: 512KiB}\n";
  const CommandResult r = run_arbiter("diff preset:default " + site);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "registered buffers:\n  no difference\n"), r.output);
  BOOST_TEST(contains(r.output, "3 group(s) of decisions differ"), r.output);
  // Variants combine: a change seen only by calls of fewer tokens than ranks
  // in registered buffers (diff tried few tokens only as a plain call, and
  // said "no decision differs").
  {
    const std::string before = "cli_test_diff_before.yaml";
    std::ofstream(before) << "format: 1\nbackends:\n  shm: {oneshot_max_total: 1TiB, "
                             "twoshot_needs_tokens_ge_world_size: true}\n";
    std::ofstream(site) << "format: 1\nbackends:\n  shm: {oneshot_max_total: 1TiB}\n";
    const CommandResult combined = run_arbiter("diff " + before + " " + site);
    std::remove(before.c_str());
    BOOST_TEST(combined.exit_code == 1, combined.output);
    BOOST_TEST(contains(combined.output,
                        "capability cpu, world size 2, 1 node, residual_rmsnorm, all dtypes, "
                        "registered buffers, fewer tokens than ranks:\n    16 MiB < bytes <= 64 "
                        "MiB: shm oneshot fused  ->  shm twoshot fused\n"),
               combined.output);
  }
  std::remove(site.c_str());
}

// Calls that no cell covers fall back, but to which backend is the rules'
// business: narrowing the fallback's world sizes leaves them with none.
// diff visited only shapes with a cell and said "no decision differs".
BOOST_AUTO_TEST_CASE(diff_sees_calls_no_cell_covers) {
  const std::string site = "cli_test_diff_uncovered.yaml";
  std::ofstream(site) << "format: 1\nbackends:\n  nccl:\n    world_sizes: [2, 4, 8, 16]\n";
  CommandResult r = run_arbiter("diff preset:default " + site);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "world size 3 (no cell; as for world sizes 3, 5-7, 9-15, 17-63)"),
             r.output);
  BOOST_TEST(contains(r.output, "nccl native unfused (no fusion entry)  ->  no backend"), r.output);
  BOOST_TEST(contains(r.output, "world size 65 (no cell; as for world sizes 65-1024)"), r.output);
  // A capability without cells stands for those its rules treat alike.
  BOOST_TEST(contains(r.output, "capability 50 (as for 50-89, 91-99), world size 3"), r.output);
  // Above 1024 ranks no list names a world size: a backend with a
  // world_sizes rule takes none. diff stopped at 1024 and said "no decision
  // differs" where every larger job was left with no backend.
  std::ofstream(site) << "format: 1\nbackends:\n  nccl:\n    world_sizes: {min: 1, max: 1024}\n";
  r = run_arbiter("diff preset:default " + site);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output,
                      "capability 90, world size 1025 (no cell; as for every world size above "
                      "1024), 1 node, all patterns, all dtypes:\n    all sizes: nccl native "
                      "unfused (no fusion entry)  ->  no backend"),
             r.output);
  // One rank on a CPU.
  std::ofstream(site) << "format: 1\nbackends:\n  shm:\n    world_sizes: {min: 2, max: 63}\n";
  r = run_arbiter("diff preset:default " + site);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "capability cpu, world size 1 (no cell), 1 node"), r.output);
  BOOST_TEST(contains(r.output, "shm native unfused (no fusion entry)  ->  no backend"), r.output);
  BOOST_TEST(contains(r.output, "1 group(s) of decisions differ"), r.output);
  std::remove(site.c_str());
}

// The replicated residual: decide, show and diff see the cells keyed by it.
BOOST_AUTO_TEST_CASE(a_replicated_residual_is_a_request_dimension_in_every_command) {
  const std::string site = shell_quote(data_path("good/residual_replicated.yaml"));
  const std::string h200 = "decide --capability 90 --world-size 8 --bytes 2MiB --config " + site;
  CommandResult r = run_arbiter(h200);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "nccl native unfused"), r.output);
  r = run_arbiter(h200 + " --residual-replicated --explain");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "trtllm twoshot fused"), r.output);
  BOOST_TEST(contains(r.output, "residual replicated"), r.output);
  BOOST_TEST(contains(r.output, "residual_replicated.yaml:7"), r.output);
  const Json j = JsonReader::parse(run_arbiter(h200 + " --residual-replicated --json").output);
  BOOST_TEST(j["request"]["residual_replicated"].boolean);
  BOOST_TEST(j["cap"].number == "4194304");
  r = run_arbiter(h200 + " --residual-replicated --pattern allreduce");
  BOOST_TEST(r.exit_code == 2, r.output);
  BOOST_TEST(contains(r.output, "allreduce"), r.output);
  r = run_arbiter("show --config " + site);
  BOOST_TEST(contains(r.output, "cells keyed by nodes, pattern, dtype, residual or buffers"),
             r.output);
  BOOST_TEST(contains(r.output, "residual replicated"), r.output);
  const std::string def = std::string(ARBITER_TEST_DATA) + "/../../configs/default.yaml";
  r = run_arbiter("diff " + def + " " + site);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "residual replicated"), r.output);
}

// Registered buffers: decide, show and diff see the cells keyed by them.
BOOST_AUTO_TEST_CASE(registered_buffers_are_a_request_dimension_in_every_command) {
  const std::string site = shell_quote(data_path("good/registered_buffers.yaml"));
  const std::string cpu = "decide --capability cpu --world-size 2 --bytes 1MiB --config " + site;
  CommandResult r = run_arbiter(cpu);
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "shm twoshot fused"), r.output);  // the 256 KiB threshold
  // Registered: the default's one-shot cell (16 MiB) without the site file,
  // the site's (512 KiB), with the same keys, with it.
  r = run_arbiter("decide --capability cpu --world-size 2 --bytes 1MiB --registered");
  BOOST_TEST(contains(r.output, "shm oneshot fused"), r.output);
  r = run_arbiter(cpu + " --registered --explain");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "shm twoshot fused"), r.output);
  BOOST_TEST(contains(r.output, "registered buffers"), r.output);
  BOOST_TEST(contains(r.output,
                      "one-shot cell (capability cpu, world size 2, pattern "
                      "residual_rmsnorm, residual distinct, buffers registered) = 512 KiB"),
             r.output);
  BOOST_TEST(contains(r.output, "registered_buffers.yaml:12"), r.output);
  // The fused cap: 32 MiB for a registered distinct-residual call, 16 MiB
  // for a replicated one (registered or not), 64 MiB otherwise.
  const Json j = JsonReader::parse(run_arbiter(cpu + " --registered --json").output);
  BOOST_TEST(j["request"]["buffers_registered"].boolean);
  BOOST_TEST(j["cap"].number == "33554432");
  const Json both =
      JsonReader::parse(run_arbiter(cpu + " --registered --residual-replicated --json").output);
  BOOST_TEST(both["cap"].number == "16777216");
  const Json plain = JsonReader::parse(run_arbiter(cpu + " --json").output);
  BOOST_TEST(!plain["request"]["buffers_registered"].boolean);
  BOOST_TEST(plain["cap"].number == "67108864");
  r = run_arbiter("show --config " + site);
  BOOST_TEST(contains(r.output, "buffers registered"), r.output);
  const std::string def = std::string(ARBITER_TEST_DATA) + "/../../configs/default.yaml";
  r = run_arbiter("diff " + def + " " + site);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output,
                      "capability cpu, world size 2, 1 node, residual_rmsnorm, all dtypes, "
                      "registered buffers:\n"
                      "    512 KiB < bytes <= 16 MiB: shm oneshot fused  ->  shm twoshot fused\n"),
             r.output);
}

// Presets: upstream tables by name, as a layer under the site files.
BOOST_AUTO_TEST_CASE(presets_layer_by_name_and_diff_against_the_default) {
  // vLLM main caps capability 103 at world size 8 at 4 MiB (the seed: 2).
  const std::string at_3mib = "decide --capability 103 --world-size 8 --bytes 3MiB --explain";
  BOOST_TEST(contains(run_arbiter(at_3mib).output, "nccl native unfused"));
  CommandResult r = run_arbiter(at_3mib + " --preset vllm-main-2026-08-13");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "trtllm twoshot fused"), r.output);
  BOOST_TEST(contains(r.output, "presets/vllm-main-2026-08-13.yaml:"), r.output);
  // The same through ARBITER_CONFIG; a site file still wins over the preset.
  r = run_command("env ARBITER_CONFIG=preset:vllm-main-2026-08-13 " + std::string(ARBITER_BIN) +
                  " decide --capability 103 --world-size 8 --bytes 3MiB");
  BOOST_TEST(contains(r.output, "trtllm twoshot fused"), r.output);
  // `preset:` with no name, last in the list, was dropped: the default
  // tables ran, silently.
  for (const char* config : {"preset:", "cli_test_no_such_file.yaml:preset:"}) {
    r = run_command(std::string("env ARBITER_CONFIG=") + config + " " + ARBITER_BIN +
                    " decide --capability 103 --world-size 8 --bytes 3MiB");
    BOOST_TEST(r.exit_code == 1, config << ": " << r.output);
    BOOST_TEST(contains(r.output, "no preset named ''"), config << ": " << r.output);
  }
  const std::string site = "cli_test_preset_site.yaml";
  std::ofstream(site) << "format: 1\nfusion:\n  - {capability: 103, world_size: 8, max: 1}\n";
  r = run_arbiter(
      "decide --capability 103 --world-size 8 --bytes 3MiB --preset "
      "vllm-main-2026-08-13 --config " +
      site);
  BOOST_TEST(contains(r.output, "nccl native unfused"), r.output);
  std::remove(site.c_str());
  // One node with multicast: vLLM main prefers mnnvl, the seed trtllm.
  r = run_arbiter("diff preset:default preset:vllm-main-2026-08-13");
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output,
                      "capability 103, world size 8, 1 node, all patterns, all dtypes:\n"
                      "    2 MiB < bytes <= 4 MiB: nccl native unfused (above the cap)"
                      "  ->  trtllm twoshot fused"),
             r.output);
  BOOST_TEST(contains(r.output, "capability 103, world size 4, 1 node (multicast)"), r.output);
  BOOST_TEST(contains(r.output, "trtllm oneshot fused  ->  mnnvl oneshot fused"), r.output);
  // The seed decides as the default does.
  r = run_arbiter("diff preset:default preset:vllm-pr46392-2026-06-24");
  BOOST_TEST(r.exit_code == 0, r.output);
  // An unknown name lists the presets.
  r = run_arbiter("decide --capability 90 --world-size 2 --bytes 1MiB --preset vllm-nope");
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "preset:vllm-nope: error: no preset named 'vllm-nope'"), r.output);
  BOOST_TEST(contains(r.output, "default, vllm-main-2026-08-13, vllm-pr46392-2026-06-24"),
             r.output);
  r = run_arbiter("diff preset:default preset:vllm-nope");
  BOOST_TEST(r.exit_code == 2, r.output);
  // Each validates by name, and as a file (configs/presets/ is installed).
  r = run_arbiter("validate preset:vllm-main-2026-08-13 preset:default");
  BOOST_TEST(r.exit_code == 0, r.output);
  r = run_arbiter("validate preset:vllm-nope");
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "no preset named 'vllm-nope'"), r.output);
  for (const char* name : {"vllm-main-2026-08-13", "vllm-pr46392-2026-06-24"}) {
    r = run_arbiter("validate " + std::string(ARBITER_TEST_DATA) + "/../../configs/presets/" +
                    name + ".yaml");
    BOOST_TEST(r.exit_code == 0, name << ": " << r.output);
  }
}

// validate opened each file once to see that it can be read and again to
// load it: a table piped in through a FIFO was then valid, empty or a hang,
// run by run. It now checks without opening; a directory says so.
BOOST_AUTO_TEST_CASE(validate_reads_a_fifo_once_and_names_a_directory) {
  const std::string fifo = "cli_test_table.fifo";
  std::remove(fifo.c_str());
  for (int run = 0; run < 3; ++run) {
    const CommandResult r =
        run_command("mkfifo " + fifo + " && (printf 'format: 1\\n' > " + fifo +
                    " &) && timeout 20 " + std::string(ARBITER_BIN) + " validate " + fifo +
                    "; status=$?; rm -f " + fifo + "; exit $status");
    BOOST_TEST(r.exit_code == 0, r.output);
    BOOST_TEST(contains(r.output, fifo + ": valid"), r.output);
  }
  const CommandResult dir = run_arbiter("validate " + std::string(ARBITER_TEST_DATA));
  BOOST_TEST(dir.exit_code == 2, dir.output);
  BOOST_TEST(contains(dir.output, "is a directory"), dir.output);
}

// A site file that moves the fallback backend to the other device clashes
// with the default's fallback line: the error is at the site file's line
// (where the change came from) and names both places. It named only
// default.yaml, which the operator did not edit.
BOOST_AUTO_TEST_CASE(a_device_clash_is_reported_at_the_site_file_naming_both_places) {
  const std::string site = "cli_test_device_clash.yaml";
  std::ofstream(site) << "format: 1\nbackends:\n  nccl: {device: cpu}\n";
  const CommandResult r = run_arbiter("validate " + site);
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, site + ":3:"), r.output);
  BOOST_TEST(contains(r.output, "fallback.gpu is 'nccl' (default.yaml:"), r.output);
  BOOST_TEST(contains(r.output, "a cpu backend (backends.nccl.device, " + site + ":3)"), r.output);
  std::remove(site.c_str());
}

BOOST_AUTO_TEST_CASE(endless_input_ends_in_an_error_not_a_hang) {
  const CommandResult r = run_command("timeout 20 " + arbiter_command("validate /dev/zero"));
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "larger than 16 MiB"), r.output);
}

BOOST_AUTO_TEST_CASE(plugins_lists_every_module_with_its_availability) {
  const CommandResult r = run_arbiter("plugins --json");
  BOOST_TEST(r.exit_code == 0, r.output);
  const Json j = JsonReader::parse(r.output);
  BOOST_REQUIRE(j.kind == Json::Kind::kArray);
  bool saw_shm = false;
  std::map<std::string, int> listed;
  for (const Json& m : j.array) {
    BOOST_TEST(m.has("name"));
    ++listed[m["name"].string];
    BOOST_TEST(m["abi_version"].is_integer());
    BOOST_TEST((m["available"].kind == Json::Kind::kBool));
    if (!m["available"].boolean) BOOST_TEST(!m["reason"].string.empty());
    if (m["name"].string == "shm") {
      saw_shm = true;
      BOOST_TEST(m["available"].boolean);
      BOOST_TEST(m["device"].string == "cpu");
      // The shm module exports the registered-memory companion: ABI v2.
      BOOST_TEST(m["abi_version"].number == "2");
      BOOST_TEST(m["registered_memory"].boolean);
    }
  }
  BOOST_TEST(saw_shm, r.output);
  // Every backend appears once: found on disk, or not in this build with why.
  for (const char* name : {"shm", "nccl", "trtllm", "mnnvl"}) {
    BOOST_TEST(listed[name] == 1, name << " in\n" << r.output);
  }
  // An ARBITER_PLUGIN_PATH entry that cannot be searched is an error (exit
  // 1, in JSON too: every communicator refuses it), the modules found
  // elsewhere still listed. It was a note in the text alone, and skipped
  // silently by communicators, which ran the default folder's modules.
  for (const char* json : {"", " --json"}) {
    const CommandResult broken =
        run_command("env ARBITER_PLUGIN_PATH=/nonexistent:" + std::string(ARBITER_PLUGIN_DIR) +
                    " " + ARBITER_BIN + " plugins" + json);
    BOOST_TEST(broken.exit_code == 1, broken.output);
    BOOST_TEST(contains(broken.output,
                        "arbiter plugins: error: ARBITER_PLUGIN_PATH entry '/nonexistent': No "
                        "such file or directory"),
               broken.output);
    BOOST_TEST(contains(broken.output,
                        *json ? "\"name\":\"shm\"" : "shm  ABI v2 (registered memory)  available"),
               broken.output);
  }
  // A copy of shm earlier in the path serves CPU ranks; the built-in one is
  // shadowed by it, and says so (not that its GPU probe failed).
  const std::string folder = "/tmp/arbiter-cli-shadow-" + std::to_string(::getpid());
  BOOST_TEST_REQUIRE(run_command("mkdir -p " + folder + " && cp " +
                                 std::string(ARBITER_PLUGIN_DIR) + "/libarbiter-shm.so " + folder)
                         .exit_code == 0);
  const CommandResult shadow =
      run_command("env ARBITER_PLUGIN_PATH=" + folder + " " + ARBITER_BIN + " plugins");
  run_command("rm -rf " + folder);
  BOOST_TEST(contains(shadow.output, "shm  ABI v2 (registered memory)  available (cpu ranks)"),
             shadow.output);
  BOOST_TEST(contains(shadow.output, "shm  unavailable: shadowed by " + folder), shadow.output);
  BOOST_TEST(!contains(shadow.output, "ABI v0"), shadow.output);
}

// arbiter footprint: what the workspaces cost per rank, from the modules'
// own sizing, on a machine without the device; --budget fails when over.
BOOST_AUTO_TEST_CASE(footprint_reports_each_backend_per_rank_and_checks_a_budget) {
  const std::string cpu = "footprint --capability cpu --world-size 2 --hidden 7168 ";
  CommandResult r = run_arbiter(cpu + "--max-tokens 1000 --json");
  BOOST_TEST(r.exit_code == 0, r.output);
  Json j = JsonReader::parse(r.output);
  BOOST_REQUIRE(j["workspaces"].kind == Json::Kind::kArray);
  BOOST_REQUIRE(j["workspaces"].array.size() == 1u);
  const Json& shm = j["workspaces"].array[0];
  BOOST_TEST(shm["backend"].string == "shm");
  BOOST_TEST(shm["known"].boolean);
  BOOST_TEST(shm["device_bytes"].number == "0");
  BOOST_TEST(shm["host_bytes"].number == "0");
  // Two ranks share one /dev/shm object, which each maps whole.
  const std::uint64_t shared = std::stoull(shm["shared_bytes"].number);
  BOOST_TEST(shared > 0u);
  BOOST_TEST(shared % 4096 == 0u);
  BOOST_TEST(j["total_bytes"].number == shm["shared_bytes"].number);
  BOOST_TEST((shm["largest_call_bytes"]["native"].kind == Json::Kind::kNull));  // any size
  BOOST_TEST((j["within_budget"].kind == Json::Kind::kNull));

  r = run_arbiter(cpu + "--budget 1GiB");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "  shm (fused, fallback, sized for "), r.output);
  BOOST_TEST(contains(r.output, "total: "), r.output);
  BOOST_TEST(contains(r.output, "budget 1 GiB"), r.output);

  // Over the budget: exit 1, naming the backend and the excess.
  r = run_arbiter(cpu + "--budget 64KiB");
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "over --budget 64 KiB"), r.output);
  BOOST_TEST(contains(r.output, "(shm "), r.output);
  r = run_arbiter(cpu + "--budget 64KiB --json");
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "\"within_budget\":false"), r.output);
}

// A budget is an amount of memory, not a message: above 1 TiB it was
// refused as "not a plausible message size", though footprint prints
// totals that large.
BOOST_AUTO_TEST_CASE(footprint_takes_budgets_above_a_tib) {
  const std::string cpu = "footprint --capability cpu --world-size 2 --hidden 7168 ";
  CommandResult r = run_arbiter(cpu + "--budget 2TiB --json");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "\"budget_bytes\":2199023255552"), r.output);
  BOOST_TEST(contains(r.output, "\"within_budget\":true"), r.output);
  r = run_arbiter(cpu + "--budget 8388608TiB");
  BOOST_TEST(r.exit_code == 0, r.output);
  r = run_arbiter(cpu + "--budget 8388609TiB");
  BOOST_TEST(r.exit_code == 2, r.output);
  BOOST_TEST(contains(r.output, "--budget: size '8388609TiB' is above 8388608 TiB"), r.output);
  BOOST_TEST(!contains(r.output, "message size"), r.output);
}

// The over-budget hint names only what shrinks the figure: --max-tokens
// sizes the fallback alone, so where the fused cap sizes the workspace it
// does nothing; where nothing is fused, the cap does nothing.
BOOST_AUTO_TEST_CASE(footprint_over_budget_names_only_the_knobs_that_shrink_it) {
  // 2 ranks: shm fuses up to 64 MiB, and that sizes its workspace.
  CommandResult r = run_arbiter(
      "footprint --capability cpu --world-size 2 --hidden 7168 --max-tokens 1 --budget 4MiB");
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "(lower the tables' fused cap, or raise the budget)"), r.output);
  // 3 ranks: no fusion cell, the fallback sized by --max-tokens.
  r = run_arbiter(
      "footprint --capability cpu --world-size 3 --hidden 7168 --max-tokens 64 --budget 4KiB");
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "(give a smaller --max-tokens, or raise the budget)"), r.output);
}

// A communicator with default options serves every pattern and sizes its
// workspaces for the largest cap among them; footprint sized for
// residual_rmsnorm alone unless told, so a pattern-keyed cell (every cell
// `arbiter tune` writes is one) made it under-count what ranks allocate.
BOOST_AUTO_TEST_CASE(footprint_sizes_for_every_pattern_unless_told_as_the_communicator_does) {
  const std::string site = "cli_test_footprint_patterns.yaml";
  std::ofstream(site) << "format: 1\nfusion:\n  - {capability: cpu, world_size: 2, pattern: "
                         "residual_rmsnorm, max: 128KiB}\n";
  const std::string cpu =
      "footprint --capability cpu --world-size 2 --hidden 1024 --json --config " + site + " ";
  CommandResult r = run_arbiter(cpu);
  BOOST_TEST(r.exit_code == 0, r.output);
  Json j = JsonReader::parse(r.output);
  BOOST_TEST(j["fused_cap_bytes"].number == std::to_string(64u << 20));  // the other patterns'
  BOOST_TEST(contains(j["topology"].string, "bf16, all patterns"), r.output);
  BOOST_TEST(j["workspaces"].array.at(0)["max_message_bytes_asked"].number ==
             std::to_string(64u << 20));
  r = run_arbiter(cpu + "--pattern residual_rmsnorm");
  BOOST_TEST(r.exit_code == 0, r.output);
  j = JsonReader::parse(r.output);
  BOOST_TEST(j["fused_cap_bytes"].number == std::to_string(128u << 10));
  r = run_arbiter(cpu + "--pattern residual_rmsnorm,allreduce");
  j = JsonReader::parse(r.output);
  BOOST_TEST(j["fused_cap_bytes"].number == std::to_string(64u << 20));
  BOOST_TEST(contains(j["topology"].string, "bf16, allreduce,residual_rmsnorm"), r.output);
  for (const char* bad : {"--pattern softmax", "--pattern allreduce,allreduce", "--pattern ,",
                          "--residual-replicated"}) {
    r = run_arbiter(cpu + bad);
    BOOST_TEST(r.exit_code == 2, bad << r.output);
  }
  r = run_arbiter(cpu + "--pattern allreduce,softmax");
  BOOST_TEST(contains(r.output, "--pattern: unknown pattern 'softmax'"), r.output);
  std::remove(site.c_str());
}

BOOST_AUTO_TEST_CASE(footprint_counts_three_lamport_stages_for_trtllm_without_a_gpu) {
  // Capability 100 at 4 ranks: trtllm fuses up to 32 MiB; its one
  // peer-mapped allocation holds 3 one-shot stages of 4 slots of the cap.
  const CommandResult r = run_arbiter(
      "footprint --capability 100 --world-size 4 --hidden 7168 --max-tokens 8192 --json");
  if (contains(r.output, "trtllm: no module found")) {
    // A build without the GPU modules (the sanitizer jobs): no backend for
    // a GPU shape, said as an error that names each module and the fix.
    BOOST_TEST(r.exit_code != 0, r.output);
    BOOST_TEST(contains(r.output, "no backend can hold this shape"), r.output);
    BOOST_TEST(contains(r.output, "see `arbiter plugins`"), r.output);
    return;
  }
  BOOST_TEST(r.exit_code == 0, r.output);
  const Json j = JsonReader::parse(r.output);
  BOOST_TEST(j["fused_cap_bytes"].number == std::to_string(32u << 20));
  bool saw_trtllm = false;
  for (const Json& w : j["workspaces"].array) {
    if (w["backend"].string != "trtllm" || !w["known"].boolean) continue;  // built without CUDA
    saw_trtllm = true;
    const std::uint64_t cap = 32u << 20;
    BOOST_TEST(std::stoull(w["shared_bytes"].number) >= 3 * 4 * cap + 2 * cap);
    BOOST_TEST(std::stoull(w["shared_bytes"].number) % (2u << 20) == 0u);  // the IPC granule
    BOOST_TEST(w["largest_call_bytes"]["oneshot"].number == std::to_string(cap));
    BOOST_TEST(w["largest_call_bytes"]["native"].number == "0");
  }
  BOOST_TEST(saw_trtllm, r.output);
  if (contains(r.output, "\"nccl\"") && !contains(r.output, "no module found")) {
    BOOST_TEST(contains(r.output, "NCCL's own buffers"), r.output);
  }
}

BOOST_AUTO_TEST_CASE(footprint_refuses_bad_input_with_the_flag_and_the_fix) {
  const std::string cpu = "footprint --capability cpu --world-size 2 --hidden 7168 ";
  CommandResult r = run_arbiter(cpu + "--budget lots");
  BOOST_TEST(r.exit_code == 2, r.output);
  BOOST_TEST(contains(r.output, "--budget: "), r.output);
  r = run_arbiter(cpu + "--preset no-such-preset");
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "no-such-preset"), r.output);
  r = run_arbiter("footprint --capability cpu --world-size 2");
  BOOST_TEST(r.exit_code == 2, r.output);
  BOOST_TEST(contains(r.output, "--hidden H is required"), r.output);
  // No backend takes 64 CPU ranks (shm stops at 63): nothing fits.
  r = run_arbiter("footprint --capability cpu --world-size 64 --hidden 7168");
  BOOST_TEST(r.exit_code == 1, r.output);
  BOOST_TEST(contains(r.output, "no backend can hold this shape"), r.output);
  BOOST_TEST(contains(r.output, "shm: refused: world size 64 is outside the 1..63"), r.output);
}
