// The shm kernels for AVX2 + F16C: 16 floats as two ymm registers. fp16 and
// fp32 blocks hold elements 0-7 and 8-15. A bf16 block holds its even
// elements in `low` and its odd ones in `high`: one 32-byte load gives both
// with a shift and a mask, and one blend packs them again, where element
// order would take two zero-extensions and two shifts to load and a pack and
// a cross-lane permutation to store. Every operation but spill is per lane,
// so each of the epilogue's 16 partial sums still adds the same elements in
// the same order; spill puts them back in element order.
// Conversions give the scalar reference's bits as in token_kernels_avx512.cpp:
// bf16 rounds on the integer bits, fp16 uses vcvtps2ph with round to nearest
// even. NaN words are made canonical after the fact (kCanonicalNan below).
#include "token_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#include "arbiter/common/host_device.h"

#define ARBITER_SHM_VECTOR_TARGET __attribute__((target("avx2,f16c")))
#define ARBITER_SHM_VECTOR_ISA avx2
#define ARBITER_SHM_LANES_INLINE ARBITER_SHM_VECTOR_TARGET ARBITER_HOST_INLINE static

namespace arbiter::shm::avx2 {

struct Lanes {
  struct F {
    __m256 low, high;
  };
  static constexpr int kFp16Rounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

  ARBITER_SHM_LANES_INLINE F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  ARBITER_SHM_LANES_INLINE F splat(float value) {
    return {_mm256_set1_ps(value), _mm256_set1_ps(value)};
  }
  ARBITER_SHM_LANES_INLINE F add(F a, F b) {
    return {_mm256_add_ps(a.low, b.low), _mm256_add_ps(a.high, b.high)};
  }
  ARBITER_SHM_LANES_INLINE F mul(F a, F b) {
    return {_mm256_mul_ps(a.low, b.low), _mm256_mul_ps(a.high, b.high)};
  }
  ARBITER_SHM_LANES_INLINE F load_f32(const float* p) {
    return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  }
  ARBITER_SHM_LANES_INLINE void store_f32(float* p, F v) {
    _mm256_storeu_ps(p, v.low);
    _mm256_storeu_ps(p + 8, v.high);
  }
  // The 16 values of a block of kDtype (as load<kDtype> lays them out),
  // stored in element order.
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE void spill(F v, float* elements) {
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      // Within 128-bit halves: 0 1 2 3 | 8 9 10 11 and 4 5 6 7 | 12 13 14 15.
      const __m256 first = _mm256_unpacklo_ps(v.low, v.high);
      const __m256 second = _mm256_unpackhi_ps(v.low, v.high);
      store_f32(elements, {_mm256_permute2f128_ps(first, second, 0x20),
                           _mm256_permute2f128_ps(first, second, 0x31)});
    } else {
      store_f32(elements, v);
    }
  }

  // NaN lanes stay NaN through round and store, with the payload and sign
  // they come with; the kernels make the NaN words they stored canonical
  // afterwards, and only where any_nan says there can be one. A compare and
  // a blend per 8 lanes at every rounding cost a sixth of the epilogue.
  static constexpr bool kCanonicalNan = false;

  // Whether any lane of `v` is NaN.
  ARBITER_SHM_LANES_INLINE bool any_nan(F v) {
    return _mm256_movemask_ps(_mm256_cmp_ps(v.low, v.high, _CMP_UNORD_Q)) != 0;
  }

  ARBITER_SHM_LANES_INLINE __m256i high_halves() {
    return _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  }

  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F load(const void* p) {
    const auto* half = static_cast<const __m128i*>(p);
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      const __m256i words = _mm256_loadu_si256(static_cast<const __m256i*>(p));
      return {_mm256_castsi256_ps(_mm256_slli_epi32(words, 16)),
              _mm256_castsi256_ps(_mm256_and_si256(words, high_halves()))};
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      return {_mm256_cvtph_ps(_mm_loadu_si128(half)), _mm256_cvtph_ps(_mm_loadu_si128(half + 1))};
    } else {
      return load_f32(static_cast<const float*>(p));
    }
  }

  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE __m256 round8(__m256 v) {
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      // Adding 0x7FFF plus the lowest kept bit rounds ties to even. A NaN
      // here has zero low halves (every one comes from bf16 data or is the
      // default NaN; eps and weight_bias are finite), so it stays that NaN.
      const __m256i bits = _mm256_castps_si256(v);
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
      const __m256i rounded = _mm256_and_si256(
          _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd), high_halves());
      return _mm256_castsi256_ps(rounded);
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      return _mm256_cvtph_ps(_mm256_cvtps_ph(v, kFp16Rounding));
    } else {
      return v;
    }
  }

  // common::rounded_to<kDtype>: the value the dtype stores, as a float (a
  // NaN as some NaN).
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F round(F v) {
    return {round8<kDtype>(v.low), round8<kDtype>(v.high)};
  }

  // Stores common::to_storage_bits<kDtype> of a value round<kDtype> gave (a
  // NaN as some NaN word).
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE void store(void* p, F rounded) {
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      // Word 2j: even element j's high half; word 2j + 1: odd element j's.
      const __m256i even = _mm256_srli_epi32(_mm256_castps_si256(rounded.low), 16);
      _mm256_storeu_si256(static_cast<__m256i*>(p),
                          _mm256_blend_epi16(_mm256_castps_si256(rounded.high), even, 0x55));
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      auto* half = static_cast<__m128i*>(p);
      _mm_storeu_si128(half, _mm256_cvtps_ph(rounded.low, kFp16Rounding));
      _mm_storeu_si128(half + 1, _mm256_cvtps_ph(rounded.high, kFp16Rounding));
    } else {
      store_f32(static_cast<float*>(p), rounded);
    }
  }

  // store(p, round(v)).
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE void store_rounded(void* p, F v) {
    store<kDtype>(p, round<kDtype>(v));
  }

  // store(p, round(v)), and round(v).
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F round_and_store(void* p, F v) {
    const F rounded = round<kDtype>(v);
    store<kDtype>(p, rounded);
    return rounded;
  }
};

}  // namespace arbiter::shm::avx2

#include "token_kernels_vector.h"

namespace arbiter::shm {
const TokenKernels* avx2_kernels() {
  static const TokenKernels kernels = {"avx2", avx2::reduce_tokens, avx2::epilogue_tokens,
                                       avx2::sum_elements};
  return &kernels;
}
}  // namespace arbiter::shm

#else

namespace arbiter::shm {
const TokenKernels* avx2_kernels() { return nullptr; }
}  // namespace arbiter::shm

#endif
