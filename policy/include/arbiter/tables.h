// The effective tables: every layer merged, validated, with the origin of
// each setting. Read by `arbiter show`, `diff` and the tests; decide() uses
// a compiled form of the same data.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/request.h"
#include "arbiter/types.h"

namespace arbiter {

inline constexpr std::uint32_t kMaxWorldSize = 1024;

// Which layer set a value. Later layers win.
enum class Layer : std::uint8_t {
  kDefault = 0,      // configs/default.yaml, embedded at build time
  kSite = 1,         // --config / ARBITER_CONFIG
  kOverride = 2,     // programmatic overrides
  kEnvironment = 3,  // ARBITER_BACKENDS
};
std::string_view layer_name(Layer layer);

struct Origin {
  std::string file;
  std::uint32_t line = 0;
  std::uint32_t column = 0;
  Layer layer = Layer::kDefault;
};

// Keys of a fusion or one-shot cell. nodes == 0, an empty pattern, dtype,
// residual or buffers match anything; each one that is set makes the cell
// more specific. A residual key matches only residual patterns.
struct CellKey {
  Capability capability;
  std::uint32_t world_size = 0;
  std::uint32_t nodes = 0;
  std::optional<Pattern> pattern;
  std::optional<Dtype> dtype;
  std::optional<Residual> residual;
  std::optional<BufferKind> buffers;

  int specificity() const {
    return (nodes != 0) + pattern.has_value() + dtype.has_value() + residual.has_value() +
           buffers.has_value();
  }
  bool matches(const Request& r) const {
    return r.capability == capability && r.world_size == world_size &&
           (nodes == 0 || nodes == r.nodes) && (!pattern || *pattern == r.pattern) &&
           (!dtype || *dtype == r.dtype) && (!residual || residual == r.residual()) &&
           (!buffers || *buffers == r.buffers());
  }
  bool same_keys(const CellKey& o) const {
    return capability == o.capability && world_size == o.world_size && nodes == o.nodes &&
           pattern == o.pattern && dtype == o.dtype && residual == o.residual &&
           buffers == o.buffers;
  }
  // Some request matches both (every key either equal or unset in one).
  bool overlaps(const CellKey& o) const;
  std::string to_string() const;  // "capability 103, world size 16, nodes 4"
};

struct Cell {
  CellKey key;
  bool off = false;             // explicitly no fusion (fusion table only)
  std::uint64_t max_bytes = 0;  // inclusive cap when !off
  std::uint16_t origin = 0;
};

enum class NodesRule : std::uint8_t { kAny = 0, kSingle = 1, kMulti = 2 };
std::string_view nodes_rule_name(NodesRule r);

// How a backend picks one-shot or two-shot.
enum class AlgorithmRule : std::uint8_t {
  kOneshotTable = 0,  // the `oneshot:` table (single-node trtllm)
  kThreshold = 1,     // one-shot while bytes x world size <= oneshot_max_total
  kNative = 2,        // one algorithm (NCCL, the unfused shm path)
};
std::string_view algorithm_rule_name(AlgorithmRule r);

// The settings of one backend: what may be chosen (eligibility) and how its
// algorithm is picked. Each field records the origin of the layer that set it.
struct BackendRules {
  enum Field : int {
    kDevice,
    kWorldSizes,
    kNodes,
    kNvlink,
    kMulticast,
    kDtypes,
    kPatterns,
    kMinCapability,
    kAlgorithm,
    kOneshotMaxTotal,
    kTwoshotTokens,
    kFieldCount
  };
  bool defined = false;  // some layer described this backend
  DeviceKind device = DeviceKind::kGpu;
  std::bitset<kMaxWorldSize + 1> world_sizes;  // empty: every world size
  std::string world_sizes_text;                // as written, for show
  NodesRule nodes = NodesRule::kAny;
  bool needs_nvlink = false;
  bool needs_multicast = false;
  std::uint8_t dtype_mask = 0;                                // 0: every dtype
  std::uint8_t pattern_mask = 0;                              // 0: every pattern
  std::array<std::uint16_t, kPatternCount> min_capability{};  // 0: none
  AlgorithmRule algorithm = AlgorithmRule::kNative;
  std::uint64_t oneshot_max_total = 0;  // kThreshold only
  bool twoshot_needs_tokens_ge_world_size = false;
  std::array<std::uint16_t, kFieldCount> origins;  // kNoOrigin when unset

  BackendRules() { origins.fill(kNoOrigin); }
};

// Topologies that own a preference list.
enum class Topology : std::uint8_t { kSingleNode = 0, kMultiNode = 1, kCpu = 2 };
inline constexpr int kTopologyCount = 3;
std::string_view topology_name(Topology t);
inline Topology topology_of(const Request& r) {
  if (r.capability.is_cpu()) return Topology::kCpu;
  return r.nodes <= 1 ? Topology::kSingleNode : Topology::kMultiNode;
}

struct Tables {
  std::vector<Origin> origins;  // indexed by every `origin` field below

  // The origin `id` names, or nullptr for kNoOrigin (a setting no layer
  // wrote: its default applies). Every reader of an origin id goes through
  // here. Any other id past the end is a bug: checked builds abort on it,
  // release builds answer nullptr.
  const Origin* find_origin(std::uint16_t id) const;

  // Provenance of each layer, "file: text" lines in layer order.
  std::vector<std::string> provenance;

  std::uint32_t enabled_mask = 0;            // bit (1 << Backend)
  std::uint16_t enabled_origin = kNoOrigin;  // kNoOrigin: no layer wrote `enabled:`
  // enabled_mask restricted by ARBITER_BACKENDS: what may be chosen.
  std::uint32_t allowed_mask = 0;
  std::optional<std::string> backends_env;

  std::array<Backend, kDeviceKindCount> fallback{Backend::kNone, Backend::kNone};
  std::array<std::uint16_t, kDeviceKindCount> fallback_origin{kNoOrigin, kNoOrigin};
  std::array<std::vector<Backend>, kTopologyCount> preference;
  std::array<std::uint16_t, kTopologyCount> preference_origin{kNoOrigin, kNoOrigin, kNoOrigin};
  std::array<BackendRules, kBackendCount> backends;

  std::vector<Cell> fusion;   // sorted: capability, world size, specificity
  std::vector<Cell> oneshot;  // idem
  Algorithm oneshot_default = Algorithm::kOneshot;
  std::uint16_t oneshot_default_origin = kNoOrigin;
};

}  // namespace arbiter
