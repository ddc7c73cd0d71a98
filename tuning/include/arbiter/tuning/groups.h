// Measurements grouped into latency curves, and the caps they imply.
//
// Grouping: rows are grouped by (capability, world size, nodes, pattern,
// dtype, residual, buffers): calls with a replicated residual are a group of
// their own, since the tables may key their cells by it; so are calls whose
// buffers lay in registered memory (`buffers: registered`). Within a group a
// curve is one option (backend, algorithm, fused) and a point is (bytes,
// latency).
//
// Duplicates: several rows for the same option and bytes (several hidden
// sizes, runs or files) make one point whose latency is their median (the
// mean of the two middle values for an even count). They must agree: when
// the slowest is more than kMaxDuplicateSpread (2x) the fastest, the group is
// refused and the message names the rows.
//
// A group is also refused when its rows name different devices (the device
// column, or a file's `# device:` line; rows with no device are not
// compared), or when it has fewer than 2 distinct sizes.
//
// Caps are always measured sizes: sizes between measured points are never
// invented. With margin m (percent):
//   fusion cap   the largest size S such that at every size <= S where both
//                a fused and an unfused option were measured, the best fused
//                latency <= (1 + m/100) x the best unfused latency (ties go
//                to fused). `off` when fused loses at the smallest such size;
//                none when the group has no unfused (or no fused) option.
//   one-shot cap single-node groups only, trtllm fused one-shot against
//                trtllm fused two-shot at the sizes where both were measured,
//                by the same rule; no baseline is needed. `off` when one-shot
//                loses at the smallest such size (a one-shot cell cannot say
//                `off`, so the overlay then writes no one-shot cell).
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/diagnostic.h"
#include "arbiter/tuning/results.h"
#include "arbiter/types.h"

namespace arbiter::tuning {

inline constexpr double kMaxDuplicateSpread = 2.0;

struct GroupKey {
  Capability capability;
  std::uint32_t world_size = 0;
  std::uint32_t nodes = 1;
  Pattern pattern = Pattern::kAllreduce;
  Dtype dtype = Dtype::kBf16;
  // As Row::residual: nullopt for allreduce, else replicated or distinct.
  std::optional<Residual> residual;
  // As Row::registered.
  bool registered = false;

  friend auto operator<=>(const GroupKey&, const GroupKey&) = default;
  bool replicated() const { return residual == Residual::kReplicated; }
  // "capability 90, world size 2, 1 node, residual_rmsnorm, bf16", then
  // ", residual replicated" for a replicated residual and ", registered
  // buffers" for registered ones.
  std::string to_string() const;
};

// What was measured: a backend running an algorithm, fused or not.
struct Option {
  std::string backend;
  std::string algorithm;
  bool fused = false;

  friend auto operator<=>(const Option&, const Option&) = default;
  // "trtllm oneshot fused", "baseline sum+norm unfused"
  std::string label() const;
};

struct Point {
  std::uint64_t bytes = 0;
  double latency_us = 0;         // the median of the rows below
  std::vector<const Row*> rows;  // at least one, in file order
};

struct Curve {
  Option option;
  std::vector<Point> points;  // ascending bytes, one per size

  const Point* at(std::uint64_t bytes) const;
};

struct Group {
  GroupKey key;
  std::string device;                // empty: no row named one
  std::vector<std::string> files;    // the files feeding the group, in input order
  std::vector<Curve> curves;         // sorted by option
  std::vector<std::uint64_t> sizes;  // every measured size, ascending

  // The best (lowest) latency among fused (or unfused) options at `bytes`,
  // with the option; nullopt when none was measured there.
  struct Best {
    double latency_us = 0;
    const Curve* curve = nullptr;
  };
  std::optional<Best> best(std::uint64_t bytes, std::optional<bool> fused) const;
  const Curve* curve(const Option& option) const;
};

struct Grouping {
  std::vector<Group> groups;         // accepted groups, sorted by key
  std::vector<Diagnostic> refusals;  // one error per refused group problem
};

// `files` must outlive the result (points point at their rows).
Grouping group_results(const std::vector<ResultsFile>& files);

// One cap derived from a group.
struct Cap {
  enum class Kind {
    kBytes,  // `bytes` is the cap
    kOff,    // the best single cap is below the smallest compared size
    kNone,   // nothing to compare: `why` says what is missing
  };
  Kind kind = Kind::kNone;
  std::uint64_t bytes = 0;
  // The compared sizes, ascending; the first above the cap, where the
  // preferred option lost (0: the cap is the largest compared size); and
  // sizes at or below the cap where it lost too, kept because the cap fits
  // the wins around them better.
  std::vector<std::uint64_t> compared;
  std::uint64_t lost_at = 0;
  std::vector<std::uint64_t> lost_inside;
  double lost_us = 0, winner_us = 0;  // at lost_at: the loser's and winner's latency
  std::string winner;                 // at lost_at: the option that won
  std::string preferred;              // "fused" or "one-shot"
  std::string why;                    // for kNone
  // One line for humans: "4 MiB (fused lost at 8 MiB: 118 us vs 100 us nccl native unfused)".
  std::string text() const;
};

// The fused option the tables run at `bytes` (std::nullopt: no fused
// backend is eligible for the group): see tables_fused_run() in regret.h.
using FusedRun = std::function<std::optional<Option>(std::uint64_t bytes)>;

// The fusion cap: fused against unfused. margin_pct >= 0. With `runs`, the
// fused side at each size is the option the tables run there (sizes where
// it was not measured are not compared), so that the cap never rests on a
// backend or algorithm the tables would not pick; without it, or when no
// fused backend is eligible at all, the best fused option measured.
Cap fusion_cap(const Group& group, double margin_pct, const FusedRun& runs = {});

// The one-shot cap of single-node trtllm: one-shot against two-shot.
// kNone for multi-node groups and groups without both algorithms measured.
Cap oneshot_cap(const Group& group, double margin_pct);

// The one-shot split of `backend` (one whose tables say `algorithm:
// threshold`: shm, mnnvl): its fused one-shot against its fused two-shot, by
// the same rule. kNone when the group lacks either. The tables' threshold is
// bytes x world size, so a group's split is cap.bytes x world size.
Cap split_cap(const Group& group, const std::string& backend, double margin_pct);

// The backends whose one-shot split split_cap() derives.
inline constexpr const char* kThresholdBackends[] = {"shm", "mnnvl"};

}  // namespace arbiter::tuning
