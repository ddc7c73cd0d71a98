// The cross-rank barriers of the trtllm kernels (workspace_layout.h, barrier
// flags). Each is per CTA index: CTA b of every rank meets CTA b of the
// others, which is enough because every rank launches the same grid and CTA
// b handles the same tokens and lanes on every rank.
#pragma once

#include <cstdint>
#include <cstdio>

#include "arbiter/common/cuda/device_ops.cuh"
#include "kernel_params.h"

namespace arbiter::trtllm {

// Every rank's CTA blockIdx.x has reached epoch `target`; its stores before
// the barrier are visible to the CTAs that pass it. After an abort (the
// host's flag) a waiting thread stores the epoch into its own word (Spin),
// so the barrier ends; every thread still passes the __syncthreads.
__device__ inline void cross_rank_barrier(const KernelParams& p, std::uint64_t target) {
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

// The barrier of a registered call: as cross_rank_barrier, on the
// registered flags, whose words are {epoch, key}. The key is stored before
// the epoch (the release orders it), so a CTA that sees the epoch sees the
// key of the same call: a peer is never more than one barrier ahead, and
// both barriers of a call carry its key. With `check_key` (the call's first
// barrier) a peer whose key differs (another allocation or offset, which
// would read this rank's memory where its input is not; or another shape or
// algorithm, which would make another number of barriers: registered.h,
// call_key) stops the kernel with a message, as a lost peer does.
__device__ inline void registered_barrier(const KernelParams& p, std::uint64_t target,
                                          bool check_key) {
  using namespace common::device;
  __syncthreads();
  for (std::uint32_t q = threadIdx.x; q < p.world_size; q += blockDim.x) {
    auto word = [&](std::uint32_t rank, std::uint32_t from) {
      return reinterpret_cast<std::uint64_t*>(p.peers[rank] + p.registered_flags_offset) +
             (std::uint64_t{blockIdx.x} * p.world_size + from) * 2;
    };
    std::uint64_t* const theirs = word(q, p.rank);
    store_relaxed_system(theirs + 1, p.call_key);
    store_release_system(theirs, target);
    std::uint64_t* const mine = word(p.rank, q);
    Spin spin("trtllm");
    while (load_acquire_system(mine) < target) {
      spin.again(
          p,
          [&] {
            store_relaxed_system(mine + 1, p.call_key);
            store_release_system(mine, target);
          },
          "registered barrier", q, blockIdx.x);
    }
    if (check_key) {
      const std::uint64_t key = load_relaxed_system(mine + 1);
      if (key != p.call_key) {
        printf(
            "arbiter trtllm: rank %u's registered call has key %llx, rank %u's %llx: the ranks "
            "made different registered calls (another allocation or offset, token count, "
            "hidden size, algorithm, pattern or dtype). Aborting the kernel.\n",
            q, static_cast<unsigned long long>(key), p.rank,
            static_cast<unsigned long long>(p.call_key));
        __trap();
      }
    }
  }
  __syncthreads();
}

}  // namespace arbiter::trtllm
