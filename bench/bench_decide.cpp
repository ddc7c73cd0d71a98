// arbiter-bench-decide: what one all-reduce decision costs.
//
// On one fixed set of requests it times, side by side:
//   decide      arbiter::Policy::decide() on the embedded default policy;
//   flat_array  the TensorRT-LLM-style lower bound: dense arrays indexed by
//               [capability slot][world size][pattern], one compare against
//               the fused cap and one against the one-shot cap;
//   nested_map  a straight port of vLLM's dict logic: string-keyed nested
//               std::unordered_map lookups and a float MiB compare.
// Both baselines are built from policy.tables(), so all three answer the same
// question; agreement is checked before anything is timed. It also counts
// heap allocations (global operator new is replaced below) and times loading
// and validating the default table.
//
// Usage: arbiter-bench-decide [--iterations N] [--repetitions R]
// stdout: exactly one JSON object. stderr: human-readable notes.

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "arbiter/decision.h"
#include "arbiter/diagnostic.h"
#include "arbiter/policy.h"
#include "arbiter/request.h"
#include "arbiter/size.h"
#include "arbiter/tables.h"
#include "arbiter/types.h"

// ---------------------------------------------------------------------------
// Allocation counting. Every global operator new form is replaced so that any
// heap allocation made by the library or the baselines is seen. The counter
// is thread_local: the benchmark is single-threaded, and a plain increment
// keeps the counting itself out of the nested-map timings as far as possible.

