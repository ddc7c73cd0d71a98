// The shm kernels for AVX-512 with BF16 (Cooper Lake, Sapphire Rapids, Zen 4
// and later): the AVX-512 kernels, except that bf16 values are rounded and
// packed by vcvtneps2bf16 (16 at a time) and vcvtne2ps2bf16 (32), one
// instruction where the integer rounding takes seven per 16. It rounds to
// nearest even like the reference, but it treats a subnormal input as zero
// and keeps a NaN's payload; a block holding either (vfpclassps says) takes
// the AVX-512 integer path, so the bits stay the reference's.
#include "token_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)

// GCC 12 reports the self-initialised "undefined" vectors inside its own
// AVX-512 intrinsics as maybe uninitialised once they are inlined here.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "arbiter/common/host_device.h"

#define ARBITER_SHM_VECTOR_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c")))
#define ARBITER_SHM_VECTOR_ISA avx512bf16
#define ARBITER_SHM_LANES_INLINE ARBITER_SHM_VECTOR_TARGET ARBITER_HOST_INLINE static

namespace arbiter::shm::avx512bf16 {

#include "token_lanes_avx512.h"

struct Lanes : Avx512Lanes {
  // Quiet NaN (0x01), subnormal (0x20), signalling NaN (0x80).
  ARBITER_SHM_LANES_INLINE bool needs_integer_path(F v) {
    return _mm512_fpclass_ps_mask(v, 0xA1) != 0;
  }
  ARBITER_SHM_LANES_INLINE __m256i to_bf16(F v) {
    return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  }
  ARBITER_SHM_LANES_INLINE F widen(__m256i bf16) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
  }

  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F round(F v) {
    if (kDtype != ARBITER_DTYPE_BF16 || needs_integer_path(v)) {
      return Avx512Lanes::round<kDtype>(v);
    }
    return widen(to_bf16(v));
  }

  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE void store(void* p, F rounded) {
    if (kDtype != ARBITER_DTYPE_BF16 || needs_integer_path(rounded)) {
      return Avx512Lanes::store<kDtype>(p, rounded);
    }
    _mm256_storeu_si256(static_cast<__m256i*>(p), to_bf16(rounded));
  }

  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE void store_rounded(void* p, F v) {
    if (kDtype != ARBITER_DTYPE_BF16 || needs_integer_path(v)) {
      return Avx512Lanes::store_rounded<kDtype>(p, v);
    }
    _mm256_storeu_si256(static_cast<__m256i*>(p), to_bf16(v));
  }

  template <arbiter_dtype kDtype>
  ARBITER_SHM_LANES_INLINE F round_and_store(void* p, F v) {
    if (kDtype != ARBITER_DTYPE_BF16 || needs_integer_path(v)) {
      return Avx512Lanes::round_and_store<kDtype>(p, v);
    }
    const __m256i bf16 = to_bf16(v);
    _mm256_storeu_si256(static_cast<__m256i*>(p), bf16);
    return widen(bf16);
  }

  // Rounds 32 values at once; see Avx512Lanes::round_two.
  ARBITER_SHM_LANES_INLINE Packed round_two(F a, F b) {
    if ((_mm512_fpclass_ps_mask(a, 0xA1) | _mm512_fpclass_ps_mask(b, 0xA1)) != 0) {
      return Avx512Lanes::round_two(a, b);
    }
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
  }
};

}  // namespace arbiter::shm::avx512bf16

#include "token_kernels_vector.h"

namespace arbiter::shm {
const TokenKernels* avx512bf16_kernels() {
  static const TokenKernels kernels = {"avx512bf16", avx512bf16::reduce_tokens,
                                       avx512bf16::epilogue_tokens, avx512bf16::sum_elements};
  return &kernels;
}
}  // namespace arbiter::shm

#else

namespace arbiter::shm {
const TokenKernels* avx512bf16_kernels() { return nullptr; }
}  // namespace arbiter::shm

#endif
