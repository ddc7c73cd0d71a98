// Re-tuning end to end on CPU ranks, as an operator runs it: `arbiter bench`
// on 2 and 4 shm ranks (through `arbiter launch`) over sizes around the
// default cpu caps, then `arbiter tune` on its CSV, `arbiter validate` on the
// overlay and `arbiter plot` of the same CSV.
#define BOOST_TEST_MODULE tools_bench_tune
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

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
       at = haystack.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Splits one CSV record; quoted fields may hold commas and doubled quotes.
std::vector<std::string> fields_of(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

// A results file: provenance, header and rows as column -> value.
struct Csv {
  std::map<std::string, std::string> provenance;
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;
};

Csv parse_csv(const std::string& text) {
  Csv csv;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("# ", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) {
        csv.provenance[line.substr(2, colon - 2)] = line.substr(colon + 2);
      }
      continue;
    }
    const std::vector<std::string> fields = fields_of(line);
    if (csv.header.empty()) {
      csv.header = fields;
      continue;
    }
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < fields.size() && i < csv.header.size(); ++i) {
      row[csv.header[i]] = fields[i];
    }
    row["#fields"] = std::to_string(fields.size());
    csv.rows.push_back(std::move(row));
  }
  return csv;
}

// Empty when `svg` is well-formed XML as plot writes it: a declaration, one
// root, balanced tags, quoted attributes, only the predefined entities.
std::string xml_problem(const std::string& svg) {
  const std::string declaration = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>";
  if (svg.rfind(declaration, 0) != 0) return "no XML declaration";
  std::vector<std::string> stack;
  int roots = 0;
  for (std::size_t i = declaration.size(); i < svg.size();) {
    if (svg[i] == '<') {
      const std::size_t end = svg.find('>', i);
      if (end == std::string::npos) return "a tag is not closed";
      const std::string tag = svg.substr(i + 1, end - i - 1);
      if (count(tag, "\"") % 2 != 0) return "unbalanced quotes in <" + tag + ">";
      if (tag.rfind("/", 0) == 0) {
        if (stack.empty() || stack.back() != tag.substr(1)) return "mismatched </" + tag + ">";
        stack.pop_back();
      } else {
        if (stack.empty() && ++roots > 1) return "more than one root element";
        if (tag.empty() || tag.back() != '/') stack.push_back(tag.substr(0, tag.find(' ')));
      }
      i = end + 1;
      continue;
    }
    if (svg[i] == '&') {
      const std::string entity = svg.substr(i, svg.find(';', i) - i + 1);
      static const std::set<std::string> known = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
      if (!known.count(entity)) return "unknown entity " + entity;
    } else if (svg[i] == '>') {
      return "a raw '>' in text";
    } else if (stack.empty() && svg[i] != '\n') {
      return "text outside the root element";
    }
    ++i;
  }
  if (!stack.empty()) return "<" + stack.back() + "> is not closed";
  return roots == 1 ? "" : "no root element";
}

