#include "arbiter/tuning/regret.h"

namespace arbiter::tuning {

Request group_request(const GroupKey& key, const TopologyFlags& topology) {
  Request r;
  r.capability = key.capability;
  r.world_size = key.world_size;
  r.nodes = key.nodes;
  r.nvlink_domain = key.nodes == 1 ? true : topology.nvlink_domain;
  r.multicast = topology.multicast;
  r.dtype = key.dtype;
  r.pattern = key.pattern;
  r.residual_replicated = key.replicated();
  r.buffers_registered = key.registered;
  return r;
}

Request request_at(const Group& group, std::uint64_t bytes, const TopologyFlags& topology) {
  Request r = group_request(group.key, topology);
  r.message_bytes = bytes;
  const Row* fewest = nullptr;
  for (const Curve& c : group.curves) {
    const Point* p = c.at(bytes);
    if (!p) continue;
    for (const Row* row : p->rows) {
      if (!fewest || row->num_tokens < fewest->num_tokens) fewest = row;
    }
  }
  if (fewest) {
    r.tokens = fewest->num_tokens;
    r.hidden = fewest->hidden;
  }
  return r;
}

FusedRun tables_fused_run(const Policy& policy, const Group& group, const TopologyFlags& topology) {
  return [&policy, &group, topology](std::uint64_t bytes) -> std::optional<Option> {
    const Decision d = policy.fused_choice(request_at(group, bytes, topology));
    if (d.backend == Backend::kNone) return std::nullopt;
    return Option{std::string(backend_name(d.backend)), std::string(algorithm_name(d.algorithm)),
                  true};
  };
}

std::string decision_label(const Decision& d) {
  if (d.backend == Backend::kNone) return "no backend";
  return std::string(backend_name(d.backend)) + " " + std::string(algorithm_name(d.algorithm)) +
         (d.fused ? " fused" : " unfused");
}

Regret regret(const Policy& policy, const Group& group, const TopologyFlags& topology) {
  Regret out;
  double sum = 0;
  int measured = 0;
  for (std::uint64_t bytes : group.sizes) {
    RegretPoint p;
    p.bytes = bytes;
    p.decision = policy.decide(request_at(group, bytes, topology));
    p.chosen = decision_label(p.decision);
    const std::optional<Group::Best> best = group.best(bytes, std::nullopt);
    p.best = best->curve->option.label();
    p.best_us = best->latency_us;
    if (p.decision.backend != Backend::kNone) {
      if (p.decision.fused) {
        const Option option{std::string(backend_name(p.decision.backend)),
                            std::string(algorithm_name(p.decision.algorithm)), true};
        if (const Curve* c = group.curve(option)) {
          if (const Point* at = c->at(bytes)) {
            p.chosen_us = at->latency_us;
            p.chosen_measured = option.label();
          }
        }
      } else if (const std::optional<Group::Best> unfused = group.best(bytes, false)) {
        p.chosen_us = unfused->latency_us;
        p.chosen_measured = unfused->curve->option.label();
      }
    }
    if (p.chosen_us) {
      p.regret_pct = (*p.chosen_us / p.best_us - 1.0) * 100.0;
      sum += *p.regret_pct;
      ++measured;
      if (!out.worst_pct || *p.regret_pct > *out.worst_pct) {
        out.worst_pct = p.regret_pct;
        out.worst_bytes = bytes;
      }
    } else {
      ++out.not_measured;
    }
    out.points.push_back(std::move(p));
  }
  if (measured > 0) out.mean_pct = sum / measured;
  return out;
}

}  // namespace arbiter::tuning
