// The shm kernels for AVX-512 (F, BW, VL, DQ): one zmm register holds 16
// floats. Conversions are done so that they give the scalar reference's bits
// (arbiter/common/numeric.h): bf16 rounds on the integer bits (no
// vcvtneps2bf16, which flushes subnormals); fp16 uses vcvtps2ph with round
// to nearest even, exact for subnormals; every NaN becomes the canonical
// quiet NaN, as the reference stores it.
#include "token_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)

// GCC 12 reports the self-initialised "undefined" vectors inside its own
// AVX-512 intrinsics as maybe uninitialised once they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include "arbiter/common/host_device.h"

#define ARBITER_SHM_VECTOR_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c")))
#define ARBITER_SHM_VECTOR_ISA avx512
#define ARBITER_SHM_LANES_INLINE ARBITER_SHM_VECTOR_TARGET ARBITER_HOST_INLINE static

namespace arbiter::shm::avx512 {

struct Lanes {
  using F = __m512;
  static constexpr int kFp16Rounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

  ARBITER_SHM_LANES_INLINE F zero() { return _mm512_setzero_ps(); }
  ARBITER_SHM_LANES_INLINE F splat(float value) { return _mm512_set1_ps(value); }
  ARBITER_SHM_LANES_INLINE F add(F a, F b) { return _mm512_add_ps(a, b); }
  ARBITER_SHM_LANES_INLINE F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  ARBITER_SHM_LANES_INLINE F load_f32(const float* p) { return _mm512_loadu_ps(p); }
  ARBITER_SHM_LANES_INLINE void store_f32(float* p, F v) { _mm512_storeu_ps(p, v); }
  ARBITER_SHM_LANES_INLINE void spill(F v, float* lanes) { _mm512_storeu_ps(lanes, v); }

  // NaN lanes of `v` replaced by the canonical quiet NaN.
  ARBITER_SHM_LANES_INLINE F canonical_nan(F v, F source) {
    const __mmask16 nan = _mm512_cmp_ps_mask(source, source, _CMP_UNORD_Q);
    return _mm512_mask_mov_ps(v, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
  }

  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F load(const void* p) {
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      const __m512i wide =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
      return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
    } else {
      return _mm512_loadu_ps(static_cast<const float*>(p));
    }
  }

  // common::rounded_to<kDtype>: the value the dtype stores, as a float.
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F round(F v) {
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      // Adding 0x7FFF plus the lowest kept bit rounds ties to even.
      const __m512i bits = _mm512_castps_si512(v);
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      const __m512i rounded =
          _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd),
                           _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
      return canonical_nan(_mm512_castsi512_ps(rounded), v);
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      return canonical_nan(_mm512_cvtph_ps(_mm512_cvtps_ph(v, kFp16Rounding)), v);
    } else {
      return v;
    }
  }

  // Stores common::to_storage_bits<kDtype> of a value round<kDtype> gave.
  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE void store(void* p, F rounded) {
    if constexpr (kDtype == ARBITER_DTYPE_BF16) {
      const __m512i high = _mm512_srli_epi32(_mm512_castps_si512(rounded), 16);
      _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi32_epi16(high));
    } else if constexpr (kDtype == ARBITER_DTYPE_FP16) {
      _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtps_ph(rounded, kFp16Rounding));
    } else {
      _mm512_storeu_ps(static_cast<float*>(p), canonical_nan(rounded, rounded));
    }
  }
};

}  // namespace arbiter::shm::avx512

#include "token_kernels_vector.h"

namespace arbiter::shm {
const TokenKernels* avx512_kernels() {
  static const TokenKernels kernels = {"avx512", avx512::reduce_tokens, avx512::epilogue_tokens,
                                       avx512::sum_elements};
  return &kernels;
}
}  // namespace arbiter::shm

#else

namespace arbiter::shm {
const TokenKernels* avx512_kernels() { return nullptr; }
}  // namespace arbiter::shm

#endif
