// A CPU fp64 reference of the whole fused operation over every rank's input,
// and the checks every backend's tests compare their outputs with.
//
// The reference computes exact-ish values (fp64, no intermediate rounding)
// and, per element, a bound on how far a correct implementation of the
// semantics in rmsnorm.h may land from them: roundings to the dtype where a
// value is stored, fp32 accumulation in any order, an approximate rsqrt. A
// check passes when |got - reference| <= 2 * bound; quantised outputs pass
// when the code is one that some value within the bound quantises to.
//
// Host only (std::vector, std::string). Not thread-safe to share a
// ReferenceOutputs being written; reading is fine.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "arbiter/common/fp8.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/common/rmsnorm.h"
#include "arbiter_backend.h"

namespace arbiter::common {

struct ReferenceCase {
  arbiter_pattern pattern = ARBITER_PATTERN_ALLREDUCE;
  arbiter_dtype dtype = ARBITER_DTYPE_BF16;
  std::uint32_t tokens = 0;
  std::uint32_t hidden = 0;
  std::vector<const void*> inputs;  // one per rank, in rank order
  const void* residual_in = nullptr;
  const void* gamma = nullptr;
  float eps = 1e-6f;
  float weight_bias = 0.0f;
  float scale = 1.0f;  // FP8: dequant scale; NVFP4: global scale
  bool linear_scales = false;
};

// tokens x hidden values each; the norm fields stay empty for plain allreduce.
struct ReferenceOutputs {
  std::vector<double> sum, residual, norm;
  std::vector<double> sum_bound, residual_bound, norm_bound;
};

// Relative rounding error of storing a value in `dtype`.
inline double unit_roundoff(arbiter_dtype dtype) {
  switch (dtype) {
    case ARBITER_DTYPE_FP16:
      return std::ldexp(1.0, -11);
    case ARBITER_DTYPE_BF16:
      return std::ldexp(1.0, -8);
    default:
      return std::ldexp(1.0, -24);
  }
}

// Absolute rounding error near zero: half the smallest subnormal of `dtype`.
inline double subnormal_roundoff(arbiter_dtype dtype) {
  switch (dtype) {
    case ARBITER_DTYPE_FP16:
      return std::ldexp(1.0, -25);
    case ARBITER_DTYPE_BF16:
      return std::ldexp(1.0, -134);
    default:
      return std::ldexp(1.0, -150);
  }
}

inline ReferenceOutputs compute_reference(const ReferenceCase& c) {
  const double u32 = std::ldexp(1.0, -24);
  const double ud = unit_roundoff(c.dtype);
  const double tiny = subnormal_roundoff(c.dtype);
  const double ranks = static_cast<double>(c.inputs.size());
  const std::size_t count = static_cast<std::size_t>(c.tokens) * c.hidden;
  ReferenceOutputs out;
  out.sum.resize(count);
  out.sum_bound.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    double sum = 0.0;
    double magnitude = 0.0;
    for (const void* input : c.inputs) {
      const double value = load_element(input, i, c.dtype);
      sum += value;
      magnitude += std::fabs(value);
    }
    out.sum[i] = sum;
    out.sum_bound[i] = ud * std::fabs(sum) + ranks * u32 * magnitude + tiny;
  }
  if (!pattern_has_norm(c.pattern)) return out;

  out.residual.resize(count);
  out.residual_bound.resize(count);
  out.norm.resize(count);
  out.norm_bound.resize(count);
  const double hidden = c.hidden;
  for (std::uint32_t t = 0; t < c.tokens; ++t) {
    const std::size_t base = static_cast<std::size_t>(t) * c.hidden;
    double squares = 0.0;
    double perturbation = 0.0;  // how much the implementation's sum of squares may move
    for (std::uint32_t i = 0; i < c.hidden; ++i) {
      // NULL residual_in: no residual, x is the sum alone.
      const double residual =
          c.residual_in != nullptr ? load_element(c.residual_in, base + i, c.dtype) : 0.0;
      const double x = out.sum[base + i] + residual;
      const double bound = out.sum_bound[base + i] + (ud + u32) * std::fabs(x) + tiny;
      out.residual[base + i] = x;
      out.residual_bound[base + i] = bound;
      squares += x * x;
      perturbation += 2.0 * std::fabs(x) * bound + bound * bound;
    }
    const double mean = squares / hidden + c.eps;
    const double inv_rms = 1.0 / std::sqrt(mean);
    // Relative error of the implementation's 1/rms: perturbed inputs, fp32
    // accumulation of the squares (worst case hidden * u32), rsqrt itself.
    const double inv_rms_error =
        0.5 * (perturbation + hidden * u32 * squares) / (squares + hidden * c.eps) + 4.0 * u32;
    for (std::uint32_t i = 0; i < c.hidden; ++i) {
      const double weight = static_cast<double>(load_element(c.gamma, i, c.dtype)) + c.weight_bias;
      const double x = out.residual[base + i];
      const double y = x * inv_rms * weight;
      out.norm[base + i] = y;
      out.norm_bound[base + i] = std::fabs(weight) * inv_rms *
                                     (out.residual_bound[base + i] + std::fabs(x) * inv_rms_error) +
                                 (ud + 3.0 * u32) * std::fabs(y) + tiny;
    }
  }
  return out;
}

