// The effective tables compiled into a dense lookup for decide(): a
// capability code indexes a slot, (slot, world size) indexes a short span of
// cells ordered most specific first. No strings, no hashing, no allocation.
#pragma once

#include <array>
#include <bit>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "arbiter/decision.h"
#include "arbiter/diagnostic.h"
#include "arbiter/tables.h"

namespace arbiter::detail {

struct CompiledCell {
  std::uint64_t max_bytes;
  std::uint32_t nodes;   // 0: any
  std::uint8_t pattern;  // kAny: any
  std::uint8_t dtype;    // kAny: any
  bool off;
  std::uint16_t origin;
  static constexpr std::uint8_t kAny = 0xFF;

  bool matches(const Request& r) const {
    return (nodes == 0 || nodes == r.nodes) &&
           (pattern == kAny || pattern == static_cast<std::uint8_t>(r.pattern)) &&
           (dtype == kAny || dtype == static_cast<std::uint8_t>(r.dtype));
  }
};

struct Span {
  std::uint32_t begin = 0;
  std::uint32_t end = 0;
};

// Everything about a request but its capability, world size, nodes count and
// size that a decision depends on, in 7 bits: NVLink, multicast, dtype,
// pattern, multi-node. Read as one 32-bit word: Request keeps those four
// one-byte fields adjacent (checked below).
inline constexpr int kSignatureCount = 128;
inline std::uint32_t signature(const Request& r) {
  std::uint32_t x;  // nvlink | multicast << 8 | dtype << 16 | pattern << 24
  std::memcpy(&x, &r.nvlink_domain, sizeof x);
  return (x & 1u) | ((x >> 7) & 2u) | ((x >> 14) & 0xCu) | ((x >> 20) & 0x30u) |
         static_cast<std::uint32_t>(r.nodes > 1) << 6;
}
static_assert(offsetof(Request, multicast) == offsetof(Request, nvlink_domain) + 1 &&
                  offsetof(Request, dtype) == offsetof(Request, nvlink_domain) + 2 &&
                  offsetof(Request, pattern) == offsetof(Request, nvlink_domain) + 3,
              "signature() reads these four fields as one word");
static_assert(std::endian::native == std::endian::little, "signature() assumes little endian");

// Everything decide() needs for one (capability, world size, signature),
// precomputed at load time by running the checks explain() runs: the fusion
// cell, the preference walk, the algorithm rule and whether the fallback may
// run. What is left per call is two size compares that pick one of three
// precomputed heads, so no branch depends on the message size. Valid when the
// caller excludes no backend.
struct Route {
  // The first fields of a Decision, ready to copy.
  struct Head {
    Backend backend = Backend::kNone;
    Algorithm algorithm = Algorithm::kNative;
    bool fused = false;
    Reason reason = Reason::kNoFusionCell;
    std::uint16_t oneshot_origin = kNoOrigin;
  };
  enum : int { kUnfused = 0, kFusedTwoshot = 1, kFusedOneshot = 2 };
  std::uint64_t cap_below = 0;      // fused while bytes < this (cap + 1; 0: none)
  std::uint64_t oneshot_below = 0;  // one-shot while bytes < this (kNoCap: always)
  std::uint64_t cap = kNoCap;       // the cap reported in the Decision
  std::array<Head, 3> head;         // [kUnfused | kFusedTwoshot | kFusedOneshot]
  std::uint16_t fusion_origin = kNoOrigin;
  bool twoshot_needs_tokens = false;
  // Cells keyed by node counts: Compiled::nodes_routes[nodes_begin, nodes_end)
  // lists the node counts with blocks of their own.
  std::uint32_t nodes_begin = 0;
  std::uint32_t nodes_end = 0;
};

// A node count named by some cell, and the block of routes for it.
struct NodesRoute {
  std::uint32_t nodes;
  std::uint32_t block;
};

// One cell table (fusion or one-shot) in lookup form.
struct CellIndex {
  std::array<std::uint8_t, 256> slot_of_capability;  // 0xFF: no cells
  std::uint32_t stride = 0;                          // max world size + 1
  std::vector<Span> spans;                           // [slot * stride + ws]
  std::vector<CompiledCell> cells;

