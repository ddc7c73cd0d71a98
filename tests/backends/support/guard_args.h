// Calls for the host-side guards of the fused GPU modules (trtllm, mnnvl):
// a valid one, with buffers at addresses that are never dereferenced,
// 16-byte aligned and 16 TiB apart, so that no two overlap for any size a
// test asks for (the aliasing contract, arbiter/common/aliasing.h, is part
// of the guards); vLLM's in-place call; and one call per rule of the
// aliasing contract and the scalar checks, which every module must refuse.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "arbiter_backend.h"

namespace arbiter::test {

// Buffer `index` (0..8) of a guard test; never dereferenced.
inline char* guard_buffer(int index) {
  return reinterpret_cast<char*>(std::uintptr_t{static_cast<unsigned>(index) + 1} << 44);
}

// A residual_rmsnorm call with every buffer of every pattern set apart.
inline arbiter_allreduce_args valid_guard_args(
    std::uint32_t tokens, std::uint32_t hidden, arbiter_dtype dtype,
    arbiter_algorithm algorithm = ARBITER_ALGORITHM_ONESHOT) {
  arbiter_allreduce_args a{};
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  a.dtype = dtype;
  a.algorithm = algorithm;
  a.tokens = tokens;
  a.hidden = hidden;
  a.input = guard_buffer(0);
  a.allreduce_out = guard_buffer(1);
  a.residual_in = guard_buffer(2);
  a.residual_out = guard_buffer(3);
  a.gamma = guard_buffer(4);
  a.norm_out = guard_buffer(5);
  a.quant_out = guard_buffer(6);
  a.scale_out = guard_buffer(7);
  a.scale = reinterpret_cast<const float*>(guard_buffer(8));
  a.eps = 1e-6f;
  return a;
}

// vLLM's in-place bf16 call: norm_out = input, residual_out = residual_in.
inline arbiter_allreduce_args in_place_guard_args(std::uint32_t tokens, std::uint32_t hidden) {
  arbiter_allreduce_args a = valid_guard_args(tokens, hidden, ARBITER_DTYPE_BF16);
  a.allreduce_out = nullptr;
  a.norm_out = const_cast<void*>(a.input);
  a.residual_out = const_cast<void*>(a.residual_in);
  return a;
}

// A call a module must refuse, on a device of `capability`, with `code` and
// `words` in the message.
struct RefusedCall {
  arbiter_allreduce_args args;
  std::string words;
  arbiter_status code = ARBITER_INVALID_ARGUMENT;
  std::uint32_t capability = 100;
};

// One bf16 call per rule of the common call checks (call_checks.h,
// aliasing.h) that every fused module runs.
inline std::vector<RefusedCall> call_check_breaches(std::uint32_t tokens, std::uint32_t hidden) {
  std::vector<RefusedCall> calls;
  auto add = [&](auto change, const char* words, arbiter_status code = ARBITER_INVALID_ARGUMENT,
                 std::uint32_t capability = 100) {
    arbiter_allreduce_args a = valid_guard_args(tokens, hidden, ARBITER_DTYPE_BF16);
    change(a);
    calls.push_back({a, words, code, capability});
  };
  add([](arbiter_allreduce_args& a) { a.pattern = static_cast<arbiter_pattern>(4); },
      "pattern 4 is not supported", ARBITER_UNSUPPORTED);
  add([](arbiter_allreduce_args& a) { a.algorithm = ARBITER_ALGORITHM_NATIVE; },
      "algorithm 2 is not supported (one-shot or two-shot)", ARBITER_UNSUPPORTED);
  add([](arbiter_allreduce_args& a) { a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4; },
      "NVFP4 needs capability >= 100 (this device is 90)", ARBITER_UNSUPPORTED, 90);
  add([](arbiter_allreduce_args& a) { a.input = nullptr; }, "input is NULL");
  add([](arbiter_allreduce_args& a) { a.gamma = nullptr; }, "gamma is NULL");
  add([](arbiter_allreduce_args& a) { a.residual_in = guard_buffer(2) + 8; },
      "residual_in is not 16-byte aligned");
  add(
      [](arbiter_allreduce_args& a) {
        a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
        a.quant_out = guard_buffer(6) + 4;
      },
      "quant_out is not 8-byte aligned");
  add([](arbiter_allreduce_args& a) { a.norm_out = guard_buffer(0) + 16; },
      "norm_out overlaps input");
  add([](arbiter_allreduce_args& a) { a.residual_out = a.allreduce_out; },
      "outputs must not share memory");
  add([](arbiter_allreduce_args& a) { a.norm_out = const_cast<void*>(a.gamma); },
      "norm_out overlaps gamma");
  add(
      [](arbiter_allreduce_args& a) {
        a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
        a.quant_out = const_cast<void*>(a.residual_in);
      },
      "quant_out overlaps residual_in");
  add([](arbiter_allreduce_args& a) { a.eps = std::numeric_limits<float>::quiet_NaN(); },
      "must be finite and >= 0");
  add([](arbiter_allreduce_args& a) { a.eps = -1e-6f; }, "must be finite and >= 0");
  add([](arbiter_allreduce_args& a) { a.weight_bias = std::numeric_limits<float>::infinity(); },
      "weight_bias is inf");
  add(
      [](arbiter_allreduce_args& a) {
        a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
        a.scale = reinterpret_cast<const float*>(guard_buffer(8) + 1);
      },
      "scale is not aligned");
  return calls;
}

}  // namespace arbiter::test
