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

  // bf16: the rounded value in each lane's high half, the low half not yet
  // cleared. Adding 0x7FFF plus the lowest kept bit rounds ties to even. A
  // NaN here has zero low halves (every one comes from bf16 data or is the
  // default NaN; eps and weight_bias are finite), so it stays that NaN.
  ARBITER_SHM_LANES_INLINE __m256i bf16_high_halves(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd);
  }

  // Stores the high halves of a bf16 block's lanes: word 2j from even
  // element j (`low`), word 2j + 1 from odd element j (`high`).
  ARBITER_SHM_LANES_INLINE void store_bf16(void* p, __m256i low, __m256i high) {
    _mm256_storeu_si256(static_cast<__m256i*>(p),
                        _mm256_blend_epi16(high, _mm256_srli_epi32(low, 16), 0x55));
  }

  // common::rounded_to<kDtype>: the value the dtype stores, as a float (a
  // NaN as some NaN).
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F round(F v) {
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      return {_mm256_castsi256_ps(_mm256_and_si256(bf16_high_halves(v.low), high_halves())),
              _mm256_castsi256_ps(_mm256_and_si256(bf16_high_halves(v.high), high_halves()))};
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      return {_mm256_cvtph_ps(_mm256_cvtps_ph(v.low, kFp16Rounding)),
              _mm256_cvtph_ps(_mm256_cvtps_ph(v.high, kFp16Rounding))};
    } else {
      return v;
    }
  }

  // Stores common::to_storage_bits<kDtype>(v) (a NaN as some NaN word) and
  // returns round(v), converting once.
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F round_and_store(void* p, F v) {
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      const __m256i low = bf16_high_halves(v.low), high = bf16_high_halves(v.high);
      store_bf16(p, low, high);
      return {_mm256_castsi256_ps(_mm256_and_si256(low, high_halves())),
              _mm256_castsi256_ps(_mm256_and_si256(high, high_halves()))};
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      auto* half = static_cast<__m128i*>(p);
      const __m128i low = _mm256_cvtps_ph(v.low, kFp16Rounding);
      const __m128i high = _mm256_cvtps_ph(v.high, kFp16Rounding);
      _mm_storeu_si128(half, low);
      _mm_storeu_si128(half + 1, high);
      return {_mm256_cvtph_ps(low), _mm256_cvtph_ps(high)};
    } else {
      store_f32(static_cast<float*>(p), v);
      return v;
    }
  }

  // round_and_store without the value: its conversion back compiles away.
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE void store_rounded(void* p, F v) {
    round_and_store<kDtype>(p, v);
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
