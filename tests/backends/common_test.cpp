// The host+device math every backend shares: conversions, the Lamport
// sentinel, token slices, scale-factor layouts, the epilogue and the
// reference the backend suites compare against.
#define BOOST_TEST_MODULE backends_common
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "arbiter/common/arch_coverage.h"
#include "arbiter/common/bits.h"
#include "arbiter/common/fp8.h"
#include "arbiter/common/liveness.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/common/partition.h"
#include "arbiter/common/reference.h"
#include "arbiter/common/rmsnorm.h"
#include "arbiter/common/sentinel.h"
#include "arbiter/common/stages.h"
#include "arbiter/common/token_slice.h"

using namespace arbiter::common;

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

bool is_half_nan(std::uint16_t bits) { return (bits & 0x7C00u) == 0x7C00u && (bits & 0x03FFu); }
bool is_bf16_nan(std::uint16_t bits) { return (bits & 0x7F80u) == 0x7F80u && (bits & 0x007Fu); }

// The float exactly halfway between two adjacent 16-bit values (exact: both
// have at most 11 significant bits, a float has 24).
float midpoint(float a, float b) {
  return static_cast<float>((static_cast<double>(a) + static_cast<double>(b)) / 2.0);
}

float next_up(float v) { return std::nextafter(v, kInf); }
float next_down(float v) { return std::nextafter(v, -kInf); }

}  // namespace

BOOST_AUTO_TEST_SUITE(conversions)

BOOST_AUTO_TEST_CASE(bf16_and_fp16_known_bit_patterns) {
  BOOST_TEST(float_to_bf16_bits(1.0f) == 0x3F80u);
  BOOST_TEST(float_to_bf16_bits(-2.0f) == 0xC000u);
  BOOST_TEST(float_to_bf16_bits(kInf) == 0x7F80u);
  BOOST_TEST(float_to_half_bits(1.0f) == 0x3C00u);
  BOOST_TEST(float_to_half_bits(65504.0f) == 0x7BFFu);
  BOOST_TEST(float_to_half_bits(-65504.0f) == 0xFBFFu);
  BOOST_TEST(float_to_half_bits(65519.0f) == 0x7BFFu);  // below the midpoint
  BOOST_TEST(float_to_half_bits(65520.0f) == 0x7C00u);  // tie rounds to even: inf
  BOOST_TEST(float_to_half_bits(1e6f) == 0x7C00u);
  BOOST_TEST(float_to_half_bits(-kInf) == 0xFC00u);
  BOOST_TEST(float_to_half_bits(-0.0f) == 0x8000u);
  BOOST_TEST(float_to_half_bits(std::ldexp(1.0f, -14)) == 0x0400u);  // smallest normal
}

BOOST_AUTO_TEST_CASE(fp16_subnormals_convert_exactly_and_round_to_even) {
  BOOST_TEST(float_to_half_bits(std::ldexp(1.0f, -24)) == 0x0001u);  // smallest subnormal
  BOOST_TEST(float_to_half_bits(std::ldexp(3.0f, -24)) == 0x0003u);
  BOOST_TEST(float_to_half_bits(-std::ldexp(1.0f, -24)) == 0x8001u);
  BOOST_TEST(float_to_half_bits(std::ldexp(1.0f, -25)) == 0x0000u);     // tie -> even 0
  BOOST_TEST(float_to_half_bits(std::ldexp(1.5f, -25)) == 0x0001u);     // above the tie
  BOOST_TEST(float_to_half_bits(std::ldexp(3.0f, -25)) == 0x0002u);     // 1.5 units -> 2
  BOOST_TEST(float_to_half_bits(std::ldexp(1023.5f, -24)) == 0x0400u);  // carries to normal
  BOOST_TEST(float_to_half_bits(std::numeric_limits<float>::denorm_min()) == 0x0000u);
  BOOST_TEST(half_bits_to_float(0x0001u) == std::ldexp(1.0f, -24));
  BOOST_TEST(half_bits_to_float(0x03FFu) == std::ldexp(1023.0f, -24));
  BOOST_TEST(half_bits_to_float(0x8200u) == -std::ldexp(512.0f, -24));
}

