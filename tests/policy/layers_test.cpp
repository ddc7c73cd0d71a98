// Layers: embedded default <- site files <- overrides; partial site files;
// most specific cell wins; conflicts rejected; fingerprint semantics.
#define BOOST_TEST_MODULE policy_layers
#include <boost/test/unit_test.hpp>

#include "print.h"
#include "site_yaml.h"

#include <cstdio>
#include <fstream>

#include "arbiter/policy.h"
#include "arbiter/size.h"

using namespace arbiter;
using namespace arbiter::test;

namespace {

Request gb300(std::uint32_t ws, std::uint32_t nodes, Pattern pattern, std::uint64_t bytes) {
  Request r;
  r.capability = Capability::sm(103);
  r.world_size = ws;
  r.nodes = nodes;
  r.nvlink_domain = true;
  r.multicast = nodes > 1;
  r.pattern = pattern;
  r.message_bytes = bytes;
  return r;
}

const char* kNvl72Site =
    "format: 1\n"
    "provenance: {source: GB300 NVL72 plain all-reduce cutoffs}\n"
    "fusion:\n"
    "  - {capability: 103, world_size: 16, nodes: 4, pattern: allreduce, max: 8MiB}\n"
    "  - {capability: 103, world_size: 8, nodes: 2, pattern: allreduce, max: 64MiB}\n";

}  // namespace

BOOST_AUTO_TEST_CASE(a_partial_site_file_changes_only_its_cells) {
  const Policy base = Policy::load_or_throw(LoadOptions{});
  const Policy site = must_load(kNvl72Site);
  // The keyed cell wins for allreduce across 4 nodes...
  const Request r = gb300(16, 4, Pattern::kAllreduce, 8 * kMiB + 1);
  BOOST_TEST(!site.decide(r).fused);
  BOOST_TEST(base.decide(r).fused);
  const Decision d = site.explain(gb300(16, 4, Pattern::kAllreduce, 8 * kMiB));
  BOOST_TEST(d.fused);
  BOOST_TEST(site.origin(d.fusion_origin).layer == Layer::kOverride);
  BOOST_TEST(site.origin(d.fusion_origin).file == "site.yaml");
  BOOST_TEST(site.origin(d.fusion_origin).line == 4u);
  // ...other patterns keep the default 64 MiB cell, and say so.
  const Decision other = site.explain(gb300(16, 4, Pattern::kResidualRmsnorm, 64 * kMiB));
  BOOST_TEST(other.fused);
  BOOST_TEST(site.origin(other.fusion_origin).layer == Layer::kDefault);
  // ws 8 across 2 nodes: the new cell; ws 8 on one node: the default 2 MiB.
  BOOST_TEST(site.decide(gb300(8, 2, Pattern::kAllreduce, 64 * kMiB)).backend == Backend::kMnnvl);
  BOOST_TEST(!site.decide(gb300(8, 1, Pattern::kAllreduce, 2 * kMiB + 1)).fused);
  BOOST_TEST(site.decide(gb300(8, 1, Pattern::kAllreduce, 2 * kMiB)).backend == Backend::kTrtllm);
}

BOOST_AUTO_TEST_CASE(the_trace_names_the_layer_of_every_cell_used) {
  const Policy site = must_load(kNvl72Site);
  const Request r = gb300(16, 4, Pattern::kAllreduce, kMiB);
  const std::string text = site.explain_text(r, site.explain(r));
  BOOST_TEST(text.find("site.yaml:4:5 (override)") != std::string::npos, text);
  BOOST_TEST(text.find("default.yaml") != std::string::npos, text);
}

BOOST_AUTO_TEST_CASE(site_files_on_disk_are_a_site_layer_and_later_files_win) {
  const std::string a = "layers_test_a.yaml", b = "layers_test_b.yaml";
  std::ofstream(a) << "format: 1\nfusion:\n  - {capability: 90, world_size: 4, max: 8}\n";
  std::ofstream(b) << "format: 1\nfusion:\n  - {capability: 90, world_size: 4, max: 16}\n";
  LoadOptions o;
  o.site_files = {a, b};
  const Policy p = Policy::load_or_throw(o);
  Request r;
  r.capability = Capability::sm(90);
  r.world_size = 4;
  r.message_bytes = 16 * kMiB;
  const Decision d = p.decide(r);
  BOOST_TEST(d.fused);
  BOOST_TEST(p.origin(d.fusion_origin).file == b);
  BOOST_TEST(p.origin(d.fusion_origin).layer == Layer::kSite);
  // An override beats both.
  CellKey key;
  key.capability = Capability::sm(90);
  key.world_size = 4;
  o.overrides.fusion_cap(key, 4 * kMiB);
  const Policy q = Policy::load_or_throw(o);
  BOOST_TEST(q.decide(r).cap == 4 * kMiB);
  BOOST_TEST(q.origin(q.decide(r).fusion_origin).layer == Layer::kOverride);
  std::remove(a.c_str());
  std::remove(b.c_str());
}

