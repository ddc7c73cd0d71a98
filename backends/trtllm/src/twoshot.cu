// Two-shot fused all-reduce: a reduce-scatter by pulling, then an all-gather
// by pushing, between two cross-rank barriers.
//
//  1. copy this rank's input into its own input area;
//  2. barrier;
//  3. for the tokens of this rank's slice (common/partition.h): load the
//     vector from every rank's input area, sum in rank order in fp32, round
//     to the dtype and store it into every rank's sum area;
//  4. barrier;
//  5. per token: read the own sum area, apply the epilogue.
// Token t is handled by cluster t % clusters in every step and on every rank
// (all ranks launch the same shape), so CTA b of one rank only ever reads
// what CTA b of the others wrote: a barrier per CTA index is enough.
//
// Barrier flags are 64-bit epochs that only grow (workspace_layout.h): CTA b
// of each rank stores the epoch into word [b][rank] of every peer and waits
// until its own words [b][0..ws) reach it. Peers may be ahead, never behind;
// a word left from an earlier call with a larger grid is below the epoch.
// The last CTA to finish records the epoch in the control block.
#include <cuda_runtime.h>

#include <cstdint>

#include "arbiter/common/cuda/device_ops.cuh"
#include "arbiter/common/cuda/fused_epilogue.cuh"
#include "arbiter/common/cuda/kernel_launch.cuh"
#include "arbiter/common/partition.h"
#include "launch.h"

