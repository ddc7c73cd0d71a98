// The policy engine: loads layered YAML tuning tables and decides, per call,
// which backend and algorithm run an all-reduce.
//
// Thread-safety: a Policy is immutable once loaded; any number of threads
// may call decide()/explain() concurrently. Copies share the tables.
//
// Errors: loading either succeeds completely or changes nothing (load()
// returns diagnostics, load_or_throw() throws LoadError). decide() never
// throws and never allocates.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/decision.h"
#include "arbiter/detail/route.h"
#include "arbiter/diagnostic.h"
#include "arbiter/request.h"
#include "arbiter/tables.h"
#include "arbiter/types.h"

namespace arbiter {

// Programmatic overrides: the last layer, above every site file.
class Overrides {
 public:
  // A cap for one cell; std::nullopt writes `off` (no fusion there).
  Overrides& fusion_cap(const CellKey& key, std::optional<std::uint64_t> bytes);
  Overrides& oneshot_cap(const CellKey& key, std::uint64_t bytes);
  // A whole table fragment in the site-file format; `name` is used as the
  // file name in diagnostics and traces.
  Overrides& yaml(std::string name, std::string text);

  struct CellOverride {
    CellKey key;
    bool fusion = true;
    std::optional<std::uint64_t> bytes;
  };
  const std::vector<CellOverride>& cells() const { return cells_; }
  const std::vector<std::pair<std::string, std::string>>& fragments() const { return fragments_; }

 private:
  std::vector<CellOverride> cells_;
  std::vector<std::pair<std::string, std::string>> fragments_;
};

struct LoadOptions {
  // The embedded configs/default.yaml is the bottom layer. Turn it off only
  // to validate a table that must stand alone.
  bool with_default = true;
  // Site files, applied in order (later files win).
  std::vector<std::string> site_files;
  // The value of ARBITER_BACKENDS (comma list), if set.
  std::optional<std::string> backends_env;
  Overrides overrides;

  // site_files from ARBITER_CONFIG (':'-separated; `preset:NAME` is one
  // item), backends_env from
  // ARBITER_BACKENDS; empty variables count as unset.
  static LoadOptions from_environment();
};

class Policy;
struct LoadResult;

namespace detail {
struct Compiled;
}  // namespace detail

class Policy {
 public:
  // Never throws for bad input; reports everything it finds.
  static LoadResult load(const LoadOptions& options);
  // Throws LoadError (with every diagnostic) when any error was found.
  static Policy load_or_throw(const LoadOptions& options);
  // The embedded defaults with ARBITER_CONFIG and ARBITER_BACKENDS applied.
  static Policy from_environment();

  // The hot path: a few nanoseconds, no allocation, no exception. The
  // returned trace is empty. Inline: the common case is a table lookup and
  // two compares; everything else goes to decide_slow().
  Decision decide(const Request& request) const noexcept;
  // The same decision, with every rule evaluated recorded in its trace.
  Decision explain(const Request& request) const noexcept;

  // The fused cap for this request's (capability, world size, nodes,
  // pattern, dtype, topology), ignoring its message bytes: what vLLM's
  // PassConfig.flashinfer_max_size() answers, used to size workspaces and
  // split compile ranges. std::nullopt when nothing would be fused at any
  // size (no cell, `off`, or no eligible fused backend).
  std::optional<std::uint64_t> max_fused_bytes(const Request& request) const noexcept;

  // The fused backend and algorithm decide() would run this request with,
  // were it under a fusion cap: the preference walk and the algorithm rule
  // alone, the fusion table not consulted. Backend::kNone when no fused
  // backend is eligible (or the request is invalid). For `arbiter tune`,
  // which must weigh the fused option the tables run, not the best one
  // measured. Not the hot path.
  Decision fused_choice(const Request& request) const noexcept;

  // The same tables with the backends in `mask` (bit 1 << Backend) no longer
  // allowed: what decide() with Request::excluded_backends = mask answers, on
  // the fast path. For a runtime whose workspaces for those backends failed.
  // The fingerprint stays that of the tables (every rank compares those).
  Policy without_backends(std::uint32_t mask) const;

  // Stable 64-bit hash of the effective tables (cells, backend rules,
  // preference, allowed backends); origins and provenance do not count.
  // Equal on every machine for equal tables.
  std::uint64_t fingerprint() const noexcept;
  std::string fingerprint_hex() const;

