#include "compiled.h"

#include <algorithm>
#include <optional>
#include <string>

namespace arbiter::detail {

void CellIndex::build(const std::vector<Cell>& sorted_cells) {
  slot_of_capability.fill(0xFF);
  std::uint32_t max_ws = 0;
  int slots = 0;
  for (const Cell& c : sorted_cells) {
    max_ws = std::max(max_ws, c.key.world_size);
    auto& slot = slot_of_capability[c.key.capability.code() & 0xFF];
    if (slot == 0xFF) slot = static_cast<std::uint8_t>(slots++);
  }
  stride = max_ws + 1;
  spans.assign(static_cast<std::size_t>(slots) * stride, Span{});
  cells.clear();
  // sorted_cells is ordered by capability, world size, then most specific
  // first, so each (capability, world size) run is one contiguous span.
  for (const Cell& c : sorted_cells) {
    const std::uint8_t slot = slot_of_capability[c.key.capability.code() & 0xFF];
    Span& s = spans[slot * stride + c.key.world_size];
    if (s.begin == s.end) s.begin = s.end = static_cast<std::uint32_t>(cells.size());
    cells.push_back(CompiledCell{
        c.max_bytes, c.key.nodes,
        c.key.pattern ? static_cast<std::uint8_t>(*c.key.pattern) : CompiledCell::kAny,
        c.key.dtype ? static_cast<std::uint8_t>(*c.key.dtype) : CompiledCell::kAny,
        c.key.residual ? static_cast<std::uint8_t>(*c.key.residual) : CompiledCell::kAny,
        c.key.buffers ? static_cast<std::uint8_t>(*c.key.buffers) : CompiledCell::kAny, c.off,
        c.origin});
    s.end = static_cast<std::uint32_t>(cells.size());
  }
}

namespace {

Request request_for(Capability cap, std::uint32_t ws, std::uint32_t sig) {
  Request r;
  r.capability = cap;
  r.world_size = ws;
  r.nvlink_domain = sig & 1u;
  r.multicast = (sig >> 1) & 1u;
  r.dtype = static_cast<Dtype>((sig >> 2) & 3u);
  r.pattern = static_cast<Pattern>((sig >> 4) & 3u);
  r.nodes = (sig >> 6) & 1u ? 2 : 1;
  r.residual_replicated = (sig >> 7) & 1u;
  r.buffers_registered = (sig >> 8) & 1u;
  return r;
}

Route route_for(const Compiled& c, const Request& r) {
  Route route;
  Reason too_big = Reason::kNoFusionCell;
  if (const CompiledCell* cell = c.fusion.find(r)) {
    route.fusion_origin = cell->origin;
    too_big = cell->off ? Reason::kFusionOff : Reason::kAboveCap;
    if (!cell->off) {
      route.cap_below = cell->max_bytes + 1;
      route.cap = cell->max_bytes;
    }
  }
  const Backend fb = c.fallback[static_cast<int>(r.capability.device())];
  const bool fallback_ok = fb != Backend::kNone && c.check(fb, r) == Ineligible::kEligible;
  auto fallback = [&](Reason why) {
    Route::Head h;
    h.backend = fallback_ok ? fb : Backend::kNone;
    h.reason = fallback_ok ? why : Reason::kNoBackend;
    return h;
  };
  route.head[Route::kUnfused] = fallback(too_big);
  // Small enough to fuse, but no preferred backend can: the fallback too.
  route.head[Route::kFusedTwoshot] = route.head[Route::kFusedOneshot] =
      fallback(Reason::kNoEligibleBackend);
  const int topo = static_cast<int>(topology_of(r));
  for (int i = 0; i < c.preference_size[topo]; ++i) {
    const Backend b = c.preference[topo][i];
    if (c.check(b, r) != Ineligible::kEligible) continue;
    const CompiledBackend& rules = c.backends[static_cast<int>(b)];
    Route::Head two{b, Algorithm::kTwoshot, true, Reason::kFused, kNoOrigin};
    Route::Head one{b, Algorithm::kOneshot, true, Reason::kFused, kNoOrigin};
    route.twoshot_needs_tokens = rules.twoshot_needs_tokens_ge_world_size;
    switch (rules.algorithm) {
      case AlgorithmRule::kNative:
        two.algorithm = one.algorithm = Algorithm::kNative;
        break;
      case AlgorithmRule::kThreshold:
        if (const CompiledCell* cell = cpu_oneshot_cell(c, r)) {
          route.oneshot_below = cell->max_bytes + 1;
          two.oneshot_origin = one.oneshot_origin = cell->origin;
        } else {
          route.oneshot_below = rules.oneshot_max_total / r.world_size + 1;
        }
        break;
      case AlgorithmRule::kOneshotTable:
        if (const CompiledCell* cell = c.oneshot.find(r)) {
          route.oneshot_below = cell->max_bytes + 1;
          two.oneshot_origin = one.oneshot_origin = cell->origin;
        } else {
          // The table's default: everything or nothing is one-shot.
          route.oneshot_below = c.tables.oneshot_default == Algorithm::kOneshot ? kNoCap : 0;
        }
        break;
    }
    route.head[Route::kFusedTwoshot] = two;
    route.head[Route::kFusedOneshot] = one;
    break;
  }
  return route;
}

// Routes for every (capability, world size) with fusion cells. A pair whose
// cells are keyed by node counts gets one extra block of routes per counted
// node number, listed by nodes_of_block[base block]; its base block
// stands for every node count no cell names.
void build_routes(Compiled& c) {
  struct Pair {
    Capability cap;
    std::uint32_t shape;               // code * stride + world size
    std::vector<std::uint32_t> keyed;  // node counts some cell names
  };
  std::vector<Pair> pairs;
  std::size_t blocks = 0;
  for (int code = 0; code < 256; ++code) {
    const std::uint8_t slot = c.fusion.slot_of_capability[code];
    if (slot == 0xFF) continue;
    const Capability cap =
        code == 0 ? Capability::cpu() : Capability::sm(static_cast<std::uint16_t>(code));
    for (std::uint32_t ws = 0; ws < c.fusion.stride; ++ws) {
      const Span& span = c.fusion.spans[slot * c.fusion.stride + ws];
      if (span.begin == span.end) continue;
      Pair p{cap, static_cast<std::uint32_t>(code) * c.fusion.stride + ws, {}};
      for (std::uint32_t i = span.begin; i < span.end; ++i) {
        const std::uint32_t n = c.fusion.cells[i].nodes;
        if (n != 0 && std::find(p.keyed.begin(), p.keyed.end(), n) == p.keyed.end()) {
          p.keyed.push_back(n);
        }
      }
      blocks += 1 + p.keyed.size();
      pairs.push_back(std::move(p));
    }
  }
  // Sized once: growing by doubling held twice the routes at its peak, and
  // large tables compile to hundreds of megabytes of routes.
  c.routes.assign(blocks * kSignatureCount, Route{});
  c.nodes_routes.clear();
  c.nodes_of_block.assign(blocks, Span{});
  c.shape_of.assign(256 * static_cast<std::size_t>(c.fusion.stride), 0);
  std::uint32_t next_block = 0;
  for (const Pair& p : pairs) {
    const std::uint32_t ws = p.shape % c.fusion.stride;
    // The base block's node counts: 1, and a multi-node count no cell names.
    std::uint32_t other_multi = 2;
    while (std::find(p.keyed.begin(), p.keyed.end(), other_multi) != p.keyed.end()) ++other_multi;
    auto add_block = [&](std::optional<std::uint32_t> nodes) {
      const std::uint32_t block = next_block++;
      for (std::uint32_t sig = 0; sig < kSignatureCount; ++sig) {
        if (((sig >> 2) & 3u) >= kDtypeCount) continue;
        Request r = request_for(p.cap, ws, sig);
        if (nodes) {
          if ((*nodes > 1) != ((sig >> 6) & 1u)) continue;  // signature says otherwise
          r.nodes = *nodes;
        } else if (r.nodes > 1) {
          r.nodes = other_multi;
        }
        c.routes[static_cast<std::size_t>(block) * kSignatureCount + sig] = route_for(c, r);
      }
      return block;
    };
    const std::uint32_t base = add_block(std::nullopt);
    c.shape_of[p.shape] = base + 1;
    if (p.keyed.empty()) continue;
    const auto begin = static_cast<std::uint32_t>(c.nodes_routes.size());
    for (std::uint32_t n : p.keyed) c.nodes_routes.push_back({n, add_block(n)});
    const auto end = static_cast<std::uint32_t>(c.nodes_routes.size());
    c.nodes_of_block[base] = Span{begin, end};
    for (std::uint32_t sig = 0; sig < kSignatureCount; ++sig) {
      c.routes[static_cast<std::size_t>(base) * kSignatureCount + sig].nodes_keyed = true;
    }
  }
}

}  // namespace

void compile(Compiled& out) {
  const Tables& t = out.tables;
  out.fusion.build(t.fusion);
  out.oneshot.build(t.oneshot);
  for (int b = 0; b < kBackendCount; ++b) {
    const BackendRules& r = t.backends[b];
    CompiledBackend& c = out.backends[b];
    c.any_world_size = r.world_sizes.none();
    c.world_sizes = r.world_sizes;
    c.device = r.device;
    c.nodes = r.nodes;
    c.needs_nvlink = r.needs_nvlink;
    c.needs_multicast = r.needs_multicast;
    c.dtype_mask = r.dtype_mask == 0 ? 0xFF : r.dtype_mask;
    c.pattern_mask = r.pattern_mask == 0 ? 0xFF : r.pattern_mask;
    c.min_capability = r.min_capability;
    c.algorithm = r.algorithm;
    c.oneshot_max_total = r.oneshot_max_total;
    c.twoshot_needs_tokens_ge_world_size = r.twoshot_needs_tokens_ge_world_size;
  }
  for (int k = 0; k < kTopologyCount; ++k) {
    const auto& list = t.preference[k];
    out.preference_size[k] = static_cast<std::uint8_t>(list.size());
    std::copy(list.begin(), list.end(), out.preference[k].begin());
  }
  out.fallback = t.fallback;
  out.allowed_mask = t.allowed_mask;
  build_routes(out);
  out.fingerprint = fingerprint_of(t);
}

namespace {

void cell_text(std::string& s, char table, const Cell& c) {
  s += table;
  s += ' ' + std::to_string(c.key.capability.code()) + ' ' + std::to_string(c.key.world_size) +
       ' ' + std::to_string(c.key.nodes) + ' ' +
       (c.key.pattern ? std::to_string(static_cast<int>(*c.key.pattern)) : "*") + ' ' +
       (c.key.dtype ? std::to_string(static_cast<int>(*c.key.dtype)) : "*") + ' ' +
       // Only when keyed, so tables without the key keep their fingerprint.
       (c.key.residual ? "residual " + std::string(residual_name(*c.key.residual)) + ' ' : "") +
       (c.key.buffers ? "buffers " + std::string(buffer_kind_name(*c.key.buffers)) + ' ' : "") +
       (c.off ? "off" : std::to_string(c.max_bytes)) + '\n';
}

}  // namespace

std::uint64_t fingerprint_of(const Tables& t) {
  // Canonical text: decimal integers and fixed field order, so the hash is
  // the same on every machine, whatever the endianness or file layout.
  std::string s = "arbiter-tables-v1\n";
  s += "enabled " + std::to_string(t.enabled_mask) + " allowed " + std::to_string(t.allowed_mask) +
       '\n';
  for (Backend b : t.fallback) s += "fallback " + std::to_string(static_cast<int>(b)) + '\n';
  for (const auto& list : t.preference) {
    s += "preference";
    for (Backend b : list) s += ' ' + std::to_string(static_cast<int>(b));
    s += '\n';
  }
  for (int b = 0; b < kBackendCount; ++b) {
    const BackendRules& r = t.backends[b];
    s += "backend " + std::to_string(b) + ' ' + std::to_string(r.defined) + ' ' +
         std::to_string(static_cast<int>(r.device)) + ' ' +
         std::to_string(static_cast<int>(r.nodes)) + ' ' + std::to_string(r.needs_nvlink) + ' ' +
         std::to_string(r.needs_multicast) + ' ' + std::to_string(r.dtype_mask) + ' ' +
         std::to_string(r.pattern_mask) + ' ' + std::to_string(static_cast<int>(r.algorithm)) +
         ' ' + std::to_string(r.oneshot_max_total) + ' ' +
         std::to_string(r.twoshot_needs_tokens_ge_world_size) + " ws";
    for (std::uint32_t w = 0; w <= kMaxWorldSize; ++w) {
      if (r.world_sizes[w]) s += ' ' + std::to_string(w);
    }
    s += " mincap";
    for (auto m : r.min_capability) s += ' ' + std::to_string(m);
    s += '\n';
  }
  for (const Cell& c : t.fusion) cell_text(s, 'F', c);
  for (const Cell& c : t.oneshot) cell_text(s, 'O', c);
  s += "oneshot_default " + std::to_string(static_cast<int>(t.oneshot_default)) + '\n';
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace arbiter::detail
