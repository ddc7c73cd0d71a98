// Tables an operator writes by trimming the default: every variant of
// configs/default.yaml with one thing left out (a top-level key, a backend,
// a backend field, a preference or fallback entry, a list entry, a key of a
// cell) or one list or mapping emptied. Each is validated alone (`arbiter
// validate --standalone`) and as a site file over the default (`arbiter
// validate`), through the library and through the program. Every variant
// must end in a verdict (exit 0 or 1), never a crash; a rejected one names
// its file; one that loads must decide, explain and sweep a grid of
// requests without crashing.
#define BOOST_TEST_MODULE policy_omission_sweep
#include <yaml-cpp/yaml.h>

#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "arbiter/policy.h"
#include "arbiter/size.h"
#include "print.h"
#include "run_command.h"

namespace fs = std::filesystem;
using namespace arbiter;
using arbiter::test::arbiter_command;
using arbiter::test::run_command;
using arbiter::test::shell_quote;

namespace {

// A step into the tree: a mapping key or a sequence index.
using Step = std::variant<std::string, std::size_t>;
using Path = std::vector<Step>;

enum class Edit { kDrop, kEmpty };

struct Variant {
  std::string name;  // "drop backends.trtllm.world_sizes[2]"
  Path path;
  Edit edit;
};

std::string path_text(const Path& path) {
  std::string s;
  for (const Step& step : path) {
    if (const auto* key = std::get_if<std::string>(&step)) {
      if (!s.empty()) s += '.';
      s += *key;
    } else {
      s += "[" + std::to_string(std::get<std::size_t>(step)) + "]";
    }
  }
  return s;
}

// Every drop and every emptying below `node`, at `path`.
void collect(const YAML::Node& node, Path& path, std::vector<Variant>& out) {
  if (node.IsMap()) {
    if (!path.empty() && node.size() > 0)
      out.push_back({"empty " + path_text(path), path, Edit::kEmpty});
    for (const auto& kv : node) {
      // Named first: GCC 12 warns (-Wmaybe-uninitialized, a false positive)
      // about a variant built from the temporary.
      const std::string key = kv.first.as<std::string>();
      path.emplace_back(std::in_place_type<std::string>, key);
      out.push_back({"drop " + path_text(path), path, Edit::kDrop});
      collect(kv.second, path, out);
      path.pop_back();
    }
  } else if (node.IsSequence()) {
    if (node.size() > 0) out.push_back({"empty " + path_text(path), path, Edit::kEmpty});
    for (std::size_t i = 0; i < node.size(); ++i) {
      path.push_back(i);
      out.push_back({"drop " + path_text(path), path, Edit::kDrop});
      collect(node[i], path, out);
      path.pop_back();
    }
  }
}

// A deep copy of `node` with the edit applied at path[depth..].
YAML::Node edited(const YAML::Node& node, const Path& path, std::size_t depth, Edit edit) {
  if (depth == path.size()) {
    BOOST_REQUIRE(edit == Edit::kEmpty);
    return YAML::Node(node.IsMap() ? YAML::NodeType::Map : YAML::NodeType::Sequence);
  }
  const bool last = depth + 1 == path.size();
  if (node.IsMap()) {
    const std::string& target = std::get<std::string>(path[depth]);
    YAML::Node copy(YAML::NodeType::Map);
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      if (key != target) {
        copy[key] = YAML::Clone(kv.second);
      } else if (!(last && edit == Edit::kDrop)) {
        copy[key] = edited(kv.second, path, depth + 1, edit);
      }
    }
    copy.SetStyle(node.Style());
    return copy;
  }
  const std::size_t target = std::get<std::size_t>(path[depth]);
  YAML::Node copy(YAML::NodeType::Sequence);
  for (std::size_t i = 0; i < node.size(); ++i) {
    if (i != target) {
      copy.push_back(YAML::Clone(node[i]));
    } else if (!(last && edit == Edit::kDrop)) {
      copy.push_back(edited(node[i], path, depth + 1, edit));
    }
  }
  copy.SetStyle(node.Style());
  return copy;
}

