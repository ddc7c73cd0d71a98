#include "arbiter/workspace_plan.h"

#include <algorithm>
#include <cstdint>

namespace arbiter {

WorkspacePlan plan_workspaces(const Policy& policy, const CommunicatorOptions& options,
                              std::uint32_t world_size) {
  constexpr std::uint32_t kAll = CommunicatorOptions::kAllPatterns;
  WorkspacePlan plan;
  plan.asked_patterns = options.pattern_mask == 0 ? kAll : options.pattern_mask;
  plan.topology = topology_of(request_of(options, world_size, Pattern::kAllreduce));
  for (int p = 0; p < kPatternCount; ++p) {
    if (!((plan.asked_patterns >> p) & 1u)) continue;
    if (auto c = policy.max_fused_bytes(request_of(options, world_size, static_cast<Pattern>(p)))) {
      plan.fused_cap = std::max(plan.fused_cap, *c);
    }
  }
  const Tables& t = policy.tables();
  const std::uint64_t largest_call =
      Request::message_bytes_of(options.max_tokens, options.hidden, options.dtype);
  const std::uint64_t token = Request::message_bytes_of(1, options.hidden, options.dtype);
  // What fused workspaces hold: the cap, or more for a bench.
  const std::uint64_t fused_bytes = std::max(plan.fused_cap, options.fused_workspace_bytes);
  std::vector<Backend> candidates;
  if (fused_bytes > 0) {
    for (Backend b : t.preference[static_cast<int>(plan.topology)]) candidates.push_back(b);
  }
  const Backend fallback = t.fallback[static_cast<int>(options.capability.device())];
  if (fallback != Backend::kNone &&
      std::find(candidates.begin(), candidates.end(), fallback) == candidates.end()) {
    candidates.push_back(fallback);
  }
  for (Backend b : candidates) {
    PlannedWorkspace w;
    w.backend = b;
    w.fallback = b == fallback;
    w.allowed = (t.allowed_mask >> static_cast<int>(b)) & 1u;
    arbiter_workspace_spec& spec = w.spec;
    spec.world_size = static_cast<std::int32_t>(world_size);
    spec.device = options.device;
    spec.nodes = options.nodes;
    spec.max_tokens = options.max_tokens;
    spec.hidden = options.hidden;
    spec.dtype = static_cast<arbiter_dtype>(options.dtype);
    spec.pattern_mask = plan.asked_patterns;
    // Fused backends take at most the cap. The fallback takes any size, in
    // slices of its workspace (run_in_slices, unless the module streams by
    // itself as shm does), so it needs no more than the cap or
    // kFallbackSliceBytes: nccl's scratch need not hold the largest call.
    spec.max_message_bytes = fused_bytes;
    if (w.fallback) {
      spec.max_message_bytes = std::max(
          {fused_bytes,
           std::min(largest_call == 0 ? kFallbackSliceBytes : largest_call, kFallbackSliceBytes),
           token});
    }
    // max_tokens 0 (unknown, the default): as many tokens as the workspace
    // takes, so that modules which size by tokens (trtllm, mnnvl) hold the
    // cap and are not refused for a zero.
    if (spec.max_tokens == 0 && options.hidden != 0) {
      spec.max_tokens = static_cast<std::uint32_t>(
          std::min<std::uint64_t>((spec.max_message_bytes + token - 1) / token, UINT32_MAX));
    }
    plan.workspaces.push_back(w);
  }
  return plan;
}

}  // namespace arbiter
