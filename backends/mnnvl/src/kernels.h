// Host entry points into the mnnvl kernels (kernels.cu). They only enqueue:
// no allocation, no synchronisation, so they may run during graph capture.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "arbiter/common/cuda/kernel_launch_shape.h"
#include "arbiter_backend.h"
#include "kernel_params.h"

namespace arbiter::mnnvl {

cudaError_t launch_oneshot(const KernelParams& params, arbiter_dtype dtype, arbiter_pattern pattern,
                           const common::LaunchShape& shape, cudaStream_t stream);

cudaError_t launch_twoshot(const KernelParams& params, arbiter_dtype dtype, arbiter_pattern pattern,
                           const common::LaunchShape& shape, cudaStream_t stream);

// Fills `bytes` (a multiple of 16) at `base` with the sentinel word.
cudaError_t launch_fill_sentinel(void* base, std::uint64_t bytes, cudaStream_t stream);

// Stores (magic, rank, ~magic, ~rank) through the multicast mapping at
// offset rank x 16: every rank's own copy must then hold every rank's words.
cudaError_t launch_multicast_probe(void* multicast, std::uint32_t rank, std::uint32_t magic,
                                   cudaStream_t stream);

// Clusters of `cluster_size` 1024-thread CTAs resident at once.
cudaError_t query_max_active_clusters(std::uint32_t cluster_size, int* clusters);

}  // namespace arbiter::mnnvl
