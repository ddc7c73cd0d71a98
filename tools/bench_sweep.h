// `arbiter bench`: what is measured. The command line, the sweep of call
// shapes (dtype x pattern x hidden x tokens) and the options measured at
// every shape (each fused backend and algorithm, then the unfused baseline).
//
// The options depend only on the tables and the device kind, never on what
// is available: a backend that cannot run is measured as a skipped row with
// the reason, so every run of the same sweep writes the same rows.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/policy.h"
#include "cli.h"

namespace arbiter::cli::bench {

// Fused workspaces are sized for the sweep's largest message, up to this
// (multi-node tuning measures 64 MiB per rank at world size 16); larger
// fused calls are recorded as skipped (above the workspace).
inline constexpr std::uint64_t kMaxWorkspaceBytes = std::uint64_t{64} << 20;
// The first call of a point is checked against the reference up to this
// many bytes per rank (the fp64 reference of every rank's input is costly).
inline constexpr std::uint64_t kMaxCheckedBytes = std::uint64_t{1} << 20;

enum class DeviceChoice { kAuto, kCpu, kGpu };

// The command line, as given; unset fields take the device kind's default
// (resolve()).
struct Settings {
  std::vector<std::uint32_t> tokens;                             // empty: --sizes, or the default
  std::optional<std::pair<std::uint64_t, std::uint64_t>> sizes;  // --sizes FROM:TO
  std::vector<std::uint32_t> hidden;
  std::vector<Dtype> dtypes;
  std::vector<Pattern> patterns;
  // --residual-replicated: every call of a residual pattern carries
  // ARBITER_RUN_RESIDUAL_REPLICATED (the ranks' residual_in are the same).
  bool residual_replicated = false;
  // --registered: every option is measured a second time with the call's
  // input and outputs in registered memory (Communicator::alloc_registered).
  bool registered = false;
  std::optional<int> warmup, trials, iterations;
  std::string output;                  // empty: stdout (rank 0)
  std::optional<std::uint32_t> nodes;  // unset: the hosts the ranks run on
  bool nvlink_domain = false;
  bool multicast = false;
  std::chrono::milliseconds timeout{60000};
  bool progress = false;
  DeviceChoice device = DeviceChoice::kAuto;
};

// Adds bench's flags (all but --config and --help) to `desc`.
void add_options(po::options_description& desc);
// Reads them; throws UsageError naming the flag at fault.
Settings read_settings(const po::variables_map& vm);
// Fills what the command line left unset with `kind`'s defaults: CPU (shm)
// sweeps 8 KiB .. 2 MiB in a few seconds, GPU sweeps 8 KiB .. 64 MiB.
void resolve(Settings& settings, DeviceKind kind);

// One call shape.
struct Point {
  Dtype dtype = Dtype::kBf16;
  Pattern pattern = Pattern::kResidualRmsnorm;
  std::uint32_t hidden = 0;
  std::uint32_t tokens = 0;
  std::uint64_t bytes = 0;  // per rank: tokens x hidden x element size
  // The call carries ARBITER_RUN_RESIDUAL_REPLICATED (residual patterns only).
  bool residual_replicated = false;

  // As the tables key it: nullopt for allreduce, else replicated or distinct.
  std::optional<Residual> residual() const {
    if (pattern == Pattern::kAllreduce) return std::nullopt;
    return residual_replicated ? Residual::kReplicated : Residual::kDistinct;
  }
};

// Ordered by dtype, pattern, hidden, then tokens (ascending), as given; the
// residual patterns' points are replicated with --residual-replicated.
// --sizes: per hidden size, the whole token count nearest each power of two
// of bytes (at least 1; repeated counts once). REQUIRES: resolve().
std::vector<Point> make_sweep(const Settings& settings);

// One thing measured at every point.
struct Option {
  Backend backend = Backend::kNone;
  Algorithm algorithm = Algorithm::kNative;
  bool fused = false;
  // The call's input and outputs lie in registered memory.
  bool registered = false;
  // "shm oneshot fused", "nccl native unfused", "shm twoshot fused registered"
  std::string label() const;
};

// The fused backends of the tables' preference lists for `kind` (CPU: cpu;
// GPU: single_node, then multi_node), each with the algorithms its rule
// picks between (one-shot and two-shot; native for `algorithm: native`),
// then the fallback's native, unfused path; with `registered`, every one of
// them again with registered buffers. Allowed or not, available or not:
// run_on() (or the registered allocation) says why one cannot run.
std::vector<Option> options_for(const Tables& tables, DeviceKind kind, bool registered = false);

// Sorted-sample percentile with linear interpolation (q in [0, 1]).
double percentile(std::vector<double> values, double q);

}  // namespace arbiter::cli::bench
