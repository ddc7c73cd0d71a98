// Device building blocks of the GPU all-reduce kernels (trtllm, mnnvl):
// 16-byte vectors of a dtype, the sentinel on raw bits, memory operations
// with the scope each protocol step needs, bounded spins, PDL, and block and
// cluster reductions correct for any block size. CUDA only (nvcc).
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "arbiter/common/fp8.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/common/rmsnorm.h"
#include "arbiter/common/sentinel.h"

namespace arbiter::common::device {

namespace cg = cooperative_groups;

inline constexpr unsigned kMaxThreads = 1024;

template <arbiter_dtype kDtype>
struct Vector {
  using Bits = std::conditional_t<kDtype == ARBITER_DTYPE_FP32, std::uint32_t, std::uint16_t>;
  static constexpr unsigned kElements = 16 / sizeof(Bits);
};

// ------------------------------------------------------------ conversions

// Round-to-nearest-even conversions in hardware; they give the same values as
// the software ones in arbiter/common/numeric.h (NaN payloads aside).
template <arbiter_dtype kDtype>
__device__ inline float to_float(std::uint32_t bits) {
  if constexpr (kDtype == ARBITER_DTYPE_FP16) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(bits)));
    return f;
  } else if constexpr (kDtype == ARBITER_DTYPE_BF16) {
    return __uint_as_float(bits << 16);
  } else {
    return __uint_as_float(bits);
  }
}

template <arbiter_dtype kDtype>
__device__ inline std::uint32_t to_bits(float f) {
  if constexpr (kDtype == ARBITER_DTYPE_FP16) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
  } else if constexpr (kDtype == ARBITER_DTYPE_BF16) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
  } else {
    return __float_as_uint(f);
  }
}

template <arbiter_dtype kDtype>
__device__ inline float round_to(float f) {
  if constexpr (kDtype == ARBITER_DTYPE_FP32) {
    return f;
  } else {
    return to_float<kDtype>(to_bits<kDtype>(f));
  }
}

// Element k of a 16-byte vector (16-bit types: two per 32-bit word, low first).
template <arbiter_dtype kDtype>
__device__ inline std::uint32_t element_bits(const uint4& v, unsigned k) {
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
  if constexpr (kDtype == ARBITER_DTYPE_FP32) {
    return words[k];
  } else {
    return (words[k / 2] >> (16 * (k % 2))) & 0xFFFFu;
  }
}

template <arbiter_dtype kDtype>
__device__ inline void unpack(const uint4& v, float (&out)[Vector<kDtype>::kElements]) {
#pragma unroll
  for (unsigned k = 0; k < Vector<kDtype>::kElements; ++k) {
    out[k] = to_float<kDtype>(element_bits<kDtype>(v, k));
  }
}