BOOST_AUTO_TEST_CASE(every_fp16_and_bf16_pattern_round_trips_through_float) {
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    if (is_half_nan(bits)) {
      BOOST_TEST_REQUIRE(std::isnan(half_bits_to_float(bits)));
      BOOST_TEST_REQUIRE(is_half_nan(float_to_half_bits(half_bits_to_float(bits))));
    } else {
      BOOST_TEST_REQUIRE(float_to_half_bits(half_bits_to_float(bits)) == bits);
    }
    if (is_bf16_nan(bits)) {
      BOOST_TEST_REQUIRE(is_bf16_nan(float_to_bf16_bits(bf16_bits_to_float(bits))));
    } else {
      BOOST_TEST_REQUIRE(float_to_bf16_bits(bf16_bits_to_float(bits)) == bits);
    }
  }
}

BOOST_AUTO_TEST_CASE(fp16_and_bf16_round_ties_to_even_at_every_midpoint) {
  // Every pair of adjacent finite positive values, subnormals included.
  for (std::uint16_t b = 0; b < 0x7BFFu; ++b) {
    const auto next = static_cast<std::uint16_t>(b + 1);
    const float mid = midpoint(half_bits_to_float(b), half_bits_to_float(next));
    const std::uint16_t even = (b & 1u) ? next : b;
    BOOST_TEST_REQUIRE(float_to_half_bits(mid) == even);
    BOOST_TEST_REQUIRE(float_to_half_bits(next_down(mid)) == b);
    BOOST_TEST_REQUIRE(float_to_half_bits(next_up(mid)) == next);
    BOOST_TEST_REQUIRE(float_to_half_bits(-mid) == (even | 0x8000u));
  }
  for (std::uint16_t b = 0; b < 0x7F7Fu; ++b) {
    const auto next = static_cast<std::uint16_t>(b + 1);
    const float mid = midpoint(bf16_bits_to_float(b), bf16_bits_to_float(next));
    const std::uint16_t even = (b & 1u) ? next : b;
    BOOST_TEST_REQUIRE(float_to_bf16_bits(mid) == even);
    BOOST_TEST_REQUIRE(float_to_bf16_bits(next_down(mid)) == b);
    BOOST_TEST_REQUIRE(float_to_bf16_bits(next_up(mid)) == next);
  }
}

#if defined(__FLT16_MAX__)
BOOST_AUTO_TEST_CASE(fp16_conversion_matches_the_compilers_float16) {
  std::mt19937 random(7);
  for (int n = 0; n < 2000000; ++n) {
    const float value = bits_float(static_cast<std::uint32_t>(random()));
    if (std::isnan(value)) continue;
    const _Float16 reference = static_cast<_Float16>(value);
    std::uint16_t bits;
    std::memcpy(&bits, &reference, sizeof bits);
    BOOST_TEST_REQUIRE(float_to_half_bits(value) == bits, "for float bits " << float_bits(value));
  }
}
#endif

BOOST_AUTO_TEST_CASE(nan_stays_nan_and_infinity_stays_infinity) {
  BOOST_TEST(is_half_nan(float_to_half_bits(kNan)));
  BOOST_TEST(is_half_nan(float_to_half_bits(bits_float(0x7F800001u))));  // payload only in low bits
  BOOST_TEST(is_bf16_nan(float_to_bf16_bits(bits_float(0x7F800001u))));
  BOOST_TEST(is_bf16_nan(float_to_bf16_bits(-kNan)));
  BOOST_TEST(std::isinf(half_bits_to_float(0x7C00u)));
  BOOST_TEST(std::isinf(bf16_bits_to_float(0xFF80u)));
  BOOST_TEST(float_to_bf16_bits(bits_float(0x7F7FFFFFu)) == 0x7F80u);  // float max rounds up
}

BOOST_AUTO_TEST_CASE(runtime_dtype_load_and_store) {
  std::uint16_t halves[2] = {};
  store_element(halves, 1, ARBITER_DTYPE_FP16, 1.0f);
  BOOST_TEST(halves[1] == 0x3C00u);
  store_element(halves, 0, ARBITER_DTYPE_BF16, 1.0f);
  BOOST_TEST(halves[0] == 0x3F80u);
  BOOST_TEST(load_element(halves, 0, ARBITER_DTYPE_BF16) == 1.0f);
  float floats[1] = {};
  store_element(floats, 0, ARBITER_DTYPE_FP32, 0.1f);
  BOOST_TEST(load_element(floats, 0, ARBITER_DTYPE_FP32) == 0.1f);
  BOOST_TEST(round_to_dtype(0.1f, ARBITER_DTYPE_BF16) == bf16_bits_to_float(0x3DCDu));
  BOOST_TEST(dtype_size(ARBITER_DTYPE_FP32) == 4u);
  BOOST_TEST(dtype_size(ARBITER_DTYPE_BF16) == 2u);
}

