// The scalar reference of the shm backend's per-token arithmetic
// (token_kernels.h): plain loops over the per-element code of
// arbiter/common/rmsnorm.h, built for the baseline of the target. The vector
// versions must give its bits.
#include <type_traits>

#include "arbiter/common/numeric.h"
#include "arbiter/common/rmsnorm.h"
#include "token_kernels.h"

namespace arbiter::shm {

namespace {

template <arbiter_dtype kDtype>
using Bits = std::conditional_t<kDtype == ARBITER_DTYPE_FP32, std::uint32_t, std::uint16_t>;

template <arbiter_dtype kDtype>
ARBITER_HOST_INLINE inline void start_row(float* __restrict row,
                                          const Bits<kDtype>* __restrict values,
                                          std::uint32_t hidden) {
  for (std::uint32_t i = 0; i < hidden; ++i) {
    row[i] = 0.0f + common::dtype_bits_to_float(values[i], kDtype);
  }
}

template <arbiter_dtype kDtype>
ARBITER_HOST_INLINE inline void add_row(float* __restrict row,
                                        const Bits<kDtype>* __restrict values,
                                        std::uint32_t hidden) {
  for (std::uint32_t i = 0; i < hidden; ++i) {
    row[i] += common::dtype_bits_to_float(values[i], kDtype);
  }
}

template <arbiter_dtype kDtype>
ARBITER_HOST_INLINE inline void load_row(float* __restrict row,
                                         const Bits<kDtype>* __restrict values,
                                         std::uint32_t hidden) {
  for (std::uint32_t i = 0; i < hidden; ++i)
    row[i] = common::dtype_bits_to_float(values[i], kDtype);
}

template <arbiter_dtype kDtype>
ARBITER_HOST_INLINE inline void sum_elements_as(const std::byte* const* inputs, std::int32_t ranks,
                                                std::size_t begin, std::size_t end, void* out) {
  // Blocks of a row's length keep the partial sums in cache.
  constexpr std::size_t kBlock = 1024;
  float row[kBlock];
  for (std::size_t first = begin; first < end; first += kBlock) {
    const std::size_t n = end - first < kBlock ? end - first : kBlock;
    start_row<kDtype>(row, reinterpret_cast<const Bits<kDtype>*>(inputs[0]) + first,
                      static_cast<std::uint32_t>(n));
    for (std::int32_t q = 1; q < ranks; ++q) {
      add_row<kDtype>(row, reinterpret_cast<const Bits<kDtype>*>(inputs[q]) + first,
                      static_cast<std::uint32_t>(n));
    }
    Bits<kDtype>* stored = static_cast<Bits<kDtype>*>(out) + first;
    for (std::size_t i = 0; i < n; ++i) {
      stored[i] = static_cast<Bits<kDtype>>(common::to_storage_bits<kDtype>(row[i]));
    }
  }
}

template <arbiter_dtype kDtype>
ARBITER_HOST_INLINE inline void reduce_tokens_as(const arbiter_allreduce_args& args,
                                                 const std::byte* const* rows, std::int32_t ranks,
                                                 std::size_t first, std::size_t count, float* row) {
  const std::uint32_t hidden = args.hidden;
  for (std::size_t t = first; t < first + count; ++t) {
    const std::size_t offset = t * hidden;
    // +0.0 + x: an all -0.0 column sums to +0.0.
    start_row<kDtype>(row, reinterpret_cast<const Bits<kDtype>*>(rows[0]) + offset, hidden);
    for (std::int32_t q = 1; q < ranks; ++q) {
      add_row<kDtype>(row, reinterpret_cast<const Bits<kDtype>*>(rows[q]) + offset, hidden);
    }
    common::apply_epilogue_token_as<kDtype>(args, static_cast<std::uint32_t>(t), row);
  }
}

template <arbiter_dtype kDtype>
ARBITER_HOST_INLINE inline void epilogue_tokens_as(const arbiter_allreduce_args& args,
                                                   const void* sums, std::size_t first,
                                                   std::size_t count, float* row) {
  const std::uint32_t hidden = args.hidden;
  for (std::size_t t = first; t < first + count; ++t) {
    load_row<kDtype>(row, static_cast<const Bits<kDtype>*>(sums) + t * hidden, hidden);
    common::apply_epilogue_token_as<kDtype>(args, static_cast<std::uint32_t>(t), row);
  }
}

void reduce_tokens(const arbiter_allreduce_args& args, const std::byte* const* rows,
                   std::int32_t ranks, std::size_t first, std::size_t count, float* row) {
  common::with_dtype(args.dtype, [&](auto d) {
    reduce_tokens_as<decltype(d)::value>(args, rows, ranks, first, count, row);
  });
}

void epilogue_tokens(const arbiter_allreduce_args& args, const void* sums, std::size_t first,
                     std::size_t count, float* row) {
  common::with_dtype(args.dtype, [&](auto d) {
    epilogue_tokens_as<decltype(d)::value>(args, sums, first, count, row);
  });
}

void sum_elements(arbiter_dtype dtype, const std::byte* const* inputs, std::int32_t ranks,
                  std::size_t begin, std::size_t end, void* out) {
  common::with_dtype(
      dtype, [&](auto d) { sum_elements_as<decltype(d)::value>(inputs, ranks, begin, end, out); });
}

}  // namespace

const TokenKernels kScalarKernels = {"scalar", reduce_tokens, epilogue_tokens, sum_elements};

}  // namespace arbiter::shm
