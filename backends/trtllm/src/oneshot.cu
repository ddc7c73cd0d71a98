// One-shot (Lamport) fused all-reduce: every rank stores its message once
// into its slot of the current stage in every peer's workspace, and polls
// its own copy of the stage until no element of any slot is the sentinel.
//
// Per call on stage s (workspace_layout.h):
//  1. push: load each owned vector of the input, replace -0.0 by +0.0, store
//     it into slot [rank] of stage s of every rank (itself included);
//  2. clear: reset this rank's own stage_to_clear(s) to -0.0 over the bytes
//     the previous one-shot call wrote there (ws slots x clear_bytes);
//  3. per token: poll slots 0..ws-1 of the own stage s, sum them in rank
//     order in fp32 (the same bits on every rank), apply the epilogue;
//  4. the last CTA to finish advances the stage and records clear_bytes.
// Why three stages: while a rank reads stage s and clears s-1, a faster peer
// may already write s+1 into its memory; it cannot reach s+2 (= s-1) before
// this rank has pushed its own data for s+1, which comes after this call.
// The payload is its own readiness flag: no fence, no barrier.
#include <cuda_runtime.h>

#include <cstdint>

#include "arbiter/common/cuda/device_ops.cuh"
#include "arbiter/common/cuda/fused_epilogue.cuh"
#include "arbiter/common/cuda/kernel_launch.cuh"
#include "arbiter/common/stages.h"
#include "launch.h"

namespace arbiter::trtllm {
namespace {

using common::Epilogue;

// Slots polled with their loads in flight together.
constexpr unsigned kPollBatch = 4;

template <arbiter_dtype kDtype, Epilogue kEpilogue>
__global__ void __launch_bounds__(common::device::kMaxThreads, 1)
    oneshot_kernel(const KernelParams p) {
  using namespace common::device;
  using V = Vector<kDtype>;
  constexpr unsigned kN = V::kElements;
  __shared__ ReductionSmem smem;
  __shared__ std::uint32_t shared_stage;
  __shared__ std::uint64_t shared_clear_bytes;

  wait_for_previous_grid();
  if (threadIdx.x == 0) {
    shared_stage = *reinterpret_cast<volatile std::uint32_t*>(&p.control->stage);
    shared_clear_bytes = *reinterpret_cast<volatile std::uint64_t*>(&p.control->clear_bytes);
  }
  __syncthreads();
  const std::uint32_t stage = shared_stage;
  const std::uint64_t clear_bytes = shared_clear_bytes;

  const Lane lane = lane_of(p.epilogue);
  const unsigned clusters = gridDim.x / p.epilogue.cluster_size;
  const unsigned cluster = blockIdx.x / p.epilogue.cluster_size;
  const std::uint64_t row_bytes = std::uint64_t{p.epilogue.hidden} * sizeof(typename V::Bits);
  const std::uint64_t lane_bytes = std::uint64_t{lane.vector} * 16;
  const std::uint64_t stage_base = p.oneshot_offset + stage * p.stage_bytes;
  char* const self = p.peers[p.rank];

  // 1. Push.
  if (lane.active) {
    const std::uint64_t my_slot = stage_base + p.rank * p.slot_bytes;
    for (std::uint32_t t = cluster; t < p.tokens; t += clusters) {
      const std::uint64_t offset = t * row_bytes + lane_bytes;
      const uint4 v = sanitize<kDtype>(load_vector(static_cast<const char*>(p.input) + offset));
      for (std::uint32_t q = 0; q < p.world_size; ++q)
        store_relaxed_system(p.peers[q] + my_slot + offset, v);
    }
  }

  // 2. Clear the previous call's stage in this rank's own memory. Nobody
  // writes it now: every peer finished that call (this rank read all of its
  // data), and none can reach the call after next before this one ends.
  if (clear_bytes != 0) {
    const std::uint64_t clear_base =
        p.oneshot_offset + common::stage_to_clear(stage) * p.stage_bytes;
    const std::uint64_t per_slot = clear_bytes / 16;
    const std::uint64_t total = per_slot * p.world_size;
    const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
    const uint4 sentinel = sentinel_vector<kDtype>();
    for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
         i += stride) {
      const std::uint64_t slot = i / per_slot;
      store_vector(self + clear_base + slot * p.slot_bytes + (i - slot * per_slot) * 16, sentinel);
    }
  }

