// What must agree across ranks for one call: its shape, pattern, scalars,
// flags and which buffers it was given. The shm backend carries it in the
// cache line of the first flag every algorithm publishes, and compares it on
// every rank before it reads any peer's data; the runtime's check mode
// (communicator.h) all-gathers it through the oob before a call runs. Either
// way a call whose signature differs on any rank is refused on every rank
// (ARBITER_MISMATCH) before any output is written. Host only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "arbiter/common/bits.h"
#include "arbiter/common/names.h"
#include "arbiter_backend.h"

namespace arbiter::common {

// Bits of CallSignature::buffers: the buffers of a call that the pattern
// reads or writes and that the caller gave (non-NULL). `input` is always
// required, so it has no bit.
enum GivenBuffer : std::uint8_t {
  kGivenResidualIn = 1u << 0,
  kGivenGamma = 1u << 1,
  kGivenScale = 1u << 2,
  kGivenAllreduceOut = 1u << 3,
  kGivenResidualOut = 1u << 4,
  kGivenNormOut = 1u << 5,
  kGivenQuantOut = 1u << 6,
  kGivenScaleOut = 1u << 7,
};

// 32 bytes, all integers, compared byte for byte. Zero-initialised fields
// that a pattern does not use stay zero, so they never differ.
struct CallSignature {
  // Not 0: this rank refused the call locally (its own error says why)
  // and joined only to tell its peers (refused_call()); the other fields
  // are then 0.
  std::uint32_t refusal;
  std::uint32_t tokens;  // of the whole call, also in each slice of a streamed one
  std::uint32_t hidden;
  std::uint32_t eps_bits;          // norm patterns
  std::uint32_t weight_bias_bits;  // norm patterns
  std::uint32_t scale_bits;        // quantising patterns, when the scale is host memory
  std::uint32_t flags;             // ARBITER_RUN_*
  std::uint8_t pattern;
  std::uint8_t dtype;
  std::uint8_t algorithm;  // the module's (0 where the caller has not chosen yet)
  std::uint8_t buffers;    // GivenBuffer bits
};
static_assert(sizeof(CallSignature) == 32);

// The signature of `a`. With `read_scale` (host backends: the scale is host
// memory) the value *a.scale counts too; GPU callers pass device pointers,
// whose values only the device may read. With `with_algorithm` the
// algorithm counts (a module's call; the runtime has not chosen one yet).
inline CallSignature signature_of(const arbiter_allreduce_args& a, bool read_scale,
                                  bool with_algorithm) {
  CallSignature s{};
  s.tokens = a.tokens;
  s.hidden = a.hidden;
  s.flags = a.flags;
  s.pattern = static_cast<std::uint8_t>(a.pattern);
  s.dtype = static_cast<std::uint8_t>(a.dtype);
  s.algorithm = with_algorithm ? static_cast<std::uint8_t>(a.algorithm) : 0;
  const bool norm = a.pattern != ARBITER_PATTERN_ALLREDUCE;
  const bool quant = a.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8 ||
                     a.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  std::uint8_t given = a.allreduce_out != nullptr ? kGivenAllreduceOut : 0;
  if (norm) {
    s.eps_bits = float_bits(a.eps);
    s.weight_bias_bits = float_bits(a.weight_bias);
    if (a.residual_in != nullptr) given |= kGivenResidualIn;
    if (a.gamma != nullptr) given |= kGivenGamma;
    if (a.residual_out != nullptr) given |= kGivenResidualOut;
    if (a.norm_out != nullptr) given |= kGivenNormOut;
  }
  if (quant) {
    if (a.scale != nullptr) {
      given |= kGivenScale;
      if (read_scale) s.scale_bits = float_bits(*a.scale);
    }
    if (a.quant_out != nullptr) given |= kGivenQuantOut;
    if (a.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4 && a.scale_out != nullptr) {
      given |= kGivenScaleOut;
    }
  }
  s.buffers = given;
  return s;
}

// The signature of a call this rank refused and joined only to say so:
// ranks that all refused agree (each returns its own error); a peer that
// did not is refused too, its error naming this rank.
inline CallSignature refused_call() {
  CallSignature s{};
  s.refusal = 1;
  return s;
}

// Four 64-bit compares, inlined (the shm backend compares on every call).
inline bool same_call(const CallSignature& a, const CallSignature& b) {
  std::uint64_t x[4];
  std::uint64_t y[4];
  std::memcpy(x, &a, sizeof x);
  std::memcpy(y, &b, sizeof y);
  return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
}

namespace detail {

inline std::string float_text(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  char text[48];
  std::snprintf(text, sizeof text, "%.9g", static_cast<double>(f));
  return text;
}

inline std::string algorithm_text(std::uint32_t a) {
  switch (a) {
    case ARBITER_ALGORITHM_ONESHOT:
      return "one-shot";
    case ARBITER_ALGORITHM_TWOSHOT:
      return "two-shot";
    case ARBITER_ALGORITHM_NATIVE:
      return "native (unfused)";
  }
  return "algorithm " + std::to_string(a);
}

inline std::string buffers_text(std::uint8_t bits) {
  static const char* const kNames[] = {"residual_in",  "gamma",    "scale",     "allreduce_out",
                                       "residual_out", "norm_out", "quant_out", "scale_out"};
  std::string out;
  for (int b = 0; b < 8; ++b) {
    if (!((bits >> b) & 1u)) continue;
    if (!out.empty()) out += "+";
    out += kNames[b];
  }
  return out.empty() ? "input only" : "input+" + out;
}

inline std::string flags_text(std::uint32_t flags) {
  std::string out;
  auto add = [&](std::uint32_t bit, const char* name) {
    if (!(flags & bit)) return;
    if (!out.empty()) out += "|";
    out += name;
    flags &= ~bit;
  };
  add(ARBITER_RUN_NVFP4_LINEAR_SCALES, "NVFP4_LINEAR_SCALES");
  add(ARBITER_RUN_PDL, "PDL");
  add(ARBITER_RUN_RESIDUAL_REPLICATED, "RESIDUAL_REPLICATED");
  add(ARBITER_RUN_REFUSED, "REFUSED");
  if (flags != 0) out += (out.empty() ? "" : "|") + std::to_string(flags);
  return out.empty() ? "none" : out;
}

}  // namespace detail

// The first field in which rank `b`'s call differs from rank `a`'s, as
// "tokens: rank 1 has 4, rank 0 has 8"; "" when they agree.
inline std::string call_difference(const CallSignature& a, int rank_a, const CallSignature& b,
                                   int rank_b) {
  const std::string ra = "rank " + std::to_string(rank_a);
  const std::string rb = "rank " + std::to_string(rank_b);
  auto differ = [&](const char* field, const std::string& va, const std::string& vb) {
    return std::string(field) + ": " + rb + " has " + vb + ", " + ra + " has " + va;
  };
  if (a.refusal != 0 || b.refusal != 0) {
    if (a.refusal == b.refusal) return "";
    return "whether it was refused: " + (b.refusal != 0 ? rb : ra) +
           " refused its call (its own error says why) and joined only to say so";
  }
  if (a.tokens != b.tokens) {
    return differ("tokens", std::to_string(a.tokens), std::to_string(b.tokens));
  }
  if (a.hidden != b.hidden) {
    return differ("hidden", std::to_string(a.hidden), std::to_string(b.hidden));
  }
  if (a.pattern != b.pattern) {
    return differ("pattern", pattern_text(a.pattern), pattern_text(b.pattern));
  }
  if (a.dtype != b.dtype) {
    return differ("dtype", dtype_text(a.dtype), dtype_text(b.dtype));
  }
  if (a.eps_bits != b.eps_bits) {
    return differ("eps", detail::float_text(a.eps_bits), detail::float_text(b.eps_bits));
  }
  if (a.weight_bias_bits != b.weight_bias_bits) {
    return differ("weight_bias", detail::float_text(a.weight_bias_bits),
                  detail::float_text(b.weight_bias_bits));
  }
  if (a.buffers != b.buffers) {
    return differ("the buffers given", detail::buffers_text(a.buffers),
                  detail::buffers_text(b.buffers));
  }
  if (a.scale_bits != b.scale_bits) {
    return differ("the quantisation scale", detail::float_text(a.scale_bits),
                  detail::float_text(b.scale_bits));
  }
  if (a.flags != b.flags) {
    return differ("flags", detail::flags_text(a.flags), detail::flags_text(b.flags));
  }
  if (a.algorithm != b.algorithm) {
    return differ("algorithm (the call was forced onto different algorithms)",
                  detail::algorithm_text(a.algorithm), detail::algorithm_text(b.algorithm));
  }
  return "";
}

// The error of a refused call: `difference` from call_difference(), `call`
// the call's number on this communicator or workspace.
inline std::string mismatch_message(const std::string& difference, std::uint64_t call) {
  return "call " + std::to_string(call) + " differs across ranks in " + difference +
         "; refused on every rank, no output written (every rank must make the same call: the "
         "same tokens, pattern, eps, flags and buffers given; only the data may differ)";
}

}  // namespace arbiter::common
