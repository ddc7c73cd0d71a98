// `arbiter validate` against the corpus under tests/data: every malformed
// table in bad/ must be rejected with the right exit code, at the right line,
// with a message that names the problem; every table in good/ must pass
// silently; the table in warn/ must pass with a warning.
#define BOOST_TEST_MODULE validate_corpus
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "run_command.h"

namespace bdata = boost::unit_test::data;
namespace fs = std::filesystem;
using arbiter::test::arbiter_command;
using arbiter::test::CommandResult;
using arbiter::test::data_path;
using arbiter::test::run_command;
using arbiter::test::shell_quote;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitInvalid = 1;
constexpr int kExitUsage = 2;

// No validation of a small file may take longer than this.
constexpr double kMaxSeconds = 5.0;
// A run still going after this is killed by timeout(1) and reported as a hang.
constexpr int kKillAfterSeconds = 8;

// One malformed table and what `arbiter validate` must say about it.
struct BadCase {
  std::string file;  // under tests/data/bad/
  int exit_code;
  // The LINE of `FILE:LINE:COL: error:`; 0 when the message has no line.
  unsigned line;
  // Each must appear (case-insensitively) in that error's text, hint
  // included. `a|b` accepts either alternative.
  std::vector<std::string> phrases;
};

std::ostream& operator<<(std::ostream& os, const BadCase& c) { return os << c.file; }