namespace detail {

inline std::string describe(const char* what, std::size_t index, std::uint32_t hidden, double got,
                            double expected, double bound) {
  std::ostringstream text;
  text.precision(9);
  text << what << "[token " << index / hidden << ", element " << index % hidden << "]: got " << got
       << ", expected " << expected << " +- " << 2.0 * bound;
  return text.str();
}

// `value` as a float rounded down (or up), so an interval converted to floats
// only ever widens.
inline float outward_float(double value, bool down) {
  float result = static_cast<float>(value);
  if (down && static_cast<double>(result) > value) {
    result = std::nextafter(result, -std::numeric_limits<float>::infinity());
  }
  if (!down && static_cast<double>(result) < value) {
    result = std::nextafter(result, std::numeric_limits<float>::infinity());
  }
  return result;
}

// Whether `code` decodes between the quantisation of lo and of hi
// (quantisation is monotonic, so those are the extreme codes).
template <class Encode, class Decode>
bool code_in_range(std::uint8_t code, double lo, double hi, Encode encode, Decode decode) {
  const double slack = 8.0 * std::ldexp(1.0, -24);
  lo -= std::fabs(lo) * slack;
  hi += std::fabs(hi) * slack;
  const float got = decode(code);
  if (std::isnan(got)) return false;
  return decode(encode(outward_float(lo, true))) <= got &&
         got <= decode(encode(outward_float(hi, false)));
}

}  // namespace detail

// "" when every element of `got` (tokens x hidden of `dtype`) is within
// 2 * bound of `expected`; otherwise the first offender, named by `what`.
inline std::string check_output(const void* got, arbiter_dtype dtype,
                                const std::vector<double>& expected,
                                const std::vector<double>& bound, std::uint32_t hidden,
                                const char* what) {
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double value = load_element(got, i, dtype);
    if (!(std::fabs(value - expected[i]) <= 2.0 * bound[i])) {
      return detail::describe(what, i, hidden, value, expected[i], bound[i]);
    }
  }
  return "";
}

// FP8 quant_out against the reference norm: each code must be the e4m3 of
// (some value within the norm's bound) / scale.
inline std::string check_fp8(const std::uint8_t* got, const ReferenceOutputs& ref, float scale,
                             std::uint32_t hidden) {
  for (std::size_t i = 0; i < ref.norm.size(); ++i) {
    const double lo = (ref.norm[i] - 2.0 * ref.norm_bound[i]) / scale;
    const double hi = (ref.norm[i] + 2.0 * ref.norm_bound[i]) / scale;
    if (!detail::code_in_range(got[i], lo, hi, float_to_e4m3, e4m3_to_float)) {
      return detail::describe("quant_out (fp8, dequantised)", i, hidden,
                              e4m3_to_float(got[i]) * scale, ref.norm[i], ref.norm_bound[i]);
    }
  }
  return "";
}

// NVFP4 quant_out and scale_out against the reference norm: each block's
// scale factor must follow from an amax within the bounds, and each value
// from a norm value within its bound under that scale factor.
inline std::string check_nvfp4(const std::uint8_t* quant, const std::uint8_t* scales,
                               const ReferenceCase& c, const ReferenceOutputs& ref) {
  const std::uint32_t blocks = nvfp4_blocks_per_row(c.hidden);
  const float global_scale = c.scale;
  for (std::uint32_t t = 0; t < c.tokens; ++t) {
    for (std::uint32_t b = 0; b < blocks; ++b) {
      const std::size_t first = static_cast<std::size_t>(t) * c.hidden + b * kNvfp4BlockSize;
      double amax_lo = 0.0;
      double amax_hi = 0.0;
      for (std::uint32_t k = 0; k < kNvfp4BlockSize; ++k) {
        const double magnitude = std::fabs(ref.norm[first + k]);
        const double bound = 2.0 * ref.norm_bound[first + k];
        amax_lo = std::max(amax_lo, magnitude - bound);
        amax_hi = std::max(amax_hi, magnitude + bound);
      }
      const std::uint8_t sf = scales[scale_offset(c.linear_scales, t, b, blocks)];
      if (!detail::code_in_range(sf, global_scale * amax_lo / kE2m1Max,
                                 global_scale * amax_hi / kE2m1Max, float_to_e4m3, e4m3_to_float)) {
        std::ostringstream text;
        text << "scale_out[token " << t << ", block " << b << "]: got e4m3 0x" << std::hex
             << int{sf} << std::dec << " (" << e4m3_to_float(sf) << "), block amax in [" << amax_lo
             << ", " << amax_hi << "]";
        return text.str();
      }
      const float value_scale = nvfp4_value_scale(sf, global_scale);
      for (std::uint32_t k = 0; k < kNvfp4BlockSize; ++k) {
        const std::size_t i = first + k;
        const std::uint8_t code = (quant[i / 2] >> ((i % 2) * 4)) & 0xFu;
        const double lo = (ref.norm[i] - 2.0 * ref.norm_bound[i]) * value_scale;
        const double hi = (ref.norm[i] + 2.0 * ref.norm_bound[i]) * value_scale;
        if (!detail::code_in_range(code, lo, hi, float_to_e2m1, e2m1_to_float)) {
          return detail::describe("quant_out (nvfp4, dequantised)", i, c.hidden,
                                  nvfp4_dequantize(code, sf, global_scale), ref.norm[i],
                                  ref.norm_bound[i]);
        }
      }
    }
  }
  return "";
}

}  // namespace arbiter::common
