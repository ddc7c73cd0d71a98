// What the fused GPU modules (trtllm, mnnvl) do alike at their entry points:
// whose a workspace is, the capabilities probe() reports, the host half of run() once the call is
// admitted (launch configuration, epilogue parameters, launch with the
// device current), and the order of a collective teardown. What differs
// (world sizes, flags, kernel parameters, how memory is mapped and freed)
// is passed in. Host only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "arbiter/common/abort_flag.h"
#include "arbiter/common/arch_coverage.h"
#include "arbiter/common/call_checks.h"
#include "arbiter/common/cuda/epilogue_params.h"
#include "arbiter/common/cuda/kernel_launch_shape.h"
#include "arbiter/common/cuda_host.h"
#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::common {

// Whose a fused module's workspace is; the first part of both modules'
// arbiter_workspace.
struct FusedRank {
  arbiter_oob oob{};  // the host keeps its context valid until destroy
  std::int64_t timeout_ms = 0;
  int device = 0;
  std::uint32_t capability = 0;
  std::uint32_t rank = 0;
  std::uint32_t world_size = 0;
  // Agreed by every rank (the minimum over ranks of each rank's share of its
  // GPU), so every rank picks the same launch configuration.
  DeviceLimits limits;
  std::uint64_t spin_timeout_ns = 0;  // kernel_timeout_ns()
  // Set by the module's abort() (any thread); the kernels poll it.
  AbortFlag abort;
  std::uint64_t calls = 0;  // run() calls so far (test-only fault injection)
};

// What run() returns once abort() was called on the workspace.
inline Status aborted_call() {
  return Status(ARBITER_ABORTED,
                "the workspace was aborted (abort()): its kernels stopped waiting on peers and "
                "left their outputs unspecified; destroy it and create a new one");
}

// A fused module's caps on a device of `capability` (major * 10 + minor)
// with kernels built for `archs`: every dtype, one-shot and two-shot, every
// pattern (NVFP4 from capability 100 on, as check_nvfp4 admits it, where the
// build has an architecture from 100 on). Both fused modules accept ranks of
// several processes on one GPU in the shared-GPU test mode (rank_hello.h).
inline arbiter_backend_caps fused_gpu_caps(std::uint32_t capability, const char* archs,
                                           std::uint64_t world_size_mask, std::uint32_t flags) {
  arbiter_backend_caps caps{};
  caps.device_kind = ARBITER_DEVICE_GPU;
  caps.capability = capability;
  caps.world_size_mask = world_size_mask;
  caps.dtype_mask =
      (1u << ARBITER_DTYPE_FP16) | (1u << ARBITER_DTYPE_BF16) | (1u << ARBITER_DTYPE_FP32);
  caps.pattern_mask = (1u << ARBITER_PATTERN_ALLREDUCE) | (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM) |
                      (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8);
  if (capability >= kMinNvfp4Capability && nvfp4_kernel_built_for(capability, archs)) {
    caps.pattern_mask |= 1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  }
  caps.algorithm_mask = (1u << ARBITER_ALGORITHM_ONESHOT) | (1u << ARBITER_ALGORITHM_TWOSHOT);
  caps.flags = flags | ARBITER_CAPS_SHARES_GPU | ARBITER_CAPS_RESIDUAL_OPTIONAL;
  return caps;
}

// A module's host entry into one of its kernels (one-shot or two-shot).
template <typename KernelParams>
using FusedLauncher = cudaError_t (*)(const KernelParams&, arbiter_dtype, arbiter_pattern,
                                      const LaunchShape&, cudaStream_t);

// Enqueues an admitted call on `stream`: chooses its launch configuration on
// `world_size` ranks within `limits`, completes `params` with the epilogue
// parameters and calls `oneshot` or `twoshot` (as the call's algorithm
// says) with `device` current. Allocates nothing and never synchronises.
template <typename KernelParams>
Status launch_fused(int device, const arbiter_allreduce_args& a, std::uint32_t world_size,
                    const DeviceLimits& limits, KernelParams& params,
                    FusedLauncher<KernelParams> oneshot, FusedLauncher<KernelParams> twoshot,
                    void* stream) {
  const Result<LaunchConfig> chosen = launch_config_for(a, world_size, limits);
  if (!chosen.ok()) return chosen.status();
  const LaunchConfig& config = chosen.value();
  params.epilogue = make_epilogue_params(a, config.threads_per_token, config.cluster_size);
  const LaunchShape shape = launch_shape_of(config, a.flags);
  const FusedLauncher<KernelParams> launch =
      a.algorithm == ARBITER_ALGORITHM_ONESHOT ? oneshot : twoshot;
  return launch_on_device(device, [&] {
    return launch(params, a.dtype, a.pattern, shape, static_cast<cudaStream_t>(stream));
  });
}

// The collective teardown of a peer-mapped workspace: this rank's kernels
// finish, then every rank's (nobody touches the group's memory any more);
// `unmap` drops this rank's mappings of its peers' memory; once every rank
// has done so, `free_own` frees this rank's own. Never fails: a lost peer
// only shortens the barriers (each ends at timeout_ms). After an abort
// (`local`) the teardown waits on no peer: this rank's kernels have stopped
// waiting (the abort flag), so it unmaps and frees at once. A live peer
// whose kernel still runs must be aborted too (the runtime aborts every
// workspace after a fault; a watchdog calls abort() on each rank), or its
// stores may reach memory this rank freed.
template <typename Unmap, typename FreeOwn>
void destroy_peer_mapped(const arbiter_oob& oob, std::int64_t timeout_ms, int device, Unmap unmap,
                         FreeOwn free_own, bool local = false) {
  DeviceScope scope;
  scope.use(device);
  cudaDeviceSynchronize();
  if (!local) oob.barrier(oob.ctx, timeout_ms);
  unmap();
  if (!local) oob.barrier(oob.ctx, timeout_ms);
  free_own();
  cudaGetLastError();
}

}  // namespace arbiter::common
