// The answer to a Request, and the trace that explains it.
//
// Both are plain fixed-size values: producing them allocates nothing, so a
// decision may be taken inside CUDA-graph capture. Text and JSON renderings
// live in Policy (they need the cell origins) and may allocate.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "arbiter/types.h"

namespace arbiter {

inline constexpr std::uint64_t kNoCap = ~std::uint64_t{0};

// Why the decision came out as it did.
enum class Reason : std::uint8_t {
  kFused = 0,              // a fused backend was chosen
  kNoFusionCell = 1,       // no fusion entry for (capability, world size)
  kFusionOff = 2,          // the matching cell says `off`
  kAboveCap = 3,           // message bytes > the fused cap
  kNoEligibleBackend = 4,  // no preferred backend can run this call
  kNoBackend = 5,          // the fallback itself is disabled or ineligible
  kInvalidRequest = 6,     // world size 0, nodes 0, nodes > world size, capability
                           // outside cpu and 50..199
};

// "fused", "no_fusion_cell", "above_cap", ... as in decision JSON.
std::string_view reason_name(Reason r);

// Why a backend could not take the call. kEligible when it could.
enum class Ineligible : std::uint8_t {
  kEligible = 0,
  kNotAllowed = 1,  // not enabled, or excluded by ARBITER_BACKENDS
  kExcluded = 2,    // the caller excluded it (Request::excluded_backends)
  kDevice = 3,      // GPU backend for a CPU rank or the other way round
  kWorldSize = 4,
  kNodes = 5,      // single-node backend on a multi-node job
  kNvlink = 6,     // needs an NVLink domain
  kMulticast = 7,  // needs multicast on all ranks
  kDtype = 8,
  kPattern = 9,
  kCapability = 10,  // below the backend's minimum capability for the pattern
};

// One rule evaluated. `origin` indexes Policy::origin() (kNoOrigin: the rule
// used no table cell). The meaning of value/limit depends on the rule.
enum class Rule : std::uint8_t {
  kRequestCheck = 0,      // value = world size, limit = nodes
  kAllowedBackends = 1,   // value = allowed mask
  kFusionCell = 2,        // limit = cap (kNoCap: none or off)
  kFusedCap = 3,          // value = bytes, limit = cap, verdict 1 = fits
  kBackendCheck = 4,      // backend, verdict = Ineligible
  kOneshotCell = 5,       // value = bytes, limit = cap, verdict 1 = oneshot
  kOneshotDefault = 6,    // no one-shot cell; verdict 1 = oneshot by default
  kOneshotThreshold = 7,  // value = bytes x world size, limit = threshold
  kTwoshotTokens = 8,     // value = tokens, limit = world size; stays oneshot
  kFallback = 9,          // backend, verdict = Ineligible
};

struct TraceEntry {
  Rule rule;
  Backend backend;
  std::uint8_t verdict;
  std::uint16_t origin;
  std::uint64_t value;
  std::uint64_t limit;
};

class Trace {
 public:
  static constexpr int kCapacity = 16;
  int size() const { return size_; }
  const TraceEntry& operator[](int i) const { return entries_[i]; }
  const TraceEntry* begin() const { return entries_.data(); }
  const TraceEntry* end() const { return entries_.data() + size_; }
  void clear() { size_ = 0; }
  void add(const TraceEntry& e) {
    if (size_ < kCapacity) entries_[size_++] = e;
  }

 private:
  int size_ = 0;
  std::array<TraceEntry, kCapacity> entries_;
};

struct Decision {
  Backend backend = Backend::kNone;
  Algorithm algorithm = Algorithm::kNative;
  bool fused = false;
  Reason reason = Reason::kNoFusionCell;
  // The fused cap that applied (kNoCap when no fusion cell applied).
  std::uint64_t cap = kNoCap;
  // Origins of the fusion and one-shot cells used (kNoOrigin: none).
  std::uint16_t fusion_origin = kNoOrigin;
  std::uint16_t oneshot_origin = kNoOrigin;
  // Filled only by Policy::explain(); Policy::decide() leaves it empty.
  Trace trace;

  bool has_cap() const { return cap != kNoCap; }
  // Same choice (ignoring the trace and origins).
  bool same_choice(const Decision& o) const {
    return backend == o.backend && algorithm == o.algorithm && fused == o.fused;
  }
};

}  // namespace arbiter
