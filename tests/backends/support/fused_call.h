// One fused all-reduce call as the GPU tests make it (every rank of a
// loopback group, same shape), the outputs it writes, and bit-for-bit
// comparison of those outputs between ranks and between algorithms.
//
// Host only; no Boost (the GPU tests build where only CUDA is installed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/common/rmsnorm.h"
#include "arbiter_backend.h"
#include "gpu_check.h"

namespace arbiter::test {

using Bytes = std::vector<std::uint8_t>;

inline constexpr std::uint32_t kMinNvfp4Capability = 100;
inline constexpr float kEps = 1e-6f;
inline constexpr float kFp8Scale = 0.008f;  // dequant scale: the largest norms saturate
inline constexpr float kNvfp4GlobalScale = 512.0f;

inline const char* dtype_name(arbiter_dtype dtype) {
  switch (dtype) {
    case ARBITER_DTYPE_FP16:
      return "fp16";
    case ARBITER_DTYPE_BF16:
      return "bf16";
    case ARBITER_DTYPE_FP32:
      return "fp32";
  }
  return "dtype?";
}

inline const char* pattern_name(arbiter_pattern pattern) {
  switch (pattern) {
    case ARBITER_PATTERN_ALLREDUCE:
      return "allreduce";
    case ARBITER_PATTERN_RESIDUAL_RMSNORM:
      return "residual_rmsnorm";
    case ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8:
      return "residual_rmsnorm_fp8";
    case ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4:
      return "residual_rmsnorm_fp4";
  }
  return "pattern?";
}

inline const char* algorithm_name(arbiter_algorithm algorithm) {
  switch (algorithm) {
    case ARBITER_ALGORITHM_ONESHOT:
      return "one-shot";
    case ARBITER_ALGORITHM_TWOSHOT:
      return "two-shot";
    case ARBITER_ALGORITHM_NATIVE:
      return "native";
  }
  return "algorithm?";
}

// A pattern and which of its optional outputs a call asks for.
struct Variant {
  arbiter_pattern pattern;
  bool norm_out;       // quantising patterns: also write the un-quantised norm
  bool linear_scales;  // NVFP4: linear scale factors, else 128x4 swizzled
};

// Every pattern; the quantising ones with and without norm_out, NVFP4 with
// both scale layouts.
inline const std::vector<Variant> kAllVariants = {
    {ARBITER_PATTERN_ALLREDUCE, false, false},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM, true, false},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, true, false},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, false, false},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, true, true},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, true, false},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, false, true},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, false, false},
};

// One run() on every rank of a group.
struct Call {
  int world_size = 2;
  arbiter_dtype dtype = ARBITER_DTYPE_BF16;
  std::uint32_t tokens = 1;
  std::uint32_t hidden = 1024;
  Variant variant = kAllVariants[0];
  arbiter_algorithm algorithm = ARBITER_ALGORITHM_ONESHOT;
  float weight_bias = 0.0f;
  bool allreduce_out = false;  // norm patterns: also write the sum
  bool residual_out = true;    // norm patterns
  bool residual_in = true;     // norm patterns; false: NULL (a first block)
  bool pdl = false;
  const char* inputs = "sweep";  // names the inputs in messages

  arbiter_pattern pattern() const { return variant.pattern; }
  bool norm() const { return common::pattern_has_norm(pattern()); }
  bool fp8() const { return pattern() == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8; }
  bool fp4() const { return pattern() == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4; }
  bool writes_allreduce_out() const { return !norm() || allreduce_out; }
  bool writes_residual_out() const { return norm() && residual_out; }
  bool writes_norm_out() const {
    return pattern() == ARBITER_PATTERN_RESIDUAL_RMSNORM || ((fp8() || fp4()) && variant.norm_out);
  }
  std::size_t elements() const { return std::size_t{tokens} * hidden; }
  std::size_t element_size() const { return common::dtype_size(dtype); }
  std::size_t bytes() const { return elements() * element_size(); }
  std::size_t row_bytes() const { return std::size_t{hidden} * element_size(); }
  std::size_t quant_bytes() const { return fp8() ? elements() : fp4() ? elements() / 2 : 0; }
  std::uint32_t scale_blocks() const { return common::nvfp4_blocks_per_row(hidden); }
  std::size_t scale_bytes() const {
    if (!fp4()) return 0;
    return variant.linear_scales ? common::linear_scale_bytes(tokens, scale_blocks())
                                 : common::swizzled_128x4_bytes(tokens, scale_blocks());
  }

  std::string name() const {
    std::ostringstream s;
    s << "ws " << world_size << " " << dtype_name(dtype) << " " << pattern_name(pattern()) << " "
      << algorithm_name(algorithm) << " tokens " << tokens << " hidden " << hidden;
    if (fp8() || fp4()) s << (variant.norm_out ? " +norm_out" : " no-norm_out");
    if (fp4()) s << (variant.linear_scales ? " linear-scales" : " swizzled-scales");
    if (norm()) {
      if (weight_bias != 0.0f) s << " weight_bias " << weight_bias;
      if (allreduce_out) s << " +allreduce_out";
      if (!residual_out) s << " no-residual_out";
      if (!residual_in) s << " no-residual_in";
    }
    if (pdl) s << " pdl";
    s << " [" << inputs << " inputs]";
    return s.str();
  }
};

