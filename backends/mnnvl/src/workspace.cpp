// Collective creation and destruction of mnnvl workspaces.
//
// Every rank all-gathers a Hello (status, host, process, GPU and its share,
// layout, what the device says of fabric handles and multicast), and every
// rank reaches the same plan from the same Hellos:
//  - all ranks in this process: loopback mode. Each rank's memory is a plain
//    allocation, peers are used through their pointers, and there is no
//    multicast mapping (the kernels store to each peer in turn);
//  - otherwise the driver-API path (vmm.cpp): FABRIC handles when every rank
//    supports them, POSIX file descriptors when every rank shares a host,
//    and a multicast object. Multicast is then checked by use, not trusted
//    from the device attribute (it lied on bridged H100/H200 NVL pairs): each
//    rank stores a pattern through the multicast mapping and every rank
//    checks its own copy holds every rank's pattern, AND-reduced.
// The buffers start as the sentinel word and every rank waits for that
// before the last agreement round, so no first call can see stale bytes.
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
#include "arbiter/common/rank_hello.h"
#include "driver_api.h"
#include "kernels.h"
#include "vmm.h"

namespace arbiter::mnnvl {
namespace {

using common::cuda_message;
using common::DeviceScope;
using common::Status;

constexpr std::uint32_t kHelloMagic = 0x4d4e564cu;  // "MNVL"; bump with the layout
constexpr std::uint32_t kProbeMagic = 0x6d637374u;

struct Hello {
  std::int32_t status;
  common::RankHello rank;
  std::uint32_t fabric;     // the device supports FABRIC handles
  std::uint32_t multicast;  // the device says it supports multicast
  char reason[240];
};

Status check_spec(const arbiter_oob& oob, const arbiter_workspace_spec& spec) {
  if (Status s = common::check_rank_spec(oob, spec, "mnnvl"); !s.ok()) return s;
  if (oob.size < 2 || oob.size > static_cast<std::int32_t>(kMaxRanks)) {
    return Status(ARBITER_UNSUPPORTED,
                  "world size " + std::to_string(oob.size) + " is outside 2..64");
  }
  return Status();
}

// Fills the device-dependent parts of `hello`.
Status describe(const arbiter_workspace_spec& spec, arbiter_workspace& ws, Hello& hello) {
  auto layout = make_workspace_layout(spec.world_size, spec.max_message_bytes, spec.dtype,
                                      spec.max_tokens, spec.hidden);
  if (!layout.ok()) return layout.status();
  ws.layout = layout.value();
  if (Status s = common::describe_rank(ws.layout, spec.device, query_max_active_clusters,
                                       &ws.capability, &hello.rank);
      !s.ok()) {
    return s;
  }
  // What the device says; multicast is then checked by use.
  const DriverApi* api = nullptr;
  CUdevice device = 0;
  if (driver_api(&api).ok() && api->device_get(&device, spec.device) == CUDA_SUCCESS) {
    int value = 0;
    if (api->device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, device) ==
        CUDA_SUCCESS) {
      hello.multicast = value != 0 ? 1 : 0;
    }
    value = 0;
    if (api->device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
                                  device) == CUDA_SUCCESS) {
      hello.fabric = value != 0 ? 1 : 0;
    }
  }
  return Status();
}

bool same_gpu(const Hello& a, const Hello& b) {
  return std::memcmp(a.rank.gpu.uuid, b.rank.gpu.uuid, sizeof a.rank.gpu.uuid) == 0;
}

// Loopback: every rank in this process and on one GPU.
bool loopback_group(const std::vector<Hello>& all) {
  return std::all_of(all.begin(), all.end(), [&](const Hello& h) {
    return h.rank.process == all[0].rank.process && same_gpu(h, all[0]);
  });
}

