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
//                              load_f32, store_f32, load<D>, spill<D>
//                              (a block as load<D> lays it out, stored in
//                              element order), round<D>, store_rounded<D>
//                              (stores the dtype's bits of a value),
//                              round_and_store<D> (stores, returns
//                              round), kCanonicalNan (whether those make
//                              every NaN canonical; if not, any_nan(F) and
//                              the kernels mend the words, NanWatch below)
//                              and, optionally, the bf16 pair operations
//                              of Bf16PairLanes (below)
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
// Two ranks, the common case: both rows in registers and no rank loop (the
// same sum, (+0.0 + first) + second). One token of 1024 bf16 on AVX2: 3-4%
// faster; end to end, 2 ranks, 4 KiB to 1 MiB: 3-4%.
struct TwoRankRows {
  const std::byte* first;
  const std::byte* second;
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
ARBITER_SHM_VECTOR_INLINE Lanes::F block_sum(const TwoRankRows& source, std::size_t index) {
  const Lanes::F first =
      Lanes::load<kDtype>(reinterpret_cast<const Bits<kDtype>*>(source.first) + index);
  const Lanes::F second =
      Lanes::load<kDtype>(reinterpret_cast<const Bits<kDtype>*>(source.second) + index);
  return Lanes::add(Lanes::add(Lanes::zero(), first), second);
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
ARBITER_SHM_VECTOR_INLINE float element_sum(const TwoRankRows& source, std::size_t index) {
  const float first = common::dtype_bits_to_float(
      reinterpret_cast<const Bits<kDtype>*>(source.first)[index], kDtype);
  const float second = common::dtype_bits_to_float(
      reinterpret_cast<const Bits<kDtype>*>(source.second)[index], kDtype);
  return 0.0f + first + second;
}

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_INLINE float element_sum(const StoredSums& source, std::size_t index) {
  return common::dtype_bits_to_float(static_cast<const Bits<kDtype>*>(source.sums)[index], kDtype);
}

// Where Lanes::kCanonicalNan is false, round and store keep a NaN a NaN but
// not the canonical one. The kernels then add up, lane by lane, the values
// they store; a NaN among them stays in the sum (so does an infinity minus
// an infinity: a needless mend, no harm). Where the sum has a NaN they make
// the NaN words they stored canonical, a scalar pass over the token's
// outputs; without a NaN the watch costs one add per block.
template <class L>
struct NanWatch {
  typename L::F sum;

  ARBITER_SHM_VECTOR_INLINE void see(typename L::F value) {
    if constexpr (!L::kCanonicalNan) sum = L::add(sum, value);
  }
  ARBITER_SHM_VECTOR_INLINE bool seen() const {
    if constexpr (!L::kCanonicalNan) return L::any_nan(sum);
    return false;
  }
};

// The NaN words of out[0, count) made the canonical NaN; out may be null.
template <arbiter_dtype kDtype>
inline void mend_nans(Bits<kDtype>* out, std::size_t count) {
  if (out == nullptr) return;
  for (std::size_t i = 0; i < count; ++i) {
    out[i] = static_cast<Bits<kDtype>>(
        common::to_storage_bits<kDtype>(common::dtype_bits_to_float(out[i], kDtype)));
  }
}

// A Lanes type that also takes bf16 32 at a time (token_lanes_avx512.h):
// load_pair, round_two, unpack, block, store_pair, store_words. The epilogue
// then runs bf16 rows 32 elements at a step, with the same arithmetic in the
// same order, and blocks of 16 after that.
template <class L>
concept Bf16PairLanes = requires(typename L::F f, typename L::Packed packed) {
  L::load_pair(nullptr);
  L::round_two(f, f);
  L::unpack(packed);
  L::block(packed, 0);
  L::store_pair(nullptr, packed);
  L::store_words(nullptr, packed);
};

template <class L>
ARBITER_SHM_VECTOR_INLINE typename L::Pair pair_sum(const RankRows& source, std::size_t index) {
  const auto* first = reinterpret_cast<const std::uint16_t*>(source.rows[0]) + index;
  const typename L::Pair p0 = L::load_pair(first);
  typename L::Pair sum{L::add(L::zero(), p0.even), L::add(L::zero(), p0.odd)};
  for (std::int32_t q = 1; q < source.ranks; ++q) {
    const typename L::Pair p =
        L::load_pair(reinterpret_cast<const std::uint16_t*>(source.rows[q]) + index);
    sum = {L::add(sum.even, p.even), L::add(sum.odd, p.odd)};
  }
  return sum;
}

template <class L>
ARBITER_SHM_VECTOR_INLINE typename L::Pair pair_sum(const TwoRankRows& source, std::size_t index) {
  const typename L::Pair first =
      L::load_pair(reinterpret_cast<const std::uint16_t*>(source.first) + index);
  const typename L::Pair second =
      L::load_pair(reinterpret_cast<const std::uint16_t*>(source.second) + index);
  return {L::add(L::add(L::zero(), first.even), second.even),
          L::add(L::add(L::zero(), first.odd), second.odd)};
}

template <class L>
ARBITER_SHM_VECTOR_INLINE typename L::Pair pair_sum(const StoredSums& source, std::size_t index) {
  return L::load_pair(static_cast<const std::uint16_t*>(source.sums) + index);
}

// For i in [begin, begin + 32 n), n the most that fit before `end`: the
// rounded sum of element base + i of `source`, stored at out + i. Returns
// begin + 32 n.
template <class L, class Source>
ARBITER_SHM_VECTOR_INLINE std::size_t sum_pairs(const Source& source, std::size_t base,
                                                std::size_t begin, std::size_t end,
                                                std::uint16_t* out) {
  std::size_t i = begin;
  for (; i + 2 * kBlock <= end; i += 2 * kBlock) {
    const typename L::Pair sum = pair_sum<L>(source, base + i);
    L::store_pair(out + i, L::round_two(sum.even, sum.odd));
  }
  return i;
}

// Pass 1 of the epilogue (below) on bf16 elements [0, 32 n) of a token, n
// the most that fit in `whole`, 32 at a step; returns 32 n. x goes to `row`
// unless `row` is NULL (pass 2 then reads it back from residual_out).
template <class L, class Source>
ARBITER_SHM_VECTOR_INLINE std::uint32_t residual_pairs(
    const Source& source, std::size_t base, std::uint32_t whole, const std::uint16_t* residual_in,
    std::uint16_t* allreduce_out, std::uint16_t* residual_out, float* row, typename L::F& squares) {
  std::uint32_t i = 0;
  for (; i + 2 * kBlock <= whole; i += 2 * kBlock) {
    const typename L::Pair residual = L::load_pair(residual_in + i);
    const typename L::Pair unrounded_sum = pair_sum<L>(source, base + i);
    const typename L::Packed sum = L::round_two(unrounded_sum.even, unrounded_sum.odd);
    if (allreduce_out != nullptr) L::store_pair(allreduce_out + i, sum);
    const typename L::Pair rounded_sum = L::unpack(sum);
    const typename L::Packed x = L::round_two(L::add(rounded_sum.even, residual.even),
                                              L::add(rounded_sum.odd, residual.odd));
    if (residual_out != nullptr) L::store_pair(residual_out + i, x);
    const typename L::F low = L::block(x, 0);
    const typename L::F high = L::block(x, 1);
    if (row != nullptr) {
      L::store_f32(row + i, low);
      L::store_f32(row + i + kBlock, high);
    }
    squares = L::add(squares, L::mul(low, low));
    squares = L::add(squares, L::mul(high, high));
  }
  return i;
}

// Pass 2 (no FP8) on bf16 elements [0, 32 n), likewise; returns 32 n.
template <class L>
ARBITER_SHM_VECTOR_INLINE std::uint32_t norm_pairs(std::uint32_t whole, const float* row,
                                                   const std::uint16_t* gamma, typename L::F inv,
                                                   typename L::F bias, std::uint16_t* norm_out) {
  std::uint32_t i = 0;
  for (; i + 2 * kBlock <= whole; i += 2 * kBlock) {
    const typename L::F low = L::mul(L::mul(L::load_f32(row + i), inv),
                                     L::add(L::template load<ARBITER_DTYPE_BF16>(gamma + i), bias));
    const typename L::F high =
        L::mul(L::mul(L::load_f32(row + i + kBlock), inv),
               L::add(L::template load<ARBITER_DTYPE_BF16>(gamma + i + kBlock), bias));
    L::store_words(norm_out + i, L::round_two(low, high));
  }
  return i;
}

// Pass 2 likewise, x read back from the bf16 words pass 1 stored in
// residual_out: the same values as `row` holds, from a third of the bytes.
// Works on even and odd elements, which the arithmetic (per element) allows.
template <class L>
ARBITER_SHM_VECTOR_INLINE std::uint32_t norm_pairs_from_words(std::uint32_t whole,
                                                              const std::uint16_t* x,
                                                              const std::uint16_t* gamma,
                                                              typename L::F inv, typename L::F bias,
                                                              std::uint16_t* norm_out) {
  std::uint32_t i = 0;
  for (; i + 2 * kBlock <= whole; i += 2 * kBlock) {
    const typename L::Pair value = L::load_pair(x + i);
    const typename L::Pair weight = L::load_pair(gamma + i);
    const typename L::F even = L::mul(L::mul(value.even, inv), L::add(weight.even, bias));
    const typename L::F odd = L::mul(L::mul(value.odd, inv), L::add(weight.odd, bias));
    L::store_pair(norm_out + i, L::round_two(even, odd));
  }
  return i;
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
    std::uint32_t i = 0;
    if constexpr (kDtype == ARBITER_DTYPE_BF16 && Bf16PairLanes<Lanes>) {
      i = static_cast<std::uint32_t>(sum_pairs<Lanes>(source, base, 0, whole, allreduce_out));
    }
    NanWatch<Lanes> watch{Lanes::zero()};
    for (; i < whole; i += kBlock) {
      const F sum = block_sum<kDtype>(source, base + i);
      watch.see(sum);
      Lanes::store_rounded<kDtype>(allreduce_out + i, sum);
    }
    if (watch.seen()) mend_nans<kDtype>(allreduce_out, whole);
    for (i = whole; i < hidden; ++i) {
      allreduce_out[i] =
          static_cast<B>(common::to_storage_bits<kDtype>(element_sum<kDtype>(source, base + i)));
    }
    return;
  }

  // NULL residual_in: no residual (a first block), x is the rounded sum.
  const B* const residual_in =
      args.residual_in ? static_cast<const B*>(args.residual_in) + base : nullptr;
  B* const residual_out = args.residual_out ? static_cast<B*>(args.residual_out) + base : nullptr;
  B* const norm_out = args.norm_out ? static_cast<B*>(args.norm_out) + base : nullptr;
  const B* const gamma = static_cast<const B*>(args.gamma);

  // Pass 1: sum, residual, sum of squares; x kept in `row` (bf16 pairs:
  // in residual_out only, when pass 2 reads it back from there).
  const bool quantize = args.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  const bool x_in_words = !quantize && residual_out != nullptr && norm_out != nullptr;
  F squares = Lanes::zero();
  std::uint32_t i = 0;
  if (residual_in == nullptr) {
    // No residual: x is the rounded sum, stored once per output asked for.
    for (; i < whole; i += kBlock) {
      const F unrounded_sum = block_sum<kDtype>(source, base + i);
      const F x = allreduce_out != nullptr
                      ? Lanes::round_and_store<kDtype>(allreduce_out + i, unrounded_sum)
                      : Lanes::round<kDtype>(unrounded_sum);
      if (residual_out != nullptr) Lanes::store_rounded<kDtype>(residual_out + i, x);
      Lanes::store_f32(row + i, x);
      squares = Lanes::add(squares, Lanes::mul(x, x));
    }
  } else {
    if constexpr (kDtype == ARBITER_DTYPE_BF16 && Bf16PairLanes<Lanes>) {
      i = residual_pairs<Lanes>(source, base, whole, residual_in, allreduce_out, residual_out,
                                x_in_words ? nullptr : row, squares);
    }
    for (; i < whole; i += kBlock) {
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
  }
  float partial[kBlock];
  Lanes::spill<kDtype>(squares, partial);
  for (i = whole; i < hidden; ++i) {
    const float sum = common::rounded_to<kDtype>(element_sum<kDtype>(source, base + i));
    // The residual is read before any output is written: allreduce_out may
    // be residual_in itself (an in-place call the ABI allows).
    const float x =
        residual_in == nullptr
            ? sum
            : common::rounded_to<kDtype>(sum + common::dtype_bits_to_float(residual_in[i], kDtype));
    if (allreduce_out != nullptr) {
      allreduce_out[i] = static_cast<B>(common::to_storage_bits<kDtype>(sum));
    }
    if (residual_out != nullptr)
      residual_out[i] = static_cast<B>(common::to_storage_bits<kDtype>(x));
    row[i] = x;
    partial[i - whole] += x * x;
  }
  float sum_of_squares = 0.0f;
  for (std::uint32_t k = 0; k < kBlock; ++k) sum_of_squares += partial[k];
  const float inv_rms = common::inverse_rms(sum_of_squares, hidden, args.eps);

  // Pass 2: the norm; y kept in `row` when FP8 needs it.
  const F inv = Lanes::splat(inv_rms);
  const F bias = Lanes::splat(args.weight_bias);
  // A NaN sum or x makes y NaN, and y can be NaN without one (an infinite x
  // times 1 / rms = 0): watching y watches every output.
  NanWatch<Lanes> watch{Lanes::zero()};
  i = 0;
  if constexpr (kDtype == ARBITER_DTYPE_BF16 && Bf16PairLanes<Lanes>) {
    if (residual_in != nullptr && x_in_words) {
      i = norm_pairs_from_words<Lanes>(whole, residual_out, gamma, inv, bias, norm_out);
    } else if (!quantize && norm_out != nullptr) {
      i = norm_pairs<Lanes>(whole, row, gamma, inv, bias, norm_out);
    }
  }
  for (; i < whole; i += kBlock) {
    const F weight = Lanes::add(Lanes::load<kDtype>(gamma + i), bias);
    const F unrounded = Lanes::mul(Lanes::mul(Lanes::load_f32(row + i), inv), weight);
    watch.see(unrounded);
    if (quantize) {
      const F y = norm_out != nullptr ? Lanes::round_and_store<kDtype>(norm_out + i, unrounded)
                                      : Lanes::round<kDtype>(unrounded);
      Lanes::spill<kDtype>(y, row + i);  // read in element order below
    } else if (norm_out != nullptr) {
      Lanes::store_rounded<kDtype>(norm_out + i, unrounded);
    }
  }
  for (i = whole; i < hidden; ++i) {
    const float weight = common::dtype_bits_to_float(gamma[i], kDtype) + args.weight_bias;
    const float y = common::rounded_to<kDtype>(row[i] * inv_rms * weight);
    if (norm_out != nullptr) norm_out[i] = static_cast<B>(common::to_storage_bits<kDtype>(y));
    row[i] = y;
  }
  if (quantize) {  // any NaN y quantises to the one NaN pattern
    auto* quant = static_cast<std::uint8_t*>(args.quant_out) + base;
    const float scale = *args.scale;
    for (std::uint32_t i = 0; i < hidden; ++i) quant[i] = common::fp8_quantize(row[i], scale);
  }
  if (watch.seen()) {
    mend_nans<kDtype>(allreduce_out, whole);
    mend_nans<kDtype>(residual_out, whole);
    mend_nans<kDtype>(norm_out, whole);
  }
}

template <arbiter_dtype kDtype, class Source>
ARBITER_SHM_VECTOR_TARGET void epilogue_from(const arbiter_allreduce_args& args,
                                             const Source& source, std::size_t first,
                                             std::size_t count, float* row) {
  for (std::size_t t = first; t < first + count; ++t) token_epilogue<kDtype>(args, source, t, row);
}

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_TARGET void reduce_tokens_as(const arbiter_allreduce_args& args,
                                                const std::byte* const* rows, std::int32_t ranks,
                                                std::size_t first, std::size_t count, float* row) {
  if (ranks == 2) {
    epilogue_from<kDtype>(args, TwoRankRows{rows[0], rows[1]}, first, count, row);
  } else {
    epilogue_from<kDtype>(args, RankRows{rows, ranks}, first, count, row);
  }
}

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_TARGET void epilogue_tokens_as(const arbiter_allreduce_args& args,
                                                  const void* sums, std::size_t first,
                                                  std::size_t count, float* row) {
  epilogue_from<kDtype>(args, StoredSums{sums}, first, count, row);
}

template <arbiter_dtype kDtype, class Source>
ARBITER_SHM_VECTOR_TARGET void sum_elements_from(const Source& source, std::size_t begin,
                                                 std::size_t end, void* out) {
  auto* stored = static_cast<Bits<kDtype>*>(out);
  std::size_t i = begin;
  if constexpr (kDtype == ARBITER_DTYPE_BF16 && Bf16PairLanes<Lanes>) {
    i = sum_pairs<Lanes>(source, 0, begin, end, stored);
  }
  NanWatch<Lanes> watch{Lanes::zero()};
  for (; i + kBlock <= end; i += kBlock) {
    const Lanes::F sum = block_sum<kDtype>(source, i);
    watch.see(sum);
    Lanes::store_rounded<kDtype>(stored + i, sum);
  }
  if (watch.seen()) mend_nans<kDtype>(stored + begin, i - begin);
  for (; i < end; ++i) {
    stored[i] =
        static_cast<Bits<kDtype>>(common::to_storage_bits<kDtype>(element_sum<kDtype>(source, i)));
  }
}

template <arbiter_dtype kDtype>
ARBITER_SHM_VECTOR_TARGET void sum_elements_as(const std::byte* const* inputs, std::int32_t ranks,
                                               std::size_t begin, std::size_t end, void* out) {
  if (ranks == 2) {
    sum_elements_from<kDtype>(TwoRankRows{inputs[0], inputs[1]}, begin, end, out);
  } else {
    sum_elements_from<kDtype>(RankRows{inputs, ranks}, begin, end, out);
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
