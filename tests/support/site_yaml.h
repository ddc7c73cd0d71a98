// Policy tests: the default tables with one site layer given as YAML text
// (reported as site.yaml), and diagnostics as text for a failing check.
// Include after <boost/test/unit_test.hpp>.
#pragma once

#include <string>
#include <vector>

#include "arbiter/policy.h"

namespace arbiter::test {

inline LoadResult load_yaml(const std::string& text) {
  LoadOptions o;
  o.overrides.yaml("site.yaml", text);
  return Policy::load(o);
}

// The tables, or a failed test naming every diagnostic.
inline Policy must_load(const std::string& text) {
  LoadResult r = load_yaml(text);
  for (const Diagnostic& d : r.diagnostics) BOOST_TEST_MESSAGE(d.to_string());
  BOOST_REQUIRE(r.policy.has_value());
  return *r.policy;
}

inline std::string messages(const std::vector<Diagnostic>& ds) {
  std::string s;
  for (const Diagnostic& d : ds) s += d.to_string() + "\n";
  return s;
}

}  // namespace arbiter::test
