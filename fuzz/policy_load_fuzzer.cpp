// libFuzzer target: the table loader, from bytes to a compiled Policy, and
// the decisions of every table it accepts.
//
// The input is one table file. It is loaded alone (as `arbiter validate
// --standalone` does) and as a layer over the embedded default (as a site
// file is). Beyond "no crash, leak or undefined behaviour", it checks:
// - a rejected load reports an error;
// - loading is deterministic (same text, same fingerprint);
// - decide() (the fast path) and explain() agree on every request tried,
//   and a fused decision fits max_fused_bytes();
// - Request::excluded_backends and without_backends() agree;
// - sweep() covers its range with contiguous bands whose decisions are
//   decide()'s at both ends.
// The requests come from the table's own cells (at their caps and one byte
// above) plus invalid and odd ones.
//
// Speed: the first four checks run on every input; the costly cross-checks
// (reload for determinism, rendering, exclusion, sweep) on one input in
// ARBITER_FUZZ_DEEP_EVERY, picked by a hash of the whole input so a replay
// takes the same path. The replay test in the normal build sets it to 1:
// every seed and past crash gets every check.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/policy.h"
#include "arbiter/size.h"
#include "fuzz_check.h"

namespace {

using namespace arbiter;

constexpr std::size_t kMaxInput =
    64 * 1024;  // tables are small; larger inputs only slow the search
constexpr std::size_t kMaxCells = 12;
#ifndef ARBITER_FUZZ_DEEP_EVERY
#define ARBITER_FUZZ_DEEP_EVERY 8
#endif
constexpr std::uint64_t kDeepEvery = ARBITER_FUZZ_DEEP_EVERY;

// FNV-1a over every byte: inputs that share their first bytes (most tables
// start alike) still spread over the sample.
std::uint64_t hash_of(const std::uint8_t* data, std::size_t size) {
  std::uint64_t h = 14695981039346656037ull;
  for (std::size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}

bool same(const Decision& a, const Decision& b) {
  return a.same_choice(b) && a.reason == b.reason && a.cap == b.cap;
}

Request from_key(const CellKey& key, std::uint32_t nodes, std::uint64_t bytes, std::uint64_t mix) {
  Request r;
  r.capability = key.capability;
  r.world_size = key.world_size;
  r.nodes = key.nodes != 0 ? key.nodes : nodes;
  r.pattern = key.pattern.value_or(static_cast<Pattern>(mix % kPatternCount));
  r.dtype = key.dtype.value_or(static_cast<Dtype>((mix / 4) % kDtypeCount));
  r.nvlink_domain = (mix & 16) == 0;
  r.multicast = (mix & 32) != 0;
  r.residual_replicated = key.residual ? *key.residual == Residual::kReplicated : (mix & 128) != 0;
  r.buffers_registered = key.buffers ? *key.buffers == BufferKind::kRegistered : (mix & 256) != 0;
  r.message_bytes = bytes;
  if (mix & 64) {
    r.hidden = 1024;
    r.tokens = static_cast<std::uint32_t>(mix % 9);  // fewer tokens than ranks, sometimes
  }
  return r;
}

std::vector<Request> requests_for(const Policy& policy, std::uint64_t mix) {
  std::vector<Request> out;
  auto add_cells = [&](const std::vector<Cell>& cells) {
    for (std::size_t i = 0; i < cells.size() && i < kMaxCells; ++i) {
      const Cell& c = cells[(i * 7 + mix) % cells.size()];
      const std::uint64_t cap = c.off ? kMiB : c.max_bytes;
      for (std::uint64_t bytes : {cap, cap + 1, std::uint64_t{1}}) {
        out.push_back(from_key(c.key, 1, bytes, mix + i));
        out.push_back(from_key(c.key, 2, bytes, mix + i + 1));
      }
    }
  };
  add_cells(policy.tables().fusion);
  add_cells(policy.tables().oneshot);
  // Requests no table covers, and invalid ones.
  for (std::uint16_t sm : {std::uint16_t{0}, std::uint16_t{90}, std::uint16_t{103}}) {
    CellKey key;
    key.capability = sm == 0 ? Capability::cpu() : Capability::sm(sm);
    for (std::uint32_t ws : {0u, 1u, 2u, 3u, 16u, kMaxWorldSize, kMaxWorldSize + 1}) {
      key.world_size = ws;
      out.push_back(from_key(key, 1, 2 * kMiB, mix));
    }
  }
  Request odd = from_key(CellKey{Capability::sm(103), 8, 0, {}, {}, {}, {}}, 9, kMaxSizeBytes, mix);
  out.push_back(odd);  // nodes > world size
  odd.nodes = 0;
  out.push_back(odd);
  odd.nodes = 1;
  odd.message_bytes = ~std::uint64_t{0};
  out.push_back(odd);
  return out;
}

void check_sweep(const Policy& policy, const Request& r, std::uint64_t from, std::uint64_t to) {
  const std::vector<Band> bands = sweep(policy, r, from, to);
  ARBITER_FUZZ_CHECK(!bands.empty(), "sweep returned no band");
  ARBITER_FUZZ_CHECK(bands.front().first == from && bands.back().last == to,
                     "sweep does not cover its range");
  for (std::size_t i = 0; i < bands.size(); ++i) {
    const Band& b = bands[i];
    ARBITER_FUZZ_CHECK(b.first <= b.last, "empty sweep band");
    if (i > 0) ARBITER_FUZZ_CHECK(bands[i - 1].last + 1 == b.first, "sweep bands not contiguous");
    for (std::uint64_t bytes : {b.first, b.last}) {
      Request at = r;
      at.message_bytes = bytes;  // sweep varies the bytes alone, tokens kept
      ARBITER_FUZZ_CHECK(policy.decide(at).same_choice(b.decision),
                         "a sweep band's decision differs from decide() at its ends");
    }
  }
}

void check_policy(const Policy& policy, std::uint64_t mix, bool deep) {
  const std::vector<Request> requests = requests_for(policy, mix);
  std::size_t rendered = 0;
  for (const Request& r : requests) {
    const Decision fast = policy.decide(r);
    const Decision slow = policy.explain(r);
    ARBITER_FUZZ_CHECK(same(fast, slow), "decide() and explain() disagree");
    ARBITER_FUZZ_CHECK(fast.trace.size() == 0, "decide() filled a trace");
    if (fast.fused) {
      const auto cap = policy.max_fused_bytes(r);
      ARBITER_FUZZ_CHECK(cap.has_value(), "fused, yet max_fused_bytes() says nothing fuses");
      ARBITER_FUZZ_CHECK(r.message_bytes <= *cap, "fused above max_fused_bytes()");
      ARBITER_FUZZ_CHECK(fast.backend != Backend::kNone, "fused on no backend");
    }
    // Rendering is slow next to deciding: a few requests per sampled table.
    if (deep && (rendered++ < 4 || (mix + rendered) % 32 == 0)) {
      (void)policy.explain_text(r, slow);
      (void)policy.decision_json(r, slow);
    }
  }
  if (!deep) return;
  // The first valid request: exclusion and sweep.
  for (const Request& r : requests) {
    if (policy.decide(r).reason == Reason::kInvalidRequest) continue;
    const std::uint32_t mask = 1u << (mix % kBackendCount);
    Request excluded = r;
    excluded.excluded_backends = mask;
    ARBITER_FUZZ_CHECK(same(policy.decide(excluded), policy.without_backends(mask).decide(r)),
                       "excluded_backends and without_backends() disagree");
    const std::uint64_t to = r.message_bytes < kGiB ? 2 * r.message_bytes + 2 : kMaxSizeBytes;
    check_sweep(policy, r, 1, to);
    break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > kMaxInput) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::uint64_t mix = 0;
  for (std::size_t i = 0; i < size && i < 16; ++i) mix = mix * 131 + data[i];
  const bool deep = hash_of(data, size) % kDeepEvery == 0;

  for (const bool with_default : {false, true}) {
    LoadOptions options;
    options.with_default = with_default;
    options.overrides.yaml("fuzz.yaml", text);
    const LoadResult result = Policy::load(options);
    for (const Diagnostic& d : result.diagnostics) (void)d.to_string();
    if (!result.policy) {
      ARBITER_FUZZ_CHECK(has_errors(result.diagnostics), "a load failed without an error");
      continue;
    }
    ARBITER_FUZZ_CHECK(!has_errors(result.diagnostics), "a load with errors produced a policy");
    if (deep && !with_default) {
      const LoadResult again = Policy::load(options);
      ARBITER_FUZZ_CHECK(
          again.policy && again.policy->fingerprint() == result.policy->fingerprint(),
          "the same text loaded twice has two fingerprints");
    }
    check_policy(*result.policy, mix, deep);
  }
  return 0;
}