// One rank's outputs, downloaded; empty where the call does not write.
struct HostOutputs {
  Bytes allreduce_out, residual_out, norm_out, quant_out, scale_out;
};

// Bytes of one output on the host.
struct Span {
  const std::uint8_t* data;
  std::size_t size;
};

inline Span span(const Bytes& bytes) { return Span{bytes.data(), bytes.size()}; }

enum class Field { kValues, kFp8, kNvfp4, kScales };

inline Field quant_field(const Call& c) { return c.fp4() ? Field::kNvfp4 : Field::kFp8; }

inline bool is_zero_code(std::uint32_t code, Field field, arbiter_dtype dtype) {
  switch (field) {
    case Field::kValues:
      return (code & (dtype == ARBITER_DTYPE_FP32 ? 0x7FFFFFFFu : 0x7FFFu)) == 0;
    case Field::kFp8:
      return (code & 0x7Fu) == 0;
    case Field::kNvfp4:
      return (code & 0x7u) == 0;
    case Field::kScales:
      return false;
  }
  return false;
}

// "" when `got` and `want` hold the same bits (with zero_sign_free, +0.0 and
// -0.0 count as the same); otherwise where they first differ.
inline std::string first_difference(Span got, Span want, Field field, const Call& c,
                                    bool zero_sign_free) {
  if (got.size != want.size) {
    return "sizes differ (" + std::to_string(got.size) + " vs " + std::to_string(want.size) +
           " bytes)";
  }
  if (got.size == 0 || std::memcmp(got.data, want.data, got.size) == 0) return "";
  const std::size_t codes = field == Field::kValues  ? got.size / c.element_size()
                            : field == Field::kNvfp4 ? got.size * 2
                                                     : got.size;
  for (std::size_t i = 0; i < codes; ++i) {
    std::uint32_t a = 0;
    std::uint32_t b = 0;
    if (field == Field::kValues) {
      a = common::load_bits(got.data, i, c.dtype);
      b = common::load_bits(want.data, i, c.dtype);
    } else if (field == Field::kNvfp4) {
      a = (got.data[i / 2] >> ((i % 2) * 4)) & 0xFu;
      b = (want.data[i / 2] >> ((i % 2) * 4)) & 0xFu;
    } else {
      a = got.data[i];
      b = want.data[i];
    }
    if (a == b) continue;
    if (zero_sign_free && is_zero_code(a, field, c.dtype) && is_zero_code(b, field, c.dtype)) {
      continue;
    }
    std::ostringstream text;
    text << (field == Field::kScales ? "byte " : "element ") << i;
    if (field != Field::kScales) text << " (token " << i / c.hidden << ", " << i % c.hidden << ")";
    text << ": 0x" << std::hex << a << " vs 0x" << b;
    return text.str();
  }
  return "";
}

// The scale factors in linear layout, whatever layout `c` wrote.
// REQUIRES: `written` holds c.scale_bytes() bytes.
inline Bytes linear_scales(const Call& c, const std::uint8_t* written) {
  if (c.variant.linear_scales) return Bytes(written, written + c.scale_bytes());
  const std::uint32_t blocks = c.scale_blocks();
  Bytes out(common::linear_scale_bytes(c.tokens, blocks));
  for (std::uint32_t t = 0; t < c.tokens; ++t) {
    for (std::uint32_t b = 0; b < blocks; ++b) {
      out[common::linear_scale_offset(t, b, blocks)] =
          written[common::swizzled_128x4_offset(t, b, blocks)];
    }
  }
  return out;
}

// Checks that output `name` of `got` has the bits of `want`. Swizzled scale
// factors are compared in linear layout: the swizzled padding holds no values.
inline void compare_field(const char* name, Span got, Span want, Field field, const Call& c,
                          bool zero_sign_free, const std::string& context) {
  std::string e = first_difference(got, want, field, c, zero_sign_free);
  if (!e.empty() && field == Field::kScales && !c.variant.linear_scales &&
      got.size == c.scale_bytes() && want.size == c.scale_bytes()) {
    e = first_difference(span(linear_scales(c, got.data)), span(linear_scales(c, want.data)), field,
                         c, false);
    if (!e.empty()) e += " (in linear layout)";
  }
  ARBITER_CHECK(e.empty(), context, name << " differs at " << e);
}

// Checks that `got` has the bits of `want`, output by output.
inline void compare_outputs(const HostOutputs& got, const HostOutputs& want, const Call& c,
                            bool zero_sign_free, const std::string& context) {
  const struct {
    const char* name;
    const Bytes& got;
    const Bytes& want;
    Field field;
  } fields[] = {{"allreduce_out", got.allreduce_out, want.allreduce_out, Field::kValues},
                {"residual_out", got.residual_out, want.residual_out, Field::kValues},
                {"norm_out", got.norm_out, want.norm_out, Field::kValues},
                {"quant_out", got.quant_out, want.quant_out, quant_field(c)},
                {"scale_out", got.scale_out, want.scale_out, Field::kScales}};
  for (const auto& f : fields) {
    compare_field(f.name, span(f.got), span(f.want), f.field, c, zero_sign_free, context);
  }
}

}  // namespace arbiter::test
