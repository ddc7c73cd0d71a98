// Launch configuration of the fused all-reduce kernels (trtllm, mnnvl): how
// one token is spread over the threads of a cluster, and how many CTAs run.
//
// Each thread moves one 16-byte vector of a token (8 fp16/bf16 or 4 fp32
// elements), so a token needs threads_per_token = hidden / vector_elements
// threads. They are spread over a cluster of 1, 2, 4 or 8 CTAs (a power of
// two: a cluster of 7 gave wrong NVFP4 output in FlashInfer #2557) of
// cta_threads threads each; thread t of CTA c in the cluster owns vector
// c * cta_threads + t of the token. Where cluster_size * cta_threads exceeds
// threads_per_token the trailing threads own nothing (idle_threads): they
// load nothing, add 0 to the sum of squares, and still take part in every
// __syncthreads / cluster.sync.
//
// cta_threads need not be a multiple of 32 (hidden 2880 in bf16 gives 180):
// the block reduction must be correct for a partial last warp (FlashInfer
// #3880: a 180-thread sum returned 192). Shuffle only among the lanes that
// exist (__activemask / a mask built from blockDim.x), and let warp 0 read
// exactly warps_per_cta partials from shared memory. When cluster_size > 1 a
// token's sum of squares is completed across the cluster through distributed
// shared memory (dsmem_reduction).
//
// One wave at most: the grid never exceeds the CTAs that can be resident at
// once (the control block's arrival counter waits for every CTA), nor
// kMaxGridBlocks (the size of the modules' per-CTA flag arrays). Clusters loop over tokens with a
// stride of grid_clusters.
//
// Every rank must pass identical inputs and so get an identical
// configuration (a rank-dependent choice deadlocks). The choice is a pure
// function of its inputs.
#pragma once

#include <cstdint>
#include <string>

#include "arbiter/common/host_device.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::common {

inline constexpr std::uint32_t kVectorBytes = 16;
// Grid blocks at most: the modules size their per-CTA flag arrays for it.
inline constexpr std::uint32_t kMaxGridBlocks = 2048;
inline constexpr std::uint32_t kMaxClusterSize = 8;
inline constexpr std::uint32_t kMaxCtaThreads = 1024;
// A token is only spread over more CTAs while each keeps at least this many.
inline constexpr std::uint32_t kMinSpreadCtaThreads = 128;
inline constexpr std::uint32_t kWarpSize = 32;
inline constexpr std::uint32_t kNvfp4BlockElements = 16;

// Elements of `dtype` in one 16-byte vector: 8 for fp16/bf16, 4 for fp32.
ARBITER_HD constexpr std::uint32_t vector_elements(arbiter_dtype dtype) {
  return kVectorBytes / static_cast<std::uint32_t>(dtype_size(dtype));
}

// The largest hidden size a kernel can cover: 8 CTAs x 1024 threads x one
// vector each (65536 for 16-bit types, 32768 for fp32).
ARBITER_HD constexpr std::uint32_t max_hidden(arbiter_dtype dtype) {
  return kMaxClusterSize * kMaxCtaThreads * vector_elements(dtype);
}

// What the launcher knows about the device and the kernel. All of it comes
// from CUDA queries the launcher makes; tests pass numbers.
struct DeviceLimits {
  std::uint32_t sm_count = 0;
  // min(cudaFuncAttributes::maxThreadsPerBlock, 1024) for the kernel.
  std::uint32_t max_threads_per_block = kMaxCtaThreads;
  // CTAs of the kernel resident on one SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
  // REQUIRES: queried at 1024 threads per block (a lower bound for every
  // block size this file picks), or at the chosen cta_threads in a second pass.
  std::uint32_t resident_blocks_per_sm = 1;
  // Largest cluster the device launches (1 below SM90: no clusters).
  // Rounded down to a power of two and to kMaxClusterSize.
  std::uint32_t max_cluster_size = 1;
  // Clusters resident at once (cudaOccupancyMaxActiveClusters queried at
  // max_cluster_size); 0 when not known, then only sm_count x
  // resident_blocks_per_sm bounds. Taken as the bound for every cluster size
  // considered, which is conservative for the smaller ones.
  std::uint32_t max_active_clusters = 0;
  // Clusters of 1, 2, 4 and 8 CTAs (index log2 of the size) resident at
  // once, where known (0: not known). Tighter than max_active_clusters for
  // the smaller sizes; the module fills it from per-size occupancy queries.
  std::uint32_t active_clusters[4] = {0, 0, 0, 0};
};