  const Tables& tables() const;
  // REQUIRES: id names an origin (throws std::out_of_range for kNoOrigin;
  // tables().find_origin() answers nullptr instead).
  const Origin& origin(std::uint16_t id) const;
  // "default.yaml:40:5 (default)"; "-" for kNoOrigin.
  std::string origin_text(std::uint16_t id) const;
  // Diagnostics (warnings) found while loading.
  const std::vector<Diagnostic>& warnings() const;

  // Human rendering of an explained decision, one rule a line.
  std::string explain_text(const Request& request, const Decision& decision) const;
  // One JSON object: backend, algorithm, fused, reason, max_fused_bytes,
  // cap, fingerprint, request, trace.
  std::string decision_json(const Request& request, const Decision& decision) const;

 private:
  explicit Policy(std::shared_ptr<const detail::Compiled> impl);
  // decide() for requests its inline part does not cover: invalid, backends
  // excluded, no fusion cell, cells keyed by node counts.
  Decision decide_slow(const Request& request) const noexcept;

  std::shared_ptr<const detail::Compiled> impl_;
  // Copies of the compiled lookup's addresses, so decide() reaches its route
  // without first loading them through impl_ (one dependent load less).
  const std::uint32_t* shape_of_ = nullptr;
  const detail::Route* routes_ = nullptr;
  std::uint32_t stride_ = 0;
};

struct LoadResult {
  std::optional<Policy> policy;         // empty when any error was found
  std::vector<Diagnostic> diagnostics;  // errors and warnings, in file order
};

static_assert(kMaxWorldSize < 0xFFFFu,
              "decide() folds capability codes above 255 into the "
              "world size compare: strides stay below 1 << 16");

inline Decision Policy::decide(const Request& r) const noexcept {
  // No branch here depends on the message size (it changes call to call).
  // A capability code above 255 (no device: decide_slow refuses it) fails
  // the world size compare, rather than alias the cells of its low byte.
  const std::uint32_t code = r.capability.code();
  const bool plain = r.world_size >= 2 && (r.world_size | (code & 0xFF00u) << 8) < stride_ &&
                     r.nodes - 1u < r.world_size && r.excluded_backends == 0;
  if (!plain) [[unlikely]] {
    return decide_slow(r);
  }
  const std::uint32_t block = shape_of_[code * stride_ + r.world_size];
  if (block == 0) return decide_slow(r);  // no fusion cell (or no device): the rule walk
  const detail::Route& route =
      routes_[(block - 1) * detail::kSignatureCount + detail::signature(r)];
  if (route.nodes_keyed) [[unlikely]] {
    return decide_slow(r);
  }
  return detail::decide_from_route(route, r);
}

// A band of message sizes [first, last] over which the decision is the same.
struct Band {
  std::uint64_t first = 0;
  std::uint64_t last = 0;
  Decision decision;
};

// The decision as a function of message size for the request's other
// fields, from `from` to `to` bytes inclusive; adjacent equal decisions are
// merged. Exact: every size where the decision can change is a breakpoint.
std::vector<Band> sweep(const Policy& policy, const Request& request, std::uint64_t from,
                        std::uint64_t to);

// Validates one file: alone (schema, types, conflicts within it) and, when
// `over_default` is set, as a site layer over the embedded defaults.
std::vector<Diagnostic> validate_file(const std::string& path, bool over_default);

// The embedded configs/default.yaml.
std::string_view embedded_default_yaml();

// Presets: upstream tables shipped with arbiter (configs/presets/NAME.yaml,
// dated and cited in their provenance), embedded in the library. Wherever a
// table file is taken (LoadOptions::site_files, ARBITER_CONFIG, --config,
// validate_file(), `arbiter diff` and `validate`), `preset:NAME` names one
// instead of a path; it is then a
// site layer like a file, reported as `presets/NAME.yaml`. `preset:default`
// is the embedded default itself (no layer over it).
inline constexpr std::string_view kPresetPrefix = "preset:";
inline constexpr std::string_view kDefaultPreset = "default";
// Every name `preset:` takes, `default` first, then the presets by name.
std::vector<std::string> preset_names();
// A preset's YAML, or nullopt when there is none of that name (or for
// `default`: embedded_default_yaml()).
std::optional<std::string_view> embedded_preset(std::string_view name);

}  // namespace arbiter
