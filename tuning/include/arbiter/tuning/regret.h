// Regret: how much slower the option the tables choose is than the best
// option measured, size by size.
//
// At every measured size of a group the tables decide on a Request built
// from the group and the rows at that size (capability, world size, nodes,
// dtype, pattern, whether the residual is replicated, bytes; tokens and
// hidden of the row with the fewest tokens there, the conservative case for
// the two-shot token rule; the topology flags from TopologyFlags). The decision is matched to a
// measured option:
//   fused     the curve with the same (backend, algorithm, fused = 1);
//   unfused   the best unfused (fused = 0) row at that size, whatever its
//             backend: the tables name the fallback, the benchmark may call
//             it "baseline".
// regret = chosen / best - 1, in percent. A decision whose option was not
// measured at that size is "not measured" and left out of the mean.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/policy.h"
#include "arbiter/tuning/groups.h"

namespace arbiter::tuning {

// The topology of a multi-node group: single-node groups always have NVLink
// (as `arbiter decide` assumes); multi-node ones only with nvlink_domain.
struct TopologyFlags {
  bool nvlink_domain = false;
  bool multicast = false;
};

// The group's request without a size (message_bytes 0, tokens unknown).
Request group_request(const GroupKey& key, const TopologyFlags& topology);

// The request for one measured size of the group (see above).
Request request_at(const Group& group, std::uint64_t bytes, const TopologyFlags& topology);

// The fused option `policy` runs for the group's request at each size
// (Policy::fused_choice): what fusion_cap() weighs, so that a cap rests on
// the backend and algorithm these tables pick. `policy` and `group` must
// outlive the result.
FusedRun tables_fused_run(const Policy& policy, const Group& group, const TopologyFlags& topology);

// "trtllm oneshot fused", "nccl native unfused", "no backend".
std::string decision_label(const Decision& decision);

struct RegretPoint {
  std::uint64_t bytes = 0;
  Decision decision;
  std::string chosen;               // decision_label(decision)
  std::optional<double> chosen_us;  // nullopt: not measured at this size
  std::string chosen_measured;      // the measured option it maps to
  std::string best;                 // the best measured option
  double best_us = 0;
  std::optional<double> regret_pct;  // nullopt when not measured
};

struct Regret {
  std::vector<RegretPoint> points;  // one per measured size, ascending
  int not_measured = 0;
  std::optional<double> mean_pct;  // over the measured points
  std::optional<double> worst_pct;
  std::uint64_t worst_bytes = 0;
};

Regret regret(const Policy& policy, const Group& group, const TopologyFlags& topology);

}  // namespace arbiter::tuning