struct LaunchRequest {
  std::uint32_t tokens = 0;
  std::uint32_t hidden = 0;
  arbiter_dtype dtype = ARBITER_DTYPE_BF16;
  std::uint32_t world_size = 0;
  arbiter_algorithm algorithm = ARBITER_ALGORITHM_ONESHOT;
  arbiter_pattern pattern = ARBITER_PATTERN_ALLREDUCE;
};

struct LaunchConfig {
  std::uint32_t vector_elements = 0;    // elements per thread (one 16-byte vector)
  std::uint32_t threads_per_token = 0;  // hidden / vector_elements
  std::uint32_t cluster_size = 1;       // CTAs per token: 1, 2, 4 or 8
  std::uint32_t cta_threads = 0;        // blockDim.x; not always a multiple of 32
  std::uint32_t warps_per_cta = 0;      // ceil(cta_threads / 32)
  bool partial_warp = false;            // cta_threads % 32 != 0
  std::uint32_t idle_threads = 0;       // cluster_size * cta_threads - threads_per_token
  bool dsmem_reduction = false;         // cluster_size > 1
  std::uint32_t wave_blocks = 0;        // CTAs resident at once (cluster multiple)
  std::uint32_t grid_blocks = 0;        // gridDim.x: a multiple of cluster_size
  std::uint32_t grid_clusters = 0;      // grid_blocks / cluster_size
};

namespace detail {

inline std::uint32_t floor_power_of_two(std::uint32_t value) {
  std::uint32_t p = 1;
  while (p * 2 <= value) p *= 2;
  return p;
}

inline std::uint32_t ceil_div(std::uint32_t a, std::uint32_t b) { return (a + b - 1) / b; }

}  // namespace detail

// Admission of a hidden size for `dtype` alone: a multiple of the vector
// width and at most max_hidden(dtype). The message names the numbers.
inline Status check_hidden(std::uint32_t hidden, arbiter_dtype dtype) {
  const std::uint32_t vec = vector_elements(dtype);
  const std::uint32_t elt = static_cast<std::uint32_t>(dtype_size(dtype));
  if (hidden == 0) return Status(ARBITER_INVALID_ARGUMENT, "hidden is 0");
  if (hidden % vec != 0) {
    return Status(ARBITER_UNSUPPORTED,
                  "hidden " + std::to_string(hidden) + " is not a multiple of " +
                      std::to_string(vec) + " (hidden x " + std::to_string(elt) +
                      " bytes must be a multiple of 16 bytes, one vector per thread)");
  }
  if (hidden > max_hidden(dtype)) {
    return Status(ARBITER_UNSUPPORTED,
                  "hidden " + std::to_string(hidden) + " exceeds the supported maximum " +
                      std::to_string(max_hidden(dtype)) + " (8 CTAs x 1024 threads x " +
                      std::to_string(vec) + " elements)");
  }
  return Status();
}