// A scratch folder, removed at the end.
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("arbiter_bench_tune_" + std::to_string(getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  // Tables whose cpu caps sit below every size these tests measure: tune
  // leaves a larger current cap alone where fused won at every size, so
  // over these it writes a cell for each group whatever the timings.
  std::string low_caps() const {
    const std::string file = path("low_caps.yaml");
    std::ofstream(file) << "format: 1\nfusion:\n  - {capability: cpu, world_size: 2, max: 4KiB}\n"
                           "  - {capability: cpu, world_size: 4, max: 4KiB}\n";
    return " --config " + shell_quote(file);
  }
};

// hidden 4096 bf16 = 8 KiB a token: 32, 64, 128, 256 KiB around the one-shot
// split (bytes x ranks <= 256 KiB), 4 and 8 MiB around the 4 MiB fused cap.
const std::vector<std::uint64_t> kSizes = {32768, 65536, 131072, 262144, 4194304, 8388608};
const std::vector<std::string> kOptions = {"shm oneshot 1", "shm twoshot 1", "shm native 0"};
const std::string kSweep =
    " --hidden 4096 --tokens 4,8,16,32,512,1024 --dtype bf16"
    " --pattern residual_rmsnorm,residual_rmsnorm_fp4 --warmup 1 --trials 3 --iterations 2";

const std::vector<std::string> kColumns = {
    "capability", "world_size", "nodes",     "dtype",  "hidden",  "num_tokens", "bytes",  "pattern",
    "residual",   "backend",    "algorithm", "fused",  "buffers", "latency_us", "p10_us", "p90_us",
    "trials",     "iterations", "device",    "status", "skipped", "reason"};

std::string run_arbiter(const std::string& args, int* exit_code) {
  const CommandResult r = run_command(arbiter_command(args));
  *exit_code = r.exit_code;
  return r.output;
}

// Checks one bench CSV of `ranks` ranks: every (pattern, size, option) once,
// residual_rmsnorm measured, NVFP4 skipped with the module's reason.
void check_results(const std::string& path, int ranks) {
  const Csv csv = parse_csv(read_file(path));
  BOOST_TEST(csv.header == kColumns, boost::test_tools::per_element());
  for (const char* key :
       {"device", "driver", "hosts", "arbiter_version", "date", "command", "timing", "residual"}) {
    BOOST_TEST(csv.provenance.count(key) == 1u, key);
  }
  BOOST_TEST(csv.provenance.at("hosts") == "1");
  BOOST_TEST(contains(csv.provenance.at("command"), "arbiter bench -o "));
  BOOST_TEST(csv.provenance.at("residual").starts_with("distinct: "));
  std::set<std::string> seen;
  for (const auto& row : csv.rows) {
    BOOST_TEST(row.at("#fields") == std::to_string(kColumns.size()));
    BOOST_TEST(row.at("capability") == "cpu");
    BOOST_TEST(row.at("world_size") == std::to_string(ranks));
    BOOST_TEST(row.at("nodes") == "1");
    BOOST_TEST(row.at("residual") == "distinct");
    BOOST_TEST(row.at("buffers") == "copied");
    const std::string key = row.at("pattern") + " " + row.at("bytes") + " " + row.at("backend") +
                            " " + row.at("algorithm") + " " + row.at("fused");
    BOOST_TEST(seen.insert(key).second, "twice: " << key);
    if (row.at("pattern") == "residual_rmsnorm") {
      BOOST_TEST(row.at("status") == "ok", key << ": " << row.at("reason"));
      BOOST_TEST(row.at("skipped") == "0");
      BOOST_TEST(std::stod(row.at("latency_us")) > 0.0, key);
      BOOST_TEST(std::stod(row.at("p10_us")) <= std::stod(row.at("latency_us")));
      BOOST_TEST(std::stod(row.at("latency_us")) <= std::stod(row.at("p90_us")));
      BOOST_TEST(row.at("trials") == "3");
      BOOST_TEST(row.at("iterations") == "2");
    } else {
      BOOST_TEST(row.at("status") == "skipped", key);
      BOOST_TEST(row.at("skipped") == "1");
      BOOST_TEST(row.at("latency_us") == "");
      BOOST_TEST(contains(row.at("reason"), "NVFP4"), row.at("reason"));
    }
  }
  std::set<std::string> expected;
  for (const char* pattern : {"residual_rmsnorm", "residual_rmsnorm_fp4"}) {
    for (std::uint64_t bytes : kSizes) {
      for (const std::string& option : kOptions) {
        expected.insert(std::string(pattern) + " " + std::to_string(bytes) + " " + option);
      }
    }
  }
  BOOST_TEST(csv.rows.size() == expected.size());
  BOOST_TEST(seen == expected, boost::test_tools::per_element());
}

}  // namespace

BOOST_AUTO_TEST_CASE(bench_then_tune_validate_and_plot_on_shm_ranks) {
  Scratch s;
  int rc = -1;
  std::vector<std::string> results;
  for (int ranks : {2, 4}) {
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      const std::string csv = s.path("results-" + std::to_string(ranks) + ".csv");
      const std::string out =
          run_arbiter("launch --nproc " + std::to_string(ranks) + " --timeout 200 -- " +
                          ARBITER_BIN + " bench -o " + shell_quote(csv) + kSweep,
                      &rc);
      BOOST_TEST(rc == 0, out);
      // One plain progress line per point (stderr is not a terminal here).
      BOOST_TEST(count(out, "[rank 0] bench: [") == 12, out);
      BOOST_TEST(contains(out, "36 rows (18 measured, 18 skipped, 0 errors)"), out);
      check_results(csv, ranks);
      results.push_back(shell_quote(csv));
    }
  }
  const std::string files = results.at(0) + " " + results.at(1);

  const std::string overlay = s.path("overlay.yaml");
  std::string out =
      run_arbiter("tune " + files + s.low_caps() + " -o " + shell_quote(overlay), &rc);
  BOOST_TEST(rc == 0, out);
  BOOST_TEST(contains(out, "capability cpu, world size 2, 1 node, residual_rmsnorm, bf16"), out);
  BOOST_TEST(contains(out, "capability cpu, world size 4, 1 node, residual_rmsnorm, bf16"), out);
  BOOST_TEST(contains(out, "wrote " + overlay), out);
  const std::string yaml = read_file(overlay);
  BOOST_TEST(contains(yaml, "{capability: cpu, world_size: 2, pattern: residual_rmsnorm, max: "),
             yaml);
  BOOST_TEST(contains(yaml, "{capability: cpu, world_size: 4, pattern: residual_rmsnorm, max: "),
             yaml);

  out = run_arbiter("validate " + shell_quote(overlay), &rc);
  BOOST_TEST(rc == 0, out);
  BOOST_TEST(out == overlay + ": valid\n");

  // An output that cannot be written says why (the OS's reason).
  for (const char* command : {"tune ", "plot "}) {
    out = run_arbiter(command + files + " -o " + shell_quote(s.path("no-such-dir/out")), &rc);
    BOOST_TEST(rc == 1, out);
    BOOST_TEST(contains(out, "No such file or directory"), out);
  }

  const std::string chart = s.path("chart.svg");
  out = run_arbiter("plot " + files + " -o " + shell_quote(chart), &rc);
  BOOST_TEST(rc == 0, out);
  const std::string svg = read_file(chart);
  BOOST_TEST(xml_problem(svg) == "");
  // Two panels (2 and 4 ranks), a polyline per option in each.
  BOOST_TEST(count(svg, "<polyline ") == 6);
  for (const char* option : {"shm oneshot fused", "shm twoshot fused", "shm native unfused"}) {
    BOOST_TEST(count(svg, std::string("<title>") + option + "</title>") == 2, option);
  }
}