// The dtype bits of `values`, rounded to nearest even.
template <arbiter_dtype kDtype>
__device__ inline uint4 pack(const float (&values)[Vector<kDtype>::kElements]) {
  unsigned words[4];
  if constexpr (kDtype == ARBITER_DTYPE_FP32) {
#pragma unroll
    for (unsigned k = 0; k < 4; ++k) words[k] = to_bits<kDtype>(values[k]);
  } else {
#pragma unroll
    for (unsigned k = 0; k < 4; ++k) {
      words[k] = to_bits<kDtype>(values[2 * k]) | (to_bits<kDtype>(values[2 * k + 1]) << 16);
    }
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// ------------------------------------------------------------ sentinel

// Every -0.0 element replaced by +0.0, so no payload equals the sentinel.
template <arbiter_dtype kDtype>
__device__ inline uint4 sanitize(uint4 v) {
  auto word = [](unsigned w) -> unsigned {
    if constexpr (kDtype == ARBITER_DTYPE_FP32) {
      return w == common::kNegativeZeroBits32 ? 0u : w;
    } else {
      const unsigned lo = (w & 0xFFFFu) == common::kNegativeZeroBits16 ? 0u : (w & 0xFFFFu);
      const unsigned hi = (w >> 16) == common::kNegativeZeroBits16 ? 0u : (w & 0xFFFF0000u);
      return lo | hi;
    }
  };
  return make_uint4(word(v.x), word(v.y), word(v.z), word(v.w));
}

// True when any element of `v` is still the sentinel (compared on raw bits:
// a float compare under flush-to-zero mistakes negative subnormals for -0.0).
template <arbiter_dtype kDtype>
__device__ inline bool has_sentinel(const uint4& v) {
  auto word = [](unsigned w) {
    if constexpr (kDtype == ARBITER_DTYPE_FP32) {
      return w == common::kNegativeZeroBits32;
    } else {
      return (w & 0xFFFFu) == common::kNegativeZeroBits16 ||
             (w >> 16) == common::kNegativeZeroBits16;
    }
  };
  return word(v.x) || word(v.y) || word(v.z) || word(v.w);
}

// The sentinel in every element, for clearing.
template <arbiter_dtype kDtype>
__device__ inline uint4 sentinel_vector() {
  constexpr unsigned w = kDtype == ARBITER_DTYPE_FP32 ? common::kNegativeZeroBits32 : 0x80008000u;
  return make_uint4(w, w, w, w);
}

// ------------------------------------------------------------ memory

__device__ inline uint4 load_vector(const void* p) { return *static_cast<const uint4*>(p); }

__device__ inline void store_vector(void* p, const uint4& v) { *static_cast<uint4*>(p) = v; }

// Not cached in L1: sees stores of peers (and of this GPU's other CTAs) that
// arrived after an earlier load of the same address.
__device__ inline uint4 load_volatile(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// A Lamport payload store into a peer's memory: relaxed at system scope, so
// it is a strong store that peers polling with ld.volatile (or ld.relaxed)
// may observe, as the PTX memory model requires; a weak st.global gives no
// such promise. Costs the same as st.global.
__device__ inline void store_relaxed_system(void* p, const uint4& v) {
  asm volatile("st.relaxed.sys.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ inline void store_release_system(std::uint64_t* p, std::uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(value) : "memory");
}

__device__ inline std::uint64_t load_acquire_system(const std::uint64_t* p) {
  std::uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(p) : "memory");
  return value;
}

// Relaxed at system scope, 64 bits: a value a peer reads after an acquire
// of a flag this thread releases later (a barrier word's key).
__device__ inline void store_relaxed_system(std::uint64_t* p, std::uint64_t value) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(value) : "memory");
}

__device__ inline std::uint64_t load_relaxed_system(const std::uint64_t* p) {
  std::uint64_t value;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(p) : "memory");
  return value;
}

__device__ inline std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A relaxed load at system scope: sees the host's stores to host-mapped
// memory (the abort flag) without caching them.
__device__ inline std::uint32_t load_relaxed_system(const std::uint32_t* p) {
  std::uint32_t value;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(p) : "memory");
  return value;
}

// A spin on a peer that gives up. Every 1024 failed polls (never on a poll
// that succeeds, so the fast path pays nothing) it reads the workspace's
// abort flag, which the host sets in host-mapped memory (the module's
// abort(), from any host thread), and the clock: after the workspace's
// timeout (0: never) it reports what it was waiting for and traps, which
// fails the stream with a CUDA error the host sees, instead of hanging the
// job forever.
//
// Aborting does not trap (that would poison the whole CUDA context). The
// waiting thread makes its own wait come true instead: `release` (the
// caller's) stores what it polls for where it polls (a non-sentinel vector
// into its own slot, the awaited epoch into its own flag word), so the
// loop ends by its own condition and the kernel goes on, through its
// barriers, to its end; its outputs are then unspecified and the module
// refuses every later call. Each later wait of an aborted kernel ends at its
// first check, 1024 polls in. Why this shape: the kernels run at their
// register limit, and both a second loop exit and a sticky "aborted" state
// spilled (sm_90a and sm_100a); the flag and the timeout are read from the
// kernel's parameters (abort_flag, spin_timeout_ns) at each check, and the
// start time is kept in 32 bits, for the same reason.
class Spin {
 public:
  // `module` names the backend in the message ("trtllm", "mnnvl").
  __device__ explicit Spin(const char* module) : module_(module) {}

