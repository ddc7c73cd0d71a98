// The aliasing contract of one run() call (arbiter_backend.h), checked on the
// host before a backend touches memory, the same way by every backend.
//
// In place: allreduce_out, residual_out and norm_out may each be exactly the
// buffer of `input` or of `residual_in` (the same address), as frameworks do
// it (vLLM passes norm_out = input and residual_out = residual_in). Every
// backend reads an element's input and residual before it writes any output
// of that element, so the result is the out-of-place one. Everything else is
// refused: a partial overlap, two outputs sharing memory, an output over
// gamma or scale, and quant_out or scale_out over any other buffer. Inputs
// may overlap each other: they are only read.
//
// Only the buffers the pattern reads or writes count (arbiter_backend.h);
// pointers the pattern ignores may be anything. Host only.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::common {

// A buffer of one call: where it starts, how many bytes the call touches.
struct CallBuffer {
  const char* name;
  std::uintptr_t begin;
  std::uint64_t bytes;
  bool output;
  // An output that may be exactly an in-place source, or an input that is
  // one (input, residual_in).
  bool in_place;
};

inline std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<std::uint64_t>::max()
                                                : product;
}

inline bool buffers_overlap(const CallBuffer& a, const CallBuffer& b) {
  if (a.bytes == 0 || b.bytes == 0) return false;
  // begin + bytes may pass the end of the address space: compare distances.
  return a.begin <= b.begin ? b.begin - a.begin < a.bytes : a.begin - b.begin < b.bytes;
}

// OK when args keeps the contract above, else ARBITER_INVALID_ARGUMENT naming
// the two buffers. REQUIRES: args.pattern and args.dtype are known values.
inline Status check_aliasing(const arbiter_allreduce_args& a) {
  const std::uint64_t elements = saturating_mul(a.tokens, a.hidden);
  const std::uint64_t values = saturating_mul(elements, dtype_size(a.dtype));
  const bool norm = a.pattern != ARBITER_PATTERN_ALLREDUCE;
  const bool fp8 = a.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  const bool fp4 = a.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  const std::uint32_t blocks = nvfp4_blocks_per_row(a.hidden);
  const std::uint64_t scale_bytes = (a.flags & ARBITER_RUN_NVFP4_LINEAR_SCALES) != 0
                                        ? linear_scale_bytes(a.tokens, blocks)
                                        : swizzled_128x4_bytes(a.tokens, blocks);
  CallBuffer buffers[9];
  int n = 0;
  const auto add = [&](const char* name, const void* p, bool by_pattern, std::uint64_t bytes,
                       bool output, bool in_place) {
    if (p != nullptr && by_pattern) {
      buffers[n++] = CallBuffer{name, reinterpret_cast<std::uintptr_t>(p), bytes, output, in_place};
    }
  };
  add("input", a.input, true, values, false, true);
  add("residual_in", a.residual_in, norm, values, false, true);
  add("gamma", a.gamma, norm, saturating_mul(a.hidden, dtype_size(a.dtype)), false, false);
  add("scale", a.scale, fp8 || fp4, sizeof(float), false, false);
  add("allreduce_out", a.allreduce_out, true, values, true, true);
  add("residual_out", a.residual_out, norm, values, true, true);
  add("norm_out", a.norm_out, norm, values, true, true);
  add("quant_out", a.quant_out, fp8 || fp4, fp4 ? elements / 2 : elements, true, false);
  add("scale_out", a.scale_out, fp4, scale_bytes, true, false);

  const auto is_in_place_source = [](const CallBuffer& b) { return !b.output && b.in_place; };
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      const CallBuffer& x = buffers[i];
      const CallBuffer& y = buffers[j];
      if (!(x.output || y.output) || !buffers_overlap(x, y)) continue;
      const CallBuffer& out = y.output ? y : x;
      const CallBuffer& other = y.output ? x : y;
      if (out.in_place && is_in_place_source(other) && out.begin == other.begin) {
        continue;  // in place
      }
      std::string why;
      if (other.output) {
        why = "outputs must not share memory";
      } else if (!out.in_place) {
        why = std::string(out.name) + " must not overlap any other buffer";
      } else if (is_in_place_source(other)) {
        why =
            "an output may be the very buffer of input or residual_in (in place), not part "
            "of it";
      } else {
        why = std::string("an output must not overlap ") + other.name;
      }
      return Status(ARBITER_INVALID_ARGUMENT,
                    std::string(out.name) + " overlaps " + other.name + ": " + why);
    }
  }
  return Status();
}

}  // namespace arbiter::common