std::vector<Request> request_grid() {
  std::vector<Request> out;
  std::uint32_t mix = 0;
  for (const Capability cap : {Capability::cpu(), Capability::sm(90), Capability::sm(100),
                               Capability::sm(103), Capability::sm(120)}) {
    for (std::uint32_t ws : {1u, 2u, 3u, 4u, 8u, 16u, 64u}) {
      for (std::uint32_t nodes : {1u, 4u}) {
        for (int p = 0; p < kPatternCount; ++p) {
          for (std::uint64_t bytes : {std::uint64_t{4096}, 2 * kMiB, 128 * kMiB}) {
            Request r;
            r.capability = cap;
            r.world_size = ws;
            r.nodes = nodes;
            r.pattern = static_cast<Pattern>(p);
            r.dtype = static_cast<Dtype>(mix % kDtypeCount);
            r.multicast = (mix & 1) != 0;
            r.nvlink_domain = (mix & 2) == 0;
            r.message_bytes = bytes;
            if (mix % 5 == 0) {
              r.hidden = 4096;
              r.tokens = static_cast<std::uint32_t>(bytes / (4096 * element_size(r.dtype)));
            }
            ++mix;
            out.push_back(r);
          }
        }
      }
    }
  }
  return out;
}

// Decides the grid; explains and renders every 16th request.
void exercise(const Policy& policy, const std::vector<Request>& grid) {
  for (std::size_t i = 0; i < grid.size(); ++i) {
    const Decision fast = policy.decide(grid[i]);
    (void)policy.max_fused_bytes(grid[i]);
    if (i % 16 != 0) continue;
    const Decision slow = policy.explain(grid[i]);
    BOOST_TEST(fast.same_choice(slow));
    BOOST_TEST(!policy.explain_text(grid[i], slow).empty());
    BOOST_TEST(!policy.decision_json(grid[i], slow).empty());
  }
  (void)sweep(policy, grid[grid.size() / 2], 1, 4 * kMiB);
}

