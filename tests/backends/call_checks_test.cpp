// The checks every backend runs on a call before it touches memory: the
// aliasing contract (arbiter/common/aliasing.h) and the scalars of the norm
// patterns (check_call_values in arbiter/common/call_checks.h).
#define BOOST_TEST_MODULE backends_call_checks
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include "arbiter/common/aliasing.h"
#include "arbiter/common/call_checks.h"
#include "guard_args.h"

using namespace arbiter::common;
using arbiter::test::guard_buffer;

namespace {

constexpr std::uint32_t kTokens = 16;
constexpr std::uint32_t kHidden = 1024;
constexpr std::uint64_t kBytes = std::uint64_t{kTokens} * kHidden * 2;  // bf16

arbiter_allreduce_args call(arbiter_pattern pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM) {
  arbiter_allreduce_args a = arbiter::test::valid_guard_args(kTokens, kHidden, ARBITER_DTYPE_BF16);
  a.pattern = pattern;
  return a;
}

void check_refused(const Status& s, const std::string& words) {
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.code() == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(s.message().find(words) != std::string::npos,
             "message \"" << s.message() << "\" lacks \"" << words << "\"");
}

void check_ok(const Status& s) { BOOST_TEST(s.ok(), s.message()); }

}  // namespace

BOOST_AUTO_TEST_CASE(separate_buffers_pass) {
  for (const arbiter_pattern p :
       {ARBITER_PATTERN_ALLREDUCE, ARBITER_PATTERN_RESIDUAL_RMSNORM,
        ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4}) {
    check_ok(check_aliasing(call(p)));
  }
}

BOOST_AUTO_TEST_CASE(each_value_output_may_be_input_or_residual_in_itself) {
  void* arbiter_allreduce_args::*const outputs[] = {&arbiter_allreduce_args::allreduce_out,
                                                    &arbiter_allreduce_args::residual_out,
                                                    &arbiter_allreduce_args::norm_out};
  for (auto output : outputs) {
    for (const void* source : {call().input, call().residual_in}) {
      arbiter_allreduce_args a = call();
      a.*output = const_cast<void*>(source);
      check_ok(check_aliasing(a));
    }
  }
  // vLLM's in-place fused call: norm_out = input, residual_out = residual_in.
  arbiter_allreduce_args a = call();
  a.allreduce_out = nullptr;
  a.norm_out = const_cast<void*>(a.input);
  a.residual_out = const_cast<void*>(a.residual_in);
  check_ok(check_aliasing(a));
  // In-place all-reduce.
  a = call(ARBITER_PATTERN_ALLREDUCE);
  a.allreduce_out = const_cast<void*>(a.input);
  check_ok(check_aliasing(a));
}

BOOST_AUTO_TEST_CASE(a_partial_overlap_with_an_input_is_refused) {
  arbiter_allreduce_args a = call();
  a.norm_out = guard_buffer(0) + 16;
  check_refused(check_aliasing(a), "norm_out overlaps input");
  check_refused(check_aliasing(a), "not part of it");
  a = call();
  a.residual_out = guard_buffer(2) - 16;  // ends 16 bytes into residual_in
  check_refused(check_aliasing(a), "residual_out overlaps residual_in");
}

BOOST_AUTO_TEST_CASE(two_outputs_sharing_memory_are_refused) {
  arbiter_allreduce_args a = call();
  a.allreduce_out = a.norm_out;
  check_refused(check_aliasing(a), "outputs must not share memory");
  // Both in place on the same input: still two outputs on one buffer.
  a = call();
  a.allreduce_out = const_cast<void*>(a.input);
  a.norm_out = const_cast<void*>(a.input);
  check_refused(check_aliasing(a), "outputs must not share memory");
  a = call(ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4);
  a.scale_out = static_cast<char*>(a.quant_out) + kTokens * kHidden / 2 - 1;
  check_refused(check_aliasing(a), "scale_out overlaps quant_out");
}

BOOST_AUTO_TEST_CASE(an_output_over_gamma_or_scale_is_refused) {
  arbiter_allreduce_args a = call();
  a.norm_out = const_cast<void*>(a.gamma);
  check_refused(check_aliasing(a), "norm_out overlaps gamma: an output must not overlap gamma");
  a = call(ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8);
  a.scale = reinterpret_cast<const float*>(static_cast<char*>(a.residual_out) + kBytes - 4);
  check_refused(check_aliasing(a), "residual_out overlaps scale");
}

