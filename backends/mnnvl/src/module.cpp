// C entry points of the mnnvl backend (libarbiter-mnnvl.so): fused
// all-reduce + residual + RMSNorm (+ FP8 / NVFP4) across the GPUs of one
// NVLink domain, one node or several (GB200/GB300 NVL72), through a
// multicast mapping; one-shot or two-shot.
//
// run() checks the call on the host (guards.h) and enqueues one kernel
// (arbiter/common/fused_module.h picks the launch shape): no allocation,
// no synchronisation, capturable in CUDA graphs. Every rank must make the
// same calls in the same order with the same shapes.
// arbiter/common/abi_entry.h holds the entry points' argument checks and
// exception boundary.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "arbiter/common/abi_entry.h"
#include "arbiter/common/fault_injection.h"
#include "arbiter/common/fused_module.h"
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
    *caps = common::fused_gpu_caps(capability, ARBITER_MNNVL_KERNEL_ARCHS, kWorldSizeMask,
                                   ARBITER_CAPS_NEEDS_MULTICAST | ARBITER_CAPS_NEEDS_NVLINK);
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
    p.multicast = ws.multicast;
    p.control = reinterpret_cast<ControlBlock*>(ws.peers[ws.rank] + ws.layout.control_offset);
    p.rank = ws.rank;
    p.world_size = ws.world_size;
    p.tokens = a.tokens;
    p.buffers_offset = ws.layout.buffers_offset;
    p.buffer_bytes = ws.layout.buffer_bytes;
    p.broadcast_offset = ws.layout.scatter_bytes;
    p.spin_timeout_ns = ws.spin_timeout_ns;
    p.abort_flag = ws.abort.device();
    p.input = a.input;
    return common::launch_fused(ws.device, a, ws.world_size, ws.limits, p, launch_oneshot,
                                launch_twoshot, stream);
  }

  // What workspace_create() allocates for `spec`, from the same layout
  // (make_workspace_layout) that describe() sizes it with.
  static Status footprint(const arbiter_workspace_spec& spec, arbiter_footprint* out) {
    auto layout = make_workspace_layout(spec.world_size, spec.max_message_bytes, spec.dtype,
                                        spec.max_tokens, spec.hidden);
    if (!layout.ok()) return layout.status();
    arbiter_footprint f{};
    // One cuMem allocation that every peer maps (unicast) and the multicast
    // object binds: 3 Lamport buffers (scatter + broadcast) and control.
    f.shared_bytes = layout.value().total_bytes;
    f.host_bytes = sizeof(std::uint32_t);  // the host-mapped abort flag
    for (int a = 0; a < ARBITER_ALGORITHM_COUNT; ++a) {
      f.max_message_bytes[a] = per_call_capacity(layout.value(), static_cast<arbiter_algorithm>(a));
    }
    f.note =
        "the driver rounds the shared allocation up to its granularity (typically 2 MiB), "
        "which a device-less count cannot know";
    *out = f;
    return Status();
  }

  static void destroy(arbiter_workspace& ws) { destroy_workspace(ws); }

  static void abort(arbiter_workspace& ws) { ws.abort.raise(); }
};

}  // namespace
}  // namespace arbiter::mnnvl

extern "C" __attribute__((visibility("default"))) const arbiter_backend_v1_t arbiter_backend_v1 =
    arbiter::common::BackendEntries<arbiter::mnnvl::Module>::table();
extern "C" __attribute__((visibility("default")))
const arbiter_backend_faults_v1_t arbiter_backend_v1_faults =
    arbiter::common::BackendEntries<arbiter::mnnvl::Module>::faults();
extern "C" __attribute__((visibility("default")))
const arbiter_backend_footprint_v1_t arbiter_backend_v1_footprint =
    arbiter::common::BackendEntries<arbiter::mnnvl::Module>::footprint_table();