struct Sandbox {
  fs::path dir;
  Sandbox() {
    dir = fs::temp_directory_path() / ("arbiter-omission-" + std::to_string(::getpid()));
    fs::create_directories(dir);
  }
  ~Sandbox() { fs::remove_all(dir); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_default_table_with_one_thing_left_out_gets_a_verdict) {
  const YAML::Node root = YAML::Load(std::string(embedded_default_yaml()));
  std::vector<Variant> variants;
  Path path;
  collect(root, path, variants);
  // The default has 7 top-level keys, 4 backends, 17 fusion and 12 one-shot
  // cells: far more than 200 variants. Fewer means the walk broke.
  BOOST_TEST_REQUIRE(variants.size() > 200u);
  BOOST_TEST_MESSAGE(variants.size() << " variants");

  const Sandbox sandbox;
  const std::vector<Request> grid = request_grid();
  std::size_t loaded[2] = {0, 0};
  std::size_t rejected[2] = {0, 0};
  for (std::size_t v = 0; v < variants.size(); ++v) {
    const Variant& variant = variants[v];
    BOOST_TEST_CONTEXT(variant.name) {
      YAML::Emitter emitter;
      emitter << edited(root, variant.path, 0, variant.edit);
      BOOST_TEST_REQUIRE(emitter.good());
      const std::string file = (sandbox.dir / ("variant-" + std::to_string(v) + ".yaml")).string();
      std::ofstream(file) << "# " << variant.name << "\n" << emitter.c_str() << "\n";

      for (const bool over_default : {false, true}) {
        BOOST_TEST_CONTEXT((over_default ? "over the default" : "standalone")) {
          // The library: a verdict whose diagnostics name a file.
          LoadOptions options;
          options.with_default = over_default;
          options.site_files = {file};
          const LoadResult result = Policy::load(options);
          bool names_file = false;
          for (const Diagnostic& d : result.diagnostics) {
            BOOST_TEST((d.file == file || d.file == "default.yaml"), d.to_string());
            names_file |= d.file == file;
          }
          if (result.policy) {
            ++loaded[over_default];
            exercise(*result.policy, grid);
          } else {
            ++rejected[over_default];
            BOOST_TEST(has_errors(result.diagnostics));
            BOOST_TEST(names_file);
          }

          // The program: exit 0 or 1, agreeing with the library.
          const auto cli = run_command(arbiter_command(std::string("validate ") +
                                                       (over_default ? "" : "--standalone ") +
                                                       shell_quote(file)));
          BOOST_TEST(cli.exit_code == (result.policy ? 0 : 1), cli.output);
          if (!result.policy) BOOST_TEST(cli.output.find(file) != std::string::npos, cli.output);
        }
      }
    }
  }
  BOOST_TEST_MESSAGE("standalone: " << loaded[0] << " loaded, " << rejected[0] << " rejected; "
                                    << "over the default: " << loaded[1] << " loaded, "
                                    << rejected[1] << " rejected");
  // Both outcomes occur: a sweep where everything loads (or nothing does)
  // tests less than it seems to.
  BOOST_TEST(loaded[0] > 0u);
  BOOST_TEST(rejected[0] > 0u);
  BOOST_TEST(loaded[1] > 0u);
  BOOST_TEST(rejected[1] > 0u);
}

// The table of the report that found the crash: five lines, no `enabled:`
// and no fallback. Rejected with the reasons, and the preference list is
// blamed in the file that wrote it.
BOOST_AUTO_TEST_CASE(a_five_line_table_without_enabled_is_rejected_with_reasons) {
  LoadOptions options;
  options.with_default = false;
  options.overrides.yaml("t.yaml",
                         "format: 1\n"
                         "preference:\n"
                         "  single_node: [trtllm]\n"
                         "backends:\n"
                         "  trtllm: {device: gpu}\n");
  const LoadResult result = Policy::load(options);
  BOOST_TEST(!result.policy.has_value());
  std::string text;
  for (const Diagnostic& d : result.diagnostics) {
    BOOST_TEST(d.file == "t.yaml");
    text += d.to_string() + "\n";
  }
  BOOST_TEST(text.find("t.yaml:3:") != std::string::npos, text);
  BOOST_TEST(text.find("which no layer enables") != std::string::npos, text);
  BOOST_TEST(text.find("t.yaml: error: no fallback backend for gpu ranks") != std::string::npos,
             text);
}

// The default with `enabled:` deleted: it loads alone, with a warning at
// each setting that names a backend no layer enables, and then no call has
// a backend: nothing fuses and the fallback is off too.
BOOST_AUTO_TEST_CASE(the_default_without_enabled_loads_with_warnings_and_runs_nothing) {
  std::string text(embedded_default_yaml());
  const std::size_t at = text.find("\nenabled:");
  BOOST_TEST_REQUIRE(at != std::string::npos);
  text.erase(at + 1, text.find('\n', at + 1) - at);
  LoadOptions options;
  options.with_default = false;
  options.overrides.yaml("no-enabled.yaml", text);
  const LoadResult result = Policy::load(options);
  std::size_t warnings = 0;
  for (const Diagnostic& d : result.diagnostics) {
    BOOST_TEST(d.file == "no-enabled.yaml");
    BOOST_TEST(d.line > 0u, d.to_string());
    warnings += d.message.find("which no layer enables") != std::string::npos;
  }
  // fallback.gpu, fallback.cpu, and trtllm, mnnvl, mnnvl, shm in the
  // preference lists.
  BOOST_TEST(warnings == 6u);
  BOOST_TEST_REQUIRE(result.policy.has_value());
  for (const Request& r : request_grid()) {
    const Decision d = result.policy->decide(r);
    BOOST_TEST(!d.fused);
    BOOST_TEST((d.backend == Backend::kNone));
  }
}
