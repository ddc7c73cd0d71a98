// C entry points of the mnnvl backend (libarbiter-mnnvl.so): fused
// all-reduce + residual + RMSNorm (+ FP8 / NVFP4) across the GPUs of one
// NVLink domain, one node or several (GB200/GB300 NVL72), through a
// multicast mapping; one-shot or two-shot.
//
// run() checks the call on the host (guards.h), picks the launch shape
// (arbiter/common/launch_config.h) and enqueues one kernel: no allocation,
// no synchronisation, capturable in CUDA graphs. Every rank must make the
// same calls in the same order with the same shapes.
// arbiter/common/abi_entry.h holds the entry points' argument checks and
// exception boundary.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "arbiter/common/abi_entry.h"
#include "arbiter/common/cuda/epilogue_params.h"
#include "arbiter/common/cuda/kernel_launch_shape.h"
#include "arbiter/common/cuda_host.h"
#include "arbiter/common/launch_config.h"
#include "arbiter/common/status.h"
#include "arbiter/mnnvl/guards.h"
#include "arbiter_backend.h"
#include "driver_api.h"
#include "kernels.h"
#include "workspace.h"

#ifndef ARBITER_MNNVL_KERNEL_ARCHS
#define ARBITER_MNNVL_KERNEL_ARCHS ""
#endif

namespace arbiter::mnnvl {
namespace {

using common::Status;

// Multicast (multimem), clusters and griddepcontrol need SM90.
constexpr std::uint32_t kMinCapability = 90;
// ABI v1 can say world sizes up to 63 (bit w of a 64-bit mask); the kernels
// take 64 too.
constexpr std::uint64_t kWorldSizeMask = ~std::uint64_t{3};
constexpr std::uint32_t kDtypeMask =
    (1u << ARBITER_DTYPE_FP16) | (1u << ARBITER_DTYPE_BF16) | (1u << ARBITER_DTYPE_FP32);

struct Module {
  static constexpr const char* kName = "mnnvl";

  static Status probe(const arbiter_probe_args& args, arbiter_backend_caps* caps) {
    std::uint32_t capability = 0;
    if (Status s = common::probe_gpu(args, kMinCapability, ARBITER_MNNVL_KERNEL_ARCHS, &capability);
        !s.ok()) {
      return s;
    }
    const DriverApi* api = nullptr;
    if (Status s = driver_api(&api); !s.ok()) return s;
    *caps = arbiter_backend_caps{};
    caps->device_kind = ARBITER_DEVICE_GPU;
    caps->capability = capability;
    caps->world_size_mask = kWorldSizeMask;
    caps->dtype_mask = kDtypeMask;
    caps->pattern_mask = (1u << ARBITER_PATTERN_ALLREDUCE) |
                         (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM) |
                         (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8);
    if (capability >= common::kMinNvfp4Capability) {
      caps->pattern_mask |= 1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
    }
    caps->algorithm_mask = (1u << ARBITER_ALGORITHM_ONESHOT) | (1u << ARBITER_ALGORITHM_TWOSHOT);
    caps->flags = ARBITER_CAPS_NEEDS_MULTICAST | ARBITER_CAPS_NEEDS_NVLINK;
    return Status();
  }

  static Status create_workspace(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                                 arbiter_workspace& ws) {
    // Rank 0 broadcasts the multicast handle.
    if (oob.broadcast == nullptr) {
      return Status(ARBITER_INVALID_ARGUMENT, "oob, its functions and spec must not be NULL");
    }
    return mnnvl::create_workspace(oob, spec, ws);
  }

  static std::uint64_t max_message_bytes(const arbiter_workspace& ws, arbiter_algorithm a) {
    return per_call_capacity(ws.layout, a);
  }

  static Status run(arbiter_workspace& ws, const arbiter_allreduce_args* args, void* stream) {
    if (Status s = check_call(ws.layout, args, ws.capability); !s.ok()) return s;
    const arbiter_allreduce_args& a = *args;
    const common::Result<common::LaunchConfig> chosen =
        common::launch_config_for(a, ws.world_size, ws.limits);
    if (!chosen.ok()) return chosen.status();
    const common::LaunchConfig& config = chosen.value();

    KernelParams p;
    for (std::uint32_t q = 0; q < ws.world_size; ++q) p.peers[q] = ws.peers[q];
    p.multicast = ws.multicast;
    p.control = reinterpret_cast<ControlBlock*>(ws.peers[ws.rank] + ws.layout.control_offset);
    p.rank = ws.rank;
    p.world_size = ws.world_size;
    p.tokens = a.tokens;
    p.buffers_offset = ws.layout.buffers_offset;
    p.buffer_bytes = ws.layout.buffer_bytes;
    p.broadcast_offset = ws.layout.scatter_bytes;
    p.spin_timeout_ns = ws.spin_timeout_ns;
    p.input = a.input;
    p.epilogue = common::make_epilogue_params(a, config.threads_per_token, config.cluster_size);

    const common::LaunchShape shape = common::launch_shape_of(config, a.flags);
    const auto s = static_cast<cudaStream_t>(stream);
    return common::launch_on_device(ws.device, [&] {
      return a.algorithm == ARBITER_ALGORITHM_ONESHOT
                 ? launch_oneshot(p, a.dtype, a.pattern, shape, s)
                 : launch_twoshot(p, a.dtype, a.pattern, shape, s);
    });
  }

  static void destroy(arbiter_workspace& ws) { destroy_workspace(ws); }
};

}  // namespace
}  // namespace arbiter::mnnvl

extern "C" __attribute__((visibility("default"))) const arbiter_backend_v1_t arbiter_backend_v1 =
    arbiter::common::BackendEntries<arbiter::mnnvl::Module>::table();
