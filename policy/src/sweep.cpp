// The decision as a function of message size. Every size at which a decision
// can change is a cap (inclusive) or a threshold divided by the world size,
// so evaluating one size per interval between those points is exact.
#include <algorithm>

#include "arbiter/policy.h"

namespace arbiter {

std::vector<Band> sweep(const Policy& policy, const Request& request, std::uint64_t from,
                        std::uint64_t to) {
  std::vector<Band> bands;
  if (from > to) return bands;
  const Tables& t = policy.tables();
  std::vector<std::uint64_t> edges;  // decisions may differ between e and e+1
  // Only cells whose keys match the request can decide it (a site table
  // may hold thousands for other shapes).
  for (const Cell& c : t.fusion) {
    if (!c.off && c.key.matches(request)) edges.push_back(c.max_bytes);
  }
  for (const Cell& c : t.oneshot) {
    if (c.key.matches(request)) edges.push_back(c.max_bytes);
  }
  if (request.world_size > 0) {
    for (const BackendRules& r : t.backends) {
      if (r.defined && r.algorithm == AlgorithmRule::kThreshold) {
        edges.push_back(r.oneshot_max_total / request.world_size);
      }
    }
  }
  edges.push_back(to);
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());

  Request r = request;
  std::uint64_t first = from;
  for (std::uint64_t edge : edges) {
    if (edge < first) continue;
    if (edge > to) break;
    r.message_bytes = edge;
    Decision d = policy.decide(r);
    // The reason too: the same backend taking a call for another reason
    // ("no eligible fused backend" below the cap, "above the cap" over it)
    // is another band, or the band's label contradicts decide().
    if (!bands.empty() && bands.back().decision.same_choice(d) &&
        bands.back().decision.cap == d.cap && bands.back().decision.reason == d.reason) {
      bands.back().last = edge;
    } else {
      bands.push_back(Band{first, edge, d});
    }
    if (edge == to) break;
    first = edge + 1;
  }
  return bands;
}

}  // namespace arbiter
