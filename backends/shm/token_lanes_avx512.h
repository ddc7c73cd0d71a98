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
  // Blocks of every dtype are in element order.
  template <arbiter_dtype>
  ARBITER_SHM_LANES_INLINE void spill(F v, float* elements) {
    _mm512_storeu_ps(elements, v);
  }

  // round and store make every NaN the canonical quiet NaN.
  static constexpr bool kCanonicalNan = true;

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

  // bf16 32 at a time (token_kernels_vector.h, Bf16PairLanes): one 64-byte
  // load widens into the even and the odd elements with one shift and one
  // mask, where two blocks of 16 take two zero-extensions and two shifts.
  // Rounded values stay packed as bf16 words, 16 of one vector then 16 of
  // the other; a word permutation gives them back in element order (to
  // store), as floats, or as the two blocks of 16 in element order (the
  // sum of squares adds blocks in order).
  struct Pair {
    F even, odd;
  };
  using Packed = __m512i;

  ARBITER_SHM_LANES_INLINE Pair load_pair(const void* p) {
    const __m512i words = _mm512_loadu_si512(p);
    return {_mm512_castsi512_ps(_mm512_slli_epi32(words, 16)),
            _mm512_castsi512_ps(
                _mm512_and_si512(words, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))))};
  }

  // round<BF16>(a) and round<BF16>(b) as bf16 words: a's 16, then b's 16.
  ARBITER_SHM_LANES_INLINE Packed round_two(F a, F b) {
    const __m512i high_words =
        _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                         25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(_mm512_castps_si512(round<ARBITER_DTYPE_BF16>(a)), high_words,
                                     _mm512_castps_si512(round<ARBITER_DTYPE_BF16>(b)));
  }

  // Lane k: word index[2k + 1] of `packed` in its high half, zero below.
  ARBITER_SHM_LANES_INLINE F widen_words(Packed packed, __m512i index) {
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, index, packed));
  }

  // A round_two of a pair as floats again.
  ARBITER_SHM_LANES_INLINE Pair unpack(Packed packed) {
    const __m512i even = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7,
                                          0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    const __m512i odd = _mm512_set_epi16(31, 0, 30, 0, 29, 0, 28, 0, 27, 0, 26, 0, 25, 0, 24, 0, 23,
                                         0, 22, 0, 21, 0, 20, 0, 19, 0, 18, 0, 17, 0, 16, 0);
    return {widen_words(packed, even), widen_words(packed, odd)};
  }

  // Elements 16 * half to 16 * half + 15 of a round_two of a pair, in order.
  ARBITER_SHM_LANES_INLINE F block(Packed packed, int half) {
    const __m512i first = _mm512_set_epi16(23, 0, 7, 0, 22, 0, 6, 0, 21, 0, 5, 0, 20, 0, 4, 0, 19,
                                           0, 3, 0, 18, 0, 2, 0, 17, 0, 1, 0, 16, 0, 0, 0);
    const __m512i second = _mm512_set_epi16(31, 0, 15, 0, 30, 0, 14, 0, 29, 0, 13, 0, 28, 0, 12, 0,
                                            27, 0, 11, 0, 26, 0, 10, 0, 25, 0, 9, 0, 24, 0, 8, 0);
    return widen_words(packed, half == 0 ? first : second);
  }

  // A round_two of a pair, stored as its 32 elements in order.
  ARBITER_SHM_LANES_INLINE void store_pair(void* p, Packed packed) {
    const __m512i in_order =
        _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    _mm512_storeu_si512(p, _mm512_permutexvar_epi16(in_order, packed));
  }

  // A round_two of two consecutive blocks, stored as it is.
  ARBITER_SHM_LANES_INLINE void store_words(void* p, Packed packed) {
    _mm512_storeu_si512(p, packed);
  }
};