BOOST_AUTO_TEST_CASE(bench_refuses_a_bad_sweep_before_any_rank_starts) {
  int rc = -1;
  const std::string out = run_arbiter("bench --tokens 4 --sizes 8KiB:1MiB", &rc);
  BOOST_TEST(rc == 2, out);
  BOOST_TEST(contains(out, "give --tokens or --sizes, not both"), out);
}

// --residual-replicated: every residual call carries
// ARBITER_RUN_RESIDUAL_REPLICATED (the ranks' residual_in are one sample
// stream, so the promise holds): the rows say so in the residual column,
// pass the check against the reference, and tune keys its cells by it.
BOOST_AUTO_TEST_CASE(bench_residual_replicated_on_shm_ranks) {
  Scratch s;
  int rc = -1;
  const std::string csv = s.path("replicated.csv");
  const std::string out = run_arbiter(
      "launch --nproc 2 --timeout 200 -- " + std::string(ARBITER_BIN) + " bench -o " +
          shell_quote(csv) +
          " --residual-replicated --hidden 4096 --tokens 2,4,16,32 --dtype bf16"
          " --pattern allreduce,residual_rmsnorm,residual_rmsnorm_fp8 --warmup 1 --trials 2"
          " --iterations 2",
      &rc);
  BOOST_TEST(rc == 0, out);
  BOOST_TEST(contains(out, "36 rows (36 measured, 0 skipped, 0 errors)"), out);
  BOOST_TEST(contains(out, "(256 KiB, residual replicated): shm oneshot fused"), out);
  const Csv results = parse_csv(read_file(csv));
  BOOST_TEST(results.header == kColumns, boost::test_tools::per_element());
  BOOST_TEST(results.provenance.at("residual").starts_with("replicated: "));
  BOOST_TEST(contains(results.provenance.at("command"), " --residual-replicated"));
  BOOST_TEST_REQUIRE(results.rows.size() == 36u);
  int replicated = 0;
  for (const auto& row : results.rows) {
    const std::string key = row.at("pattern") + " " + row.at("bytes") + " " + row.at("backend") +
                            " " + row.at("algorithm");
    // Measured, and checked against the reference up to 1 MiB: all of them.
    BOOST_TEST(row.at("status") == "ok", key << ": " << row.at("reason"));
    if (row.at("pattern") == "allreduce") {
      BOOST_TEST(row.at("residual") == "", key);
    } else {
      BOOST_TEST(row.at("residual") == "replicated", key);
      ++replicated;
    }
  }
  BOOST_TEST(replicated == 24);

  // tune groups them apart and keys what it writes; the overlay loads.
  const std::string overlay = s.path("overlay.yaml");
  const std::string tuned =
      run_arbiter("tune " + shell_quote(csv) + s.low_caps() + " -o " + shell_quote(overlay), &rc);
  BOOST_TEST(rc == 0, tuned);
  BOOST_TEST(contains(tuned,
                      "capability cpu, world size 2, 1 node, residual_rmsnorm, bf16, residual "
                      "replicated\n"),
             tuned);
  BOOST_TEST(contains(tuned, "capability cpu, world size 2, 1 node, allreduce, bf16\n"), tuned);
  const std::string yaml = read_file(overlay);
  BOOST_TEST(contains(yaml, "pattern: residual_rmsnorm, residual: replicated, max: "), yaml);
  BOOST_TEST(!contains(yaml, "pattern: allreduce, residual"), yaml);
  const std::string valid = run_arbiter("validate " + shell_quote(overlay), &rc);
  BOOST_TEST(rc == 0, valid);
}

