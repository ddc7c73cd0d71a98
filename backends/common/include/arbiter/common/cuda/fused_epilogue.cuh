// The fused epilogue of the GPU all-reduce kernels, per 16-byte vector of a
// token, after the sum over ranks: allreduce_out, residual add, RMSNorm with
// the sum of squares reduced over the token's CTAs, norm_out, FP8 or NVFP4.
// Semantics exactly as arbiter/common/rmsnorm.h; the thread layout is in
// epilogue_params.h. Also the end-of-kernel arrival on a control block.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "arbiter/common/cuda/device_ops.cuh"
#include "arbiter/common/cuda/epilogue_params.h"
#include "arbiter/common/fp8.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/common/rmsnorm.h"

namespace arbiter::common::device {

// Where this thread sits: which vector of the token it owns, if any.
struct Lane {
  unsigned vector;  // index of the owned 16-byte vector within the token
  bool active;      // vector < threads_per_token
};

__device__ inline Lane lane_of(const EpilogueParams& p) {
  const unsigned cta_in_cluster = p.cluster_size == 1 ? 0u : cg::this_cluster().block_rank();
  const unsigned vector = cta_in_cluster * blockDim.x + threadIdx.x;
  return Lane{vector, vector < p.threads_per_token};
}

// The fused epilogue for one vector of token `token`, given the fp32 sums
// over ranks. Every thread of the CTA calls it (idle ones with anything in
// `sum`): it contains block and cluster reductions. Semantics: rmsnorm.h.
template <arbiter_dtype kDtype, Epilogue kEpilogue>
__device__ inline void apply_epilogue(const EpilogueParams& p, std::uint32_t token, Lane lane,
                                      const float (&sum)[Vector<kDtype>::kElements],
                                      ReductionSmem& smem) {
  using V = Vector<kDtype>;
  constexpr unsigned kN = V::kElements;
  constexpr unsigned kElementBytes = sizeof(typename V::Bits);
  const std::uint64_t first = std::uint64_t{token} * p.hidden + std::uint64_t{lane.vector} * kN;
  const std::uint64_t offset = first * kElementBytes;

  // A sum that rounds to -0.0 (a tiny negative fp32 sum) is stored as +0.0
  // by every algorithm alike: mnnvl two-shot must sanitise the sums it
  // broadcasts, and the others follow so that all give the same bits.
  const uint4 s_bits = sanitize<kDtype>(pack<kDtype>(sum));
  if constexpr (kEpilogue == Epilogue::kAllreduce) {
    if (lane.active && p.allreduce_out != nullptr) {
      store_vector(static_cast<char*>(p.allreduce_out) + offset, s_bits);
    }
    return;
  } else {
    float x[kN];
    float squares = 0.0f;
    if (lane.active) {
      // The residual is loaded before any output of this vector is stored:
      // every output may be residual_in itself (aliasing.h). This thread is
      // the only one that touches the vector. No residual_in (a first
      // block): zeros, so x is the (sanitised, never -0.0) sum.
      const uint4 r_bits = p.residual_in != nullptr
                               ? load_vector(static_cast<const char*>(p.residual_in) + offset)
                               : make_uint4(0u, 0u, 0u, 0u);
      if (p.allreduce_out != nullptr) {
        store_vector(static_cast<char*>(p.allreduce_out) + offset, s_bits);
      }
      float s[kN];
      float r[kN];
      unpack<kDtype>(s_bits, s);
      unpack<kDtype>(r_bits, r);
#pragma unroll
      for (unsigned k = 0; k < kN; ++k) {
        x[k] = round_to<kDtype>(s[k] + r[k]);
        squares += x[k] * x[k];
      }
      if (p.residual_out != nullptr) {
        store_vector(static_cast<char*>(p.residual_out) + offset, pack<kDtype>(x));
      }
    } else {
#pragma unroll
      for (unsigned k = 0; k < kN; ++k) x[k] = 0.0f;
    }
    const float inv_rms =
        common::inverse_rms(cluster_sum(squares, smem, p.cluster_size), p.hidden, p.eps);

    float y[kN];
    if (lane.active) {
      float g[kN];
      unpack<kDtype>(load_vector(static_cast<const char*>(p.gamma) +
                                 std::uint64_t{lane.vector} * kN * kElementBytes),
                     g);
#pragma unroll
      for (unsigned k = 0; k < kN; ++k) {
        y[k] = round_to<kDtype>(x[k] * inv_rms * (g[k] + p.weight_bias));
      }
      if (p.norm_out != nullptr) {
        store_vector(static_cast<char*>(p.norm_out) + offset, pack<kDtype>(y));
      }
    } else {
#pragma unroll
      for (unsigned k = 0; k < kN; ++k) y[k] = 0.0f;
    }

    if constexpr (kEpilogue == Epilogue::kNormFp8) {
      if (lane.active) {
        const float scale = *p.scale;
        std::uint8_t* out = static_cast<std::uint8_t*>(p.quant_out) + first;
        unsigned words[kN / 4];
#pragma unroll
        for (unsigned w = 0; w < kN / 4; ++w) {
          words[w] = 0;
#pragma unroll
          for (unsigned b = 0; b < 4; ++b) {
            words[w] |= unsigned{common::fp8_quantize(y[4 * w + b], scale)} << (8 * b);
          }
        }
        if constexpr (kN == 8) {
          *reinterpret_cast<uint2*>(out) = make_uint2(words[0], words[1]);
        } else {
          *reinterpret_cast<unsigned*>(out) = words[0];
        }
      }
    } else if constexpr (kEpilogue == Epilogue::kNormFp4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 1000
      // NVFP4 is refused on the host below capability 100 (call_checks.h),
      // so this is never reached there; not compiling the quantiser for
      // those architectures keeps their kernels within 64 registers.
      __trap();
#else
      // A 16-element block is two adjacent threads' vectors (8 elements
      // each; the launcher keeps CTAs at an even thread count, so partners
      // share a warp). Every existing lane joins the shuffle.
      static_assert(kN == 8, "NVFP4 takes fp16 or bf16");
      float amax = 0.0f;
#pragma unroll
      for (unsigned k = 0; k < kN; ++k) amax = fmaxf(amax, fabsf(y[k]));
      amax = fmaxf(amax, __shfl_xor_sync(lane_mask(warp_lanes()), amax, 1));
      if (lane.active) {
        const float global_scale = *p.scale;
        const std::uint8_t sf = common::nvfp4_block_scale(amax, global_scale);
        const float value_scale = common::nvfp4_value_scale(sf, global_scale);
        unsigned packed = 0;
#pragma unroll
        for (unsigned k = 0; k < kN; k += 2) {
          const std::uint8_t even = common::float_to_e2m1(y[k] * value_scale);
          const std::uint8_t odd = common::float_to_e2m1(y[k + 1] * value_scale);
          packed |= unsigned{common::pack_e2m1(even, odd)} << (4 * k);
        }
        *reinterpret_cast<unsigned*>(static_cast<std::uint8_t*>(p.quant_out) + first / 2) = packed;
        if ((lane.vector & 1u) == 0) {
          const std::uint32_t blocks = common::nvfp4_blocks_per_row(p.hidden);
          const std::uint32_t block = lane.vector / 2;
          static_cast<std::uint8_t*>(
              p.scale_out)[common::scale_offset(p.linear_scales, token, block, blocks)] = sf;
        }
      }
#endif
    }
  }
}

// Counts this CTA as done; the last CTA of the grid runs `publish` (the
// control block's update for the next call) and resets the count. The grid
// is one wave, so every CTA gets here; the next kernel on the stream reads
// the control block only after this one completes.
template <typename Control, typename Publish>
__device__ inline void arrive(Control* control, Publish publish) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned before = atomicAdd(&control->arrivals, 1u);
    if (before == gridDim.x - 1) {
      publish(*control);
      control->arrivals = 0;
      __threadfence();
    }
  }
}

}  // namespace arbiter::common::device