BOOST_AUTO_TEST_CASE(fp8_e4m3_known_codes_saturation_and_nan) {
  BOOST_TEST(float_to_e4m3(448.0f) == 0x7Eu);
  BOOST_TEST(float_to_e4m3(500.0f) == 0x7Eu);  // saturates, never becomes NaN
  BOOST_TEST(float_to_e4m3(464.0f) == 0x7Eu);
  BOOST_TEST(float_to_e4m3(1e30f) == 0x7Eu);
  BOOST_TEST(float_to_e4m3(kInf) == 0x7Eu);
  BOOST_TEST(float_to_e4m3(-500.0f) == 0xFEu);
  BOOST_TEST(float_to_e4m3(-kInf) == 0xFEu);
  BOOST_TEST(float_to_e4m3(kNan) == 0x7Fu);
  BOOST_TEST(float_to_e4m3(1.0f) == 0x38u);
  BOOST_TEST(float_to_e4m3(-1.5f) == 0xBCu);
  BOOST_TEST(float_to_e4m3(std::ldexp(1.0f, -6)) == 0x08u);   // smallest normal
  BOOST_TEST(float_to_e4m3(std::ldexp(1.0f, -9)) == 0x01u);   // smallest subnormal
  BOOST_TEST(float_to_e4m3(std::ldexp(1.0f, -10)) == 0x00u);  // tie -> even 0
  BOOST_TEST(float_to_e4m3(std::ldexp(1.5f, -10)) == 0x01u);
  BOOST_TEST(float_to_e4m3(-0.0f) == 0x80u);
  BOOST_TEST(e4m3_to_float(0x7Eu) == 448.0f);
  BOOST_TEST(std::isnan(e4m3_to_float(0x7Fu)));
  BOOST_TEST(std::isnan(e4m3_to_float(0xFFu)));
  BOOST_TEST(e4m3_to_float(0x01u) == std::ldexp(1.0f, -9));
  BOOST_TEST(e4m3_to_float(0x07u) == std::ldexp(7.0f, -9));
}

BOOST_AUTO_TEST_CASE(fp8_e4m3_round_trips_and_rounds_ties_to_even) {
  for (std::uint32_t code = 0; code < 0x7Eu; ++code) {
    const auto b = static_cast<std::uint8_t>(code);
    const auto next = static_cast<std::uint8_t>(code + 1);
    BOOST_TEST_REQUIRE(float_to_e4m3(e4m3_to_float(b)) == b);
    BOOST_TEST_REQUIRE(float_to_e4m3(-e4m3_to_float(b)) == (b | 0x80u));
    const float mid = midpoint(e4m3_to_float(b), e4m3_to_float(next));
    BOOST_TEST_REQUIRE(float_to_e4m3(mid) == ((b & 1u) ? next : b));
    BOOST_TEST_REQUIRE(float_to_e4m3(next_down(mid)) == b);
    BOOST_TEST_REQUIRE(float_to_e4m3(next_up(mid)) == next);
  }
  BOOST_TEST(float_to_e4m3(e4m3_to_float(0x7Eu)) == 0x7Eu);
}

BOOST_AUTO_TEST_CASE(e2m1_codes_round_to_even_and_saturate_at_six) {
  const float values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (std::uint8_t code = 0; code < 8; ++code) {
    BOOST_TEST(float_to_e2m1(values[code]) == code);
    BOOST_TEST(float_to_e2m1(-values[code]) == (code | 0x8u));
    BOOST_TEST(e2m1_to_float(code) == values[code]);
    BOOST_TEST(e2m1_to_float(code | 0x8u) == -values[code]);
  }
  // Midpoints go to the even code.
  BOOST_TEST(float_to_e2m1(0.25f) == 0u);
  BOOST_TEST(float_to_e2m1(0.75f) == 2u);
  BOOST_TEST(float_to_e2m1(1.25f) == 2u);
  BOOST_TEST(float_to_e2m1(1.75f) == 4u);
  BOOST_TEST(float_to_e2m1(2.5f) == 4u);
  BOOST_TEST(float_to_e2m1(3.5f) == 6u);
  BOOST_TEST(float_to_e2m1(5.0f) == 6u);
  BOOST_TEST(float_to_e2m1(next_up(0.25f)) == 1u);
  BOOST_TEST(float_to_e2m1(next_up(5.0f)) == 7u);
  BOOST_TEST(float_to_e2m1(7.0f) == 7u);
  BOOST_TEST(float_to_e2m1(kInf) == 7u);
  BOOST_TEST(float_to_e2m1(-100.0f) == 0xFu);
  BOOST_TEST(pack_e2m1(0x1u, 0xFu) == 0xF1u);  // element 0 in the low nibble
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(lamport_sentinel)

BOOST_AUTO_TEST_CASE(sanitising_never_produces_the_sentinel_for_any_16_bit_pattern) {
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const std::uint16_t clean = sanitize_bits16(bits);
    BOOST_TEST_REQUIRE(clean != kNegativeZeroBits16);
    BOOST_TEST_REQUIRE(
        !is_negative_zero_bits(sanitize_bits(bits, ARBITER_DTYPE_BF16), ARBITER_DTYPE_BF16));
    // Only -0.0 changes, and only to +0.0 (same value): negative subnormals
    // such as 0x8001 survive, so flush-to-zero cannot forge a sentinel.
    BOOST_TEST_REQUIRE(clean == (bits == 0x8000u ? 0u : bits));
  }
}

