// Human and JSON renderings of explained decisions.
#include <algorithm>

#include "arbiter/json_writer.h"
#include "arbiter/policy.h"
#include "arbiter/size.h"

namespace arbiter {
namespace {

std::string_view rule_name(Rule r) {
  switch (r) {
    case Rule::kRequestCheck:
      return "request";
    case Rule::kAllowedBackends:
      return "allowed_backends";
    case Rule::kFusionCell:
      return "fusion_cell";
    case Rule::kFusedCap:
      return "fused_cap";
    case Rule::kBackendCheck:
      return "backend";
    case Rule::kOneshotCell:
      return "oneshot_cell";
    case Rule::kOneshotDefault:
      return "oneshot_default";
    case Rule::kOneshotThreshold:
      return "oneshot_threshold";
    case Rule::kTwoshotTokens:
      return "twoshot_tokens";
    case Rule::kFallback:
      return "fallback";
  }
  return "?";
}

std::string ineligible_text(Ineligible why, Backend b, const Request& r, const Tables& t) {
  const BackendRules& rules = t.backends[static_cast<int>(b)];
  switch (why) {
    case Ineligible::kEligible:
      return "eligible";
    case Ineligible::kNotAllowed:
      return t.backends_env
                 ? "not allowed (not enabled, or not in ARBITER_BACKENDS=" + *t.backends_env + ")"
                 : "not enabled";
    case Ineligible::kExcluded:
      return "excluded by the caller (workspace unavailable or too small)";
    case Ineligible::kDevice:
      return "a " + std::string(device_kind_name(rules.device)) + " backend cannot serve " +
             std::string(device_kind_name(r.capability.device())) + " ranks";
    case Ineligible::kWorldSize:
      return "world size " + std::to_string(r.world_size) + " is not in " + rules.world_sizes_text;
    case Ineligible::kNodes:
      return rules.nodes == NodesRule::kSingle
                 ? "single-node backend, but the job spans " + std::to_string(r.nodes) + " nodes"
                 : "multi-node backend, but the job is on one node";
    case Ineligible::kNvlink:
      return "needs an NVLink domain spanning all ranks";
    case Ineligible::kMulticast:
      return "needs NVLink multicast on all ranks";
    case Ineligible::kDtype:
      return "does not support dtype " + std::string(dtype_name(r.dtype));
    case Ineligible::kPattern:
      return "does not support pattern " + std::string(pattern_name(r.pattern));
    case Ineligible::kCapability:
      return "pattern " + std::string(pattern_name(r.pattern)) + " needs capability >= " +
             std::to_string(rules.min_capability[static_cast<int>(r.pattern)]);
  }
  return "?";
}

const Cell* cell_by_origin(const std::vector<Cell>& cells, std::uint16_t origin) {
  auto it =
      std::find_if(cells.begin(), cells.end(), [&](const Cell& c) { return c.origin == origin; });
  return it == cells.end() ? nullptr : &*it;
}

std::string request_text(const Request& r) {
  std::string s = "capability " + capability_name(r.capability) + ", world size " +
                  std::to_string(r.world_size) + ", nodes " + std::to_string(r.nodes);
  if (!r.capability.is_cpu()) {
    s += r.nvlink_domain ? ", NVLink domain" : ", no NVLink domain";
    s += r.multicast ? ", multicast" : ", no multicast";
  }
  s += ", " + std::string(dtype_name(r.dtype)) + ", " + std::string(pattern_name(r.pattern));
  if (r.residual() == Residual::kReplicated) s += ", residual replicated";
  if (r.buffers_registered) s += ", registered buffers";
  s += ", " + std::to_string(r.message_bytes) + " bytes";
  if (r.tokens != 0) {
    s += " (" + std::to_string(r.tokens) + " tokens x " + std::to_string(r.hidden) + ")";
  }
  return s;
}

std::string entry_text(const Policy& p, const Request& r, const TraceEntry& e) {
  const Tables& t = p.tables();
  const std::string b(backend_name(e.backend));
  switch (e.rule) {
    case Rule::kRequestCheck:
      return e.verdict
                 ? "request: " + request_text(r)
                 : "invalid request (" + request_text(r) +
                       "): needs world size >= 1, 1 <= nodes <= world size and a capability of cpu "
                       "or 50..199";
    case Rule::kAllowedBackends: {
      std::string s =
          "backends allowed: " + backend_mask_names(static_cast<std::uint32_t>(e.value));
      if (t.backends_env) s += " (ARBITER_BACKENDS=" + *t.backends_env + ")";
      if (e.limit != 0)
        s += "; excluded by the caller: " + backend_mask_names(static_cast<std::uint32_t>(e.limit));
      return s;
    }
    case Rule::kFusionCell: {
      if (e.origin == kNoOrigin) {
        return "no fusion entry for capability " + capability_name(r.capability) + ", world size " +
               std::to_string(r.world_size) + ": not fused";
      }
      const Cell* c = cell_by_origin(t.fusion, e.origin);
      const std::string key = c ? c->key.to_string() : "?";
      return "fusion cell (" + key +
             ") = " + (e.verdict ? format_size(e.limit) : std::string("off: not fused"));
    }
    case Rule::kFusedCap:
      return e.verdict
                 ? format_size(e.value) + " <= cap " + format_size(e.limit) + ": fused"
                 : format_size(e.value) + " > cap " + format_size(e.limit) + ": too large to fuse";
    case Rule::kBackendCheck:
      return b + ": " + ineligible_text(static_cast<Ineligible>(e.verdict), e.backend, r, t);
    case Rule::kOneshotCell: {
      const Cell* c = cell_by_origin(t.oneshot, e.origin);
      return "one-shot cell (" + (c ? c->key.to_string() : std::string("?")) +
             ") = " + format_size(e.limit) + ": " + format_size(e.value) +
             (e.verdict ? " <= cap: oneshot" : " > cap: twoshot");
    }
    case Rule::kOneshotDefault:
      return "no one-shot cell for capability " + capability_name(r.capability) + ", world size " +
             std::to_string(r.world_size) + ": the table's default is " +
             (e.verdict ? "oneshot" : "twoshot");
    case Rule::kOneshotThreshold:
      return b + " one-shot threshold: bytes x world size = " + format_size(e.value) +
             (e.verdict ? " <= " : " > ") + format_size(e.limit) +
             (e.verdict ? ": oneshot" : ": twoshot");
    case Rule::kTwoshotTokens:
      return "two-shot needs tokens >= world size (" + std::to_string(e.value) + " < " +
             std::to_string(e.limit) + "): stays oneshot";
    case Rule::kFallback:
      if (e.backend == Backend::kNone) return "fallback: none configured: no backend";
      return static_cast<Ineligible>(e.verdict) == Ineligible::kEligible
                 ? "fallback: " + b + " (native, unfused)"
                 : "fallback " + b + " cannot run: " +
                       ineligible_text(static_cast<Ineligible>(e.verdict), e.backend, r, t) +
                       ": no backend";
  }
  return "?";
}

std::string headline(const Decision& d) {
  if (d.backend == Backend::kNone) return "no backend can run this call";
  std::string s = std::string(backend_name(d.backend)) + " " +
                  std::string(algorithm_name(d.algorithm)) + (d.fused ? " fused" : " unfused");
  if (d.has_cap()) s += " (cap " + format_size(d.cap) + ")";
  return s;
}

}  // namespace

std::string_view reason_name(Reason r) {
  switch (r) {
    case Reason::kFused:
      return "fused";
    case Reason::kNoFusionCell:
      return "no_fusion_cell";
    case Reason::kFusionOff:
      return "fusion_off";
    case Reason::kAboveCap:
      return "above_cap";
    case Reason::kNoEligibleBackend:
      return "no_eligible_backend";
    case Reason::kNoBackend:
      return "no_backend";
    case Reason::kInvalidRequest:
      return "invalid_request";
  }
  return "?";
}

std::string Policy::explain_text(const Request& request, const Decision& decision) const {
  std::string out = "decision: " + headline(decision) + "\n";
  int step = 0;
  for (const TraceEntry& e : decision.trace) {
    out += "  " + std::to_string(++step) + ". " + entry_text(*this, request, e);
    if (e.origin != kNoOrigin) out += "  [" + origin_text(e.origin) + "]";
    out += "\n";
  }
  return out;
}

std::string Policy::decision_json(const Request& request, const Decision& decision) const {
  std::string out;
  JsonObject o(out);
  o.str("backend", backend_name(decision.backend));
  o.str("algorithm", algorithm_name(decision.algorithm));
  o.boolean("fused", decision.fused);
  o.str("reason", reason_name(decision.reason));
  if (auto m = max_fused_bytes(request))
    o.num("max_fused_bytes", *m);
  else
    o.null("max_fused_bytes");
  if (decision.has_cap())
    o.num("cap", decision.cap);
  else
    o.null("cap");
  o.str("fingerprint", fingerprint_hex());
  {
    std::string& r = o.key("request");
    JsonObject q(r);
    q.str("capability", capability_name(request.capability));
    q.num("world_size", request.world_size);
    q.num("nodes", request.nodes);
    q.boolean("nvlink_domain", request.nvlink_domain);
    q.boolean("multicast", request.multicast);
    q.str("dtype", dtype_name(request.dtype));
    q.str("pattern", pattern_name(request.pattern));
    q.boolean("residual_replicated", request.residual_replicated);
    q.boolean("buffers_registered", request.buffers_registered);
    q.num("bytes", request.message_bytes);
    if (request.tokens)
      q.num("tokens", request.tokens);
    else
      q.null("tokens");
    if (request.hidden)
      q.num("hidden", request.hidden);
    else
      q.null("hidden");
    q.close();
  }
  std::string& arr = o.key("trace");
  arr += '[';
  bool first = true;
  for (const TraceEntry& e : decision.trace) {
    if (!first) arr += ',';
    first = false;
    JsonObject t(arr);
    t.str("rule", rule_name(e.rule));
    if (e.backend != Backend::kNone) t.str("backend", backend_name(e.backend));
    t.str("text", entry_text(*this, request, e));
    if (const Origin* og = tables().find_origin(e.origin)) {
      std::string& oo = t.key("origin");
      JsonObject oj(oo);
      oj.str("file", og->file);
      oj.num("line", og->line);
      oj.num("column", og->column);
      oj.str("layer", layer_name(og->layer));
      oj.close();
    } else {
      t.null("origin");
    }
    t.close();
  }
  arr += ']';
  o.close();
  return out;
}

}  // namespace arbiter