// Typed overrides are checked as a file is: a capability outside cpu and
// 50..199 loaded and applied to the capability of its low byte (356 to
// 100), and a residual key on pattern allreduce loaded though it never
// applies.
BOOST_AUTO_TEST_CASE(overrides_that_a_file_could_not_hold_are_refused) {
  CellKey alias;
  alias.capability = Capability::sm(356);
  alias.world_size = 3;
  CellKey never;
  never.capability = Capability::sm(90);
  never.world_size = 4;
  never.pattern = Pattern::kAllreduce;
  never.residual = Residual::kReplicated;
  for (const CellKey& key : {alias, never}) {
    LoadOptions o;
    o.overrides.fusion_cap(key, 64 * kMiB);
    const LoadResult r = Policy::load(o);
    BOOST_TEST(!r.policy.has_value());
    const std::string m = messages(r.diagnostics);
    BOOST_TEST((m.find("capability 356 is outside 50..199") != std::string::npos ||
                m.find("pattern allreduce has no residual") != std::string::npos),
               m);
  }
}

BOOST_AUTO_TEST_CASE(off_disables_a_default_cell) {
  const Policy p =
      must_load("format: 1\nfusion:\n  - {capability: 100, world_size: 4, max: off}\n");
  Request r;
  r.capability = Capability::sm(100);
  r.world_size = 4;
  r.message_bytes = 1;
  BOOST_TEST(p.decide(r).reason == Reason::kFusionOff);
  BOOST_TEST(!p.max_fused_bytes(r).has_value());
}

BOOST_AUTO_TEST_CASE(equally_specific_conflicting_cells_are_rejected) {
  LoadResult r = load_yaml(
      "format: 1\nfusion:\n"
      "  - {capability: 103, world_size: 16, nodes: 4, max: 8MiB}\n"
      "  - {capability: 103, world_size: 16, pattern: allreduce, max: 16MiB}\n");
  BOOST_TEST(!r.policy.has_value());
  const std::string m = messages(r.diagnostics);
  BOOST_TEST(m.find("site.yaml:4:5: error:") != std::string::npos, m);
  BOOST_TEST(m.find("conflicts with the equally specific cell") != std::string::npos, m);
  // The same two cells with the same value do not conflict.
  BOOST_TEST(load_yaml("format: 1\nfusion:\n"
                       "  - {capability: 103, world_size: 16, nodes: 4, max: 8MiB}\n"
                       "  - {capability: 103, world_size: 16, pattern: allreduce, max: 8MiB}\n")
                 .policy.has_value());
}

