// Shared by the tuning suites: the fixtures under tests/data/tune, read and
// grouped, and the tables with an overlay on top.
#pragma once

#include <boost/test/unit_test.hpp>

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/policy.h"
#include "arbiter/tuning/groups.h"
#include "arbiter/tuning/results.h"
#include "run_command.h"

namespace arbiter::test {

inline std::string tune_path(const std::string& name) { return data_path("tune/" + name); }

// Files and their groups; groups point into the files, so the two live
// together on the heap.
struct TuneData {
  std::vector<tuning::ResultsFile> files;
  tuning::Grouping grouping;

  const tuning::Group& only_group() const {
    BOOST_TEST_REQUIRE(grouping.groups.size() == 1u);
    return grouping.groups.front();
  }
};

inline std::unique_ptr<TuneData> group_files(std::vector<tuning::ResultsFile> files) {
  auto data = std::make_unique<TuneData>();
  data->files = std::move(files);
  data->grouping = tuning::group_results(data->files);
  return data;
}

inline std::unique_ptr<TuneData> load_fixtures(std::initializer_list<std::string> names) {
  std::vector<tuning::ResultsFile> files;
  for (const std::string& name : names) {
    tuning::ReadResult r = tuning::read_results(tune_path(name));
    std::string errors;
    for (const Diagnostic& d : r.diagnostics) errors += d.to_string() + "\n";
    BOOST_TEST_REQUIRE(r.file.has_value(), name << ": " << errors);
    files.push_back(std::move(*r.file));
  }
  return group_files(std::move(files));
}

// Results from CSV text written in a test.
inline std::unique_ptr<TuneData> parse_csv(const std::string& text,
                                           const std::string& name = "inline.csv") {
  tuning::ReadResult r = tuning::parse_results(name, text);
  std::string errors;
  for (const Diagnostic& d : r.diagnostics) errors += d.to_string() + "\n";
  BOOST_TEST_REQUIRE(r.file.has_value(), errors);
  std::vector<tuning::ResultsFile> files;
  files.push_back(std::move(*r.file));
  return group_files(std::move(files));
}

inline const char* kHeader =
    "capability,world_size,nodes,dtype,hidden,num_tokens,bytes,pattern,backend,algorithm,fused,"
    "latency_us\n";

// The default tables (no environment), optionally with a site fragment on top.
inline Policy tables_with(const std::string& overlay_yaml = "") {
  LoadOptions options;
  if (!overlay_yaml.empty()) options.overrides.yaml("overlay.yaml", overlay_yaml);
  LoadResult r = Policy::load(options);
  std::string diagnostics;
  for (const Diagnostic& d : r.diagnostics) diagnostics += d.to_string() + "\n";
  BOOST_TEST_REQUIRE(r.policy.has_value(), diagnostics);
  BOOST_TEST(r.diagnostics.empty(), diagnostics);
  return *r.policy;
}

}  // namespace arbiter::test
