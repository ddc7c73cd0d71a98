// C entry points of the trtllm backend (libarbiter-trtllm.so): single-node
// fused all-reduce + residual + RMSNorm (+ FP8 / NVFP4) over peer-mapped
// memory, one-shot (Lamport) or two-shot.
//
// run() checks the call on the host (guards.h), then enqueues one kernel
// (arbiter/common/fused_module.h picks the launch shape). It allocates nothing and never
// synchronises, so calls are capturable in CUDA graphs and replayable. Every
// rank must make the same calls in the same order with the same shapes, as
// for any collective. run_registered() (ABI v2) is the same for an input in
// the workspace's registered memory (registered.h): the peers' inputs are
// read in place instead of being copied in. arbiter/common/abi_entry.h
// holds the entry points' argument checks and exception boundary.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "arbiter/common/abi_entry.h"
#include "arbiter/common/collective.h"
#include "arbiter/common/fault_injection.h"
#include "arbiter/common/fused_module.h"
#include "arbiter/common/status.h"
#include "arbiter/common/token_slice.h"
#include "arbiter/trtllm/guards.h"
#include "arbiter_backend.h"
#include "launch.h"
#include "registered.h"
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

  // What every launch of `a` on `ws` receives but the epilogue (launch_fused
  // adds it) and a registered call's sources.
  static KernelParams params_of(const arbiter_workspace& ws, const arbiter_allreduce_args& a) {
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
    p.registered_flags_offset = ws.layout.registered_flags_offset;
    p.spin_timeout_ns = ws.spin_timeout_ns;
    p.abort_flag = ws.abort.device();
    p.input = a.input;
    return p;
  }

  static Status run(arbiter_workspace& ws, const arbiter_allreduce_args* args, void* stream) {
    const std::uint64_t call = ws.calls++;
    if (ws.abort.raised()) return common::aborted_call();
    if (Status s = check_call(ws.layout, args, ws.capability); !s.ok()) return s;
    // Test-only: a rank that never launches (its peers' kernels wait for it).
    if (common::FaultInjection::get().at("gpu.call.start", static_cast<int>(ws.rank), call)) {
      return Status();
    }
    KernelParams p = params_of(ws, *args);
    return common::launch_fused(ws.device, *args, ws.world_size, ws.limits, p, launch_oneshot,
                                launch_twoshot, stream);
  }

  // ABI v2 (registered.h). Allocation and free are host-only; nothing is
  // enqueued.
  static constexpr std::uint64_t kRegisteredAlignment = trtllm::kRegisteredAlignment;

  static Status alloc_registered(arbiter_workspace& ws, std::uint64_t bytes, void** local) {
    if (ws.abort.raised()) return common::aborted_call();
    const Status status =
        ws.registered.allocate(RegisteredGroup{&ws, ws.same_process}, bytes, local);
    if (status.code() == ARBITER_TIMEOUT && ws.abort.raised()) {
      return common::aborted_while_exchanging("trtllm", status);
    }
    return status;
  }

  static Status free_registered(arbiter_workspace& ws, void* local) {
    return ws.registered.release(local);
  }

  // A call whose input lies in this workspace's registered memory: every
  // rank reads every peer's input in place (oneshot_registered.cu,
  // twoshot.cu). One-shot has no per-call capacity; two-shot runs in
  // balanced slices of whole tokens when the message exceeds its sum area.
  static Status run_registered(arbiter_workspace& ws, const arbiter_allreduce_args* args,
                               void* stream) {
    const std::uint64_t call = ws.calls++;
    if (ws.abort.raised()) return common::aborted_call();
    if (Status s = check_call(ws.layout, args, ws.capability, /*registered=*/true); !s.ok()) {
      return s;
    }
    const arbiter_allreduce_args& a = *args;
    const std::uint64_t row_bytes = std::uint64_t{a.hidden} * common::dtype_size(a.dtype);
    const std::uint64_t bytes = a.tokens * row_bytes;
    std::string why;
    const RegisteredAllocation* area = ws.registered.find(a.input, bytes, why);
    if (area == nullptr) return Status(ARBITER_INVALID_ARGUMENT, "trtllm run (registered): " + why);
    // Test-only, as in run().
    if (common::FaultInjection::get().at("gpu.call.start", static_cast<int>(ws.rank), call)) {
      return Status();
    }
    const auto launch_slice = [&](const arbiter_allreduce_args& slice) {
      const auto offset =
          static_cast<std::uint64_t>(static_cast<const char*>(slice.input) - area->local);
      KernelParams p = params_of(ws, slice);
      for (std::uint32_t q = 0; q < ws.world_size; ++q) p.sources[q] = area->parts[q] + offset;
      p.call_key = RegisteredMemory::call_key(*area, offset, slice);
      p.input_overwritten = slice.allreduce_out == slice.input ||
                            slice.residual_out == slice.input || slice.norm_out == slice.input;
      return common::launch_fused(ws.device, slice, ws.world_size, ws.limits, p,
                                  launch_oneshot_registered, launch_twoshot, stream);
    };
    const std::uint64_t capacity = per_call_capacity(ws.layout, ARBITER_ALGORITHM_TWOSHOT);
    if (a.algorithm == ARBITER_ALGORITHM_ONESHOT || bytes <= capacity) {
      return launch_slice(a);
    }
    // Two-shot above the sum area: slices as even as whole tokens allow, so
    // that each keeps tokens >= world size where the whole call does.
    const std::uint64_t most = capacity / row_bytes;
    const std::uint64_t slices = most == 0 ? 0 : (a.tokens + most - 1) / most;
    if (a.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4 || slices == 0 ||
        a.tokens / slices < ws.world_size) {
      return Status(ARBITER_UNSUPPORTED,
                    "trtllm run (registered): a two-shot message of " + std::to_string(bytes) +
                        " bytes exceeds the workspace's " + std::to_string(capacity) +
                        " bytes per call and cannot be sliced (NVFP4 scales, or slices of fewer "
                        "tokens than ranks); use one-shot");
    }
    const auto base = static_cast<std::uint32_t>(a.tokens / slices);
    const auto extra = static_cast<std::uint32_t>(a.tokens % slices);
    std::uint32_t first = 0;
    for (std::uint64_t i = 0; i < slices; ++i) {
      const std::uint32_t count = base + (i < extra ? 1 : 0);
      if (Status s = launch_slice(common::token_slice(a, first, count)); !s.ok()) return s;
      first += count;
    }
    return Status();
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
    // stages of world size x slot, the two-shot scratch, flags, control,
    // rounded up to 2 MiB (kIpcGranule).
    f.shared_bytes = layout.value().allocation_bytes();
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
const arbiter_backend_memory_v2_t arbiter_backend_v2_memory =
    arbiter::common::BackendEntries<arbiter::trtllm::Module>::memory_table();
extern "C" __attribute__((visibility("default")))
const arbiter_backend_footprint_v1_t arbiter_backend_v1_footprint =
    arbiter::common::BackendEntries<arbiter::trtllm::Module>::footprint_table();