namespace arbiter::trtllm {
namespace {

using common::Epilogue;

constexpr unsigned kPullBatch = 4;

// Every rank's CTA blockIdx.x has reached epoch `target`; its stores before
// the barrier are visible to the CTAs that pass it. After an abort (the
// host's flag) a waiting thread stores the epoch into its own word (Spin),
// so the barrier ends; every thread still passes the __syncthreads.
__device__ void cross_rank_barrier(const KernelParams& p, std::uint64_t target) {
  using namespace common::device;
  __syncthreads();
  for (std::uint32_t q = threadIdx.x; q < p.world_size; q += blockDim.x) {
    auto flags = [&](std::uint32_t rank) {
      return reinterpret_cast<std::uint64_t*>(p.peers[rank] + p.flags_offset) +
             std::uint64_t{blockIdx.x} * p.world_size;
    };
    // The CTA's stores, ordered before this thread by __syncthreads, happen
    // before the flag for observers on any GPU: a system-scope release is
    // cumulative, so no fence is needed before it.
    store_release_system(flags(q) + p.rank, target);
    std::uint64_t* const mine = flags(p.rank) + q;
    Spin spin("trtllm");
    while (load_acquire_system(mine) < target) {
      spin.again(
          p, [&] { store_release_system(mine, target); }, "two-shot barrier", q, blockIdx.x);
    }
  }
  __syncthreads();
}

template <arbiter_dtype kDtype, Epilogue kEpilogue>
__global__ void __launch_bounds__(common::device::kMaxThreads, 1)
    twoshot_kernel(const KernelParams p) {
  using namespace common::device;
  using V = Vector<kDtype>;
  constexpr unsigned kN = V::kElements;
  __shared__ ReductionSmem smem;
  __shared__ std::uint64_t shared_epoch;

  wait_for_previous_grid();
  if (threadIdx.x == 0) {
    shared_epoch = *reinterpret_cast<volatile std::uint64_t*>(&p.control->barrier_epoch);
  }
  __syncthreads();
  const std::uint64_t epoch = shared_epoch;

  const Lane lane = lane_of(p.epilogue);
  const unsigned clusters = gridDim.x / p.epilogue.cluster_size;
  const unsigned cluster = blockIdx.x / p.epilogue.cluster_size;
  const std::uint64_t row_bytes = std::uint64_t{p.epilogue.hidden} * sizeof(typename V::Bits);
  const std::uint64_t lane_bytes = std::uint64_t{lane.vector} * 16;
  char* const self = p.peers[p.rank];

  // 1. Stage in.
  if (lane.active) {
    for (std::uint32_t t = cluster; t < p.tokens; t += clusters) {
      const std::uint64_t offset = t * row_bytes + lane_bytes;
      store_vector(self + p.twoshot_input_offset + offset,
                   load_vector(static_cast<const char*>(p.input) + offset));
    }
  }
  cross_rank_barrier(p, epoch + 1);

  // 3. Reduce this rank's slice; push the sums to every rank.
  if (lane.active) {
    const std::uint32_t begin = common::slice_begin(p.tokens, p.world_size, p.rank);
    const std::uint32_t end = common::slice_end(p.tokens, p.world_size, p.rank);
    // The first token of the slice that this cluster handles (t % clusters).
    std::uint32_t t = begin + (cluster + clusters - begin % clusters) % clusters;
    for (; t < end; t += clusters) {
      const std::uint64_t offset = t * row_bytes + lane_bytes;
      float sum[kN];
#pragma unroll
      for (unsigned k = 0; k < kN; ++k) sum[k] = 0.0f;
      for (std::uint32_t q0 = 0; q0 < p.world_size; q0 += kPullBatch) {
        uint4 v[kPullBatch];
#pragma unroll
        for (unsigned j = 0; j < kPullBatch; ++j) {
          if (q0 + j < p.world_size) {
            v[j] = load_volatile(p.peers[q0 + j] + p.twoshot_input_offset + offset);
          }
        }
#pragma unroll
        for (unsigned j = 0; j < kPullBatch; ++j) {
          if (q0 + j >= p.world_size) continue;
          float f[kN];
          unpack<kDtype>(v[j], f);
#pragma unroll
          for (unsigned k = 0; k < kN; ++k) sum[k] += f[k];
        }
      }
      const uint4 rounded = pack<kDtype>(sum);
      for (std::uint32_t q = 0; q < p.world_size; ++q) {
        store_vector(p.peers[q] + p.twoshot_sum_offset + offset, rounded);
      }
    }
  }
  cross_rank_barrier(p, epoch + 2);

  // 5. Epilogue on the gathered sums.
  for (std::uint32_t t = cluster; t < p.tokens; t += clusters) {
    float sum[kN];
    if (lane.active) {
      unpack<kDtype>(load_volatile(self + p.twoshot_sum_offset + t * row_bytes + lane_bytes), sum);
    } else {
#pragma unroll
      for (unsigned k = 0; k < kN; ++k) sum[k] = 0.0f;
    }
    apply_epilogue<kDtype, kEpilogue>(p.epilogue, t, lane, sum, smem);
  }

  arrive(p.control, [&](ControlBlock& control) { control.barrier_epoch = epoch + 2; });
  allow_dependent_grid();
}

}  // namespace

cudaError_t launch_twoshot(const KernelParams& params, arbiter_dtype dtype, arbiter_pattern pattern,
                           const LaunchShape& shape, cudaStream_t stream) {
  const auto kernel = common::select_kernel<KernelParams>(
      dtype, pattern, [](auto d, auto e) -> common::KernelFunction<KernelParams> {
        return twoshot_kernel<decltype(d)::value, decltype(e)::value>;
      });
  return common::launch_kernel(kernel, params, shape, stream);
}

cudaError_t query_max_active_clusters(std::uint32_t cluster_size, int* clusters) {
  // The smaller of the two kernels' residency, so neither outgrows a wave.
  int oneshot = 0;
  int twoshot = 0;
  cudaError_t e = query_oneshot_clusters(cluster_size, &oneshot);
  if (e == cudaSuccess) {
    e = common::max_active_clusters<KernelParams>(
        twoshot_kernel<ARBITER_DTYPE_BF16, Epilogue::kNormFp4>, cluster_size, &twoshot);
  }
  *clusters = oneshot < twoshot ? oneshot : twoshot;
  return e;
}

}  // namespace arbiter::trtllm
