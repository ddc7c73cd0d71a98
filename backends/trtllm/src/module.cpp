// C entry points of the trtllm backend (libarbiter-trtllm.so): single-node
// fused all-reduce + residual + RMSNorm (+ FP8 / NVFP4) over peer-mapped
// memory, one-shot (Lamport) or two-shot.
//
// run() checks the call on the host (guards.h), picks the launch shape
// (launch_config.h) and enqueues one kernel. It allocates nothing and never
// synchronises, so calls are capturable in CUDA graphs and replayable. Every
// rank must make the same calls in the same order with the same shapes, as
// for any collective. Every entry point catches everything and maps it to an
// ABI status code.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "arbiter/common/abi_entry.h"
#include "arbiter/common/cuda_host.h"
#include "arbiter/common/status.h"
#include "arbiter/trtllm/guards.h"
#include "arbiter/trtllm/launch_config.h"
#include "arbiter_backend.h"
#include "launch.h"
#include "workspace.h"

#ifndef ARBITER_TRTLLM_KERNEL_ARCHS
#define ARBITER_TRTLLM_KERNEL_ARCHS ""
#endif

namespace arbiter::trtllm {
namespace {

using common::cuda_message;
using common::Status;

// Clusters, distributed shared memory and griddepcontrol need SM90.
constexpr std::uint32_t kMinCapability = 90;
constexpr std::uint64_t kWorldSizeMask = (1ull << 2) | (1ull << 4) | (1ull << 8) | (1ull << 16);
constexpr std::uint32_t kDtypeMask =
    (1u << ARBITER_DTYPE_FP16) | (1u << ARBITER_DTYPE_BF16) | (1u << ARBITER_DTYPE_FP32);

thread_local std::string t_last_error;

std::int32_t report(const Status& s) { return common::report(t_last_error, "trtllm", s); }

std::uint32_t patterns_for(std::uint32_t capability) {
  std::uint32_t mask = (1u << ARBITER_PATTERN_ALLREDUCE) |
                       (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM) |
                       (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8);
  if (capability >= kMinNvfp4Capability) mask |= 1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  return mask;
}

std::int32_t probe_impl(const arbiter_probe_args* args, arbiter_backend_caps* caps) {
  if (args == nullptr || caps == nullptr) {
    return report(Status(ARBITER_INVALID_ARGUMENT, "probe: args and caps must not be NULL"));
  }
  std::uint32_t capability = 0;
  if (Status s = common::probe_gpu(*args, kMinCapability, ARBITER_TRTLLM_KERNEL_ARCHS, &capability);
      !s.ok()) {
    return report(s);
  }
  *caps = arbiter_backend_caps{};
  caps->device_kind = ARBITER_DEVICE_GPU;
  caps->capability = capability;
  caps->world_size_mask = kWorldSizeMask;
  caps->dtype_mask = kDtypeMask;
  caps->pattern_mask = patterns_for(capability);
  caps->algorithm_mask = (1u << ARBITER_ALGORITHM_ONESHOT) | (1u << ARBITER_ALGORITHM_TWOSHOT);
  caps->flags = ARBITER_CAPS_SINGLE_NODE_ONLY;
  return ARBITER_OK;
}

std::int32_t create_impl(const arbiter_oob* oob, const arbiter_workspace_spec* spec,
                         arbiter_workspace** out) {
  if (out == nullptr) return report(Status(ARBITER_INVALID_ARGUMENT, "out is NULL"));
  *out = nullptr;
  if (oob == nullptr || spec == nullptr || oob->allgather == nullptr || oob->barrier == nullptr) {
    return report(Status(ARBITER_INVALID_ARGUMENT, "oob, its functions and spec must not be NULL"));
  }
  auto* ws = new arbiter_workspace();
  if (Status s = create_workspace(*oob, *spec, *ws); !s.ok()) {
    delete ws;
    return report(s);
  }
  *out = ws;
  return ARBITER_OK;
}

std::int32_t run_impl(arbiter_workspace* ws, const arbiter_allreduce_args* args, void* stream) {
  if (ws == nullptr) return report(Status(ARBITER_INVALID_ARGUMENT, "workspace is NULL"));
  if (Status s = check_call(ws->layout, args, ws->capability); !s.ok()) return report(s);
  const arbiter_allreduce_args& a = *args;

  LaunchRequest request;
  request.tokens = a.tokens;
  request.hidden = a.hidden;
  request.dtype = a.dtype;
  request.world_size = ws->world_size;
  request.algorithm = a.algorithm;
  request.pattern = a.pattern;
  const Result<LaunchConfig> chosen = choose_launch_config(request, ws->limits);
  if (!chosen.ok()) return report(chosen.status());
  const LaunchConfig& config = chosen.value();

  KernelParams p;
  for (std::uint32_t q = 0; q < ws->world_size; ++q) p.peers[q] = ws->peers[q];
  p.control = reinterpret_cast<ControlBlock*>(ws->base + ws->layout.control_offset);
  p.rank = ws->rank;
  p.world_size = ws->world_size;
  p.tokens = a.tokens;
  p.hidden = a.hidden;
  p.flags_offset = ws->layout.flags_offset;
  p.oneshot_offset = ws->layout.oneshot_offset;
  p.stage_bytes = ws->layout.stage_bytes;
  p.slot_bytes = ws->layout.slot_bytes;
  p.twoshot_input_offset = ws->layout.twoshot_input_offset();
  p.twoshot_sum_offset = ws->layout.twoshot_sum_offset();
  p.spin_timeout_ns = ws->spin_timeout_ns;
  p.input = a.input;
  p.epilogue = common::make_epilogue_params(a, config.threads_per_token, config.cluster_size);

  LaunchShape shape;
  shape.grid_blocks = config.grid_blocks;
  shape.cta_threads = config.cta_threads;
  shape.cluster_size = config.cluster_size;
  shape.pdl = (a.flags & ARBITER_RUN_PDL) != 0;

  common::DeviceScope scope;
  if (const cudaError_t e = scope.use(ws->device); e != cudaSuccess) {
    return report(Status(ARBITER_INTERNAL, cuda_message("cudaSetDevice", e)));
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const cudaError_t e = a.algorithm == ARBITER_ALGORITHM_ONESHOT
                            ? launch_oneshot(p, a.dtype, a.pattern, shape, s)
                            : launch_twoshot(p, a.dtype, a.pattern, shape, s);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return report(Status(ARBITER_INTERNAL, cuda_message("kernel launch", e)));
  }
  return ARBITER_OK;
}

// ---------------------------------------------------------------- ABI

// The ABI entry points (arbiter/common/abi_entry.h wraps each).
struct Module {
  static constexpr const char* kName = "trtllm";
  static std::string& last_error() { return t_last_error; }
  static std::int32_t probe(const arbiter_probe_args* args, arbiter_backend_caps* caps) {
    return probe_impl(args, caps);
  }
  static std::int32_t create(const arbiter_oob* oob, const arbiter_workspace_spec* spec,
                             arbiter_workspace** out) {
    return create_impl(oob, spec, out);
  }
  static std::uint64_t max_message_bytes(const arbiter_workspace* ws, arbiter_algorithm a) {
    return per_call_capacity(ws->layout, a);
  }
  static std::int32_t run(arbiter_workspace* ws, const arbiter_allreduce_args* args, void* stream) {
    return run_impl(ws, args, stream);
  }
  static void destroy(arbiter_workspace& ws) { destroy_workspace(ws); }
};

}  // namespace
}  // namespace arbiter::trtllm

extern "C" __attribute__((visibility("default"))) const arbiter_backend_v1_t arbiter_backend_v1 =
    arbiter::common::BackendEntries<arbiter::trtllm::Module>::table();
