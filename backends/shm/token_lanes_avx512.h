// The 16-lane vector type of the AVX-512 kernels (token_kernels_vector.h
// says what it must provide). Conversions give the scalar reference's bits
// (arbiter/common/numeric.h): bf16 rounds on the integer bits (vcvtneps2bf16
// flushes subnormals: token_kernels_avx512bf16.cpp uses it with a guard);
// fp16 uses vcvtps2ph with round to nearest even, exact for subnormals;
// every NaN becomes the canonical quiet NaN, as the reference stores it.
//
// No include guard: included once by each AVX-512 kernel file, inside its
// namespace, after it defines ARBITER_SHM_LANES_INLINE (the target attribute
// of its level, always inline, static).

struct Avx512Lanes {
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
