// The compiled decision lookup that Policy::decide() reads inline. Not an
// API: layout and names may change with any release.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "arbiter/decision.h"
#include "arbiter/request.h"

namespace arbiter::detail {

// Everything about a request but its capability, world size, nodes count and
// size that a decision depends on, in 9 bits: NVLink, multicast, dtype,
// pattern, multi-node, residual replicated, buffers registered. The first
// four are read as one 32-bit word: Request keeps those one-byte fields
// adjacent (checked below).
inline constexpr int kSignatureCount = 512;
inline std::uint32_t signature(const Request& r) {
  std::uint32_t x;  // nvlink | multicast << 8 | dtype << 16 | pattern << 24
  std::memcpy(&x, &r.nvlink_domain, sizeof x);
  return (x & 1u) | ((x >> 7) & 2u) | ((x >> 14) & 0xCu) | ((x >> 20) & 0x30u) |
         static_cast<std::uint32_t>(r.nodes > 1) << 6 |
         static_cast<std::uint32_t>(r.residual_replicated) << 7 |
         static_cast<std::uint32_t>(r.buffers_registered) << 8;
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
  // Cells keyed by node counts: Compiled::nodes_of_block says which node
  // counts have blocks of their own (kept out of the route: 8 bytes less in
  // every one of them).
  bool nodes_keyed = false;
};

// A node count named by some cell, and the block of routes for it.
struct NodesRoute {
  std::uint32_t nodes;
  std::uint32_t block;
};

// The decision a route gives for the request's size and token count: two
// compares pick one of its three outcomes, with no branch on the size.
inline Decision decide_from_route(const Route& route, const Request& r) {
  const unsigned fits = r.message_bytes < route.cap_below;
  // tokens known (!= 0) and fewer than the ranks: two-shot cannot split them.
  const unsigned few_tokens = route.twoshot_needs_tokens & (r.tokens - 1u < r.world_size - 1u);
  const unsigned one = (r.message_bytes < route.oneshot_below) | few_tokens;
  const Route::Head& h = route.head[fits + (fits & one)];
  Decision d;
  d.backend = h.backend;
  d.algorithm = h.algorithm;
  d.fused = h.fused;
  d.reason = h.reason;
  d.cap = route.cap;
  d.fusion_origin = route.fusion_origin;
  d.oneshot_origin = h.oneshot_origin;
  return d;
}

}  // namespace arbiter::detail
