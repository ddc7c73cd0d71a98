// The shm kernels for AVX2 + F16C: 16 floats as two ymm registers (lanes
// 0-7 and 8-15, so the epilogue's 16 partial sums keep their order).
// Conversions give the scalar reference's bits as in token_kernels_avx512.cpp:
// bf16 rounds on the integer bits, fp16 uses vcvtps2ph with round to nearest
// even, every NaN becomes the canonical quiet NaN.
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
  ARBITER_SHM_LANES_INLINE void spill(F v, float* lanes) { store_f32(lanes, v); }

  // NaN lanes of `v` replaced by the canonical quiet NaN.
  ARBITER_SHM_LANES_INLINE __m256 canonical_nan(__m256 v, __m256 source) {
    const __m256 nan = _mm256_cmp_ps(source, source, _CMP_UNORD_Q);
    return _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
  }

  ARBITER_SHM_LANES_INLINE __m256 widen_bf16(__m128i bits) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }

  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F load(const void* p) {
    const auto* half = static_cast<const __m128i*>(p);
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      return {widen_bf16(_mm_loadu_si128(half)), widen_bf16(_mm_loadu_si128(half + 1))};
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      return {_mm256_cvtph_ps(_mm_loadu_si128(half)), _mm256_cvtph_ps(_mm_loadu_si128(half + 1))};
    } else {
      return load_f32(static_cast<const float*>(p));
    }
  }

  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE __m256 round8(__m256 v) {
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      // Adding 0x7FFF plus the lowest kept bit rounds ties to even.
      const __m256i bits = _mm256_castps_si256(v);
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
      const __m256i rounded =
          _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd),
                           _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
      return canonical_nan(_mm256_castsi256_ps(rounded), v);
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      return canonical_nan(_mm256_cvtph_ps(_mm256_cvtps_ph(v, kFp16Rounding)), v);
    } else {
      return v;
    }
  }

  // common::rounded_to<kDtype>: the value the dtype stores, as a float.
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F round(F v) {
    return {round8<kDtype>(v.low), round8<kDtype>(v.high)};
  }

  // Stores common::to_storage_bits<kDtype> of a value round<kDtype> gave.
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE void store(void* p, F rounded) {
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      const __m256i low = _mm256_srli_epi32(_mm256_castps_si256(rounded.low), 16);
      const __m256i high = _mm256_srli_epi32(_mm256_castps_si256(rounded.high), 16);
      // packus works within 128-bit halves: 0-3, 8-11, 4-7, 12-15; put 4-7 second.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, high), 0xD8);
      _mm256_storeu_si256(static_cast<__m256i*>(p), packed);
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      auto* half = static_cast<__m128i*>(p);
      _mm_storeu_si128(half, _mm256_cvtps_ph(rounded.low, kFp16Rounding));
      _mm_storeu_si128(half + 1, _mm256_cvtps_ph(rounded.high, kFp16Rounding));
    } else {
      store_f32(static_cast<float*>(p), {canonical_nan(rounded.low, rounded.low),
                                         canonical_nan(rounded.high, rounded.high)});
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