// How ranks in different processes share memory, or why they cannot.
Status choose_handles(const std::vector<Hello>& all, HandleKind* kind) {
  for (std::size_t r = 0; r < all.size(); ++r) {
    for (std::size_t q = 0; q < r; ++q) {
      if (all[q].rank.process == all[r].rank.process) {
        return Status(ARBITER_UNSUPPORTED,
                      "ranks " + std::to_string(q) + " and " + std::to_string(r) +
                          " share a process but the group is not all in one process on one GPU "
                          "(loopback); run one rank per process and GPU");
      }
      if (same_gpu(all[q], all[r]) && !common::test_shared_gpu()) {
        return Status(ARBITER_UNSUPPORTED,
                      "ranks " + std::to_string(q) + " and " + std::to_string(r) +
                          " use the same GPU from different processes; their kernels would not "
                          "run at the same time and would wait for each other forever. Give "
                          "each rank its own GPU (device = LOCAL_RANK)");
      }
    }
    if (!all[r].multicast) {
      return Status(ARBITER_UNAVAILABLE, "rank " + std::to_string(r) +
                                             "'s GPU does not support multicast (NVLink SHARP); "
                                             "use trtllm on one node or nccl");
    }
  }
  // One host: file descriptors always work there, while FABRIC handles also
  // need the IMEX service, which single-node boxes often do not run.
  const bool one_host = std::all_of(
      all.begin(), all.end(), [&](const Hello& h) { return h.rank.host == all[0].rank.host; });
  const bool fabric = std::all_of(all.begin(), all.end(), [](const Hello& h) { return h.fabric; });
  if (one_host) {
    *kind = HandleKind::kPosixFd;
  } else if (fabric) {
    *kind = HandleKind::kFabric;
  } else {
    return Status(ARBITER_UNAVAILABLE,
                  "the ranks span hosts but not every GPU supports FABRIC handles (is the IMEX "
                  "service running and the NVLink domain configured?)");
  }
  return Status();
}

// Zeroes this rank's memory and fills the buffers with the sentinel; waits
// (until the workspace deadline).
Status initialise(arbiter_workspace& ws) {
  const common::PrivateStream stream;
  cudaError_t e = stream.error();
  char* self = ws.peers[ws.rank];
  if (e == cudaSuccess) e = cudaMemsetAsync(self, 0, ws.layout.buffers_offset, stream.get());
  if (e == cudaSuccess) {
    e = launch_fill_sentinel(self + ws.layout.buffers_offset, 3 * ws.layout.buffer_bytes,
                             stream.get());
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(ARBITER_INTERNAL, cuda_message("initialising the workspace", e));
  }
  return common::wait_for_stream(stream.get(), ws.timeout_ms, "initialising the workspace");
}

// Every rank stores its pattern through the multicast mapping; every rank
// then finds every rank's pattern in its own copy. Restores the sentinel.
// Everything runs on a private stream (never the legacy default stream,
// which would wait for a framework's blocking streams, possibly holding work
// that waits on the peers), and every wait ends at the workspace deadline.
Status probe_multicast(const arbiter_oob& oob, arbiter_workspace& ws) {
  const std::int64_t timeout = ws.timeout_ms;
  Status local;
  const common::PrivateStream stream;
  cudaError_t e = stream.error();
  if (e == cudaSuccess) {
    e = launch_multicast_probe(ws.multicast + ws.layout.buffers_offset, ws.rank, kProbeMagic,
                               stream.get());
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    local = Status(ARBITER_UNAVAILABLE, cuda_message("a store through the multicast mapping", e));
  } else {
    local = common::wait_for_stream(stream.get(), timeout, "a store through the multicast mapping");
    if (local.code() == ARBITER_INTERNAL) local = Status(ARBITER_UNAVAILABLE, local.message());
  }
  // Every rank has stored (and waited for its store) before anyone reads.
  if (Status s = common::agree(oob, local, timeout); !s.ok()) return s;
  // Pageable memory: the copy returns once done, and it follows only this
  // stream's work, which has finished.
  std::vector<std::uint32_t> seen(4 * ws.world_size);
  e = cudaMemcpyAsync(seen.data(), ws.peers[ws.rank] + ws.layout.buffers_offset,
                      seen.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, stream.get());
  if (e != cudaSuccess) {
    cudaGetLastError();
    local = Status(ARBITER_INTERNAL, cuda_message("reading the multicast probe back", e));
  } else {
    local = common::wait_for_stream(stream.get(), timeout, "reading the multicast probe back");
  }
  for (std::uint32_t q = 0; q < ws.world_size && local.ok(); ++q) {
    const std::uint32_t* w = &seen[4 * q];
    if (w[0] != kProbeMagic || w[1] != q || w[2] != ~kProbeMagic || w[3] != ~q) {
      local = Status(ARBITER_UNAVAILABLE,
                     "multicast does not work here: rank " + std::to_string(q) +
                         "'s store through the multicast address did not reach rank " +
                         std::to_string(ws.rank) +
                         " (the device attribute promised it; bridged NVL pairs are known to "
                         "do this). Use trtllm or nccl");
    }
  }
  if (local.ok()) {
    e = launch_fill_sentinel(ws.peers[ws.rank] + ws.layout.buffers_offset, 16 * ws.world_size,
                             stream.get());
    local = e == cudaSuccess ? common::wait_for_stream(stream.get(), timeout, "after the probe")
                             : Status(ARBITER_INTERNAL, cuda_message("after the probe", e));
  }
  return common::agree(oob, local, timeout);
}

