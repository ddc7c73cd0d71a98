// The nccl backend's epilogue kernel: residual add + RMSNorm (+ FP8 e4m3 or
// NVFP4) on the all-reduced sum, with the exact semantics of
// arbiter/common/rmsnorm.h and the NVFP4 quantiser the fused modules use
// (nvfp4_quantize_block, nvfp4.h's scale layouts).
//
// One block per token (grid-strided when tokens exceed the grid). Each thread
// handles units of the row: a pack of kPack elements (16 bytes when the row
// allows it, one element otherwise), or for NVFP4 one 16-element scale block
// (two 16-byte packs), so that a thread quantises a block alone. Pass 1
// writes residual_out = dtype(sum + residual_in) (residual_in NULL: 0) and sums its squares in
// fp32; pass 2 re-reads the stored x (the same thread's own stores, so no
// barrier is needed) and writes the outputs. Reading and then writing the
// same element from the same thread makes sum == residual_out and
// residual_in == residual_out (or allreduce_out, or norm_out) safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "arbiter/common/cuda/epilogue_params.h"
#include "arbiter/common/fp8.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
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

// REQUIRES: p.hidden % (kPack * packs per unit) == 0; every pointer aligned
// to its pack (NVFP4: quant_out to 4 bytes); blockDim.x <= 1024.
template <arbiter_dtype kDtype, int kPack, common::Epilogue kEpilogue>
__global__ void __launch_bounds__(kMaxEpilogueThreads)
    residual_rmsnorm_kernel(const EpilogueParams p) {
  constexpr bool kFp8 = kEpilogue == common::Epilogue::kNormFp8;
  constexpr bool kFp4 = kEpilogue == common::Epilogue::kNormFp4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 1000
  if constexpr (kFp4) {
    // NVFP4 is refused on the host below capability 100 (call_rules.h), and
    // its quantiser is not compiled for these architectures: were it ever
    // launched here, fail the stream rather than write nothing.
    __trap();
    return;
  }
#endif
  constexpr int kUnitPacks = kFp4 ? static_cast<int>(common::kNvfp4BlockSize) / kPack : 1;
  constexpr int kUnit = kPack * kUnitPacks;
  static_assert(
      !kFp4 || (kUnit == static_cast<int>(common::kNvfp4BlockSize) && kDtype != ARBITER_DTYPE_FP32),
      "NVFP4 takes fp16 or bf16 in 16-element units");
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
  const std::uint32_t units = p.hidden / kUnit;
  const float scale = kFp8 || kFp4 ? *p.scale : 1.0f;
  const auto* gamma = static_cast<const Vec*>(p.gamma);
  auto load = [](Bits b) { return common::dtype_bits_to_float(b, kDtype); };
  auto store = [](float f) { return static_cast<Bits>(common::float_to_dtype_bits(f, kDtype)); };

  for (std::size_t token = blockIdx.x; token < p.tokens; token += gridDim.x) {
    const std::size_t row = token * packs;
    const Vec* sum = static_cast<const Vec*>(p.sum) + row;
    // NULL residual_in (a first block): x is the sum itself, as in the
    // reference (adding +0.0 would turn a -0.0 sum into +0.0).
    const Vec* residual_in =
        p.residual_in == nullptr ? nullptr : static_cast<const Vec*>(p.residual_in) + row;
    Vec* residual_out = static_cast<Vec*>(p.residual_out) + row;
    Vec* allreduce_out =
        p.allreduce_out == nullptr ? nullptr : static_cast<Vec*>(p.allreduce_out) + row;

    float squares = 0.0f;
    for (std::uint32_t u = threadIdx.x; u < units; u += blockDim.x) {
#pragma unroll
      for (int j = 0; j < kUnitPacks; ++j) {
        const std::uint32_t i = u * kUnitPacks + j;
        const Vec s = sum[i];
        const Vec r = residual_in != nullptr ? residual_in[i] : Vec{};
        if (allreduce_out != nullptr) allreduce_out[i] = s;
        Vec x;
#pragma unroll
        for (int k = 0; k < kPack; ++k) {
          const float value = residual_in != nullptr
                                  ? common::add_residual(load(s.v[k]), load(r.v[k]), kDtype)
                                  : load(s.v[k]);
          x.v[k] = store(value);
          squares += value * value;
        }
        residual_out[i] = x;
      }
    }
    const float inv_rms = common::inverse_rms(block_sum(squares, partial, &total), p.hidden, p.eps);

    Vec* norm_out = p.norm_out == nullptr ? nullptr : static_cast<Vec*>(p.norm_out) + row;
    BytePack<kPack>* fp8_out = kFp8 ? static_cast<BytePack<kPack>*>(p.quant_out) + row : nullptr;
    for (std::uint32_t u = threadIdx.x; u < units; u += blockDim.x) {
      float y[kUnit];
#pragma unroll
      for (int j = 0; j < kUnitPacks; ++j) {
        const std::uint32_t i = u * kUnitPacks + j;
        const Vec x = residual_out[i];
        const Vec g = gamma[i];
        Vec out;
        BytePack<kPack> q;
#pragma unroll
        for (int k = 0; k < kPack; ++k) {
          const float value =
              common::rmsnorm_element(load(x.v[k]), inv_rms, load(g.v[k]), p.weight_bias, kDtype);
          y[j * kPack + k] = value;
          out.v[k] = store(value);
          if constexpr (kFp8) q.v[k] = common::fp8_quantize(value, scale);
        }
        if (norm_out != nullptr) norm_out[i] = out;
        if constexpr (kFp8) fp8_out[i] = q;
      }
      if constexpr (kFp4) {
        std::uint8_t packed[common::kNvfp4BlockSize / 2];
        const std::uint8_t sf = common::nvfp4_quantize_block(y, kUnit, scale, packed);
        unsigned words[2] = {0u, 0u};
#pragma unroll
        for (unsigned b = 0; b < 8; ++b) words[b / 4] |= unsigned{packed[b]} << (8 * (b % 4));
        // Two elements a byte: the unit's 16 elements are the 8 bytes at
        // byte (token * hidden + 16 u) / 2 of quant_out, 4-byte aligned.
        auto* q = reinterpret_cast<unsigned*>(static_cast<std::uint8_t*>(p.quant_out) +
                                              token * (p.hidden / 2) + std::size_t{u} * 8);
        q[0] = words[0];
        q[1] = words[1];
        const auto call_row = static_cast<std::uint32_t>(p.first_token + token);
        static_cast<std::uint8_t*>(
            p.scale_out)[common::scale_offset(p.linear_scales, call_row, u, units)] = sf;
      }
    }
  }
}

}  // namespace arbiter::nccl
