// The per-token kernels of token_kernels.h, written once over a 16-lane
// vector type and compiled by one translation unit per x86-64 level
// (token_kernels_avx512bf16.cpp, token_kernels_avx512.cpp,
// token_kernels_avx2.cpp).
//
// The arithmetic is the scalar reference's (arbiter/common/rmsnorm.h), step
// for step, so both give the same bits:
//   - sums from +0.0 in rank order, each value rounded to the dtype where the
//     reference rounds it, every NaN made the canonical quiet NaN;
//   - the sum of squares in 16 lanes (kEpilogueLanes): lane k adds element
//     k, k + 16, ... in order, then the lanes are added in order;
//   - x * inv_rms * (gamma + weight_bias) in that order, no FMA contraction
//     (the module is built with -ffp-contract=off);
//   - each block loads its residual before storing any output of it, as the
//     reference does per element (in-place calls, aliasing.h).
// A hidden size that is not a multiple of 16 ends with the reference's
// scalar code for the tail. FP8 quantisation runs the reference's scalar
// conversion on the normalised row.
//
// The including file defines, before including this header:
//   ARBITER_SHM_VECTOR_TARGET  the target attribute of its level
//   ARBITER_SHM_VECTOR_ISA     the namespace to put these kernels in
//   Lanes                      (in that namespace) the vector type F of 16
//                              floats, with static zero, splat, add, mul,
//                              load_f32, store_f32, spill, load<D>,
//                              round<D>, store<D> (of a rounded value),
//                              store_rounded<D> (of any value),
//                              round_and_store<D> (stores, returns round)
// and gets, in that namespace, the three entry points of TokenKernels. No
// include guard: each including file includes it once, in its own
// namespace, compiled for its own level.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "arbiter/common/host_device.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/rmsnorm.h"
#include "arbiter_backend.h"
#include "token_kernels.h"

// A helper of one level, inlined into that level's kernels.
#define ARBITER_SHM_VECTOR_INLINE ARBITER_SHM_VECTOR_TARGET ARBITER_HOST_INLINE inline

