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
//
// A registered call (KernelParams::sources set) skips step 1: step 3 pulls
// from every rank's input in place, and its barriers are the registered
// ones (barrier.cuh; epochs in ControlBlock::registered_epoch). Every read
// of a peer's input happens before the second barrier, so the caller may
// overwrite it once the kernel ends, and outputs over the input are safe.
#include <cuda_runtime.h>

#include <cstdint>

#include "arbiter/common/cuda/device_ops.cuh"
#include "arbiter/common/cuda/fused_epilogue.cuh"
#include "arbiter/common/cuda/kernel_launch.cuh"
#include "arbiter/common/partition.h"
#include "barrier.cuh"
#include "launch.h"

namespace arbiter::trtllm {
namespace {

using common::Epilogue;

constexpr unsigned kPullBatch = 4;

// kRegistered: a registered call (sources set). A template parameter, not a
// branch: the branch spills at the register limit.
template <arbiter_dtype kDtype, Epilogue kEpilogue, bool kRegistered>
__global__ void __launch_bounds__(common::device::kMaxThreads, 1)
    twoshot_kernel(const KernelParams p) {
  using namespace common::device;
  using V = Vector<kDtype>;
  constexpr unsigned kN = V::kElements;
  __shared__ ReductionSmem smem;
  __shared__ std::uint64_t shared_epoch;

  wait_for_previous_grid();
  if (threadIdx.x == 0) {
    shared_epoch = *reinterpret_cast<volatile std::uint64_t*>(
        kRegistered ? &p.control->registered_epoch : &p.control->barrier_epoch);
  }
  __syncthreads();
  const std::uint64_t epoch = shared_epoch;
  auto barrier = [&](std::uint64_t target) {
    if constexpr (kRegistered) {
      registered_barrier(p, target, target == epoch + 1);
    } else {
      cross_rank_barrier(p, target);
    }
  };

  const Lane lane = lane_of(p.epilogue);
  const unsigned clusters = gridDim.x / p.epilogue.cluster_size;
  const unsigned cluster = blockIdx.x / p.epilogue.cluster_size;
  const std::uint64_t row_bytes = std::uint64_t{p.epilogue.hidden} * sizeof(typename V::Bits);
  const std::uint64_t lane_bytes = std::uint64_t{lane.vector} * 16;
  char* const self = p.peers[p.rank];

  // 1. Stage in (copied calls).
  if (lane.active && !kRegistered) {
    for (std::uint32_t t = cluster; t < p.tokens; t += clusters) {
      const std::uint64_t offset = t * row_bytes + lane_bytes;
      store_vector(self + p.twoshot_input_offset + offset,
                   load_vector(static_cast<const char*>(p.input) + offset));
    }
  }
  barrier(epoch + 1);

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
            if constexpr (kRegistered) {
              v[j] = load_volatile(p.sources[q0 + j] + offset);
            } else {
              v[j] = load_volatile(p.peers[q0 + j] + p.twoshot_input_offset + offset);
            }
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
  barrier(epoch + 2);

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

  arrive(p.control, [&](ControlBlock& control) {
    if constexpr (kRegistered) {
      control.registered_epoch = epoch + 2;
    } else {
      control.barrier_epoch = epoch + 2;
    }
  });
  allow_dependent_grid();
}

}  // namespace

cudaError_t launch_twoshot(const KernelParams& params, arbiter_dtype dtype, arbiter_pattern pattern,
                           const LaunchShape& shape, cudaStream_t stream) {
  const bool registered = params.sources[0] != nullptr;
  const auto kernel = common::select_kernel<KernelParams>(
      dtype, pattern, [registered](auto d, auto e) -> common::KernelFunction<KernelParams> {
        if (registered) return twoshot_kernel<decltype(d)::value, decltype(e)::value, true>;
        return twoshot_kernel<decltype(d)::value, decltype(e)::value, false>;
      });
  return common::launch_kernel(kernel, params, shape, stream);
}

cudaError_t query_max_active_clusters(std::uint32_t cluster_size, int* clusters) {
  // The smallest of the kernels' residency, so none outgrows a wave.
  int oneshot = 0;
  int registered = 0;
  int twoshot = 0;
  int twoshot_registered = 0;
  cudaError_t e = query_oneshot_clusters(cluster_size, &oneshot);
  if (e == cudaSuccess) e = query_oneshot_registered_clusters(cluster_size, &registered);
  if (e == cudaSuccess) {
    e = common::max_active_clusters<KernelParams>(
        twoshot_kernel<ARBITER_DTYPE_BF16, Epilogue::kNormFp4, false>, cluster_size, &twoshot);
  }
  if (e == cudaSuccess) {
    e = common::max_active_clusters<KernelParams>(
        twoshot_kernel<ARBITER_DTYPE_BF16, Epilogue::kNormFp4, true>, cluster_size,
        &twoshot_registered);
  }
  *clusters = oneshot < twoshot ? oneshot : twoshot;
  if (registered < *clusters) *clusters = registered;
  if (twoshot_registered < *clusters) *clusters = twoshot_registered;
  return e;
}

}  // namespace arbiter::trtllm