BOOST_AUTO_TEST_CASE(bench_refuses_residual_replicated_for_allreduce_alone) {
  int rc = -1;
  const std::string out = run_arbiter("bench --pattern allreduce --residual-replicated", &rc);
  BOOST_TEST(rc == 2, out);
  BOOST_TEST(contains(out, "--residual-replicated: pattern allreduce has no residual"), out);
}

// --registered: every option again with the call's input and outputs in
// registered memory (the zero-copy path; with ARBITER_SHM_OWNERS_FROM=0 the
// replicated two-shot's owners' path at every size), each first call checked
// against the reference; tune groups those rows apart and keys their cells
// `buffers: registered`.
BOOST_AUTO_TEST_CASE(bench_registered_on_shm_ranks) {
  Scratch s;
  const std::string csv = s.path("both.csv");
  const CommandResult r = run_command(
      std::string("env -u ARBITER_CONFIG -u ARBITER_BACKENDS ARBITER_SHM_OWNERS_FROM=0 ") +
      ARBITER_BIN + " launch --nproc 2 --timeout 200 -- " + ARBITER_BIN + " bench -o " +
      shell_quote(csv) +
      " --registered --residual-replicated --hidden 4096 --tokens 2,4,16,32 --dtype bf16"
      " --pattern allreduce,residual_rmsnorm,residual_rmsnorm_fp8 --warmup 1 --trials 2"
      " --iterations 2");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "72 rows (72 measured, 0 skipped, 0 errors)"), r.output);
  BOOST_TEST(contains(r.output, "shm twoshot fused registered"), r.output);
  const Csv results = parse_csv(read_file(csv));
  BOOST_TEST(results.header == kColumns, boost::test_tools::per_element());
  BOOST_TEST(results.provenance.at("buffers").starts_with("copied and registered: "));
  BOOST_TEST_REQUIRE(results.rows.size() == 72u);
  std::map<std::string, int> by_buffers;
  std::set<std::string> seen;
  for (const auto& row : results.rows) {
    const std::string key = row.at("pattern") + " " + row.at("bytes") + " " + row.at("backend") +
                            " " + row.at("algorithm") + " " + row.at("fused") + " " +
                            row.at("buffers");
    BOOST_TEST(seen.insert(key).second, "twice: " << key);
    // Measured, and checked against the reference (all of them: <= 1 MiB).
    BOOST_TEST(row.at("status") == "ok", key << ": " << row.at("reason"));
    ++by_buffers[row.at("buffers")];
  }
  BOOST_TEST(by_buffers["copied"] == 36);
  BOOST_TEST(by_buffers["registered"] == 36);

  int rc = -1;
  const std::string overlay = s.path("overlay.yaml");
  const std::string tuned =
      run_arbiter("tune " + shell_quote(csv) + s.low_caps() + " -o " + shell_quote(overlay), &rc);
  BOOST_TEST(rc == 0, tuned);
  for (const char* group : {"allreduce, bf16", "residual_rmsnorm, bf16, residual replicated",
                            "residual_rmsnorm_fp8, bf16, residual replicated"}) {
    const std::string key = std::string("capability cpu, world size 2, 1 node, ") + group;
    BOOST_TEST(contains(tuned, key + "\n"), tuned);
    BOOST_TEST(contains(tuned, key + ", registered buffers\n"), tuned);
  }
  const std::string yaml = read_file(overlay);
  BOOST_TEST(contains(yaml,
                      "{capability: cpu, world_size: 2, pattern: allreduce, buffers: "
                      "registered, max: "),
             yaml);
  BOOST_TEST(contains(yaml,
                      "{capability: cpu, world_size: 2, pattern: residual_rmsnorm, "
                      "residual: replicated, buffers: registered, max: "),
             yaml);
  BOOST_TEST(contains(yaml,
                      "{capability: cpu, world_size: 2, pattern: residual_rmsnorm, "
                      "residual: replicated, max: "),
             yaml);
  const std::string valid = run_arbiter("validate " + shell_quote(overlay), &rc);
  BOOST_TEST(rc == 0, valid);
  // What the overlay says a registered call runs, explained.
  const std::string decided = run_arbiter(
      "decide --capability cpu --world-size 2 --bytes 64KiB --residual-replicated --registered "
      "--explain --config " +
          shell_quote(overlay),
      &rc);
  BOOST_TEST(rc == 0, decided);
  BOOST_TEST(contains(decided,
                      "residual_rmsnorm, residual replicated, registered buffers, 65536 "
                      "bytes"),
             decided);
  BOOST_TEST(contains(decided,
                      "fusion cell (capability cpu, world size 2, pattern "
                      "residual_rmsnorm, residual replicated, buffers registered)"),
             decided);
}