BOOST_AUTO_TEST_CASE(quantised_outputs_may_not_overlap_anything) {
  arbiter_allreduce_args a = call(ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8);
  a.quant_out = const_cast<void*>(a.input);
  check_refused(check_aliasing(a), "quant_out overlaps input: quant_out must not overlap");
  a = call(ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4);
  a.scale_out = const_cast<void*>(a.residual_in);
  check_refused(check_aliasing(a), "scale_out overlaps residual_in");
}

BOOST_AUTO_TEST_CASE(buffers_that_touch_without_overlapping_pass) {
  arbiter_allreduce_args a = call();
  a.norm_out = guard_buffer(0) + kBytes;      // starts where input ends
  a.residual_out = guard_buffer(2) - kBytes;  // ends where residual_in starts
  check_ok(check_aliasing(a));
  // FP8 quant_out holds one byte per element.
  a = call(ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8);
  a.quant_out = guard_buffer(0) + kBytes;
  a.input = static_cast<char*>(a.quant_out) - kBytes;
  check_ok(check_aliasing(a));
  a.quant_out = static_cast<char*>(a.quant_out) - 1;
  check_refused(check_aliasing(a), "quant_out overlaps input");
}

BOOST_AUTO_TEST_CASE(buffers_the_pattern_does_not_use_are_ignored) {
  arbiter_allreduce_args a = call(ARBITER_PATTERN_ALLREDUCE);
  a.residual_out = a.allreduce_out;  // pattern allreduce writes only allreduce_out
  a.norm_out = a.allreduce_out;
  a.quant_out = a.allreduce_out;
  check_ok(check_aliasing(a));
  a = call(ARBITER_PATTERN_RESIDUAL_RMSNORM);
  a.quant_out = a.norm_out;  // no quantised output in this pattern
  a.scale_out = a.norm_out;
  check_ok(check_aliasing(a));
}

BOOST_AUTO_TEST_CASE(inputs_may_overlap_each_other) {
  arbiter_allreduce_args a = call();
  a.residual_in = a.input;
  a.gamma = a.input;
  check_ok(check_aliasing(a));
}

BOOST_AUTO_TEST_CASE(sizes_near_the_end_of_the_address_space_do_not_wrap) {
  arbiter_allreduce_args a = call();
  a.tokens = std::numeric_limits<std::uint32_t>::max();
  a.hidden = std::numeric_limits<std::uint32_t>::max();
  // Every extent saturates; buffers 16 TiB apart then overlap: refused, not wrapped.
  check_refused(check_aliasing(a), "overlaps");
  a = call();
  a.norm_out = reinterpret_cast<void*>(std::numeric_limits<std::uintptr_t>::max() - 15);
  check_ok(check_aliasing(a));
}

BOOST_AUTO_TEST_CASE(eps_and_weight_bias_must_be_finite_and_eps_not_negative) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const float eps : {nan, inf, -inf, -1e-6f}) {
    arbiter_allreduce_args a = call();
    a.eps = eps;
    check_refused(check_call_values(a), "it must be finite and >= 0");
  }
  for (const float bias : {nan, inf, -inf}) {
    arbiter_allreduce_args a = call();
    a.weight_bias = bias;
    check_refused(check_call_values(a), "weight_bias is");
  }
  arbiter_allreduce_args a = call();
  a.eps = 0.0f;
  a.weight_bias = -1.0f;
  check_ok(check_call_values(a));
  // Pattern allreduce reads neither.
  a = call(ARBITER_PATTERN_ALLREDUCE);
  a.eps = nan;
  a.weight_bias = inf;
  check_ok(check_call_values(a));
}

BOOST_AUTO_TEST_CASE(a_misaligned_scale_is_refused) {
  for (const arbiter_pattern p :
       {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4}) {
    arbiter_allreduce_args a = call(p);
    a.scale = reinterpret_cast<const float*>(guard_buffer(8) + 2);
    check_refused(check_call_values(a), "scale is not aligned to a float");
    a.scale = reinterpret_cast<const float*>(guard_buffer(8) + 4);
    check_ok(check_call_values(a));
  }
}