// clang-format off
const std::vector<BadCase> kBadCases = {
  // YAML and encoding
  {"yaml_unterminated_flow_mapping.yaml",  1, 4, {"YAML syntax", "flow|}"}},
  {"yaml_unterminated_quote.yaml",         1, 5, {"YAML syntax", "quot"}},
  {"yaml_tab_indentation.yaml",            1, 4, {"tab"}},
  {"binary_garbage.yaml",                  1, 1, {"UTF-8"}},
  {"utf8_overlong.yaml",                   1, 4, {"UTF-8"}},
  {"utf8_surrogate.yaml",                  1, 4, {"UTF-8"}},
  {"nul_byte.yaml",                        1, 2, {"NUL"}},
  {"empty_file.yaml",                      1, 1, {"empty", "format: 1"}},
  {"only_comments.yaml",                   1, 1, {"empty", "format: 1"}},
  {"top_level_list.yaml",                  1, 2, {"mapping", "list"}},
  {"deep_nesting.yaml",                    1, 3, {"nesting", "32"}},
  {"anchor_self_reference.yaml",           1, 3, {"anchor", "not allowed"}},
  {"alias_bomb.yaml",                      1, 4, {"anchor", "not allowed"}},
  {"yaml_tag.yaml",                        1, 4, {"tag", "not allowed"}},
  {"two_documents.yaml",                   1, 5, {"document", "second"}},
  {"duplicate_key.yaml",                   1, 5, {"duplicate key", "'fallback'", "first at line 3"}},
  {"duplicate_key_in_cell.yaml",           1, 4, {"duplicate key", "'max'"}},
  // format
  {"format_missing.yaml",                  1, 2, {"missing", "format: 1"}},
  {"format_2.yaml",                        1, 2, {"format 2", "not supported"}},
  {"format_quoted_string.yaml",            1, 2, {"format", "integer"}},
  // unknown keys and names
  {"unknown_key_typo.yaml",                1, 3, {"unknown key", "'fusoin'", "did you mean 'fusion'"}},
  {"unknown_backend_field.yaml",           1, 5, {"unknown key", "'needs_nvlnk'", "did you mean 'needs_nvlink'"}},
  {"unknown_backend_in_enabled.yaml",      1, 3, {"unknown backend", "'trtlm'", "did you mean 'trtllm'"}},
  {"unknown_backend_in_preference.yaml",   1, 4, {"unknown backend", "'mnvl'", "did you mean 'mnnvl'"}},
  {"unknown_backend_in_backends.yaml",     1, 4, {"'ncl'", "backends", "did you mean 'nccl'"}},
  {"backend_listed_twice_in_enabled.yaml", 1, 3, {"'nccl'", "twice"}},
  {"pattern_typo_in_cell.yaml",            1, 4, {"unknown pattern", "'allreduse'", "did you mean 'allreduce'"}},
  {"residual_on_allreduce_cell.yaml",      1, 4, {"never applies", "allreduce has no residual", "drop 'residual'"}},
  {"buffers_typo_in_cell.yaml",            1, 5, {"unknown buffers", "'registred'", "did you mean 'registered'"}},
  {"dtype_typo_in_backend.yaml",           1, 5, {"unknown dtype", "'bf61'", "did you mean 'bf16'"}},
  // types
  {"world_size_string.yaml",               1, 4, {"world size", "integer"}},
  {"max_is_list.yaml",                     1, 4, {"size", "list"}},
  {"needs_nvlink_yes.yaml",                1, 5, {"needs_nvlink", "true or false", "'yes'"}},
  {"oneshot_default_maybe.yaml",           1, 4, {"oneshot.default", "oneshot or twoshot", "'maybe'"}},
  // sizes
  {"size_zero.yaml",                       1, 4, {"zero", "max: off"}},
  {"size_negative.yaml",                   1, 4, {"-2", "negative"}},
  {"size_nan.yaml",                        1, 4, {".nan", "finite"}},
  {"size_inf.yaml",                        1, 5, {".inf", "finite"}},
  {"size_above_1tib.yaml",                 1, 4, {"2TiB", "1 TiB"}},
  {"size_fractional_bytes.yaml",           1, 4, {"0.3", "whole number of bytes"}},
  {"size_decimal_unit.yaml",               1, 4, {"'MB'", "MiB"}},
  {"size_lowercase_unit.yaml",             1, 4, {"'mib'", "MiB"}},
  {"size_two_spaces_before_unit.yaml",     1, 4, {"64  MiB", "space"}},
  // capabilities
  {"capability_sm_90a.yaml",               1, 4, {"unknown capability", "'sm_90a'"}},
  {"capability_9.yaml",                    1, 4, {"'9'", "50..199", "did you mean 90"}},
  {"capability_ten.yaml",                  1, 4, {"unknown capability", "'ten'"}},
  {"capability_bare_float.yaml",           1, 4, {"10.3", "quot"}},
  {"min_capability_cpu.yaml",              1, 5, {"min_capability", "cpu"}},
  // world sizes and nodes
  {"world_size_1.yaml",                    1, 4, {"world size 1", "below 2"}},
  {"world_size_0.yaml",                    1, 5, {"world size 0", "below 1"}},
  {"world_size_above_1024.yaml",           1, 4, {"2048", "1024"}},
  {"world_sizes_min_above_max.yaml",       1, 5, {"min 64", "max 8"}},
  {"nodes_above_world_size.yaml",          1, 4, {"nodes 16", "above world size 8"}},
  {"nodes_far_above_world_size.yaml",      1, 4, {"nodes 2000", "above"}},
  {"nodes_zero.yaml",                      1, 4, {"nodes 0", "at least 1"}},
  // cells
  {"duplicate_cell.yaml",                  1, 6, {"defined twice", "first at line 4"}},
  {"conflicting_cells_equal_specificity.yaml", 1, 5, {"conflicts", "nodes 4", "pattern allreduce"}},
  {"oneshot_cell_max_off.yaml",            1, 5, {"'off'", "fusion"}},
  {"oneshot_cell_with_nodes.yaml",         1, 5, {"'nodes'", "oneshot|one-shot"}},
  {"cell_missing_max.yaml",                1, 4, {"missing", "max"}},
  {"cell_missing_capability.yaml",         1, 4, {"missing", "capability"}},
  // rules that span fields or layers
  {"cpu_backend_in_single_node_preference.yaml", 1, 4, {"preference.single_node", "'shm'", "cpu backend"}},
  {"fallback_gpu_is_cpu_backend.yaml",     1, 4, {"fallback.gpu", "'shm'", "cpu backend"}},
  {"threshold_without_oneshot_max_total.yaml", 1, 5, {"'trtllm'", "threshold", "oneshot_max_total"}},
  // the modules' hard limits
  {"trtllm_nodes_any.yaml",                1, 5, {"trtllm runs on one node", "single", "mnnvl or nccl"}},
  {"mnnvl_algorithm_oneshot_table.yaml",   1, 5, {"oneshot_table", "single-node trtllm", "threshold"}},
};
// clang-format on