namespace arbiter::shm::ARBITER_SHM_VECTOR_ISA {

template <arbiter_dtype kDtype>
using Bits = std::conditional_t<kDtype == ARBITER_DTYPE_FP32, std::uint32_t, std::uint16_t>;

inline constexpr std::uint32_t kBlock = common::kEpilogueLanes;
static_assert(kBlock == 16, "Lanes holds 16 floats");

// Where a token's unrounded fp32 sums come from: every rank's row (one-shot:
// +0.0 plus each rank in order) or one stored row of sums (two-shot, native:
// loaded as stored, as epilogue_tokens() in the reference).
struct RankRows {
  const std::byte* const* rows;
  std::int32_t ranks;
};
struct StoredSums {
  const void* sums;
};

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_INLINE Lanes::F block_sum(const RankRows& source, std::size_t index) {
  Lanes::F sum = Lanes::add(
      Lanes::zero(),
      Lanes::load<kDtype>(reinterpret_cast<const Bits<kDtype>*>(source.rows[0]) + index));
  for (std::int32_t q = 1; q < source.ranks; ++q) {
    sum = Lanes::add(
        sum, Lanes::load<kDtype>(reinterpret_cast<const Bits<kDtype>*>(source.rows[q]) + index));
  }
  return sum;
}

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_INLINE Lanes::F block_sum(const StoredSums& source, std::size_t index) {
  return Lanes::load<kDtype>(static_cast<const Bits<kDtype>*>(source.sums) + index);
}

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_INLINE float element_sum(const RankRows& source, std::size_t index) {
  float sum = 0.0f;
  for (std::int32_t q = 0; q < source.ranks; ++q) {
    sum += common::dtype_bits_to_float(reinterpret_cast<const Bits<kDtype>*>(source.rows[q])[index],
                                       kDtype);
  }
  return sum;
}

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_INLINE float element_sum(const StoredSums& source, std::size_t index) {
  return common::dtype_bits_to_float(static_cast<const Bits<kDtype>*>(source.sums)[index], kDtype);
}

// The epilogue of `args` for token `token`, its sums read from `source`.
// `row` (hidden floats) is scratch.
template <arbiter_dtype kDtype, class Source>
ARBITER_SHM_VECTOR_TARGET void token_epilogue(const arbiter_allreduce_args& args,
                                              const Source& source, std::size_t token, float* row) {
  using B = Bits<kDtype>;
  using F = Lanes::F;
  const std::uint32_t hidden = args.hidden;
  const std::uint32_t whole = hidden - hidden % kBlock;
  const std::size_t base = token * hidden;
  B* const allreduce_out =
      args.allreduce_out ? static_cast<B*>(args.allreduce_out) + base : nullptr;

  if (!common::pattern_has_norm(args.pattern)) {
    if (allreduce_out == nullptr) return;
    for (std::uint32_t i = 0; i < whole; i += kBlock) {
      Lanes::store_rounded<kDtype>(allreduce_out + i, block_sum<kDtype>(source, base + i));
    }
    for (std::uint32_t i = whole; i < hidden; ++i) {
      allreduce_out[i] =
          static_cast<B>(common::to_storage_bits<kDtype>(element_sum<kDtype>(source, base + i)));
    }
    return;
  }

  const B* const residual_in = static_cast<const B*>(args.residual_in) + base;
  B* const residual_out = args.residual_out ? static_cast<B*>(args.residual_out) + base : nullptr;
  B* const norm_out = args.norm_out ? static_cast<B*>(args.norm_out) + base : nullptr;
  const B* const gamma = static_cast<const B*>(args.gamma);

  // Pass 1: sum, residual, sum of squares; x kept in `row`.
  F squares = Lanes::zero();
  for (std::uint32_t i = 0; i < whole; i += kBlock) {
    const F residual = Lanes::load<kDtype>(residual_in + i);
    const F unrounded_sum = block_sum<kDtype>(source, base + i);
    const F sum = allreduce_out != nullptr
                      ? Lanes::round_and_store<kDtype>(allreduce_out + i, unrounded_sum)
                      : Lanes::round<kDtype>(unrounded_sum);
    const F unrounded_x = Lanes::add(sum, residual);
    const F x = residual_out != nullptr
                    ? Lanes::round_and_store<kDtype>(residual_out + i, unrounded_x)
                    : Lanes::round<kDtype>(unrounded_x);
    Lanes::store_f32(row + i, x);
    squares = Lanes::add(squares, Lanes::mul(x, x));
  }
  float partial[kBlock];
  Lanes::spill(squares, partial);
  for (std::uint32_t i = whole; i < hidden; ++i) {
    const float residual = common::dtype_bits_to_float(residual_in[i], kDtype);
    const float sum = common::rounded_to<kDtype>(element_sum<kDtype>(source, base + i));
    if (allreduce_out != nullptr) {
      allreduce_out[i] = static_cast<B>(common::to_storage_bits<kDtype>(sum));
    }
    const float x = common::rounded_to<kDtype>(sum + residual);
    if (residual_out != nullptr)
      residual_out[i] = static_cast<B>(common::to_storage_bits<kDtype>(x));
    row[i] = x;
    partial[i - whole] += x * x;
  }
  float sum_of_squares = 0.0f;
  for (std::uint32_t k = 0; k < kBlock; ++k) sum_of_squares += partial[k];
  const float inv_rms = common::inverse_rms(sum_of_squares, hidden, args.eps);

  // Pass 2: the norm; y kept in `row` when FP8 needs it.
  const bool quantize = args.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  const F inv = Lanes::splat(inv_rms);
  const F bias = Lanes::splat(args.weight_bias);
  for (std::uint32_t i = 0; i < whole; i += kBlock) {
    const F weight = Lanes::add(Lanes::load<kDtype>(gamma + i), bias);
    const F unrounded = Lanes::mul(Lanes::mul(Lanes::load_f32(row + i), inv), weight);
    if (quantize) {
      const F y = norm_out != nullptr ? Lanes::round_and_store<kDtype>(norm_out + i, unrounded)
                                      : Lanes::round<kDtype>(unrounded);
      Lanes::store_f32(row + i, y);
    } else if (norm_out != nullptr) {
      Lanes::store_rounded<kDtype>(norm_out + i, unrounded);
    }
  }
  for (std::uint32_t i = whole; i < hidden; ++i) {
    const float weight = common::dtype_bits_to_float(gamma[i], kDtype) + args.weight_bias;
    const float y = common::rounded_to<kDtype>(row[i] * inv_rms * weight);
    if (norm_out != nullptr) norm_out[i] = static_cast<B>(common::to_storage_bits<kDtype>(y));
    row[i] = y;
  }
  if (quantize) {
    auto* quant = static_cast<std::uint8_t*>(args.quant_out) + base;
    const float scale = *args.scale;
    for (std::uint32_t i = 0; i < hidden; ++i) quant[i] = common::fp8_quantize(row[i], scale);
  }
}

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_TARGET void reduce_tokens_as(const arbiter_allreduce_args& args,
                                                const std::byte* const* rows, std::int32_t ranks,
                                                std::size_t first, std::size_t count, float* row) {
  const RankRows source{rows, ranks};
  for (std::size_t t = first; t < first + count; ++t) token_epilogue<kDtype>(args, source, t, row);
}

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_TARGET void epilogue_tokens_as(const arbiter_allreduce_args& args,
                                                  const void* sums, std::size_t first,
                                                  std::size_t count, float* row) {
  const StoredSums source{sums};
  for (std::size_t t = first; t < first + count; ++t) token_epilogue<kDtype>(args, source, t, row);
}

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_TARGET void sum_elements_as(const std::byte* const* inputs, std::int32_t ranks,
                                               std::size_t begin, std::size_t end, void* out) {
  const RankRows source{inputs, ranks};
  auto* stored = static_cast<Bits<kDtype>*>(out);
  std::size_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    Lanes::store_rounded<kDtype>(stored + i, block_sum<kDtype>(source, i));
  }
  for (; i < end; ++i) {
    stored[i] =
        static_cast<Bits<kDtype>>(common::to_storage_bits<kDtype>(element_sum<kDtype>(source, i)));
  }
}