  // 3. Poll, sum in rank order, epilogue. After an abort (the host's flag)
  // a wait ends with a zero vector stored where it polls (Spin); the sums
  // are then unspecified.
  for (std::uint32_t t = cluster; t < p.tokens; t += clusters) {
    float sum[kN];
#pragma unroll
    for (unsigned k = 0; k < kN; ++k) sum[k] = 0.0f;
    if (lane.active) {
      const std::uint64_t offset = stage_base + t * row_bytes + lane_bytes;
      Spin spin("trtllm");
      for (std::uint32_t q0 = 0; q0 < p.world_size; q0 += kPollBatch) {
        uint4 v[kPollBatch];
#pragma unroll
        for (unsigned j = 0; j < kPollBatch; ++j) {
          if (q0 + j < p.world_size) v[j] = load_volatile(self + offset + (q0 + j) * p.slot_bytes);
        }
#pragma unroll
        for (unsigned j = 0; j < kPollBatch; ++j) {
          if (q0 + j >= p.world_size) continue;
          while (has_sentinel<kDtype>(v[j])) {
            char* const polled = self + offset + (q0 + j) * p.slot_bytes;
            spin.again(
                p, [&] { store_vector(polled, make_uint4(0, 0, 0, 0)); }, "one-shot data", q0 + j,
                t);
            v[j] = load_volatile(polled);
          }
          float f[kN];
          unpack<kDtype>(v[j], f);
#pragma unroll
          for (unsigned k = 0; k < kN; ++k) sum[k] += f[k];
        }
      }
    }
    apply_epilogue<kDtype, kEpilogue>(p.epilogue, t, lane, sum, smem);
  }

  // 4. The next one-shot call uses the next stage and clears this one.
  arrive(p.control, [&](ControlBlock& control) {
    control.stage = common::next_stage(stage);
    control.clear_bytes = p.tokens * row_bytes;
  });
  allow_dependent_grid();
}

__global__ void fill_kernel(uint4* base, std::uint64_t vectors, uint4 value) {
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < vectors;
       i += stride) {
    base[i] = value;
  }
}

}  // namespace

cudaError_t launch_oneshot(const KernelParams& params, arbiter_dtype dtype, arbiter_pattern pattern,
                           const LaunchShape& shape, cudaStream_t stream) {
  const auto kernel = common::select_kernel<KernelParams>(
      dtype, pattern, [](auto d, auto e) -> common::KernelFunction<KernelParams> {
        return oneshot_kernel<decltype(d)::value, decltype(e)::value>;
      });
  return common::launch_kernel(kernel, params, shape, stream);
}

cudaError_t launch_fill_sentinel(void* base, std::uint64_t bytes, arbiter_dtype dtype,
                                 cudaStream_t stream) {
  const unsigned word = dtype == ARBITER_DTYPE_FP32 ? 0x80000000u : 0x80008000u;
  const std::uint64_t vectors = bytes / 16;
  if (vectors == 0) return cudaSuccess;
  const std::uint64_t blocks = (vectors + 255) / 256;
  fill_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(
      static_cast<uint4*>(base), vectors, make_uint4(word, word, word, word));
  return cudaGetLastError();
}

cudaError_t query_oneshot_clusters(std::uint32_t cluster_size, int* clusters) {
  // Every instantiation has the same footprint: 1024 threads capped at 64
  // registers by __launch_bounds__, and the same static shared memory.
  return common::max_active_clusters<KernelParams>(
      oneshot_kernel<ARBITER_DTYPE_BF16, Epilogue::kNormFp4>, cluster_size, clusters);
}

}  // namespace arbiter::trtllm