const std::vector<std::string> kGoodFiles = {
    "gb300_nvl72_nodes.yaml",    "max_off.yaml",
    "capability_spellings.yaml", "backend_rules.yaml",
    "cpu_cap_4mib.yaml",         "residual_replicated.yaml",
    "registered_buffers.yaml",   "oneshot_under_a_dtype_cap.yaml",
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool contains_phrase(const std::string& text, const std::string& phrase) {
  const std::string haystack = lower(text);
  std::stringstream alternatives(phrase);
  std::string alternative;
  while (std::getline(alternatives, alternative, '|')) {
    if (!alternative.empty() && haystack.find(lower(alternative)) != std::string::npos) {
      return true;
    }
  }
  return false;
}

// One `FILE[:LINE[:COL]]: error|warning: TEXT` line of output.
struct Diag {
  std::string file;
  unsigned line = 0;
  unsigned column = 0;
  std::string severity;  // "error" or "warning"
  std::string text;      // message and hint
  std::string raw;
};

// Every line of `output` shaped like a diagnostic, whichever file it names
// (default.yaml included).
std::vector<Diag> parse_diagnostics(const std::string& output) {
  std::vector<Diag> out;
  std::stringstream lines(output);
  std::string raw;
  while (std::getline(lines, raw)) {
    for (const char* severity : {"error", "warning"}) {
      const std::string marker = std::string(": ") + severity + ": ";
      const std::size_t at = raw.find(marker);
      if (at == std::string::npos) continue;
      Diag d;
      d.severity = severity;
      d.text = raw.substr(at + marker.size());
      d.raw = raw;
      // Location: FILE, FILE:LINE or FILE:LINE:COL, numbers peeled off the end.
      std::string location = raw.substr(0, at);
      unsigned numbers[2] = {0, 0};
      int count = 0;
      while (count < 2) {
        const std::size_t colon = location.rfind(':');
        if (colon == std::string::npos) break;
        const std::string tail = location.substr(colon + 1);
        if (tail.empty() || tail.size() > 9 ||
            !std::all_of(tail.begin(), tail.end(),
                         [](unsigned char c) { return std::isdigit(c); })) {
          break;
        }
        numbers[count++] = static_cast<unsigned>(std::stoul(tail));
        location.erase(colon);
      }
      d.file = location;
      if (count == 2) {
        d.line = numbers[1];
        d.column = numbers[0];
      } else if (count == 1) {
        d.line = numbers[0];
      }
      out.push_back(d);
      break;
    }
  }
  return out;
}

struct Run {
  CommandResult result;
  double seconds = 0;
};

// Runs `arbiter validate ARGS` under a kill timer and checks that it neither
// crashed, hung nor took too long.
Run validate(const std::string& args) {
  Run run;
  const auto start = std::chrono::steady_clock::now();
  run.result = run_command("timeout -k 2 " + std::to_string(kKillAfterSeconds) + " " +
                           arbiter_command("validate " + args));
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int code = run.result.exit_code;
  BOOST_TEST_INFO("arbiter validate " << args << "\n" << run.result.output);
  BOOST_TEST(code != 124, "hang: killed after " << kKillAfterSeconds << " s");
  BOOST_TEST_INFO("arbiter validate " << args << "\n" << run.result.output);
  BOOST_TEST(code < 125,
             (code >= 128 ? "CRASH: killed by signal " + std::to_string(code - 128)
                          : "could not run arbiter (exit " + std::to_string(code) + ")"));
  BOOST_TEST_INFO("arbiter validate " << args);
  BOOST_TEST(run.seconds < kMaxSeconds, "took " << run.seconds << " s");
  return run;
}

std::string bad_path(const std::string& file) { return data_path("bad/" + file); }

}  // namespace

BOOST_AUTO_TEST_SUITE(bad_tables)

BOOST_DATA_TEST_CASE(is_rejected_with_a_precise_message, bdata::make(kBadCases), c) {
  const std::string path = bad_path(c.file);
  const Run run = validate(shell_quote(path));
  const std::string& output = run.result.output;
  BOOST_TEST_CONTEXT("arbiter validate " << path << "\n" << output) {
    BOOST_TEST(run.result.exit_code == c.exit_code);

    const std::vector<Diag> diags = parse_diagnostics(output);
    std::vector<Diag> errors;
    for (const Diag& d : diags) {
      if (d.severity == "error") errors.push_back(d);
    }
    BOOST_TEST_REQUIRE(!errors.empty(), "no `error:` diagnostic");

    // A problem in the file is reported in the file, not in default.yaml.
    for (const Diag& e : errors) {
      BOOST_TEST(e.file == path, "error reported against another file: " << e.raw);
      if (e.line != 0) {
        BOOST_TEST(e.column >= 1u, "FILE:LINE without :COL: " << e.raw);
      }
    }

    // Some error names the problem at the expected line.
    const auto matches = [&](const Diag& e) {
      if (e.file != path || e.line != c.line) return false;
      return std::all_of(c.phrases.begin(), c.phrases.end(),
                         [&](const std::string& p) { return contains_phrase(e.text, p); });
    };
    std::string wanted = std::to_string(c.line) + ":";
    for (const std::string& p : c.phrases) wanted += " [" + p + "]";
    BOOST_TEST(std::any_of(errors.begin(), errors.end(), matches), "no error at line " << wanted);

    // The first error is the one that matters to the user.
    BOOST_TEST(errors.front().line == c.line,
               "the first error is at line " << errors.front().line << ", expected " << c.line);
  }
}

