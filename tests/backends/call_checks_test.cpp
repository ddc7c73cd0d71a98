// The checks every backend runs on a call before it touches memory: the
// call's kind, NVFP4's requirements, required pointers and alignment
// (arbiter/common/call_checks.h), the aliasing contract (aliasing.h) and the
// scalars of the norm patterns (check_call_values). The module guards run
// them in this order; each module's host test checks that they do.
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

// The common checks in the order a module's guards run them.
Status guards(const arbiter_allreduce_args& a, std::uint32_t capability) {
  if (Status s = check_call_kind(a); !s.ok()) return s;
  if (Status s = check_nvfp4(a, capability); !s.ok()) return s;
  return check_call_buffers(a);
}

arbiter_allreduce_args valid_args(std::uint32_t tokens, std::uint32_t hidden, arbiter_dtype dtype) {
  return arbiter::test::valid_guard_args(tokens, hidden, dtype);
}

void check_refused(const Status& s, arbiter_status code, const std::string& words) {
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.code() == code);
  BOOST_TEST(s.message().find(words) != std::string::npos,
             "message \"" << s.message() << "\" lacks \"" << words << "\"");
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

BOOST_AUTO_TEST_CASE(unknown_patterns_and_the_native_algorithm_are_refused) {
  arbiter_allreduce_args a = valid_args(16, 1024, ARBITER_DTYPE_BF16);
  a.algorithm = ARBITER_ALGORITHM_NATIVE;
  check_refused(guards(a, 100), ARBITER_UNSUPPORTED,
                "algorithm 2 is not supported (one-shot or two-shot)");
  a.algorithm = ARBITER_ALGORITHM_ONESHOT;
  a.pattern = static_cast<arbiter_pattern>(4);
  check_refused(guards(a, 100), ARBITER_UNSUPPORTED, "pattern 4 is not supported");
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  a.dtype = static_cast<arbiter_dtype>(9);
  check_refused(guards(a, 100), ARBITER_UNSUPPORTED, "dtype 9 is not fp16, bf16 or fp32");
}

BOOST_AUTO_TEST_CASE(nvfp4_needs_capability_100_hidden_a_multiple_of_16_and_16_bit_input) {
  arbiter_allreduce_args a = valid_args(16, 4096, ARBITER_DTYPE_BF16);
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  check_refused(guards(a, 90), ARBITER_UNSUPPORTED,
                "NVFP4 needs capability >= 100 (this device is 90)");
  check_ok(guards(a, 100));
  check_ok(guards(a, 103));
  a.hidden = 2888;  // 2888 % 16 == 8
  check_refused(guards(a, 103), ARBITER_UNSUPPORTED,
                "NVFP4 needs hidden % 16 == 0 (hidden is 2888)");
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  check_ok(guards(a, 103));
  arbiter_allreduce_args b = valid_args(16, 4096, ARBITER_DTYPE_FP32);
  b.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  check_refused(guards(b, 103), ARBITER_UNSUPPORTED, "NVFP4 needs fp16 or bf16 input");
}

