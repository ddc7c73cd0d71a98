// C entry points of the trtllm backend (libarbiter-trtllm.so): single-node
// fused all-reduce + residual + RMSNorm (+ FP8 / NVFP4) over peer-mapped
// memory, one-shot (Lamport) or two-shot.
//
// run() checks the call on the host (guards.h), then enqueues one kernel
// (arbiter/common/fused_module.h picks the launch shape). It allocates nothing and never
// synchronises, so calls are capturable in CUDA graphs and replayable. Every
// rank must make the same calls in the same order with the same shapes, as
// for any collective. arbiter/common/abi_entry.h holds the entry points'
// argument checks and exception boundary.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "arbiter/common/abi_entry.h"
#include "arbiter/common/fault_injection.h"
#include "arbiter/common/fused_module.h"
#include "arbiter/common/status.h"
#include "arbiter/trtllm/guards.h"
#include "arbiter_backend.h"
#include "launch.h"
#include "workspace.h"

#ifndef ARBITER_TRTLLM_KERNEL_ARCHS
#define ARBITER_TRTLLM_KERNEL_ARCHS ""
#endif

namespace arbiter::trtllm {
namespace {

using common::Status;

// Clusters, distributed shared memory and griddepcontrol need SM90.
constexpr std::uint32_t kMinCapability = 90;
constexpr std::uint64_t kWorldSizeMask = (1ull << 2) | (1ull << 4) | (1ull << 8) | (1ull << 16);

struct Module {
  static constexpr const char* kName = "trtllm";

  static Status probe(const arbiter_probe_args& args, arbiter_backend_caps* caps) {
    std::uint32_t capability = 0;
    if (Status s =
            common::probe_gpu(args, kMinCapability, ARBITER_TRTLLM_KERNEL_ARCHS, &capability);
        !s.ok()) {
      return s;
    }
    *caps = common::fused_gpu_caps(capability, ARBITER_TRTLLM_KERNEL_ARCHS, kWorldSizeMask,
                                   ARBITER_CAPS_SINGLE_NODE_ONLY);
    return Status();
  }

  static Status create_workspace(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                                 arbiter_workspace& ws) {
    return trtllm::create_workspace(oob, spec, ws);
  }

  static std::uint64_t max_message_bytes(const arbiter_workspace& ws, arbiter_algorithm a) {
    return per_call_capacity(ws.layout, a);
  }

  static Status run(arbiter_workspace& ws, const arbiter_allreduce_args* args, void* stream) {
    const std::uint64_t call = ws.calls++;
    if (ws.abort.raised()) return common::aborted_call();
    if (Status s = check_call(ws.layout, args, ws.capability); !s.ok()) return s;
    // Test-only: a rank that never launches (its peers' kernels wait for it).
    if (common::FaultInjection::get().at("gpu.call.start", static_cast<int>(ws.rank), call)) {
      return Status();
    }
    const arbiter_allreduce_args& a = *args;
    KernelParams p;
    for (std::uint32_t q = 0; q < ws.world_size; ++q) p.peers[q] = ws.peers[q];
    p.control = reinterpret_cast<ControlBlock*>(ws.base + ws.layout.control_offset);
    p.rank = ws.rank;
    p.world_size = ws.world_size;
    p.tokens = a.tokens;
    p.flags_offset = ws.layout.flags_offset;
    p.oneshot_offset = ws.layout.oneshot_offset;
    p.stage_bytes = ws.layout.stage_bytes;
    p.slot_bytes = ws.layout.slot_bytes;
    p.twoshot_input_offset = ws.layout.twoshot_input_offset();
    p.twoshot_sum_offset = ws.layout.twoshot_sum_offset();
    p.spin_timeout_ns = ws.spin_timeout_ns;
    p.abort_flag = ws.abort.device();
    p.input = a.input;
    return common::launch_fused(ws.device, a, ws.world_size, ws.limits, p, launch_oneshot,
                                launch_twoshot, stream);
  }

  // What workspace_create() allocates for `spec`, from the same layout
  // (make_workspace_layout) that prepare() allocates.
  static Status footprint(const arbiter_workspace_spec& spec, arbiter_footprint* out) {
    if (spec.nodes > 1) {
      return Status(ARBITER_UNSUPPORTED, "the ranks span " + std::to_string(spec.nodes) +
                                             " nodes; trtllm is single-node (use mnnvl or nccl)");
    }
    auto layout = make_workspace_layout(spec.world_size, spec.max_message_bytes, spec.dtype,
                                        spec.max_tokens, spec.hidden);
    if (!layout.ok()) return layout.status();
    arbiter_footprint f{};
    // One cudaMalloc that every peer maps through CUDA IPC: 3 Lamport
    // stages of world size x slot, the two-shot scratch, flags, control.
    f.shared_bytes = layout.value().total_bytes;
    f.host_bytes = sizeof(std::uint32_t);  // the host-mapped abort flag
    for (int a = 0; a < ARBITER_ALGORITHM_COUNT; ++a) {
      f.max_message_bytes[a] = per_call_capacity(layout.value(), static_cast<arbiter_algorithm>(a));
    }
    f.note = "";
    *out = f;
    return Status();
  }

  static void destroy(arbiter_workspace& ws) { destroy_workspace(ws); }

  static void abort(arbiter_workspace& ws) { ws.abort.raise(); }
};

}  // namespace
}  // namespace arbiter::trtllm

extern "C" __attribute__((visibility("default"))) const arbiter_backend_v1_t arbiter_backend_v1 =
    arbiter::common::BackendEntries<arbiter::trtllm::Module>::table();
extern "C" __attribute__((visibility("default")))
const arbiter_backend_faults_v1_t arbiter_backend_v1_faults =
    arbiter::common::BackendEntries<arbiter::trtllm::Module>::faults();
extern "C" __attribute__((visibility("default")))
const arbiter_backend_footprint_v1_t arbiter_backend_v1_footprint =
    arbiter::common::BackendEntries<arbiter::trtllm::Module>::footprint_table();