BOOST_AUTO_TEST_CASE(every_bad_file_has_an_expectation) {
  std::set<std::string> listed;
  for (const BadCase& c : kBadCases) {
    BOOST_TEST(listed.insert(c.file).second, c.file << " is listed twice");
  }
  std::set<std::string> present;
  for (const fs::directory_entry& e : fs::directory_iterator(data_path("bad"))) {
    if (e.is_regular_file()) present.insert(e.path().filename().string());
  }
  for (const std::string& f : present) {
    BOOST_TEST(listed.count(f) == 1u, "tests/data/bad/" << f << " has no entry in kBadCases");
  }
  for (const std::string& f : listed) {
    BOOST_TEST(present.count(f) == 1u,
               "kBadCases lists " << f << ", which is not in tests/data/bad/");
  }
  BOOST_TEST(present.size() >= 34u);
}

BOOST_AUTO_TEST_CASE(every_bad_file_but_binary_and_empty_ones_says_what_is_wrong) {
  for (const BadCase& c : kBadCases) {
    if (c.file == "empty_file.yaml" || c.file == "binary_garbage.yaml") continue;
    std::ifstream in(bad_path(c.file), std::ios::binary);
    std::string first;
    std::getline(in, first);
    BOOST_TEST(first.rfind("# ", 0) == 0u, c.file << " does not start with a comment");
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(good_tables)

BOOST_DATA_TEST_CASE(validate_cleanly, bdata::make(kGoodFiles), file) {
  const std::string path = data_path("good/" + file);
  const Run run = validate(shell_quote(path));
  BOOST_TEST_CONTEXT("arbiter validate " << path << "\n" << run.result.output) {
    BOOST_TEST(run.result.exit_code == kExitOk);
    BOOST_TEST(run.result.output.find("error:") == std::string::npos);
    // A good table draws no warning either, not even one placed in default.yaml.
    BOOST_TEST(run.result.output.find("warning:") == std::string::npos);
    BOOST_TEST(run.result.output.find(path + ": valid") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(every_good_file_is_listed) {
  std::set<std::string> present;
  for (const fs::directory_entry& e : fs::directory_iterator(data_path("good"))) {
    if (e.is_regular_file()) present.insert(e.path().filename().string());
  }
  const std::set<std::string> listed(kGoodFiles.begin(), kGoodFiles.end());
  BOOST_TEST(present == listed, boost::test_tools::per_element());
  BOOST_TEST(present.size() >= 3u);
}

BOOST_AUTO_TEST_CASE(default_table_is_valid_standalone) {
  const std::string path = data_path("../../configs/default.yaml");
  const Run run = validate("--standalone " + shell_quote(path));
  BOOST_TEST_CONTEXT(run.result.output) {
    BOOST_TEST(run.result.exit_code == kExitOk);
    BOOST_TEST(run.result.output.find("error:") == std::string::npos);
    BOOST_TEST(run.result.output.find("warning:") == std::string::npos);
  }
}

// The five-line table that once crashed `validate --standalone` (no
// `enabled:`, no fallback): rejected for the missing fallbacks, with a
// warning at the preference list; over the default it is valid.
BOOST_AUTO_TEST_CASE(a_table_without_enabled_or_fallback_is_rejected_not_a_crash) {
  const std::string path = data_path("fuzz/policy_load/crash-preference-without-enabled.yaml");
  const Run alone = validate("--standalone " + shell_quote(path));
  BOOST_TEST_CONTEXT(alone.result.output) {
    BOOST_TEST(alone.result.exit_code == kExitInvalid);
    BOOST_TEST(alone.result.output.find(path + ": error: no fallback backend for gpu ranks") !=
               std::string::npos);
    BOOST_TEST(alone.result.output.find(path + ":3:16: warning: preference.single_node lists "
                                               "'trtllm', which no layer enables") !=
               std::string::npos);
  }
  const Run layered = validate(shell_quote(path));
  BOOST_TEST(layered.result.exit_code == kExitOk, layered.result.output);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(oneshot_cap_above_fusion_cap_warns_but_passes) {
  const std::string path = data_path("warn/oneshot_above_fusion_cap.yaml");
  const Run run = validate(shell_quote(path));
  BOOST_TEST_CONTEXT(run.result.output) {
    BOOST_TEST(run.result.exit_code == kExitOk);
    BOOST_TEST(run.result.output.find("error:") == std::string::npos);
    const std::vector<Diag> diags = parse_diagnostics(run.result.output);
    const auto warning = std::find_if(diags.begin(), diags.end(),
                                      [&](const Diag& d) { return d.severity == "warning"; });
    BOOST_TEST_REQUIRE((warning != diags.end()), "no `warning:`");
    BOOST_TEST(warning->file == path);
    BOOST_TEST(warning->line == 5u);
    BOOST_TEST(contains_phrase(warning->text, "one-shot|oneshot"));
    BOOST_TEST(contains_phrase(warning->text, "fusion cap"));
  }
}

BOOST_AUTO_TEST_SUITE(command_line)

BOOST_AUTO_TEST_CASE(one_bad_file_among_good_ones_fails_the_run) {
  const std::string good = data_path("good/gb300_nvl72_nodes.yaml");
  const std::string bad = bad_path("size_zero.yaml");
  const Run run = validate(shell_quote(good) + " " + shell_quote(bad) + " " +
                           shell_quote(data_path("good/max_off.yaml")));
  BOOST_TEST_CONTEXT(run.result.output) {
    BOOST_TEST(run.result.exit_code == kExitInvalid);
    // Every file is checked: the good ones are reported valid, the bad one not.
    BOOST_TEST(run.result.output.find(good + ": valid") != std::string::npos);
    BOOST_TEST(run.result.output.find(bad + ":4:") != std::string::npos);
    BOOST_TEST(run.result.output.find(bad + ": valid") == std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(several_good_files_pass) {
  std::string args;
  for (const std::string& f : kGoodFiles) args += " " + shell_quote(data_path("good/" + f));
  const Run run = validate(args);
  BOOST_TEST_CONTEXT(run.result.output) { BOOST_TEST(run.result.exit_code == kExitOk); }
}

BOOST_AUTO_TEST_CASE(several_bad_files_each_report) {
  const std::string a = bad_path("world_size_1.yaml");
  const std::string b = bad_path("unknown_key_typo.yaml");
  const Run run = validate(shell_quote(a) + " " + shell_quote(b));
  BOOST_TEST_CONTEXT(run.result.output) {
    BOOST_TEST(run.result.exit_code == kExitInvalid);
    BOOST_TEST(run.result.output.find(a + ":4:") != std::string::npos);
    BOOST_TEST(run.result.output.find(b + ":3:") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(missing_path_is_a_usage_error) {
  const std::string path = data_path("bad/no_such_file.yaml");
  const Run run = validate(shell_quote(path));
  BOOST_TEST_CONTEXT(run.result.output) {
    BOOST_TEST(run.result.exit_code == kExitUsage);
    BOOST_TEST(run.result.output.find(path) != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(missing_path_among_valid_files_is_a_usage_error) {
  const Run run = validate(shell_quote(data_path("good/max_off.yaml")) + " " +
                           shell_quote(data_path("good/no_such_file.yaml")));
  BOOST_TEST_CONTEXT(run.result.output) { BOOST_TEST(run.result.exit_code == kExitUsage); }
}

BOOST_AUTO_TEST_CASE(directory_is_an_unreadable_path) {
  const std::string path = data_path("good");
  const Run run = validate(shell_quote(path));
  BOOST_TEST_CONTEXT(run.result.output) {
    BOOST_TEST(run.result.exit_code == kExitUsage);
    BOOST_TEST(run.result.output.find(path) != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(no_arguments_is_a_usage_error) {
  const Run run = validate("");
  BOOST_TEST_CONTEXT(run.result.output) { BOOST_TEST(run.result.exit_code == kExitUsage); }
}

BOOST_AUTO_TEST_SUITE_END()
