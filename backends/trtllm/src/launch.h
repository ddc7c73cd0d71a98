// Host entry points into the trtllm kernels (the .cu files). They only
// enqueue: no allocation, no synchronisation, so every one of them may run
// during CUDA-graph capture. Checks on the call belong to guards.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "arbiter/common/cuda/kernel_launch_shape.h"
#include "arbiter_backend.h"
#include "kernel_params.h"

namespace arbiter::trtllm {

using common::LaunchShape;

cudaError_t launch_oneshot(const KernelParams& params, arbiter_dtype dtype, arbiter_pattern pattern,
                           const LaunchShape& shape, cudaStream_t stream);

// A registered one-shot call (params.sources set): oneshot_registered.cu.
cudaError_t launch_oneshot_registered(const KernelParams& params, arbiter_dtype dtype,
                                      arbiter_pattern pattern, const LaunchShape& shape,
                                      cudaStream_t stream);

// Copied or registered (params.sources set) two-shot.
cudaError_t launch_twoshot(const KernelParams& params, arbiter_dtype dtype, arbiter_pattern pattern,
                           const LaunchShape& shape, cudaStream_t stream);

// Fills `bytes` (a multiple of 16) at `base` with the -0.0 pattern of dtype.
cudaError_t launch_fill_sentinel(void* base, std::uint64_t bytes, arbiter_dtype dtype,
                                 cudaStream_t stream);

// Clusters of `cluster_size` CTAs of 1024 threads the device keeps resident
// at once, for the kernels' resource footprint (cudaOccupancyMaxActiveClusters).
cudaError_t query_max_active_clusters(std::uint32_t cluster_size, int* clusters);

// The same for the one-shot kernels alone (oneshot.cu, and
// oneshot_registered.cu; the above takes the smallest of all kernels).
cudaError_t query_oneshot_clusters(std::uint32_t cluster_size, int* clusters);
cudaError_t query_oneshot_registered_clusters(std::uint32_t cluster_size, int* clusters);

}  // namespace arbiter::trtllm
