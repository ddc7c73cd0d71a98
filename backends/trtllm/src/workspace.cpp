// Collective creation and destruction of trtllm workspaces.
//
// Each rank allocates its workspace with cudaMalloc, zeroes it, fills the
// one-shot stages with the sentinel and waits for that, then all-gathers a
// Hello: its status, where it runs (host, process, GPU), its layout, its
// share of the GPU, its base pointer and a CUDA IPC handle. From the same
// Hellos every rank reaches the same verdict. Peers in another process are
// mapped with cudaIpcOpenMemHandle; peers in this process (loopback virtual
// ranks, or one process driving several GPUs) are used through their plain
// pointers. A second all-gather agrees that every rank mapped every peer.
//
// Only the runtime API is used (no driver entry points are needed), so the
// module still loads and answers where there is no driver.
#include "workspace.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "arbiter/common/collective.h"
#include "arbiter/common/cuda_host.h"
#include "arbiter/common/fused_module.h"
#include "arbiter/common/gpu_share.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/rank_hello.h"
#include "launch.h"

namespace arbiter::trtllm {
namespace {

using common::cuda_message;
using common::DeviceScope;
using common::Status;

constexpr std::uint32_t kHelloMagic = 0x54524c4cu;  // "TRLL"; bump with the layout
constexpr std::size_t kReasonBytes = 240;

struct Hello {
  std::int32_t status;
  common::RankHello rank;
  std::uint64_t base;
  std::uint32_t ipc_ok;  // cudaIpcGetMemHandle succeeded
  cudaIpcMemHandle_t handle;
  char reason[kReasonBytes];
};

struct Outcome {
  std::int32_t status;
  char reason[kReasonBytes];
};

Status check_spec(const arbiter_oob& oob, const arbiter_workspace_spec& spec) {
  if (Status s = common::check_rank_spec(oob, spec, "trtllm"); !s.ok()) return s;
  if (spec.nodes > 1) {
    return Status(ARBITER_UNSUPPORTED, "the ranks span " + std::to_string(spec.nodes) +
                                           " nodes; trtllm maps peer memory with CUDA IPC, "
                                           "which works within one node only (use mnnvl or nccl)");
  }
  return Status();
}

// Allocates and initialises this rank's workspace and fills `hello`.
Status prepare(const arbiter_workspace_spec& spec, arbiter_workspace& ws, Hello& hello) {
  auto layout = make_workspace_layout(spec.world_size, spec.max_message_bytes, spec.dtype,
                                      spec.max_tokens, spec.hidden);
  if (!layout.ok()) return layout.status();
  ws.layout = layout.value();
  if (Status s = common::describe_rank(ws.layout, spec.device, query_max_active_clusters,
                                       &ws.capability, &hello.rank);
      !s.ok()) {
    return s;
  }

  void* base = nullptr;
  if (cudaError_t e = cudaMalloc(&base, ws.layout.allocation_bytes()); e != cudaSuccess) {
    cudaGetLastError();
    return Status(
        ARBITER_UNAVAILABLE,
        cuda_message("cudaMalloc(" + std::to_string(ws.layout.allocation_bytes()) +
                         " bytes: 3 one-shot stages x " + std::to_string(ws.layout.world_size) +
                         " slots of " + std::to_string(ws.layout.slot_bytes) +
                         " bytes + two-shot scratch, rounded up to 2 MiB); lower "
                         "max_message_bytes",
                     e));
  }
  ws.base = static_cast<char*>(base);
  hello.base = reinterpret_cast<std::uintptr_t>(base);

  const common::PrivateStream stream;
  cudaError_t e = stream.error();
  if (e == cudaSuccess) e = cudaMemsetAsync(base, 0, ws.layout.total_bytes, stream.get());
  if (e == cudaSuccess) {
    e = launch_fill_sentinel(ws.base + ws.layout.oneshot_offset, ws.layout.oneshot_bytes,
                             ws.layout.dtype, stream.get());
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(ARBITER_INTERNAL, cuda_message("initialising the workspace", e));
  }
  // Every peer sees the sentinel before any first call: the exchange below
  // happens after this wait on every rank.
  if (Status s = common::wait_for_stream(stream.get(), ws.timeout_ms, "initialising the workspace");
      !s.ok()) {
    return s;
  }

  // Only peers in other processes need the handle; in-process peers (loopback)
  // use the pointer, so a failure here matters only if such a peer exists.
  hello.ipc_ok = cudaIpcGetMemHandle(&hello.handle, base) == cudaSuccess ? 1 : 0;
  cudaGetLastError();
  return Status();
}

// Checks every rank can reach the same conclusion from the Hellos alone.
// Everything trtllm needs beyond the common checks: one host, and no GPU
// shared by two processes (but in arbiter's own tests, test_shared_gpu()).
Status check_group(const std::vector<Hello>& all) {
  if (Status s = common::check_same_workspace(all); !s.ok()) return s;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const common::RankHello& b = all[r].rank;
    if (b.host != all[0].rank.host) {
      return Status(ARBITER_UNSUPPORTED, "rank " + std::to_string(r) +
                                             " is on another host than rank 0; trtllm is "
                                             "single-node (CUDA IPC), use mnnvl or nccl");
    }
    for (std::size_t q = 0; q < r; ++q) {
      const common::RankHello& a = all[q].rank;
      if (std::memcmp(a.gpu.uuid, b.gpu.uuid, sizeof b.gpu.uuid) == 0 && a.process != b.process &&
          !common::test_shared_gpu()) {
        return Status(ARBITER_UNSUPPORTED,
                      "ranks " + std::to_string(q) + " and " + std::to_string(r) +
                          " use the same GPU from different processes; their kernels would not "
                          "run at the same time and would wait for each other forever. Give "
                          "each rank its own GPU (device = LOCAL_RANK)");
      }
    }
  }
  return Status();
}

// Maps peer `q` into this process.
Status map_peer(arbiter_workspace& ws, const Hello& mine, const Hello& peer, std::uint32_t q) {
  if (peer.rank.process == mine.rank.process) {
    if (peer.rank.device != mine.rank.device) {
      int can = 0;
      cudaError_t e = cudaDeviceCanAccessPeer(&can, mine.rank.device, peer.rank.device);
      if (e != cudaSuccess || can == 0) {
        cudaGetLastError();
        return Status(ARBITER_UNAVAILABLE,
                      "GPU " + std::to_string(mine.rank.device) + " cannot access GPU " +
                          std::to_string(peer.rank.device) + " directly (no peer-to-peer path)");
      }
      e = cudaDeviceEnablePeerAccess(peer.rank.device, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
        return Status(ARBITER_UNAVAILABLE, cuda_message("cudaDeviceEnablePeerAccess", e));
      }
      cudaGetLastError();  // clears cudaErrorPeerAccessAlreadyEnabled
    }
    ws.peers[q] = reinterpret_cast<char*>(static_cast<std::uintptr_t>(peer.base));
    ws.same_process[q] = true;
    return Status();
  }
  if (!peer.ipc_ok) {
    return Status(ARBITER_UNAVAILABLE, "rank " + std::to_string(q) +
                                           " could not export its workspace (cudaIpcGetMemHandle "
                                           "failed there); CUDA IPC is needed across processes");
  }
  void* mapped = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&mapped, peer.handle, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    cudaGetLastError();
    return Status(ARBITER_UNAVAILABLE,
                  cuda_message("mapping rank " + std::to_string(q) +
                                   "'s workspace (cudaIpcOpenMemHandle; the GPUs need a "
                                   "peer-to-peer path, e.g. NVLink)",
                               e));
  }
  ws.peers[q] = static_cast<char*>(mapped);
  ws.ipc_opened[q] = true;
  return Status();
}

