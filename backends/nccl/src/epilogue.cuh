// The nccl backend's epilogue kernel: residual add + RMSNorm (+ FP8 e4m3) on
// the all-reduced sum, with the exact semantics of arbiter/common/rmsnorm.h.
//
// One block per token (grid-strided when tokens exceed the grid). Each thread
// handles packs of kPack elements: 16 bytes when the row allows it, one
// element otherwise. Pass 1 writes residual_out = dtype(sum + residual_in)
// and sums its squares in fp32; pass 2 re-reads the stored x (the same
// thread's own stores, so no barrier is needed) and writes the outputs.
// Reading and then writing the same element from the same thread makes
// sum == residual_out and residual_in == residual_out (or allreduce_out, or
// norm_out) safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "arbiter/common/fp8.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/rmsnorm.h"
#include "epilogue_launch.h"

namespace arbiter::nccl {

inline constexpr unsigned kMaxEpilogueThreads = 1024;

template <arbiter_dtype kDtype>
using StorageBits = std::conditional_t<kDtype == ARBITER_DTYPE_FP32, std::uint32_t, std::uint16_t>;

template <typename Bits, int kPack>
struct alignas(sizeof(Bits) * kPack) Pack {
  Bits v[kPack];
};

template <int kPack>
struct alignas(kPack) BytePack {
  std::uint8_t v[kPack];
};

// Sum over the first `lanes` lanes of the calling warp, valid in lane 0.
// Lanes past `lanes` do not exist (a partial last warp, e.g. 360 threads for
// hidden 2880): they are left out of the mask and their values never added.
__device__ inline float warp_sum(float v, unsigned lanes) {
  const unsigned mask = lanes >= 32 ? 0xFFFFFFFFu : (1u << lanes) - 1u;
  const unsigned lane = threadIdx.x & 31u;
  for (unsigned offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_down_sync(mask, v, offset);
    if (lane + offset < lanes) v += other;
  }
  return v;
}

// Sum of `v` over the block, returned to every thread; correct for any
// blockDim.x up to 1024. `partial` holds 32 floats, `total` one. Safe to call
// again right away: the next call's first barrier orders its writes after
// every read of this one.
__device__ inline float block_sum(float v, float* partial, float* total) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const unsigned warps = (blockDim.x + 31u) >> 5;
  const unsigned lanes = blockDim.x - warp * 32u < 32u ? blockDim.x - warp * 32u : 32u;
  v = warp_sum(v, lanes);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? partial[lane] : 0.0f;
    w = warp_sum(w, lanes);
    if (lane == 0) *total = w;
  }
  __syncthreads();
  return *total;
}

// REQUIRES: p.hidden % kPack == 0; every pointer aligned to its pack; blockDim.x <= 1024.
template <arbiter_dtype kDtype, int kPack, bool kFp8>
__global__ void __launch_bounds__(kMaxEpilogueThreads)
    residual_rmsnorm_kernel(const EpilogueParams p) {
  using Bits = StorageBits<kDtype>;
  using Vec = Pack<Bits, kPack>;
  __shared__ float partial[32];
  __shared__ float total;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Programmatic dependent launch: nothing before this line reads memory the
  // previous kernel writes. Completion is signalled implicitly at exit, after
  // the last store.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const std::uint32_t packs = p.hidden / kPack;
  const float scale = kFp8 ? *p.scale : 1.0f;
  const auto* gamma = static_cast<const Vec*>(p.gamma);
  auto load = [](Bits b) { return common::dtype_bits_to_float(b, kDtype); };
  auto store = [](float f) { return static_cast<Bits>(common::float_to_dtype_bits(f, kDtype)); };

  for (std::size_t token = blockIdx.x; token < p.tokens; token += gridDim.x) {
    const std::size_t row = token * packs;
    const Vec* sum = static_cast<const Vec*>(p.sum) + row;
    const Vec* residual_in = static_cast<const Vec*>(p.residual_in) + row;
    Vec* residual_out = static_cast<Vec*>(p.residual_out) + row;
    Vec* allreduce_out =
        p.allreduce_out == nullptr ? nullptr : static_cast<Vec*>(p.allreduce_out) + row;

    float squares = 0.0f;
    for (std::uint32_t i = threadIdx.x; i < packs; i += blockDim.x) {
      const Vec s = sum[i];
      const Vec r = residual_in[i];
      if (allreduce_out != nullptr) allreduce_out[i] = s;
      Vec x;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float value = common::add_residual(load(s.v[k]), load(r.v[k]), kDtype);
        x.v[k] = store(value);
        squares += value * value;
      }
      residual_out[i] = x;
    }
    const float inv_rms = common::inverse_rms(block_sum(squares, partial, &total), p.hidden, p.eps);

    Vec* norm_out = p.norm_out == nullptr ? nullptr : static_cast<Vec*>(p.norm_out) + row;
    BytePack<kPack>* quant_out = kFp8 ? static_cast<BytePack<kPack>*>(p.quant_out) + row : nullptr;
    for (std::uint32_t i = threadIdx.x; i < packs; i += blockDim.x) {
      const Vec x = residual_out[i];
      const Vec g = gamma[i];
      Vec y;
      BytePack<kPack> q;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float value =
            common::rmsnorm_element(load(x.v[k]), inv_rms, load(g.v[k]), p.weight_bias, kDtype);
        y.v[k] = store(value);
        if constexpr (kFp8) q.v[k] = common::fp8_quantize(value, scale);
      }
      if (norm_out != nullptr) norm_out[i] = y;
      if constexpr (kFp8) quant_out[i] = q;
    }
  }
}

}  // namespace arbiter::nccl