// The entry points. NVFP4 (which shm refuses) goes to the scalar reference.
ARBITER_SHM_VECTOR_TARGET void reduce_tokens(const arbiter_allreduce_args& args,
                                             const std::byte* const* rows, std::int32_t ranks,
                                             std::size_t first, std::size_t count, float* row) {
  if (args.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    return kScalarKernels.reduce_tokens(args, rows, ranks, first, count, row);
  }
  common::with_dtype(args.dtype, [&](auto d) {
    reduce_tokens_as<decltype(d)::value>(args, rows, ranks, first, count, row);
  });
}

ARBITER_SHM_VECTOR_TARGET void epilogue_tokens(const arbiter_allreduce_args& args, const void* sums,
                                               std::size_t first, std::size_t count, float* row) {
  if (args.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    return kScalarKernels.epilogue_tokens(args, sums, first, count, row);
  }
  common::with_dtype(args.dtype, [&](auto d) {
    epilogue_tokens_as<decltype(d)::value>(args, sums, first, count, row);
  });
}

ARBITER_SHM_VECTOR_TARGET void sum_elements(arbiter_dtype dtype, const std::byte* const* inputs,
                                            std::int32_t ranks, std::size_t begin, std::size_t end,
                                            void* out) {
  common::with_dtype(
      dtype, [&](auto d) { sum_elements_as<decltype(d)::value>(inputs, ranks, begin, end, out); });
}

}  // namespace arbiter::shm::ARBITER_SHM_VECTOR_ISA

#undef ARBITER_SHM_VECTOR_INLINE