// Closes the CUDA IPC mappings of peers in other processes.
void close_peer_mappings(arbiter_workspace& ws) {
  for (std::uint32_t q = 0; q < kMaxRanks; ++q) {
    if (ws.ipc_opened[q]) cudaIpcCloseMemHandle(ws.peers[q]);
    ws.ipc_opened[q] = false;
  }
}

void unmap_and_free(arbiter_workspace& ws) {
  close_peer_mappings(ws);
  for (char*& peer : ws.peers) peer = nullptr;
  if (ws.base != nullptr) cudaFree(ws.base);
  ws.base = nullptr;
  cudaGetLastError();
}

}  // namespace

Status create_workspace(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                        arbiter_workspace& ws) {
  ws.oob = oob;
  ws.timeout_ms = spec.timeout_ms;
  ws.device = spec.device;
  ws.rank = static_cast<std::uint32_t>(oob.rank);
  ws.world_size = static_cast<std::uint32_t>(oob.size);
  DeviceScope scope;
  Hello mine{};
  mine.rank = common::identify_rank(kHelloMagic, spec.device);
  Status local = common::kernel_timeout_ns(&ws.spin_timeout_ns);
  if (local.ok()) local = check_spec(oob, spec);
  if (local.ok()) local = common::use_device(scope, spec.device);
  if (local.ok()) local = ws.abort.allocate();  // freed with the workspace object
  if (local.ok()) local = prepare(spec, ws, mine);
  std::vector<Hello> hellos;
  Status s = common::gather_records(oob, mine, local, spec.timeout_ms, &hellos);
  if (s.ok()) s = check_group(hellos);
  if (!s.ok()) {
    unmap_and_free(ws);
    return s;
  }

  Status mapped;
  for (std::uint32_t q = 0; q < ws.world_size && mapped.ok(); ++q) {
    mapped = q == ws.rank ? Status() : map_peer(ws, mine, hellos[q], q);
  }
  ws.peers[ws.rank] = ws.base;
  ws.same_process[ws.rank] = true;
  Outcome outcome{};
  outcome.status = mapped.code();
  common::put_reason(outcome, mapped.message());
  std::vector<Outcome> outcomes(oob.size);
  if (const std::int32_t rc =
          oob.allgather(oob.ctx, &outcome, outcomes.data(), sizeof(Outcome), spec.timeout_ms);
      rc != ARBITER_OK) {
    unmap_and_free(ws);
    return common::exchange_failed(oob, "allgather", rc);
  }
  if (s = common::verdict(outcomes, oob.rank); !s.ok()) {
    // A peer may have mapped this rank's memory already: wait for everyone
    // to unmap before freeing.
    close_peer_mappings(ws);
    oob.barrier(oob.ctx, spec.timeout_ms);
    unmap_and_free(ws);
    return s;
  }
  ws.limits = common::limits_of(hellos);
  return Status();
}

void destroy_workspace(arbiter_workspace& ws) {
  common::destroy_peer_mapped(
      ws.oob, ws.timeout_ms, ws.device,
      [&] {
        close_peer_mappings(ws);
        ws.registered.close_peer_mappings();
      },
      [&] {
        unmap_and_free(ws);
        ws.registered.free_own();
      },
      /*local=*/ws.abort.raised());
}

}  // namespace arbiter::trtllm
