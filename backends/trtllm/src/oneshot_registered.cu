// One-shot fused all-reduce of a registered call (registered.h): every rank
// reads every peer's input in place, from the peers' registered memory, and
// sums it; nothing is pushed, staged or cleared, and the message has no
// per-call capacity (the workspace's stages are not used).
//
// Per call:
//  1. barrier (registered flags): every rank's kernel has started, so its
//     input, written before the launch, is visible; the ranks' call keys
//     must agree (barrier.cuh);
//  2. per token: load the vector of every rank's input in rank order, sum
//     in fp32 (the bits of the copied one-shot: it only turns -0.0 into
//     +0.0, which a sum starting at +0.0 does anyway), apply the epilogue;
//  3. barrier: every peer has read this rank's input, so the caller may
//     overwrite it once the kernel ends.
// When an output is this rank's input (in place), a rank must not write a
// token's outputs before every peer has read that token: the tokens then go
// in rounds of one per cluster, with a barrier between the sums and the
// epilogue of each round (epochs +2 .. +1 + rounds) instead of the one at
// the end (epoch +1 + rounds).
#include <cuda_runtime.h>

#include <cstdint>

#include "arbiter/common/cuda/device_ops.cuh"
#include "arbiter/common/cuda/fused_epilogue.cuh"
#include "arbiter/common/cuda/kernel_launch.cuh"
#include "barrier.cuh"
#include "launch.h"

namespace arbiter::trtllm {
namespace {

using common::Epilogue;

constexpr unsigned kPullBatch = 4;

// kInPlace: KernelParams::input_overwritten (a template parameter, since
// the branch spills at the register limit).
template <arbiter_dtype kDtype, Epilogue kEpilogue, bool kInPlace>
__global__ void __launch_bounds__(common::device::kMaxThreads, 1)
    oneshot_registered_kernel(const KernelParams p) {
  using namespace common::device;
  using V = Vector<kDtype>;
  constexpr unsigned kN = V::kElements;
  __shared__ ReductionSmem smem;
  __shared__ std::uint64_t shared_epoch;

  wait_for_previous_grid();
  if (threadIdx.x == 0) {
    shared_epoch = *reinterpret_cast<volatile std::uint64_t*>(&p.control->registered_epoch);
  }
  __syncthreads();
  const std::uint64_t epoch = shared_epoch;

  const Lane lane = lane_of(p.epilogue);
  const unsigned clusters = gridDim.x / p.epilogue.cluster_size;
  const unsigned cluster = blockIdx.x / p.epilogue.cluster_size;
  const std::uint64_t row_bytes = std::uint64_t{p.epilogue.hidden} * sizeof(typename V::Bits);
  const std::uint64_t lane_bytes = std::uint64_t{lane.vector} * 16;

  registered_barrier(p, epoch + 1, /*check_key=*/true);

  const std::uint32_t rounds = (p.tokens + clusters - 1) / clusters;
  for (std::uint32_t round = 0; round < rounds; ++round) {
    const std::uint32_t t = round * clusters + cluster;  // the same on every CTA of a cluster
    float sum[kN];
#pragma unroll
    for (unsigned k = 0; k < kN; ++k) sum[k] = 0.0f;
    if (lane.active && t < p.tokens) {
      const std::uint64_t offset = t * row_bytes + lane_bytes;
      for (std::uint32_t q0 = 0; q0 < p.world_size; q0 += kPullBatch) {
        uint4 v[kPullBatch];
#pragma unroll
        for (unsigned j = 0; j < kPullBatch; ++j) {
          if (q0 + j < p.world_size) v[j] = load_volatile(p.sources[q0 + j] + offset);
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
    }
    if constexpr (kInPlace) registered_barrier(p, epoch + 2 + round, false);
    if (t < p.tokens) apply_epilogue<kDtype, kEpilogue>(p.epilogue, t, lane, sum, smem);
  }
  // Both variants end at the same epoch, so ranks may differ in whether
  // they write in place: a rank's single end barrier (after all its reads)
  // stores what satisfies every round barrier of an in-place peer, and
  // waits until that peer has arrived at its last round (after all its
  // reads).
  const std::uint64_t last = epoch + 1 + rounds;
  if constexpr (!kInPlace) registered_barrier(p, last, false);

  arrive(p.control, [&](ControlBlock& control) { control.registered_epoch = last; });
  allow_dependent_grid();
}

}  // namespace

cudaError_t launch_oneshot_registered(const KernelParams& params, arbiter_dtype dtype,
                                      arbiter_pattern pattern, const LaunchShape& shape,
                                      cudaStream_t stream) {
  const bool in_place = params.input_overwritten != 0;
  const auto kernel = common::select_kernel<KernelParams>(
      dtype, pattern, [in_place](auto d, auto e) -> common::KernelFunction<KernelParams> {
        if (in_place)
          return oneshot_registered_kernel<decltype(d)::value, decltype(e)::value, true>;
        return oneshot_registered_kernel<decltype(d)::value, decltype(e)::value, false>;
      });
  return common::launch_kernel(kernel, params, shape, stream);
}

cudaError_t query_oneshot_registered_clusters(std::uint32_t cluster_size, int* clusters) {
  // Both variants (in place or not): the smaller residency.
  int in_place = 0;
  int apart = 0;
  cudaError_t e = common::max_active_clusters<KernelParams>(
      oneshot_registered_kernel<ARBITER_DTYPE_BF16, Epilogue::kNormFp4, true>, cluster_size,
      &in_place);
  if (e == cudaSuccess) {
    e = common::max_active_clusters<KernelParams>(
        oneshot_registered_kernel<ARBITER_DTYPE_BF16, Epilogue::kNormFp4, false>, cluster_size,
        &apart);
  }
  *clusters = in_place < apart ? in_place : apart;
  return e;
}

}  // namespace arbiter::trtllm