BOOST_AUTO_TEST_CASE(required_pointers_are_checked_per_pattern) {
  // Null each required pointer of each pattern in turn.
  auto refuse = [&](arbiter_pattern pattern, auto setter, const std::string& words) {
    arbiter_allreduce_args a = valid_args(16, 1024, ARBITER_DTYPE_BF16);
    a.pattern = pattern;
    check_ok(guards(a, 100));
    setter(a);
    check_refused(guards(a, 100), words);
  };
  for (const arbiter_pattern p :
       {ARBITER_PATTERN_ALLREDUCE, ARBITER_PATTERN_RESIDUAL_RMSNORM,
        ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4}) {
    refuse(
        p, [](arbiter_allreduce_args& a) { a.input = nullptr; }, "input is NULL");
  }
  refuse(
      ARBITER_PATTERN_ALLREDUCE, [](arbiter_allreduce_args& a) { a.allreduce_out = nullptr; },
      "allreduce_out is NULL");
  for (const arbiter_pattern p :
       {ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8,
        ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4}) {
    refuse(
        p, [](arbiter_allreduce_args& a) { a.gamma = nullptr; }, "gamma is NULL");
    // residual_in is optional (the first block's norm has none): the module's
    // caps flag, not the common guard, decides whether it may be NULL.
    arbiter_allreduce_args first_block = valid_args(16, 1024, ARBITER_DTYPE_BF16);
    first_block.pattern = p;
    first_block.residual_in = nullptr;
    check_ok(guards(first_block, 100));
  }
  refuse(
      ARBITER_PATTERN_RESIDUAL_RMSNORM, [](arbiter_allreduce_args& a) { a.norm_out = nullptr; },
      "norm_out is NULL");
  for (const arbiter_pattern p :
       {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4}) {
    refuse(
        p, [](arbiter_allreduce_args& a) { a.quant_out = nullptr; }, "quant_out is NULL");
    refuse(
        p, [](arbiter_allreduce_args& a) { a.scale = nullptr; }, "scale is NULL");
  }
  refuse(
      ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4,
      [](arbiter_allreduce_args& a) { a.scale_out = nullptr; }, "scale_out is NULL");
  // Optional outputs may be NULL; pattern allreduce needs no norm buffers.
  arbiter_allreduce_args a = valid_args(16, 1024, ARBITER_DTYPE_BF16);
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  a.allreduce_out = nullptr;
  a.residual_out = nullptr;
  a.norm_out = nullptr;
  check_ok(guards(a, 100));
  a.pattern = ARBITER_PATTERN_ALLREDUCE;
  a.allreduce_out = guard_buffer(1);
  a.residual_in = nullptr;
  a.gamma = nullptr;
  a.quant_out = nullptr;
  a.scale = nullptr;
  a.scale_out = nullptr;
  check_ok(guards(a, 100));
}

BOOST_AUTO_TEST_CASE(vector_buffers_must_be_16_byte_aligned) {
  void* arbiter_allreduce_args::*const outputs[] = {&arbiter_allreduce_args::allreduce_out,
                                                    &arbiter_allreduce_args::residual_out,
                                                    &arbiter_allreduce_args::norm_out};
  const char* const output_names[] = {"allreduce_out", "residual_out", "norm_out"};
  for (int k = 0; k < 3; ++k) {
    arbiter_allreduce_args a = valid_args(16, 1024, ARBITER_DTYPE_BF16);
    a.*outputs[k] = static_cast<char*>(a.*outputs[k]) + 8;
    check_refused(guards(a, 100), std::string(output_names[k]) + " is not 16-byte aligned");
  }
  const void* arbiter_allreduce_args::*const inputs[] = {&arbiter_allreduce_args::input,
                                                         &arbiter_allreduce_args::residual_in,
                                                         &arbiter_allreduce_args::gamma};
  const char* const input_names[] = {"input", "residual_in", "gamma"};
  for (int k = 0; k < 3; ++k) {
    arbiter_allreduce_args a = valid_args(16, 1024, ARBITER_DTYPE_BF16);
    a.*inputs[k] = static_cast<const char*>(a.*inputs[k]) + 8;
    check_refused(guards(a, 100), std::string(input_names[k]) + " is not 16-byte aligned");
  }
}

BOOST_AUTO_TEST_CASE(quant_out_alignment_follows_what_a_thread_stores) {
  // FP8: one byte per element of a 16-byte vector (8 for bf16, 4 for fp32);
  // NVFP4: half a byte per element (4).
  arbiter_allreduce_args a = valid_args(16, 1024, ARBITER_DTYPE_BF16);
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  a.quant_out = guard_buffer(6) + 8;
  check_ok(guards(a, 100));
  a.quant_out = guard_buffer(6) + 4;
  check_refused(guards(a, 100), "quant_out is not 8-byte aligned");
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  check_ok(guards(a, 100));
  a.quant_out = guard_buffer(6) + 2;
  check_refused(guards(a, 100), "quant_out is not 4-byte aligned");
  // Patterns that do not quantise ignore quant_out.
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  check_ok(guards(a, 100));

  arbiter_allreduce_args b = valid_args(16, 1024, ARBITER_DTYPE_FP32);
  b.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  b.quant_out = guard_buffer(6) + 4;
  check_ok(guards(b, 100));
  b.quant_out = guard_buffer(6) + 2;
  check_refused(guards(b, 100), "quant_out is not 4-byte aligned");
}

BOOST_AUTO_TEST_CASE(the_guards_run_the_aliasing_and_value_checks) {
  check_ok(guards(arbiter::test::in_place_guard_args(16, 1024), 100));
  for (const arbiter::test::RefusedCall& c : arbiter::test::call_check_breaches(16, 1024)) {
    check_refused(guards(c.args, c.capability), c.code, c.words);
  }
}