namespace {

thread_local std::uint64_t t_allocations = 0;

// alignment == 0: plain malloc. Follows the standard's new-handler loop.
void* allocate_or_throw(std::size_t size, std::size_t alignment) {
  ++t_allocations;
  if (size == 0) size = 1;
  if (alignment != 0) {
    // aligned_alloc wants a size that is a multiple of the alignment.
    size = (size + alignment - 1) / alignment * alignment;
  }
  for (;;) {
    void* p = alignment != 0 ? std::aligned_alloc(alignment, size) : std::malloc(size);
    if (p != nullptr) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

void* allocate_or_null(std::size_t size, std::size_t alignment) noexcept {
  try {
    return allocate_or_throw(size, alignment);
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

void* operator new(std::size_t size) { return allocate_or_throw(size, 0); }
void* operator new[](std::size_t size) { return allocate_or_throw(size, 0); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return allocate_or_null(size, 0);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return allocate_or_null(size, 0);
}
void* operator new(std::size_t size, std::align_val_t alignment) {
  return allocate_or_throw(size, static_cast<std::size_t>(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
  return allocate_or_throw(size, static_cast<std::size_t>(alignment));
}
void* operator new(std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return allocate_or_null(size, static_cast<std::size_t>(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return allocate_or_null(size, static_cast<std::size_t>(alignment));
}

// malloc and aligned_alloc memory are both released with free().
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using arbiter::Algorithm;
using arbiter::Backend;
using arbiter::Capability;
using arbiter::Cell;
using arbiter::Dtype;
using arbiter::Pattern;
using arbiter::Policy;
using arbiter::Request;
using arbiter::Tables;

using Clock = std::chrono::steady_clock;

constexpr std::size_t kRequestCount = 4096;
constexpr std::uint64_t kSeed = 0x5eed'a7b1'7e2d'ec1dULL;
constexpr std::uint64_t kDefaultDecisionsPerMethod = 50'000'000;
constexpr int kDefaultRepetitions = 9;
constexpr int kLoadRuns = 50;
constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();

volatile std::uint64_t g_sink = 0;

// One answer, comparable across methods: bit 0 fused, bits 1-2 the algorithm
// when fused (unfused answers are all 0: the fallback's algorithm is not what
// the baselines model).
inline std::uint32_t encode(bool fused, Algorithm algorithm) {
  return fused ? 1u | (static_cast<std::uint32_t>(algorithm) << 1) : 0u;
}

// ---------------------------------------------------------------------------
// Requests.

// No std::*_distribution on purpose: mt19937_64's output is fixed by the
// standard, the distributions' mappings are not, so with this the request mix
// is the same with every standard library.
class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1p-53; }
  template <class T, std::size_t N>
  T pick(const std::array<std::pair<T, double>, N>& weighted) {
    double u = uniform();
    for (const auto& [value, weight] : weighted) {
      if (u < weight) return value;
      u -= weight;
    }
    return weighted.back().first;
  }

 private:
  std::mt19937_64 engine_;
};

// A serving-like mix: mostly single-node NVSwitch boxes, some 4-node NVL
// domains at world size 16, and a world size (6) no table covers. Sizes are
// log-uniform over 1 KiB .. 128 MiB, plus a few exact powers of two (and one
// byte more) so the inclusive cap boundaries are exercised. tokens stays 0
// (unknown), as for a caller that only knows the byte count.
std::vector<Request> make_requests(std::size_t count, std::uint64_t seed) {
  static constexpr std::array<std::pair<std::uint16_t, double>, 4> kCapabilities = {
      {{90, 0.25}, {100, 0.25}, {103, 0.25}, {107, 0.25}}};
  static constexpr std::array<std::pair<std::uint32_t, double>, 5> kWorldSizes = {
      {{2, 0.20}, {4, 0.25}, {6, 0.08}, {8, 0.35}, {16, 0.12}}};
  static constexpr std::array<std::pair<Dtype, double>, 3> kDtypes = {
      {{Dtype::kBf16, 0.70}, {Dtype::kFp16, 0.20}, {Dtype::kFp32, 0.10}}};
  static constexpr std::array<std::pair<Pattern, double>, 4> kPatterns = {
      {{Pattern::kResidualRmsnorm, 0.40},
       {Pattern::kResidualRmsnormFp8, 0.25},
       {Pattern::kResidualRmsnormFp4, 0.20},
       {Pattern::kAllreduce, 0.15}}};
  const double log_min = std::log(static_cast<double>(arbiter::kKiB));
  const double log_max = std::log(static_cast<double>(128 * arbiter::kMiB));

  Random random(seed);
  std::vector<Request> requests;
  requests.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    Request r;
    r.capability = Capability::sm(random.pick(kCapabilities));
    r.world_size = random.pick(kWorldSizes);
    r.nodes = 1;
    r.nvlink_domain = true;
    r.multicast = random.uniform() < 0.5;
    if (r.world_size == 16 && random.uniform() < 0.5) {
      r.nodes = 4;  // a multi-node NVLink domain (NVL72-style)
      r.multicast = true;
    }
    r.dtype = random.pick(kDtypes);
    r.pattern = random.pick(kPatterns);
    const std::uint64_t element = static_cast<std::uint64_t>(arbiter::element_size(r.dtype));
    if (random.uniform() < 0.05) {
      const int shift = 10 + static_cast<int>(random.uniform() * 18);  // ..27
      r.message_bytes = (std::uint64_t{1} << shift) + (random.uniform() < 0.5 ? 0 : element);
    } else {
      const double bytes = std::exp(log_min + random.uniform() * (log_max - log_min));
      r.message_bytes =
          std::max<std::uint64_t>(element, static_cast<std::uint64_t>(bytes) / element * element);
    }
    r.in_graph_capture = random.uniform() < 0.3;  // changes nothing today
    requests.push_back(r);
  }
  return requests;
}

// ---------------------------------------------------------------------------
// The baselines' data, derived from the effective tables.

// What a single-node request with these keys gets: the fused cap (0: never
// fused) and the one-shot cap (kNoLimit: always one-shot when fused).
struct ReferenceCell {
  std::uint16_t capability = 0;
  std::uint32_t world_size = 0;
  Pattern pattern = Pattern::kAllreduce;
  std::uint64_t fused_cap = 0;
  std::uint64_t oneshot_cap = kNoLimit;
};

// The most specific cell matching `r`, as the table format defines it.
const Cell* most_specific(const std::vector<Cell>& cells, const Request& r) {
  const Cell* best = nullptr;
  for (const Cell& cell : cells) {
    if (cell.key.matches(r) &&
        (best == nullptr || cell.key.specificity() > best->key.specificity())) {
      best = &cell;
    }
  }
  return best;
}

// Backend eligibility for a single-node NVLink request without multicast
// (what a TensorRT-LLM-style table assumes). Dtype is not a key of the flat
// array; the synthetic request carries bf16.
bool eligible(const Tables& tables, Backend backend, const Request& r) {
  const auto b = static_cast<std::size_t>(backend);
  if (b >= tables.backends.size()) return false;
  if ((tables.allowed_mask & (1u << b)) == 0) return false;
  const arbiter::BackendRules& rules = tables.backends[b];
  if (!rules.defined || rules.device != r.capability.device()) return false;
  if (rules.world_sizes.any() &&
      (r.world_size > arbiter::kMaxWorldSize || !rules.world_sizes.test(r.world_size))) {
    return false;
  }
  if (rules.nodes == arbiter::NodesRule::kMulti) return false;
  if (rules.needs_nvlink && !r.nvlink_domain) return false;
  if (rules.needs_multicast && !r.multicast) return false;
  if (rules.dtype_mask != 0 && (rules.dtype_mask & (1u << static_cast<unsigned>(r.dtype))) == 0) {
    return false;
  }
  const auto p = static_cast<std::size_t>(r.pattern);
  if (rules.pattern_mask != 0 && (rules.pattern_mask & (1u << p)) == 0) {
    return false;
  }
  const std::uint16_t min_capability = rules.min_capability[p];
  return min_capability == 0 || r.capability.code() >= min_capability;
}

// One ReferenceCell per (GPU capability, world size) that has a fusion cell,
// for every pattern. Eligibility and the one-shot rule are folded in here,
// once, so the hot paths of both baselines stay a lookup and a compare.
std::vector<ReferenceCell> build_reference(const Tables& tables) {
  std::vector<std::pair<std::uint16_t, std::uint32_t>> keys;
  for (const Cell& cell : tables.fusion) {
    if (cell.key.capability.is_cpu()) continue;
    keys.emplace_back(cell.key.capability.code(), cell.key.world_size);
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());

  const auto& preference =
      tables.preference[static_cast<std::size_t>(arbiter::Topology::kSingleNode)];
  std::vector<ReferenceCell> reference;
  for (const auto& [capability, world_size] : keys) {
    for (int p = 0; p < arbiter::kPatternCount; ++p) {
      Request r;
      r.capability = Capability::sm(capability);
      r.world_size = world_size;
      r.nodes = 1;
      r.nvlink_domain = true;
      r.multicast = false;
      r.dtype = Dtype::kBf16;
      r.pattern = static_cast<Pattern>(p);

      ReferenceCell out;
      out.capability = capability;
      out.world_size = world_size;
      out.pattern = r.pattern;
      const Cell* fusion = most_specific(tables.fusion, r);
      const Backend* backend = nullptr;
      for (const Backend& candidate : preference) {
        if (eligible(tables, candidate, r)) {
          backend = &candidate;
          break;
        }
      }
      if (fusion != nullptr && !fusion->off && backend != nullptr) {
        out.fused_cap = fusion->max_bytes;
        const arbiter::BackendRules& rules = tables.backends[static_cast<std::size_t>(*backend)];
        switch (rules.algorithm) {
          case arbiter::AlgorithmRule::kOneshotTable:
            if (const Cell* oneshot = most_specific(tables.oneshot, r)) {
              out.oneshot_cap = oneshot->max_bytes;
            } else {
              out.oneshot_cap = tables.oneshot_default == Algorithm::kOneshot ? kNoLimit : 0;
            }
            break;
          case arbiter::AlgorithmRule::kThreshold:
            // bytes x ws <= total  <=>  bytes <= floor(total / ws).
            out.oneshot_cap = rules.oneshot_max_total / world_size;
            break;
          case arbiter::AlgorithmRule::kNative:
            // Not representable as one-shot/two-shot; the agreement check
            // will report it as an algorithm mismatch.
            break;
        }
      }
      reference.push_back(out);
    }
  }
  return reference;
}

// (b) The flat-array lower bound. Fixed extents keep both arrays (8.4 KiB
// each) in L1 and the index arithmetic constant-folded, as a compiled-in
// TensorRT-LLM table would be.
constexpr std::size_t kFlatSlots = 8;
constexpr std::uint32_t kFlatMaxWorldSize = 32;
constexpr std::uint8_t kNoSlot = 0xFF;
constexpr std::size_t kFlatCells = kFlatSlots * (kFlatMaxWorldSize + 1) * arbiter::kPatternCount;

struct FlatTable {
  std::array<std::uint8_t, Capability::kMaxSm + 1> slot_of;
  std::array<std::uint64_t, kFlatCells> fused_cap{};    // 0: not fused
  std::array<std::uint64_t, kFlatCells> oneshot_cap{};  // inclusive
};

constexpr std::size_t flat_index(std::size_t slot, std::uint32_t world_size, Pattern pattern) {
  return (slot * (kFlatMaxWorldSize + 1) + world_size) * arbiter::kPatternCount +
         static_cast<std::size_t>(pattern);
}

// Returns how many reference cells did not fit the fixed extents.
std::size_t build_flat(const std::vector<ReferenceCell>& reference, FlatTable& flat) {
  flat.slot_of.fill(kNoSlot);
  std::size_t slots = 0;
  std::size_t skipped = 0;
  for (const ReferenceCell& cell : reference) {
    std::uint8_t& slot = flat.slot_of[cell.capability];
    if (slot == kNoSlot) {
      if (slots == kFlatSlots) {
        ++skipped;
        continue;
      }
      slot = static_cast<std::uint8_t>(slots++);
    }
    if (cell.world_size > kFlatMaxWorldSize) {
      ++skipped;
      continue;
    }
    const std::size_t i = flat_index(slot, cell.world_size, cell.pattern);
    flat.fused_cap[i] = cell.fused_cap;
    flat.oneshot_cap[i] = cell.oneshot_cap;
  }
  return skipped;
}

inline std::uint32_t flat_decide(const FlatTable& flat, const Request& r) {
  const std::uint16_t code = r.capability.code();
  if (code > Capability::kMaxSm || r.world_size > kFlatMaxWorldSize) return 0;
  const std::uint8_t slot = flat.slot_of[code];
  if (slot == kNoSlot) return 0;
  const std::size_t i = flat_index(slot, r.world_size, r.pattern);
  const bool fused = r.message_bytes <= flat.fused_cap[i];
  const bool twoshot = r.message_bytes > flat.oneshot_cap[i];
  return encode(fused, twoshot ? Algorithm::kTwoshot : Algorithm::kOneshot);
}

// (c) A straight port of vLLM's dicts: capability "10.3" -> world size "8"
// -> pattern name -> caps in MiB as floats. The keys are built from the
// request on every call, as the Python does; short keys fit the small-string
// buffer, longer ones ("residual_rmsnorm", 16 chars) allocate.
struct MibCaps {
  double fusion_mib = 0;
  double oneshot_mib = std::numeric_limits<double>::infinity();
};
using PatternCaps = std::unordered_map<std::string, MibCaps>;
using WorldSizeCaps = std::unordered_map<std::string, PatternCaps>;
using CapabilityCaps = std::unordered_map<std::string, WorldSizeCaps>;

constexpr double kBytesPerMib = 1024.0 * 1024.0;

std::string capability_key(std::uint16_t code) {
  return std::to_string(code / 10) + "." + std::to_string(code % 10);
}

CapabilityCaps build_nested(const std::vector<ReferenceCell>& reference) {
  CapabilityCaps nested;
  for (const ReferenceCell& cell : reference) {
    if (cell.fused_cap == 0) continue;  // vLLM: no dict entry, no fusion
    MibCaps caps;
    caps.fusion_mib = static_cast<double>(cell.fused_cap) / kBytesPerMib;
    if (cell.oneshot_cap != kNoLimit) {
      caps.oneshot_mib = static_cast<double>(cell.oneshot_cap) / kBytesPerMib;
    }
    nested[capability_key(cell.capability)][std::to_string(cell.world_size)]
          [std::string(arbiter::pattern_name(cell.pattern))] = caps;
  }
  return nested;
}

inline std::uint32_t nested_decide(const CapabilityCaps& nested, const Request& r) {
  const auto by_capability = nested.find(capability_key(r.capability.code()));
  if (by_capability == nested.end()) return 0;
  const auto by_world_size = by_capability->second.find(std::to_string(r.world_size));
  if (by_world_size == by_capability->second.end()) return 0;
  const auto caps = by_world_size->second.find(std::string(arbiter::pattern_name(r.pattern)));
  if (caps == by_world_size->second.end()) return 0;
  const double size_mib = static_cast<double>(r.message_bytes) / kBytesPerMib;
  const bool fused = size_mib <= caps->second.fusion_mib;
  const bool twoshot = size_mib > caps->second.oneshot_mib;
  return encode(fused, twoshot ? Algorithm::kTwoshot : Algorithm::kOneshot);
}

inline std::uint32_t policy_decide(const Policy& policy, const Request& r) {
  const arbiter::Decision d = policy.decide(r);
  return encode(d.fused, d.algorithm);
}

// ---------------------------------------------------------------------------
// Timing.

// `passes` runs over the requests. The empty asm statements keep every
// result (so nothing is dropped or vectorised across requests, the way
// separate calls in a serving loop are not) and make each pass re-read the
// requests (so passes cannot be folded into one).
template <class Fn>
[[gnu::noinline]] std::uint64_t run_passes(const std::vector<Request>& requests,
                                           std::uint64_t passes, const Fn& fn) {
  const Request* data = requests.data();
  const std::size_t count = requests.size();
  std::uint64_t acc = 0;
  for (std::uint64_t pass = 0; pass < passes; ++pass) {
    asm volatile("" : : "r"(data) : "memory");
    for (std::size_t i = 0; i < count; ++i) {
      std::uint32_t answer = fn(data[i]);
      asm volatile("" : "+r"(answer));
      acc += answer;
    }
  }
  return acc;
}

enum class Method { kDecide = 0, kFlatArray = 1, kNestedMap = 2 };
constexpr int kMethodCount = 3;

struct Subjects {
  const Policy* policy;
  const FlatTable* flat;
  const CapabilityCaps* nested;
};

std::uint64_t run_method(Method method, const Subjects& s, const std::vector<Request>& requests,
                         std::uint64_t passes) {
  switch (method) {
    case Method::kDecide:
      return run_passes(requests, passes,
                        [&](const Request& r) { return policy_decide(*s.policy, r); });
    case Method::kFlatArray:
      return run_passes(requests, passes,
                        [&](const Request& r) { return flat_decide(*s.flat, r); });
    case Method::kNestedMap:
      return run_passes(requests, passes,
                        [&](const Request& r) { return nested_decide(*s.nested, r); });
  }
  return 0;
}

struct MethodTotals {
  std::vector<double> ns_per_decision;  // one per repetition
  std::uint64_t decisions = 0;
  std::uint64_t allocations = 0;
  std::uint64_t checksum = 0;
};

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

double elapsed_ns(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::nano>(end - start).count();
}

// ---------------------------------------------------------------------------
// Command line.

struct Options {
  std::uint64_t decisions_per_method = kDefaultDecisionsPerMethod;
  int repetitions = kDefaultRepetitions;
};

bool parse_count(std::string_view text, std::uint64_t& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && out > 0;
}

std::optional<Options> parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fprintf(stderr,
                   "usage: arbiter-bench-decide [--iterations N] "
                   "[--repetitions R]\n"
                   "  --iterations N   decisions per method, all repetitions "
                   "together (default %llu)\n"
                   "  --repetitions R  timed repetitions; the median is "
                   "reported (default %d)\n",
                   static_cast<unsigned long long>(kDefaultDecisionsPerMethod),
                   kDefaultRepetitions);
      std::exit(0);
    }
    std::uint64_t value = 0;
    if ((arg == "--iterations" || arg == "--repetitions") && i + 1 < argc &&
        parse_count(argv[i + 1], value)) {
      if (arg == "--iterations") {
        options.decisions_per_method = value;
      } else if (value <= 1000) {
        options.repetitions = static_cast<int>(value);
      } else {
        std::fprintf(stderr, "error: --repetitions must be 1 .. 1000\n");
        return std::nullopt;
      }
      ++i;
      continue;
    }
    std::fprintf(stderr,
                 "error: bad argument '%s' (usage: arbiter-bench-decide "
                 "[--iterations N] [--repetitions R])\n",
                 argv[i]);
    return std::nullopt;
  }
  return options;
}

std::string describe(const Request& r) {
  return "capability " + arbiter::capability_name(r.capability) + ", world size " +
         std::to_string(r.world_size) + ", nodes " + std::to_string(r.nodes) + ", " +
         std::string(arbiter::pattern_name(r.pattern)) + ", " +
         std::string(arbiter::dtype_name(r.dtype)) + ", " + std::to_string(r.message_bytes) + " B";
}

int run(const Options& options) {
#ifndef NDEBUG
  std::fprintf(stderr,
               "warning: assertions are on; build with "
               "-DCMAKE_BUILD_TYPE=Release for meaningful numbers\n");
#endif

  // Load + validate the embedded default table, median of kLoadRuns. The
  // first load is untimed: it pays one-time costs (page faults, statics).
  const Policy policy = Policy::load_or_throw(arbiter::LoadOptions{});
  std::vector<double> load_ms;
  std::uint64_t load_allocations = 0;
  for (int i = 0; i < kLoadRuns; ++i) {
    const arbiter::LoadOptions load_options;
    const std::uint64_t allocations_before = t_allocations;
    const Clock::time_point start = Clock::now();
    Policy loaded = Policy::load_or_throw(load_options);
    const Clock::time_point end = Clock::now();
    load_allocations += t_allocations - allocations_before;
    g_sink = loaded.fingerprint();
    load_ms.push_back(elapsed_ns(start, end) / 1e6);
  }

  const Tables& tables = policy.tables();
  const std::vector<ReferenceCell> reference = build_reference(tables);
  auto flat = std::make_unique<FlatTable>();
  if (const std::size_t skipped = build_flat(reference, *flat)) {
    std::fprintf(stderr,
                 "note: %zu table cells lie outside the flat array's fixed "
                 "extents (%zu capabilities, world size <= %u)\n",
                 skipped, kFlatSlots, kFlatMaxWorldSize);
  }
  const CapabilityCaps nested = build_nested(reference);
  for (const Cell& cell : tables.fusion) {
    if (cell.key.dtype || cell.key.nodes > 1) {
      std::fprintf(stderr,
                   "note: fusion cell %s is keyed by dtype or nodes; the "
                   "baselines model single-node bf16 only\n",
                   cell.key.to_string().c_str());
    }
  }

  const std::vector<Request> requests = make_requests(kRequestCount, kSeed);

  // Agreement, before timing. decide() vs the flat array on single-node
  // requests (the flat array knows nothing of topology); the nested map vs
  // the flat array everywhere (same data, different lookup).
  std::uint64_t checked = 0;
  std::uint64_t mismatches = 0;
  std::uint64_t algorithm_mismatches = 0;
  std::uint64_t nested_mismatches = 0;
  std::uint64_t fused_single = 0;
  std::uint64_t fused_multi = 0;
  std::uint64_t multi = 0;
  int reported = 0;
  for (const Request& r : requests) {
    const std::uint32_t by_policy = policy_decide(policy, r);
    const std::uint32_t by_flat = flat_decide(*flat, r);
    const std::uint32_t by_nested = nested_decide(nested, r);
    if (by_nested != by_flat) ++nested_mismatches;
    if (r.nodes > 1) {
      ++multi;
      fused_multi += by_policy & 1u;
      continue;
    }
    ++checked;
    fused_single += by_policy & 1u;
    const bool fused_differs = ((by_policy ^ by_flat) & 1u) != 0;
    if (fused_differs) {
      ++mismatches;
    } else if (by_policy != by_flat) {
      ++algorithm_mismatches;
    }
    if (by_policy != by_flat && reported < 5) {
      ++reported;
      const arbiter::Decision d = policy.decide(r);
      std::fprintf(stderr,
                   "mismatch: %s: decide fused=%d %s (%s, reason %d), flat "
                   "fused=%u %s\n",
                   describe(r).c_str(), d.fused ? 1 : 0,
                   std::string(arbiter::algorithm_name(d.algorithm)).c_str(),
                   std::string(arbiter::backend_name(d.backend)).c_str(),
                   static_cast<int>(d.reason), by_flat & 1u,
                   (by_flat >> 1) == 1 ? "twoshot" : "oneshot");
    }
  }
  std::fprintf(stderr,
               "requests: %zu (%llu single-node, %llu fused by decide; %llu "
               "multi-node, %llu fused)\n",
               requests.size(), static_cast<unsigned long long>(checked),
               static_cast<unsigned long long>(fused_single),
               static_cast<unsigned long long>(multi),
               static_cast<unsigned long long>(fused_multi));

  // Timing: every repetition runs all three methods back to back, in a
  // rotating order, so each sees the same machine conditions.
  const Subjects subjects{&policy, flat.get(), &nested};
  const int repetitions = options.repetitions;
  const std::uint64_t per_pass = requests.size();
  const std::uint64_t per_repetition =
      (options.decisions_per_method + repetitions - 1) / repetitions;
  const std::uint64_t passes = (per_repetition + per_pass - 1) / per_pass;
  std::array<MethodTotals, kMethodCount> totals;
  for (int m = 0; m < kMethodCount; ++m) {
    g_sink = run_method(static_cast<Method>(m), subjects, requests, 1);
  }
  for (int rep = 0; rep < repetitions; ++rep) {
    for (int k = 0; k < kMethodCount; ++k) {
      const int m = (rep + k) % kMethodCount;
      const std::uint64_t allocations_before = t_allocations;
      const Clock::time_point start = Clock::now();
      const std::uint64_t checksum = run_method(static_cast<Method>(m), subjects, requests, passes);
      const Clock::time_point end = Clock::now();
      MethodTotals& t = totals[m];
      t.allocations += t_allocations - allocations_before;
      t.decisions += passes * per_pass;
      t.checksum += checksum;
      t.ns_per_decision.push_back(elapsed_ns(start, end) / static_cast<double>(passes * per_pass));
      g_sink = checksum;
    }
  }

  const MethodTotals& decide = totals[static_cast<int>(Method::kDecide)];
  const MethodTotals& flat_t = totals[static_cast<int>(Method::kFlatArray)];
  const MethodTotals& nested_t = totals[static_cast<int>(Method::kNestedMap)];
  const double decide_ns = median(decide.ns_per_decision);
  const double flat_ns = median(flat_t.ns_per_decision);
  const double nested_ns = median(nested_t.ns_per_decision);
  const auto per = [](std::uint64_t n, std::uint64_t d) {
    return d == 0 ? 0.0 : static_cast<double>(n) / static_cast<double>(d);
  };
  const auto spread = [](const std::vector<double>& v) {
    return *std::max_element(v.begin(), v.end()) / *std::min_element(v.begin(), v.end());
  };
  std::fprintf(stderr,
               "timed %d repetitions x %llu passes x %llu requests per "
               "method; max/min spread: decide %.2f, flat %.2f, nested %.2f\n",
               repetitions, static_cast<unsigned long long>(passes),
               static_cast<unsigned long long>(per_pass), spread(decide.ns_per_decision),
               spread(flat_t.ns_per_decision), spread(nested_t.ns_per_decision));
  std::fprintf(stderr,
               "median ns/decision: decide %.3f, flat array %.3f, nested map "
               "%.3f; load+validate default %.3f ms\n",
               decide_ns, flat_ns, nested_ns, median(load_ms));

  std::printf(
      "{\"decide_ns\": %.3f, \"flat_array_ns\": %.3f, \"nested_map_ns\": "
      "%.3f, \"allocations_per_decide\": %.6g, "
      "\"nested_map_allocations_per_lookup\": %.6g, "
      "\"flat_array_allocations_per_lookup\": %.6g, \"load_default_ms\": "
      "%.4f, \"load_default_allocations\": %.6g, \"requests\": %zu, "
      "\"decisions_per_method\": %llu, \"repetitions\": %d, "
      "\"ratio_decide_to_flat\": %.3f, \"ratio_nested_to_decide\": %.3f, "
      "\"mismatches\": %llu, \"algorithm_mismatches\": %llu, "
      "\"nested_map_mismatches\": %llu, \"checked_single_node\": %llu, "
      "\"fingerprint\": \"%s\"}\n",
      decide_ns, flat_ns, nested_ns, per(decide.allocations, decide.decisions),
      per(nested_t.allocations, nested_t.decisions), per(flat_t.allocations, flat_t.decisions),
      median(load_ms), per(load_allocations, kLoadRuns), requests.size(),
      static_cast<unsigned long long>(decide.decisions), repetitions,
      flat_ns > 0 ? decide_ns / flat_ns : 0.0, decide_ns > 0 ? nested_ns / decide_ns : 0.0,
      static_cast<unsigned long long>(mismatches),
      static_cast<unsigned long long>(algorithm_mismatches),
      static_cast<unsigned long long>(nested_mismatches), static_cast<unsigned long long>(checked),
      policy.fingerprint_hex().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Options> options = parse_options(argc, argv);
  if (!options) return 2;
  try {
    return run(*options);
  } catch (const arbiter::LoadError& e) {
    for (const arbiter::Diagnostic& d : e.diagnostics()) {
      std::fprintf(stderr, "%s\n", d.to_string().c_str());
    }
    std::fprintf(stderr, "error: the default policy did not load\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
