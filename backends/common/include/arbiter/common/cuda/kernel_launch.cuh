// Turning a runtime (dtype, pattern) into a kernel instantiation, and the
// launch itself with its attributes (cluster shape, PDL). Shared by the GPU
// modules; each passes its own kernel parameter struct.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "arbiter/common/cuda/epilogue_params.h"
#include "arbiter/common/cuda/kernel_launch_shape.h"
#include "arbiter_backend.h"

namespace arbiter::common {

template <typename Params>
using KernelFunction = void (*)(Params);

// Picks Kernel<dtype, epilogue> through `pick`, a generic lambda taking the
// two as integral constants. NULL for combinations that do not exist (NVFP4
// in fp32; the guards refuse it first).
template <typename Params, typename Pick>
KernelFunction<Params> select_kernel(arbiter_dtype dtype, arbiter_pattern pattern, Pick pick) {
  auto by_pattern = [&](auto d) -> KernelFunction<Params> {
    constexpr arbiter_dtype kDtype = decltype(d)::value;
    switch (pattern) {
      case ARBITER_PATTERN_ALLREDUCE:
        return pick(d, std::integral_constant<Epilogue, Epilogue::kAllreduce>{});
      case ARBITER_PATTERN_RESIDUAL_RMSNORM:
        return pick(d, std::integral_constant<Epilogue, Epilogue::kNorm>{});
      case ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8:
        return pick(d, std::integral_constant<Epilogue, Epilogue::kNormFp8>{});
      case ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4:
        if constexpr (kDtype != ARBITER_DTYPE_FP32) {
          return pick(d, std::integral_constant<Epilogue, Epilogue::kNormFp4>{});
        }
        return nullptr;
    }
    return nullptr;
  };
  switch (dtype) {
    case ARBITER_DTYPE_FP16:
      return by_pattern(std::integral_constant<arbiter_dtype, ARBITER_DTYPE_FP16>{});
    case ARBITER_DTYPE_BF16:
      return by_pattern(std::integral_constant<arbiter_dtype, ARBITER_DTYPE_BF16>{});
    case ARBITER_DTYPE_FP32:
      return by_pattern(std::integral_constant<arbiter_dtype, ARBITER_DTYPE_FP32>{});
  }
  return nullptr;
}

template <typename Params>
cudaError_t launch_kernel(KernelFunction<Params> kernel, const Params& params,
                          const LaunchShape& shape, cudaStream_t stream) {
  if (kernel == nullptr) return cudaErrorInvalidDeviceFunction;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(shape.grid_blocks);
  config.blockDim = dim3(shape.cta_threads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (shape.cluster_size > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = shape.cluster_size;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  if (shape.pdl) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, params);
}

// Clusters of `cluster_size` CTAs of 1024 threads that the device keeps
// resident at once for `kernel`'s footprint (cudaOccupancyMaxActiveClusters).
template <typename Params>
cudaError_t max_active_clusters(KernelFunction<Params> kernel, std::uint32_t cluster_size,
                                int* clusters) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(cluster_size);
  config.blockDim = dim3(1024);
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster_size;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
}

}  // namespace arbiter::common