  void build(const std::vector<Cell>& sorted_cells);
  const CompiledCell* find(const Request& r) const {
    const std::uint8_t slot = slot_of_capability[r.capability.code() & 0xFF];
    if (slot == 0xFF || r.world_size >= stride) return nullptr;
    const Span s = spans[slot * stride + r.world_size];
    for (std::uint32_t i = s.begin; i < s.end; ++i) {
      if (cells[i].matches(r)) return &cells[i];
    }
    return nullptr;
  }
};

struct CompiledBackend {
  bool any_world_size = true;
  std::bitset<kMaxWorldSize + 1> world_sizes;
  DeviceKind device = DeviceKind::kGpu;
  NodesRule nodes = NodesRule::kAny;
  bool needs_nvlink = false;
  bool needs_multicast = false;
  std::uint8_t dtype_mask = 0xFF;
  std::uint8_t pattern_mask = 0xFF;
  std::array<std::uint16_t, kPatternCount> min_capability{};
  AlgorithmRule algorithm = AlgorithmRule::kNative;
  std::uint64_t oneshot_max_total = 0;
  bool twoshot_needs_tokens_ge_world_size = false;
};

struct Compiled {
  Tables tables;
  std::vector<Diagnostic> warnings;
  std::uint64_t fingerprint = 0;

  CellIndex fusion;
  CellIndex oneshot;
  std::array<CompiledBackend, kBackendCount> backends;
  std::array<std::array<Backend, kBackendCount>, kTopologyCount> preference{};
  std::array<std::uint8_t, kTopologyCount> preference_size{};
  std::array<Backend, kDeviceKindCount> fallback{};
  std::uint32_t allowed_mask = 0;
  // [block * kSignatureCount + signature]
  std::vector<Route> routes;
  std::vector<NodesRoute> nodes_routes;
  // [capability code * fusion.stride + world size] -> block + 1 (0: no fusion
  // cell for that pair), so decide() reaches its route in two loads.
  std::vector<std::uint32_t> shape_of;

  // Why backend b cannot take r (kEligible when it can).
  Ineligible check(Backend b, const Request& r) const {
    const int i = static_cast<int>(b);
    if (!((allowed_mask >> i) & 1u)) return Ineligible::kNotAllowed;
    if ((r.excluded_backends >> i) & 1u) return Ineligible::kExcluded;
    const CompiledBackend& c = backends[i];
    if (c.device != r.capability.device()) return Ineligible::kDevice;
    if (!c.any_world_size && (r.world_size > kMaxWorldSize || !c.world_sizes[r.world_size])) {
      return Ineligible::kWorldSize;
    }
    if ((c.nodes == NodesRule::kSingle && r.nodes != 1) ||
        (c.nodes == NodesRule::kMulti && r.nodes == 1)) {
      return Ineligible::kNodes;
    }
    if (c.needs_nvlink && !r.nvlink_domain) return Ineligible::kNvlink;
    if (c.needs_multicast && !r.multicast) return Ineligible::kMulticast;
    if (!((c.dtype_mask >> static_cast<int>(r.dtype)) & 1u)) return Ineligible::kDtype;
    if (!((c.pattern_mask >> static_cast<int>(r.pattern)) & 1u)) return Ineligible::kPattern;
    if (r.capability.code() < c.min_capability[static_cast<int>(r.pattern)]) {
      return Ineligible::kCapability;
    }
    return Ineligible::kEligible;
  }
};

// Compiles merged, validated tables.
void compile(Compiled& out);

// FNV-1a over the canonical text of the effective tables.
std::uint64_t fingerprint_of(const Tables& tables);

}  // namespace arbiter::detail
