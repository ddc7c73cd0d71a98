// The shm backend's per-token arithmetic, compiled for several x86-64 levels
// (AVX-512, AVX2, baseline) and chosen at load time from CPUID; the module
// still runs on any x86-64 and on other architectures (one plain build).
// Every version gives the same bits: the module is built without FP
// contraction, and the epilogue's sum of squares has a fixed order
// (arbiter/common/rmsnorm.h, kEpilogueLanes).
#pragma once

#include <cstddef>
#include <cstdint>

#include "arbiter_backend.h"

namespace arbiter::shm {

// For tokens [first, first + count): sums row t of every rank (rows[q] + t *
// row_bytes, q in rank order, from +0.0) into `row` (hidden floats) and
// applies the epilogue of `args` to it.
void reduce_tokens(const arbiter_allreduce_args& args, const std::byte* const* rows,
                   std::int32_t ranks, std::size_t first, std::size_t count, float* row);

// For tokens [first, first + count): the epilogue of `args` on the sums
// already stored (as args.dtype) in `sums`, token t at t x hidden elements.
void epilogue_tokens(const arbiter_allreduce_args& args, const void* sums, std::size_t first,
                     std::size_t count, float* row);

// out[i] = +0.0 + sum over q of inputs[q][i] in rank order, stored as
// `dtype` (NaN canonical, as the epilogue stores it), for i in [begin, end).
void sum_elements(arbiter_dtype dtype, const std::byte* const* inputs, std::int32_t ranks,
                  std::size_t begin, std::size_t end, void* out);

}  // namespace arbiter::shm