BOOST_AUTO_TEST_CASE(a_conflict_with_the_default_names_both_places) {
  // The default has no nodes-keyed cells; build the conflict in two layers.
  LoadOptions o;
  o.overrides.yaml(
      "a.yaml", "format: 1\nfusion:\n  - {capability: 103, world_size: 16, nodes: 4, max: 8MiB}\n");
  o.overrides.yaml(
      "b.yaml",
      "format: 1\nfusion:\n  - {capability: 103, world_size: 16, dtype: bf16, max: 4MiB}\n");
  LoadResult r = Policy::load(o);
  BOOST_TEST(!r.policy.has_value());
  const std::string m = messages(r.diagnostics);
  BOOST_TEST(m.find("b.yaml:3:5: error:") != std::string::npos, m);
  BOOST_TEST(m.find("at a.yaml:3") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(loading_is_all_or_nothing) {
  // One good file and one bad: no policy at all, and the error names the bad.
  LoadOptions o;
  o.overrides.yaml("good.yaml", kNvl72Site);
  o.overrides.yaml("bad.yaml",
                   "format: 1\nfusion:\n  - {capability: 103, world_size: 1, max: 1}\n");
  LoadResult r = Policy::load(o);
  BOOST_TEST(!r.policy.has_value());
  BOOST_TEST(messages(r.diagnostics).find("bad.yaml:3:35: error: world size 1 is below 2") !=
                 std::string::npos,
             messages(r.diagnostics));
  BOOST_CHECK_THROW(Policy::load_or_throw(o), LoadError);
}

BOOST_AUTO_TEST_CASE(missing_files_fail_the_load) {
  LoadOptions o;
  o.site_files = {"/nonexistent/site.yaml"};
  LoadResult r = Policy::load(o);
  BOOST_TEST(!r.policy.has_value());
  BOOST_TEST(messages(r.diagnostics).find("/nonexistent/site.yaml: error: cannot open") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(arbiter_backends_restricts_and_rejects_unknown_names) {
  LoadOptions o;
  o.backends_env = "trtllm,nccl";
  const Policy p = Policy::load_or_throw(o);
  BOOST_TEST(p.tables().allowed_mask == ((1u << 0) | (1u << 2)));
  o.backends_env = "trtllm,ncl";
  LoadResult r = Policy::load(o);
  BOOST_TEST(!r.policy.has_value());
  const std::string m = messages(r.diagnostics);
  BOOST_TEST(m.find("ARBITER_BACKENDS: error: unknown backend 'ncl'") != std::string::npos, m);
  BOOST_TEST(m.find("did you mean 'nccl'") != std::string::npos, m);
  o.backends_env = "trtllm,,nccl";
  BOOST_TEST(!Policy::load(o).policy.has_value());
  // Several empty names: one error, naming where the first is.
  o.backends_env = "shm,,";
  r = Policy::load(o);
  BOOST_TEST(!r.policy.has_value());
  BOOST_TEST(r.diagnostics.size() == 1u, messages(r.diagnostics));
  BOOST_TEST(
      messages(r.diagnostics).find("empty backend name (item 2) in 'shm,,'") != std::string::npos,
      messages(r.diagnostics));
}

BOOST_AUTO_TEST_CASE(disabling_the_fallback_leaves_no_backend_rather_than_crashing) {
  LoadOptions o;
  o.backends_env = "trtllm";
  const Policy p = Policy::load_or_throw(o);
  Request r;
  r.capability = Capability::sm(90);
  r.world_size = 8;
  r.message_bytes = kGiB;
  const Decision d = p.explain(r);
  BOOST_TEST(d.backend == Backend::kNone);
  BOOST_TEST(d.reason == Reason::kNoBackend);
  BOOST_TEST(p.explain_text(r, d).find("no backend") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(fingerprint_changes_when_and_only_when_a_cell_changes) {
  const Policy base = Policy::load_or_throw(LoadOptions{});
  // The same tables, reached differently: equal fingerprints.
  const Policy same = must_load(
      "format: 1\nprovenance: {source: a rerun}\nfusion:\n"
      "  - {capability: 90, world_size: 4, max: 2MiB}\n");
  BOOST_TEST(same.fingerprint() == base.fingerprint());
  BOOST_TEST(Policy::load_or_throw(LoadOptions{}).fingerprint() == base.fingerprint());
  // One cell changed by one byte: different.
  const Policy changed = must_load(
      "format: 1\nfusion:\n"
      "  - {capability: 90, world_size: 4, max: 2097153B}\n");
  BOOST_TEST(changed.fingerprint() != base.fingerprint());
  // A one-shot cell, a backend rule, the allowed set: all count.
  BOOST_TEST(must_load("format: 1\noneshot: {cells: [{capability: 90, world_size: 4, max: 1}]}\n")
                 .fingerprint() != base.fingerprint());
  BOOST_TEST(must_load("format: 1\nbackends: {mnnvl: {oneshot_max_total: 2MiB}}\n").fingerprint() !=
             base.fingerprint());
  LoadOptions o;
  o.backends_env = "trtllm,nccl";
  BOOST_TEST(Policy::load_or_throw(o).fingerprint() != base.fingerprint());
  // Stable across processes and machines: a fixed value for the default.
  BOOST_TEST(base.fingerprint_hex().size() == 16u);
}

BOOST_AUTO_TEST_CASE(the_fingerprint_does_not_depend_on_how_the_file_is_written) {
  // The default table written standalone with its cell lines in reverse order
  // and different spacing: the same tables, so the same fingerprint.
  std::string text(embedded_default_yaml());
  std::vector<std::string> lines;
  std::string out;
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t end = text.find('\n', start);
    std::string line = text.substr(start, end - start);
    start = end == std::string::npos ? text.size() : end + 1;
    if (line.rfind("  - {capability", 0) == 0) {
      lines.push_back(line);
      continue;
    }
    if (!lines.empty()) {
      for (auto it = lines.rbegin(); it != lines.rend(); ++it) out += *it + "\n";
      lines.clear();
    }
    out += line + "\n";
  }
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) out += *it + "\n";
  BOOST_REQUIRE(out != std::string(embedded_default_yaml()));
  LoadOptions o;
  o.with_default = false;
  o.overrides.yaml("reordered.yaml", out);
  const Policy reordered = Policy::load_or_throw(o);
  BOOST_TEST(reordered.fingerprint() == Policy::load_or_throw(LoadOptions{}).fingerprint());
}

BOOST_AUTO_TEST_CASE(without_backends_decides_as_excluding_them_per_call) {
  const Policy base = Policy::load_or_throw(LoadOptions{});
  for (std::uint32_t mask : {1u, 2u, 3u, 4u, 8u}) {
    const Policy restricted = base.without_backends(mask);
    BOOST_TEST(restricted.fingerprint() == base.fingerprint());
    for (int cap : {90, 100, 103}) {
      for (std::uint32_t ws : {2u, 4u, 8u, 16u}) {
        for (std::uint32_t nodes : {1u, 4u}) {
          for (std::uint64_t bytes : {std::uint64_t{1024}, 3 * kMiB, 64 * kMiB}) {
            Request r = gb300(ws, nodes, Pattern::kResidualRmsnorm, bytes);
            r.capability = Capability::sm(static_cast<std::uint16_t>(cap));
            const Decision fast = restricted.decide(r);
            r.excluded_backends = mask;
            const Decision excluded = base.decide(r);
            BOOST_TEST(fast.same_choice(excluded));
            BOOST_TEST(fast.reason == excluded.reason);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(an_embedded_default_program_decides_with_no_files) {
  BOOST_TEST(!embedded_default_yaml().empty());
  BOOST_TEST(embedded_default_yaml().find("format: 1") != std::string_view::npos);
}
