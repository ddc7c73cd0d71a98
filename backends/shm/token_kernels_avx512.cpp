// The shm kernels for AVX-512 (F, BW, VL, DQ): one zmm register holds 16
// floats (token_lanes_avx512.h).
#include "token_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)

// GCC 12 reports the self-initialised "undefined" vectors inside its own
// AVX-512 intrinsics as maybe uninitialised once they are inlined here.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "arbiter/common/host_device.h"

#define ARBITER_SHM_VECTOR_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c")))
#define ARBITER_SHM_VECTOR_ISA avx512
#define ARBITER_SHM_LANES_INLINE ARBITER_SHM_VECTOR_TARGET ARBITER_HOST_INLINE static

namespace arbiter::shm::avx512 {

#include "token_lanes_avx512.h"

using Lanes = Avx512Lanes;

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