BOOST_AUTO_TEST_CASE(sanitising_never_produces_the_sentinel_for_fp32_patterns) {
  std::vector<std::uint32_t> patterns = {0x80000000u, 0x80000001u, 0x807FFFFFu, 0x00000000u,
                                         0xFFFFFFFFu, 0x7FC00000u, 0xFF800000u};
  for (std::uint32_t low = 0; low <= 0xFFFFu; ++low) patterns.push_back(0x80000000u | low);
  std::mt19937 random(1);
  for (int n = 0; n < 1000000; ++n) patterns.push_back(static_cast<std::uint32_t>(random()));
  for (std::uint32_t bits : patterns) {
    const std::uint32_t clean = sanitize_bits32(bits);
    BOOST_TEST_REQUIRE(clean != kNegativeZeroBits32);
    BOOST_TEST_REQUIRE(clean == (bits == 0x80000000u ? 0u : bits));
  }
}

BOOST_AUTO_TEST_CASE(the_sentinel_is_negative_zero_of_each_dtype) {
  BOOST_TEST(negative_zero_bits(ARBITER_DTYPE_FP32) == 0x80000000u);
  BOOST_TEST(negative_zero_bits(ARBITER_DTYPE_FP16) == 0x8000u);
  BOOST_TEST(negative_zero_bits(ARBITER_DTYPE_BF16) == 0x8000u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(layouts)

BOOST_AUTO_TEST_CASE(two_shot_slices_cover_every_token_exactly_once) {
  for (std::uint32_t tokens = 0; tokens <= 100; ++tokens) {
    for (std::uint32_t ws = 2; ws <= 16; ++ws) {
      std::vector<int> owners(tokens, 0);
      std::uint32_t smallest = tokens;
      std::uint32_t largest = 0;
      for (std::uint32_t r = 0; r < ws; ++r) {
        const std::uint32_t begin = slice_begin(tokens, ws, r);
        const std::uint32_t end = slice_end(tokens, ws, r);
        BOOST_TEST_REQUIRE(begin <= end);
        BOOST_TEST_REQUIRE(end <= tokens);
        if (r > 0) BOOST_TEST_REQUIRE(begin == slice_end(tokens, ws, r - 1));  // contiguous
        smallest = std::min(smallest, end - begin);
        largest = std::max(largest, end - begin);
        for (std::uint32_t t = begin; t < end; ++t) {
          ++owners[t];
          BOOST_TEST_REQUIRE(slice_owner(tokens, ws, t) == r);
        }
      }
      BOOST_TEST_REQUIRE(slice_begin(tokens, ws, 0) == 0u);
      BOOST_TEST_REQUIRE(slice_end(tokens, ws, ws - 1) == tokens);
      BOOST_TEST_REQUIRE(largest - smallest <= 1u);
      for (int count : owners) BOOST_TEST_REQUIRE(count == 1);
    }
  }
}

BOOST_AUTO_TEST_CASE(lamport_stages_and_barrier_flags_rotate_through_three_values) {
  for (std::uint32_t s = 0; s < 3; ++s) {
    BOOST_TEST(next_stage(s) == (s + 1) % 3);
    BOOST_TEST(stage_to_clear(s) == (s + 2) % 3);
    // Read, next and clear are three different stages.
    BOOST_TEST(next_stage(s) != s);
    BOOST_TEST(stage_to_clear(s) != s);
    BOOST_TEST(stage_to_clear(s) != next_stage(s));
    BOOST_TEST(stage_to_clear(next_stage(s)) == s);  // the next call clears this one
    BOOST_TEST(previous_flag(next_flag(s)) == s);
    BOOST_TEST(next_flag(s) != previous_flag(s));
  }
  std::uint32_t stage = 0;
  for (int call = 0; call < 9; ++call) stage = next_stage(stage);
  BOOST_TEST(stage == 0u);
}

BOOST_AUTO_TEST_CASE(swizzled_scale_layout_is_a_bijection_onto_the_padded_buffer) {
  for (std::uint32_t rows : {1u, 7u, 127u, 128u, 129u, 300u}) {
    for (std::uint32_t cols : {1u, 3u, 4u, 5u, 64u, 180u, 448u}) {
      const std::size_t padded_rows = (rows + 127) / 128 * 128;
      const std::size_t padded_cols = (cols + 3) / 4 * 4;
      const std::size_t bytes = swizzled_128x4_bytes(rows, cols);
      BOOST_TEST_REQUIRE(bytes == padded_rows * padded_cols);
      std::vector<char> seen(bytes, 0);
      for (std::uint32_t r = 0; r < padded_rows; ++r) {
        for (std::uint32_t k = 0; k < padded_cols; ++k) {
          const std::size_t offset = swizzled_128x4_offset(r, k, cols);
          BOOST_TEST_REQUIRE(offset < bytes);
          BOOST_TEST_REQUIRE(!seen[offset]);
          seen[offset] = 1;
        }
      }
    }
  }
  // Known positions inside the first tile and in the second column tile.
  BOOST_TEST(swizzled_128x4_offset(0, 0, 8) == 0u);
  BOOST_TEST(swizzled_128x4_offset(1, 0, 8) == 16u);
  BOOST_TEST(swizzled_128x4_offset(32, 0, 8) == 4u);
  BOOST_TEST(swizzled_128x4_offset(0, 3, 8) == 3u);
  BOOST_TEST(swizzled_128x4_offset(0, 4, 8) == 512u);
  BOOST_TEST(swizzled_128x4_offset(128, 0, 8) == 1024u);
}

BOOST_AUTO_TEST_CASE(linear_scale_layout_is_row_major) {
  BOOST_TEST(linear_scale_offset(0, 0, 180) == 0u);
  BOOST_TEST(linear_scale_offset(2, 5, 180) == 365u);
  BOOST_TEST(linear_scale_bytes(3, 180) == 540u);
  BOOST_TEST(scale_offset(true, 2, 5, 180) == 365u);
  BOOST_TEST(scale_offset(false, 1, 0, 180) == 16u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(token_slices)

// Streaming a call through a workspace: consecutive slices that cover every
// token once, each advanced by the slice's own length.
BOOST_AUTO_TEST_CASE(slices_cover_a_call_of_two_to_the_32_minus_one_tokens_and_end) {
  // bf16, hidden 1, 1 MiB slots: 2^19 tokens a slice. Stepping by 2^19
  // instead went from token 2^32 - 2^19 to 2^32, which wraps to 0, and the
  // call started over, forever.
  arbiter_allreduce_args call{};
  call.dtype = ARBITER_DTYPE_BF16;
  call.hidden = 1;
  call.tokens = std::numeric_limits<std::uint32_t>::max();
  call.input = reinterpret_cast<const void*>(std::uintptr_t{1} << 40);
  const std::uint64_t per_slice = std::uint64_t{1} << 19;
  std::uint64_t slices = 0, covered = 0;
  bool in_order = true;
  const bool finished =
      arbiter::common::for_each_token_slice(call, per_slice, [&](const arbiter_allreduce_args& s) {
        // Each slice starts where the previous one ended (2 bytes a token).
        in_order = in_order && static_cast<const std::byte*>(s.input) ==
                                   static_cast<const std::byte*>(call.input) + 2 * covered;
        covered += s.tokens;
        ++slices;
        return slices <= 8192;  // a wrapped loop is stopped here, not left to spin
      });
  BOOST_TEST(finished);
  BOOST_TEST(slices == 8192u);
  BOOST_TEST(covered == call.tokens);
  BOOST_TEST(in_order);
}

BOOST_AUTO_TEST_CASE(slices_stop_at_the_first_that_fails) {
  arbiter_allreduce_args call{};
  call.dtype = ARBITER_DTYPE_FP32;
  call.hidden = 4;
  call.tokens = 10;
  std::vector<std::uint32_t> lengths;
  const bool finished =
      arbiter::common::for_each_token_slice(call, 3, [&](const arbiter_allreduce_args& s) {
        lengths.push_back(s.tokens);
        return lengths.size() < 2;
      });
  BOOST_TEST(!finished);
  BOOST_TEST(lengths == (std::vector<std::uint32_t>{3, 3}));
  lengths.clear();
  BOOST_TEST(arbiter::common::for_each_token_slice(call, 3, [&](const arbiter_allreduce_args& s) {
    lengths.push_back(s.tokens);
    return true;
  }));
  BOOST_TEST(lengths == (std::vector<std::uint32_t>{3, 3, 3, 1}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(epilogue)

namespace {

// One token, fp32, by hand: x = [1, 2, 3, 4], mean(x^2) = 7.5.
struct HandCase {
  float sums[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  float residual[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float gamma[4];
  float residual_out[4] = {};
  float norm_out[4] = {};
  float allreduce_out[4] = {};
  arbiter_allreduce_args args{};

  HandCase(float gamma_value, float weight_bias) {
    for (float& g : gamma) g = gamma_value;
    args.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
    args.dtype = ARBITER_DTYPE_FP32;
    args.tokens = 1;
    args.hidden = 4;
    args.residual_in = residual;
    args.residual_out = residual_out;
    args.allreduce_out = allreduce_out;
    args.gamma = gamma;
    args.eps = 0.0f;
    args.weight_bias = weight_bias;
    args.norm_out = norm_out;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(rmsnorm_matches_a_hand_computed_token) {
  HandCase c(2.0f, 0.0f);
  float row[4];
  std::copy(c.sums, c.sums + 4, row);
  apply_epilogue_token(c.args, 0, row);
  const double inv_rms = 1.0 / std::sqrt(7.5);
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(c.allreduce_out[i] == c.sums[i]);
    BOOST_TEST(c.residual_out[i] == c.sums[i]);
    BOOST_TEST(c.norm_out[i] == (i + 1) * inv_rms * 2.0, boost::test_tools::tolerance(1e-6));
  }
}

BOOST_AUTO_TEST_CASE(gemma_norm_multiplies_by_one_plus_gamma) {
  // weight_bias = 1 with gamma 0.5 scales by 1.5; gamma 0 is the plain norm.
  HandCase gemma(0.5f, 1.0f);
  float row[4];
  std::copy(gemma.sums, gemma.sums + 4, row);
  apply_epilogue_token(gemma.args, 0, row);
  HandCase zero(0.0f, 1.0f);
  float plain_row[4];
  std::copy(zero.sums, zero.sums + 4, plain_row);
  apply_epilogue_token(zero.args, 0, plain_row);
  const double inv_rms = 1.0 / std::sqrt(7.5);
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(gemma.norm_out[i] == (i + 1) * inv_rms * 1.5, boost::test_tools::tolerance(1e-6));
    BOOST_TEST(zero.norm_out[i] == (i + 1) * inv_rms, boost::test_tools::tolerance(1e-6));
  }
}

BOOST_AUTO_TEST_CASE(residual_is_added_before_the_norm_and_eps_is_inside_the_root) {
  HandCase c(1.0f, 0.0f);
  for (float& r : c.residual) r = 1.0f;  // x = [2, 3, 4, 5], mean(x^2) = 13.5
  c.args.eps = 0.5f;
  float row[4];
  std::copy(c.sums, c.sums + 4, row);
  apply_epilogue_token(c.args, 0, row);
  const double inv_rms = 1.0 / std::sqrt(13.5 + 0.5);
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(c.allreduce_out[i] == c.sums[i]);  // the sum before the residual
    BOOST_TEST(c.residual_out[i] == c.sums[i] + 1.0f);
    BOOST_TEST(c.norm_out[i] == (i + 2) * inv_rms, boost::test_tools::tolerance(1e-6));
  }
}

namespace {

// A bf16 token set with all outputs, run through apply_epilogue_token and
// checked against the fp64 reference.
struct RandomCase {
  std::uint32_t tokens;
  std::uint32_t hidden;
  arbiter_dtype dtype;
  std::vector<std::vector<std::uint16_t>> inputs;  // 16-bit dtypes only
  std::vector<std::uint16_t> residual, gamma, sum_out, residual_out, norm_out;
  std::vector<std::uint8_t> quant, scales;
  ReferenceCase ref;

  RandomCase(std::uint32_t t, std::uint32_t h, arbiter_dtype d, arbiter_pattern pattern, int ranks,
             float weight_bias, float scale, bool linear)
      : tokens(t), hidden(h), dtype(d) {
    std::mt19937 random(t * 131 + h);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const std::size_t count = static_cast<std::size_t>(t) * h;
    auto fill = [&](std::vector<std::uint16_t>& v, std::size_t n, float offset) {
      v.resize(n);
      for (auto& e : v)
        e = static_cast<std::uint16_t>(float_to_dtype_bits(offset + uniform(random), d));
    };
    inputs.resize(ranks);
    for (auto& input : inputs) fill(input, count, 0.0f);
    fill(residual, count, 0.0f);
    fill(gamma, h, weight_bias == 0.0f ? 1.0f : 0.0f);
    sum_out.resize(count);
    residual_out.resize(count);
    norm_out.resize(count);
    quant.resize(pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4 ? count / 2 : count);
    scales.resize(swizzled_128x4_bytes(t, nvfp4_blocks_per_row(h)));
    ref.pattern = pattern;
    ref.dtype = d;
    ref.tokens = t;
    ref.hidden = h;
    for (auto& input : inputs) ref.inputs.push_back(input.data());
    ref.residual_in = residual.data();
    ref.gamma = gamma.data();
    ref.eps = 1e-6f;
    ref.weight_bias = weight_bias;
    ref.scale = scale;
    ref.linear_scales = linear;
  }

  arbiter_allreduce_args args() {
    arbiter_allreduce_args a{};
    a.pattern = ref.pattern;
    a.dtype = dtype;
    a.tokens = tokens;
    a.hidden = hidden;
    a.flags = ref.linear_scales ? ARBITER_RUN_NVFP4_LINEAR_SCALES : 0u;
    a.allreduce_out = sum_out.data();
    a.residual_in = residual.data();
    a.residual_out = residual_out.data();
    a.gamma = gamma.data();
    a.eps = ref.eps;
    a.weight_bias = ref.weight_bias;
    a.norm_out = norm_out.data();
    a.quant_out = quant.data();
    a.scale_out = scales.data();
    a.scale = &ref.scale;
    return a;
  }

  // The sums in fixed rank order in fp32, as every backend computes them.
  void run() {
    const arbiter_allreduce_args a = args();
    std::vector<float> row(hidden);
    for (std::uint32_t t = 0; t < tokens; ++t) {
      for (std::uint32_t i = 0; i < hidden; ++i) {
        float sum = 0.0f;
        for (auto& input : inputs) sum += load_element(input.data(), t * hidden + i, dtype);
        row[i] = sum;
      }
      apply_epilogue_token(a, t, row.data());
    }
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(hidden_2880_bf16_epilogue_matches_the_reference) {
  RandomCase c(5, 2880, ARBITER_DTYPE_BF16, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, 8, 0.0f, 0.02f,
               false);
  c.run();
  const ReferenceOutputs ref = compute_reference(c.ref);
  BOOST_TEST(check_output(c.sum_out.data(), c.dtype, ref.sum, ref.sum_bound, c.hidden,
                          "allreduce_out") == "");
  BOOST_TEST(check_output(c.residual_out.data(), c.dtype, ref.residual, ref.residual_bound,
                          c.hidden, "residual_out") == "");
  BOOST_TEST(check_output(c.norm_out.data(), c.dtype, ref.norm, ref.norm_bound, c.hidden,
                          "norm_out") == "");
  BOOST_TEST(check_fp8(c.quant.data(), ref, c.ref.scale, c.hidden) == "");
}

BOOST_AUTO_TEST_CASE(fp16_gemma_epilogue_matches_the_reference) {
  RandomCase c(3, 1024, ARBITER_DTYPE_FP16, ARBITER_PATTERN_RESIDUAL_RMSNORM, 4, 1.0f, 1.0f, false);
  c.run();
  const ReferenceOutputs ref = compute_reference(c.ref);
  BOOST_TEST(check_output(c.norm_out.data(), c.dtype, ref.norm, ref.norm_bound, c.hidden,
                          "norm_out") == "");
}

BOOST_AUTO_TEST_CASE(nvfp4_epilogue_matches_the_reference_in_both_scale_layouts) {
  for (bool linear : {false, true}) {
    RandomCase c(3, 2880, ARBITER_DTYPE_BF16, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, 2, 0.0f,
                 448.0f * 6.0f / 4.0f, linear);
    c.run();
    const ReferenceOutputs ref = compute_reference(c.ref);
    BOOST_TEST(check_nvfp4(c.quant.data(), c.scales.data(), c.ref, ref) == "");
    // Dequantised values track the norm within e2m1 precision.
    const std::uint32_t blocks = nvfp4_blocks_per_row(c.hidden);
    for (std::uint32_t i = 0; i < c.hidden; ++i) {
      const std::uint8_t sf = c.scales[scale_offset(linear, 1, i / 16, blocks)];
      const std::size_t e = c.hidden + i;
      const std::uint8_t code = (c.quant[e / 2] >> ((e % 2) * 4)) & 0xFu;
      const double value = nvfp4_dequantize(code, sf, c.ref.scale);
      BOOST_TEST_REQUIRE(std::fabs(value - ref.norm[e]) <= 0.3 * std::fabs(ref.norm[e]) + 0.2);
    }
  }
}

BOOST_AUTO_TEST_CASE(reference_checks_catch_a_wrong_output) {
  RandomCase c(2, 64, ARBITER_DTYPE_BF16, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, 2, 0.0f, 0.02f,
               false);
  c.run();
  const ReferenceOutputs ref = compute_reference(c.ref);
  c.norm_out[70] = float_to_bf16_bits(bf16_bits_to_float(c.norm_out[70]) * 1.1f + 0.05f);
  const std::string norm =
      check_output(c.norm_out.data(), c.dtype, ref.norm, ref.norm_bound, c.hidden, "norm_out");
  BOOST_TEST(norm.find("norm_out[token 1, element 6]") != std::string::npos, norm);
  c.quant[5] = float_to_e4m3(e4m3_to_float(c.quant[5]) * 2.0f + 1.0f);
  BOOST_TEST(check_fp8(c.quant.data(), ref, c.ref.scale, c.hidden) != "");
  // Forgetting the Gemma bias is caught too.
  RandomCase gemma(2, 64, ARBITER_DTYPE_BF16, ARBITER_PATTERN_RESIDUAL_RMSNORM, 2, 1.0f, 1.0f,
                   false);
  gemma.ref.weight_bias = 0.0f;  // the implementation runs without it
  gemma.run();
  gemma.ref.weight_bias = 1.0f;
  const ReferenceOutputs gemma_ref = compute_reference(gemma.ref);
  BOOST_TEST(check_output(gemma.norm_out.data(), gemma.dtype, gemma_ref.norm, gemma_ref.norm_bound,
                          gemma.hidden, "norm_out") != "");
}

BOOST_AUTO_TEST_SUITE_END()

// NVFP4 needs capability 100 and a kernel built from 100 on: PTX for
// compute_90 JIT-compiled on a B200 has the epilogue that traps, so a build
// for 90a alone must not offer NVFP4 there (trtllm, mnnvl and nccl ask this).
BOOST_AUTO_TEST_CASE(nvfp4_is_offered_only_by_builds_with_an_architecture_from_100_on) {
  using arbiter::common::nvfp4_kernel_built_for;
  BOOST_TEST(!nvfp4_kernel_built_for(90, "90a,100a,103a"));
  BOOST_TEST(nvfp4_kernel_built_for(100, "90a,100a,103a"));
  BOOST_TEST(nvfp4_kernel_built_for(103, "90a,100a,103a"));
  BOOST_TEST(!nvfp4_kernel_built_for(100, "90a"));
  BOOST_TEST(!nvfp4_kernel_built_for(100, "90"));  // compute_90 PTX, JIT on a B200
  BOOST_TEST(nvfp4_kernel_built_for(103, "90,100f"));
  BOOST_TEST(nvfp4_kernel_built_for(120, "100-virtual"));
  BOOST_TEST(nvfp4_kernel_built_for(100, ""));  // unknown list: every capability
  BOOST_TEST(!nvfp4_kernel_built_for(90, ""));
}

// Liveness watches every peer, however many: a rank whose process exits is
// named, also past the 64 pidfds it polls at a time (there were 64 slots,
// and more peers overflowed them).
BOOST_AUTO_TEST_CASE(liveness_names_a_peer_that_exits_among_more_than_64) {
  int hold[2];
  BOOST_REQUIRE(pipe(hold) == 0);
  const pid_t peer = fork();
  if (peer == 0) {  // lives until the pipe closes
    close(hold[1]);
    char c;
    while (read(hold[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  BOOST_REQUIRE(peer > 0);
  close(hold[0]);
  constexpr int kRanks = 100;
  std::vector<std::int32_t> pids(kRanks, static_cast<std::int32_t>(getpid()));
  pids[97] = peer;
  const std::vector<std::uint64_t> namespaces(kRanks,
                                              arbiter::common::Liveness::own_pid_namespace());
  const arbiter::common::Liveness liveness(0, pids, namespaces);
  BOOST_TEST(liveness.watched() == std::size_t{kRanks - 1});
  BOOST_TEST(liveness.first_dead() == -1);
  close(hold[1]);
  BOOST_REQUIRE(waitpid(peer, nullptr, 0) == peer);
  BOOST_TEST(liveness.first_dead() == 97);
}