// Chooses the configuration; see the file comment. Rules, in order:
//  1. cluster = the smallest power of two <= max_cluster_size whose CTAs need
//     at most max_threads_per_block threads (cta_threads = ceil(tpt / cluster),
//     rounded up to a whole NVFP4 block of threads for the FP4 pattern so no
//     16-element block straddles two CTAs);
//  2. while the wave has room for tokens x (2 x cluster) CTAs, 2 x cluster is
//     allowed, divides the token's threads evenly and leaves CTAs of at least
//     128 threads: double the cluster (few tokens: spread each over more SMs);
//  3. grid = min(tokens x cluster, wave, kMaxGridBlocks) rounded down to a
//     multiple of cluster.
inline Result<LaunchConfig> choose_launch_config(const LaunchRequest& request,
                                                 const DeviceLimits& device) {
  using detail::ceil_div;
  if (!is_valid_dtype(request.dtype)) {
    return Status(ARBITER_UNSUPPORTED,
                  "dtype " + std::to_string(request.dtype) + " is not fp16, bf16 or fp32");
  }
  if (request.tokens == 0) return Status(ARBITER_INVALID_ARGUMENT, "tokens is 0");
  if (Status s = check_hidden(request.hidden, request.dtype); !s.ok()) return s;
  if (device.sm_count == 0 || device.resident_blocks_per_sm == 0 ||
      device.max_threads_per_block == 0) {
    return Status(ARBITER_INVALID_ARGUMENT,
                  "device limits are incomplete (sm_count " + std::to_string(device.sm_count) +
                      ", resident_blocks_per_sm " + std::to_string(device.resident_blocks_per_sm) +
                      ", max_threads_per_block " + std::to_string(device.max_threads_per_block) +
                      ")");
  }

  LaunchConfig config;
  config.vector_elements = vector_elements(request.dtype);
  config.threads_per_token = request.hidden / config.vector_elements;
  const std::uint32_t tpt = config.threads_per_token;
  const std::uint32_t max_cta =
      device.max_threads_per_block < kMaxCtaThreads ? device.max_threads_per_block : kMaxCtaThreads;
  const std::uint32_t max_cluster = detail::floor_power_of_two(
      device.max_cluster_size == 0
          ? 1
          : (device.max_cluster_size < kMaxClusterSize ? device.max_cluster_size
                                                       : kMaxClusterSize));
  // Threads per NVFP4 scale block; a CTA holds whole blocks only.
  const std::uint32_t granule = request.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4 &&
                                        kNvfp4BlockElements > config.vector_elements
                                    ? kNvfp4BlockElements / config.vector_elements
                                    : 1;
  const auto cta_threads_for = [&](std::uint32_t cluster) {
    return ceil_div(ceil_div(tpt, cluster), granule) * granule;
  };

  std::uint32_t cluster = 1;
  while (cta_threads_for(cluster) > max_cta && cluster < max_cluster) cluster *= 2;
  if (cta_threads_for(cluster) > max_cta) {
    return Status(ARBITER_UNSUPPORTED,
                  "hidden " + std::to_string(request.hidden) + " needs " + std::to_string(tpt) +
                      " threads per token, more than a cluster of " + std::to_string(max_cluster) +
                      " CTAs x " + std::to_string(max_cta) + " threads on this device");
  }

  // One wave, in whole clusters; computed for the widest cluster considered.
  const auto wave_for = [&](std::uint32_t c) {
    std::uint64_t wave = std::uint64_t{device.sm_count} * device.resident_blocks_per_sm;
    if (c > 1 && device.max_active_clusters != 0) {
      const std::uint64_t by_clusters = std::uint64_t{device.max_active_clusters} * c;
      if (by_clusters < wave) wave = by_clusters;
    }
    const std::uint32_t log2 = c >= 8 ? 3 : c >= 4 ? 2 : c >= 2 ? 1 : 0;
    if (device.active_clusters[log2] != 0) {
      const std::uint64_t by_size = std::uint64_t{device.active_clusters[log2]} * c;
      if (by_size < wave) wave = by_size;
    }
    if (wave > kMaxGridBlocks) wave = kMaxGridBlocks;
    return static_cast<std::uint32_t>(wave / c * c);
  };
  while (cluster * 2 <= max_cluster && tpt % (cluster * 2) == 0 &&
         cta_threads_for(cluster * 2) >= kMinSpreadCtaThreads &&
         std::uint64_t{request.tokens} * cluster * 2 <= wave_for(cluster * 2)) {
    cluster *= 2;
  }

  config.cluster_size = cluster;
  config.cta_threads = cta_threads_for(cluster);
  config.warps_per_cta = ceil_div(config.cta_threads, kWarpSize);
  config.partial_warp = config.cta_threads % kWarpSize != 0;
  config.idle_threads = cluster * config.cta_threads - tpt;
  config.dsmem_reduction = cluster > 1;
  config.wave_blocks = wave_for(cluster);
  if (config.wave_blocks == 0) {
    return Status(ARBITER_UNSUPPORTED, "not even one cluster of " + std::to_string(cluster) +
                                           " CTAs can be resident on this device");
  }
  const std::uint64_t wanted = std::uint64_t{request.tokens} * cluster;
  config.grid_blocks =
      wanted < config.wave_blocks ? static_cast<std::uint32_t>(wanted) : config.wave_blocks;
  config.grid_clusters = config.grid_blocks / cluster;
  return config;
}

}  // namespace arbiter::common
