// The shm backend's per-token arithmetic, in four versions that give the
// same bits: AVX-512 with BF16, AVX-512 (F, BW, VL, DQ) and AVX2 + F16C,
// written with intrinsics over 16 lanes (token_kernels_vector.h), and the
// scalar reference (token_kernels_scalar.cpp), which runs anywhere. The widest the
// CPU has is chosen when a workspace is created; ARBITER_SHM_ISA may ask for
// a narrower one (tests compare them; a user can rule out a suspect one).
// The module is built without FP contraction, and the epilogue's sum of
// squares has a fixed order (arbiter/common/rmsnorm.h, kEpilogueLanes).
#pragma once

#include <cstddef>
#include <cstdint>

#include "arbiter_backend.h"
#include "status.h"

namespace arbiter::shm {

struct TokenKernels {
  const char* name;  // "avx512bf16", "avx512", "avx2" or "scalar"

  // For tokens [first, first + count): sums row t of every rank (rows[q] + t
  // x row bytes, q in rank order, from +0.0) and applies the epilogue of
  // `args` to it. `row` (hidden floats) is scratch.
  void (*reduce_tokens)(const arbiter_allreduce_args& args, const std::byte* const* rows,
                        std::int32_t ranks, std::size_t first, std::size_t count, float* row);

  // For tokens [first, first + count): the epilogue of `args` on the sums
  // already stored (as args.dtype) in `sums`, token t at t x hidden elements.
  void (*epilogue_tokens)(const arbiter_allreduce_args& args, const void* sums, std::size_t first,
                          std::size_t count, float* row);

  // out[i] = +0.0 + sum over q of inputs[q][i] in rank order, stored as
  // `dtype` (NaN canonical, as the epilogue stores it), for i in [begin, end).
  void (*sum_elements)(arbiter_dtype dtype, const std::byte* const* inputs, std::int32_t ranks,
                       std::size_t begin, std::size_t end, void* out);
};

// The kernels `request` names: "auto" or empty (the widest this CPU runs),
// "avx512bf16", "avx512", "avx2" or "scalar". An unknown name, or a level this CPU lacks,
// is an error that says what it has.
Status choose_token_kernels(const char* request, const TokenKernels** out);

// The versions (token_kernels_*.cpp); a vector one is NULL where this build
// has none (not x86-64, or a compiler without the intrinsics).
extern const TokenKernels kScalarKernels;
const TokenKernels* avx512bf16_kernels();
const TokenKernels* avx512_kernels();
const TokenKernels* avx2_kernels();

}  // namespace arbiter::shm
