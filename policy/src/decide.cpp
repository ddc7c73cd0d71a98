// decide() and explain().
//
// explain() walks every rule and records it. decide() takes the same path
// through precomputed routes: the preference walk and the algorithm rule
// for each (capability, world size, signature) were computed at load time
// by the very checks explain() runs, so both agree by construction (and
// decide_test checks it exhaustively).
#include "arbiter/policy.h"
#include "compiled.h"

namespace arbiter {
namespace {

using detail::Compiled;
using detail::CompiledCell;

void record(Decision& d, Rule rule, Backend backend, std::uint8_t verdict, std::uint16_t origin,
            std::uint64_t value, std::uint64_t limit) {
  d.trace.add({rule, backend, verdict, origin, value, limit});
}

void explain_algorithm(const Compiled& c, const Request& r, Backend b, Decision& d) {
  const detail::CompiledBackend& rules = c.backends[static_cast<int>(b)];
  const BackendRules& source = c.tables.backends[static_cast<int>(b)];
  switch (rules.algorithm) {
    case AlgorithmRule::kNative:
      d.algorithm = Algorithm::kNative;
      return;
    case AlgorithmRule::kOneshotTable:
      if (const CompiledCell* cell = c.oneshot.find(r)) {
        const bool one = r.message_bytes <= cell->max_bytes;
        d.algorithm = one ? Algorithm::kOneshot : Algorithm::kTwoshot;
        d.oneshot_origin = cell->origin;
        record(d, Rule::kOneshotCell, b, one, cell->origin, r.message_bytes, cell->max_bytes);
      } else {
        d.algorithm = c.tables.oneshot_default;
        record(d, Rule::kOneshotDefault, b, d.algorithm == Algorithm::kOneshot,
               c.tables.oneshot_default_origin, r.message_bytes, kNoCap);
      }
      break;
    case AlgorithmRule::kThreshold: {
      if (const CompiledCell* cell = detail::cpu_oneshot_cell(c, r)) {
        const bool one = r.message_bytes <= cell->max_bytes;
        d.algorithm = one ? Algorithm::kOneshot : Algorithm::kTwoshot;
        d.oneshot_origin = cell->origin;
        record(d, Rule::kOneshotCell, b, one, cell->origin, r.message_bytes, cell->max_bytes);
        break;
      }
      const std::uint64_t total = r.message_bytes * r.world_size;
      const bool one = total <= rules.oneshot_max_total;
      d.algorithm = one ? Algorithm::kOneshot : Algorithm::kTwoshot;
      record(d, Rule::kOneshotThreshold, b, one, source.origins[BackendRules::kOneshotMaxTotal],
             total, rules.oneshot_max_total);
      break;
    }
  }
  if (d.algorithm == Algorithm::kTwoshot && rules.twoshot_needs_tokens_ge_world_size &&
      r.tokens != 0 && r.tokens < r.world_size) {
    d.algorithm = Algorithm::kOneshot;
    record(d, Rule::kTwoshotTokens, b, 1, source.origins[BackendRules::kTwoshotTokens], r.tokens,
           r.world_size);
  }
}

void explain_fallback(const Compiled& c, const Request& r, Reason reason, Decision& d) {
  const int kind = static_cast<int>(r.capability.device());
  const Backend fb = c.fallback[kind];
  const Ineligible why = fb == Backend::kNone ? Ineligible::kNotAllowed : c.check(fb, r);
  record(d, Rule::kFallback, fb, static_cast<std::uint8_t>(why), c.tables.fallback_origin[kind],
         r.message_bytes, 0);
  d.fused = false;
  d.algorithm = Algorithm::kNative;
  d.reason = why == Ineligible::kEligible ? reason : Reason::kNoBackend;
  d.backend = why == Ineligible::kEligible ? fb : Backend::kNone;
}

// The preference walk: the first eligible backend runs the call fused.
bool explain_fused(const Compiled& c, const Request& r, Decision& d) {
  const int topo = static_cast<int>(topology_of(r));
  for (int i = 0; i < c.preference_size[topo]; ++i) {
    const Backend b = c.preference[topo][i];
    const Ineligible why = c.check(b, r);
    record(d, Rule::kBackendCheck, b, static_cast<std::uint8_t>(why),
           c.tables.preference_origin[topo], 0, 0);
    if (why != Ineligible::kEligible) continue;
    d.backend = b;
    d.fused = true;
    d.reason = Reason::kFused;
    explain_algorithm(c, r, b, d);
    return true;
  }
  return false;
}

// One rank is a valid group: no cell fuses it (cells need 2), so the
// fallback runs its epilogue, where the fallback's world_sizes include 1.
// A capability outside cpu and 50..199 (only Capability::sm() in C++ can
// make one; every parser refuses it) names no device: the lookups index by
// its low byte, so capability 356 read capability 100's cells.
bool valid_capability(Capability c) {
  return c.is_cpu() || (c.code() >= Capability::kMinSm && c.code() <= Capability::kMaxSm);
}

bool valid_request(const Request& r) {
  return r.world_size >= 1 && r.nodes >= 1 && r.nodes <= r.world_size &&
         valid_capability(r.capability);
}

}  // namespace

// Requests the routes do not cover (invalid, or with backends excluded by the
// caller) take the rule walk; kept out of line so decide() stays small.
[[gnu::noinline]] static Decision decide_by_rules(const Policy& policy, const Request& r) {
  Decision full = policy.explain(r);
  full.trace.clear();
  return full;
}

Decision Policy::explain(const Request& r) const noexcept {
  const Compiled& c = *impl_;
  Decision d;
  const bool valid = valid_request(r);
  record(d, Rule::kRequestCheck, Backend::kNone, valid, kNoOrigin, r.world_size, r.nodes);
  if (!valid) {
    explain_fallback(c, r, Reason::kInvalidRequest, d);
    return d;
  }
  record(d, Rule::kAllowedBackends, Backend::kNone, 1, c.tables.enabled_origin, c.allowed_mask,
         r.excluded_backends);
  const CompiledCell* cell = c.fusion.find(r);
  if (cell == nullptr) {
    record(d, Rule::kFusionCell, Backend::kNone, 0, kNoOrigin, 0, kNoCap);
    explain_fallback(c, r, Reason::kNoFusionCell, d);
    return d;
  }
  d.fusion_origin = cell->origin;
  record(d, Rule::kFusionCell, Backend::kNone, !cell->off, cell->origin, 0,
         cell->off ? kNoCap : cell->max_bytes);
  if (cell->off) {
    explain_fallback(c, r, Reason::kFusionOff, d);
    return d;
  }
  d.cap = cell->max_bytes;
  const bool fits = r.message_bytes <= cell->max_bytes;  // inclusive
  record(d, Rule::kFusedCap, Backend::kNone, fits, cell->origin, r.message_bytes, cell->max_bytes);
  if (!fits) {
    explain_fallback(c, r, Reason::kAboveCap, d);
    return d;
  }
  if (!explain_fused(c, r, d)) explain_fallback(c, r, Reason::kNoEligibleBackend, d);
  return d;
}

Decision Policy::fused_choice(const Request& r) const noexcept {
  Decision d;
  if (valid_request(r)) explain_fused(*impl_, r, d);
  d.trace.clear();
  return d;
}

Decision Policy::decide_slow(const Request& r) const noexcept {
  const Compiled& c = *impl_;
  if (!valid_request(r) || r.excluded_backends != 0) return decide_by_rules(*this, r);
  const std::uint32_t block =
      r.world_size < stride_ ? shape_of_[(r.capability.code() & 0xFF) * stride_ + r.world_size] : 0;
  if (block == 0) {
    // No fusion entry for (capability, world size): the fallback, if it can.
    Decision d;
    const Backend fb = c.fallback[static_cast<int>(r.capability.device())];
    const bool ok = fb != Backend::kNone && c.check(fb, r) == Ineligible::kEligible;
    d.backend = ok ? fb : Backend::kNone;
    d.reason = ok ? Reason::kNoFusionCell : Reason::kNoBackend;
    return d;
  }
  // Cells keyed by node counts: this count may have a block of its own.
  const std::uint32_t sig = detail::signature(r);
  const detail::Route* route = &routes_[(block - 1) * detail::kSignatureCount + sig];
  const detail::Span keyed = c.nodes_of_block[block - 1];
  for (std::uint32_t i = keyed.begin; i < keyed.end; ++i) {
    if (c.nodes_routes[i].nodes == r.nodes) {
      route = &routes_[c.nodes_routes[i].block * detail::kSignatureCount + sig];
      break;
    }
  }
  return detail::decide_from_route(*route, r);
}

std::optional<std::uint64_t> Policy::max_fused_bytes(const Request& request) const noexcept {
  const Compiled& c = *impl_;
  if (!valid_request(request)) return std::nullopt;
  const CompiledCell* cell = c.fusion.find(request);
  if (cell == nullptr || cell->off) return std::nullopt;
  const int topo = static_cast<int>(topology_of(request));
  for (int i = 0; i < c.preference_size[topo]; ++i) {
    if (c.check(c.preference[topo][i], request) == Ineligible::kEligible) {
      return cell->max_bytes;
    }
  }
  return std::nullopt;
}

}  // namespace arbiter