void release(arbiter_workspace& ws) {
  if (ws.loopback) {
    if (ws.loopback_base != nullptr) cudaFree(ws.loopback_base);
    ws.loopback_base = nullptr;
    for (char*& p : ws.peers) p = nullptr;
    cudaGetLastError();
    return;
  }
  const DriverApi* api = nullptr;
  if (driver_api(&api).ok()) release_memory(*api, ws);
}

}  // namespace

Status create_workspace(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                        arbiter_workspace& ws) {
  ws.oob = oob;
  ws.timeout_ms = spec.timeout_ms;
  ws.device = spec.device;
  ws.rank = static_cast<std::uint32_t>(oob.rank);
  ws.world_size = static_cast<std::uint32_t>(oob.size);
  Status local = common::kernel_timeout_ns(&ws.spin_timeout_ns);

  DeviceScope scope;
  Hello mine{};
  mine.rank = common::identify_rank(kHelloMagic, spec.device);
  if (local.ok()) local = check_spec(oob, spec);
  if (local.ok()) local = common::use_device(scope, spec.device);
  if (local.ok()) local = ws.abort.allocate();  // freed with the workspace object
  if (local.ok()) local = describe(spec, ws, mine);
  std::vector<Hello> hellos;
  Status s = common::gather_records(oob, mine, local, spec.timeout_ms, &hellos);
  if (s.ok()) s = common::check_same_workspace(hellos);
  if (!s.ok()) return s;

  ws.loopback = loopback_group(hellos);
  if (ws.loopback) {
    void* base = nullptr;
    if (cudaError_t e = cudaMalloc(&base, ws.layout.total_bytes); e != cudaSuccess) {
      cudaGetLastError();
      local = Status(ARBITER_UNAVAILABLE,
                     cuda_message("cudaMalloc(" + std::to_string(ws.layout.total_bytes) + ")", e));
    } else {
      ws.loopback_base = static_cast<char*>(base);
    }
    // Pointers of every virtual rank: one more all-gather, after allocation.
    const std::uint64_t mine_base = reinterpret_cast<std::uintptr_t>(ws.loopback_base);
    std::vector<std::uint64_t> bases(oob.size);
    if (Status a = common::agree(oob, local, spec.timeout_ms); !a.ok()) {
      release(ws);
      return a;
    }
    if (const std::int32_t rc =
            oob.allgather(oob.ctx, &mine_base, bases.data(), sizeof mine_base, spec.timeout_ms);
        rc != ARBITER_OK) {
      release(ws);
      return common::exchange_failed(oob, "allgather", rc);
    }
    for (std::uint32_t q = 0; q < ws.world_size; ++q) {
      ws.peers[q] = reinterpret_cast<char*>(static_cast<std::uintptr_t>(bases[q]));
    }
  } else {
    HandleKind kind = HandleKind::kFabric;
    if (s = choose_handles(hellos, &kind); !s.ok()) return s;
    const DriverApi* api = nullptr;
    local = driver_api(&api);
    if (Status a = common::agree(oob, local, spec.timeout_ms); !a.ok()) return a;
    if (s = map_memory(oob, *api, kind, ws.layout.total_bytes, ws); !s.ok()) {
      release(ws);
      return s;
    }
  }
  local = initialise(ws);
  if (s = common::agree(oob, local, spec.timeout_ms); s.ok() && !ws.loopback) {
    s = probe_multicast(oob, ws);
  }
  if (!s.ok()) {
    release(ws);
    return s;
  }
  ws.limits = common::limits_of(hellos);
  return Status();
}

void destroy_workspace(arbiter_workspace& ws) {
  // release() unmaps and frees at once: imported handles keep a peer's
  // memory alive until every rank has unmapped it (loopback peers are plain
  // pointers), so there is nothing left to free after the second barrier.
  common::destroy_peer_mapped(
      ws.oob, ws.timeout_ms, ws.device, [&] { release(ws); }, [] {}, /*local=*/ws.abort.raised());
}

}  // namespace arbiter::mnnvl