  // Call once per failed poll.
  template <typename Params, typename Release>
  __device__ void again(const Params& p, Release release, const char* what, std::uint32_t peer,
                        std::uint32_t token) {
    if ((++polls_ & 1023u) != 0) return;
    if (p.abort_flag != nullptr && load_relaxed_system(p.abort_flag) != 0) {
      release();
      return;
    }
    if (p.spin_timeout_ns == 0) return;
    // In units of 2^20 ns (about a millisecond), 32 bits: 49 days before the
    // difference wraps. Odd once started.
    const std::uint32_t now = static_cast<std::uint32_t>(global_timer_ns() >> 20) | 1u;
    if (start_ == 0) {
      start_ = now;
    } else if ((std::uint64_t{now - start_} << 20) > p.spin_timeout_ns) {
      printf(
          "arbiter %s: rank %u waited over %llu ms for rank %u (%s, token %u); "
          "a peer is gone or diverged. Aborting the kernel.\n",
          module_, p.rank, static_cast<unsigned long long>(p.spin_timeout_ns / 1000000), peer, what,
          token);
      __trap();
    }
  }

 private:
  const char* module_;
  std::uint32_t start_ = 0;  // 0: not started
  std::uint32_t polls_ = 0;
};

// ------------------------------------------------------------ PDL

// Programmatic dependent launch: nothing before wait() reads memory the
// previous kernel writes; launch_dependents() is called after this CTA's last
// store, so a dependent that waits sees every output.
__device__ inline void wait_for_previous_grid() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ inline void allow_dependent_grid() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ------------------------------------------------------------ reductions

// Lanes of the calling warp that exist (a partial last warp has fewer).
__device__ inline unsigned warp_lanes() {
  const unsigned warp_first = threadIdx.x & ~31u;
  const unsigned left = blockDim.x - warp_first;
  return left < 32u ? left : 32u;
}

__device__ inline unsigned lane_mask(unsigned lanes) {
  return lanes >= 32u ? 0xFFFFFFFFu : (1u << lanes) - 1u;
}

// Sum over the first `lanes` lanes of the warp, valid in lane 0.
__device__ inline float warp_sum(float v, unsigned lanes) {
  const unsigned mask = lane_mask(lanes);
  const unsigned lane = threadIdx.x & 31u;
#pragma unroll
  for (unsigned offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_down_sync(mask, v, offset);
    if (lane + offset < lanes) v += other;
  }
  return v;
}

struct ReductionSmem {
  float partial[32];
  float block_total;
  float cta_total;  // read by the other CTAs of the cluster
};

// Sum of `v` over the CTA, returned to every thread, in a fixed order (so the
// same inputs give the same bits on every rank). Correct for any blockDim.x.
__device__ inline float block_sum(float v, ReductionSmem& s) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const unsigned warps = (blockDim.x + 31u) >> 5;
  v = warp_sum(v, warp_lanes());
  if (lane == 0) s.partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? s.partial[lane] : 0.0f;
    w = warp_sum(w, warp_lanes());
    if (lane == 0) s.block_total = w;
  }
  __syncthreads();
  return s.block_total;
}

// Sum over the cluster's CTAs (distributed shared memory), in CTA order.
__device__ inline float cluster_sum(float v, ReductionSmem& s, unsigned cluster_size) {
  const float mine = block_sum(v, s);
  if (cluster_size == 1) return mine;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) s.cta_total = mine;
  cluster.sync();
  float total = 0.0f;
  for (unsigned r = 0; r < cluster_size; ++r) total += *cluster.map_shared_rank(&s.cta_total, r);
  // Nobody rewrites cta_total (next token) before every CTA has read it.
  cluster.sync();
  return total;
}

}  // namespace arbiter::common::device
