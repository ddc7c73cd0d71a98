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
#include "arbiter/detail/route.h"
#include "arbiter/diagnostic.h"
#include "arbiter/tables.h"

namespace arbiter::detail {

struct CompiledCell {
  std::uint64_t max_bytes;
  std::uint32_t nodes;    // 0: any
  std::uint8_t pattern;   // kAny: any
  std::uint8_t dtype;     // kAny: any
  std::uint8_t residual;  // kAny: any; else matches residual patterns only
  std::uint8_t buffers;   // kAny: any
  bool off;
  std::uint16_t origin;
  static constexpr std::uint8_t kAny = 0xFF;

  bool matches(const Request& r) const {
    return (nodes == 0 || nodes == r.nodes) &&
           (pattern == kAny || pattern == static_cast<std::uint8_t>(r.pattern)) &&
           (dtype == kAny || dtype == static_cast<std::uint8_t>(r.dtype)) &&
           (residual == kAny || (r.pattern != Pattern::kAllreduce &&
                                 residual == static_cast<std::uint8_t>(r.residual_replicated))) &&
           (buffers == kAny || buffers == static_cast<std::uint8_t>(r.buffers_registered));
  }
};

struct Span {
  std::uint32_t begin = 0;
  std::uint32_t end = 0;
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

static_assert(sizeof(Route) == 48,
              "a route is 48 bytes: tables compile to one per signature per block");

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
  // [block] -> the node counts in nodes_routes with blocks of their own
  // (empty but for base blocks of pairs whose cells name node counts).
  std::vector<Span> nodes_of_block;
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

// A threshold backend on CPU ranks (shm) takes a matching `oneshot:` cell of
// capability cpu before its oneshot_max_total: cpu cells have no other
// reader, while GPU cells hold trtllm's caps, which say nothing of mnnvl.
inline const CompiledCell* cpu_oneshot_cell(const Compiled& c, const Request& r) {
  return r.capability.is_cpu() ? c.oneshot.find(r) : nullptr;
}

// Compiles merged, validated tables.
void compile(Compiled& out);

// FNV-1a over the canonical text of the effective tables.
std::uint64_t fingerprint_of(const Tables& tables);

}  // namespace arbiter::detail
