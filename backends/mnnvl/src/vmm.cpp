#include "vmm.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "arbiter/common/collective.h"
#include "fd_exchange.h"

namespace arbiter::mnnvl {
namespace {

using common::Status;

CUmemAllocationHandleType handle_type(HandleKind kind) {
  return kind == HandleKind::kFabric ? CU_MEM_HANDLE_TYPE_FABRIC
                                     : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

Status driver_failure(const DriverApi& api, const char* call, CUresult r) {
  return Status(ARBITER_UNAVAILABLE, api.message(call, r));
}

std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) {
  return multiple == 0 ? value : (value + multiple - 1) / multiple * multiple;
}

// The granularity both the allocation and the multicast object accept.
Status granularity(const DriverApi& api, int device, CUmemAllocationHandleType type,
                   std::uint32_t ranks, std::uint64_t total, std::uint64_t* granule,
                   std::uint64_t* out) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = type;
  std::size_t memory = 0;
  if (CUresult r =
          api.mem_get_allocation_granularity(&memory, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      r != CUDA_SUCCESS) {
    return driver_failure(api, "cuMemGetAllocationGranularity", r);
  }
  CUmulticastObjectProp mc{};
  mc.numDevices = ranks;
  mc.size = static_cast<std::size_t>(total);
  mc.handleTypes = type;
  std::size_t multicast = 0;
  if (CUresult r =
          api.multicast_get_granularity(&multicast, &mc, CU_MULTICAST_GRANULARITY_RECOMMENDED);
      r != CUDA_SUCCESS) {
    return driver_failure(api, "cuMulticastGetGranularity", r);
  }
  const std::uint64_t g = memory > multicast ? memory : multicast;
  *granule = g;
  *out = round_up(total, g);
  return Status();
}

// Shares one handle per rank (`mine` from every rank, or only rank 0's when
// root_only) and imports what the others shared: imported[r] for every r
// that shared one, except this rank.
Status share_and_import(const arbiter_oob& oob, const DriverApi& api, HandleKind kind,
                        CUmemGenericAllocationHandle mine, bool offer, bool root_only,
                        std::int64_t timeout_ms, std::vector<CUmemGenericAllocationHandle>* out,
                        std::vector<bool>* valid) {
  const std::uint32_t size = static_cast<std::uint32_t>(oob.size);
  out->assign(size, 0);
  valid->assign(size, false);
  const CUmemAllocationHandleType type = handle_type(kind);
  Status local;
  if (kind == HandleKind::kFabric) {
    CUmemFabricHandle handle{};
    if (offer) {
      if (CUresult r = api.mem_export(&handle, mine, type, 0); r != CUDA_SUCCESS) {
        local = driver_failure(api, "cuMemExportToShareableHandle(FABRIC)", r);
      }
    }
    if (Status s = common::agree(oob, local, timeout_ms); !s.ok()) return s;
    std::vector<CUmemFabricHandle> all(size);
    const std::int32_t rc =
        root_only ? oob.broadcast(oob.ctx, &handle, sizeof handle, 0, timeout_ms)
                  : oob.allgather(oob.ctx, &handle, all.data(), sizeof handle, timeout_ms);
    if (rc != ARBITER_OK)
      return common::exchange_failed(oob, root_only ? "broadcast" : "allgather", rc);
    if (root_only) all[0] = handle;
    for (std::uint32_t r = 0; r < size && local.ok(); ++r) {
      if (static_cast<std::int32_t>(r) == oob.rank || (root_only && r != 0)) continue;
      if (CUresult e = api.mem_import(&(*out)[r], &all[r], type); e != CUDA_SUCCESS) {
        local = driver_failure(api, "cuMemImportFromShareableHandle(FABRIC)", e);
      } else {
        (*valid)[r] = true;
      }
    }
    return common::agree(oob, local, timeout_ms);
  }
  int fd = -1;
  if (offer) {
    if (CUresult r = api.mem_export(&fd, mine, type, 0); r != CUDA_SUCCESS) {
      local = driver_failure(api, "cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)", r);
      fd = -1;
    }
  }
  if (Status s = common::agree(oob, local, timeout_ms); !s.ok()) {
    if (fd >= 0) close(fd);
    return s;
  }
  std::vector<int> fds;
  Status s = exchange_fds(oob, offer ? fd : -1, &fds, timeout_ms);
  if (fd >= 0) close(fd);
  if (!s.ok()) return s;
  for (std::uint32_t r = 0; r < size; ++r) {
    if (fds[r] < 0) continue;
    if (local.ok()) {
      void* os_handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fds[r]));
      if (CUresult e = api.mem_import(&(*out)[r], os_handle, type); e != CUDA_SUCCESS) {
        local = driver_failure(api, "cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)", e);
      } else {
        (*valid)[r] = true;
      }
    }
    close(fds[r]);
  }
  return common::agree(oob, local, timeout_ms);
}

Status set_access(const DriverApi& api, CUdeviceptr va, std::uint64_t bytes, int device) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = api.mem_set_access(va, static_cast<std::size_t>(bytes), &access, 1);
      r != CUDA_SUCCESS) {
    return driver_failure(api, "cuMemSetAccess", r);
  }
  return Status();
}

}  // namespace

const char* handle_kind_name(HandleKind kind) {
  return kind == HandleKind::kFabric ? "FABRIC" : "POSIX file descriptor";
}

Status map_memory(const arbiter_oob& oob, const DriverApi& api, HandleKind kind,
                  std::uint64_t total_bytes, arbiter_workspace& ws) {
  MnnvlMemory& m = ws.memory;
  const std::int64_t timeout = ws.timeout_ms;
  const std::uint32_t size = ws.world_size;
  const CUmemAllocationHandleType type = handle_type(kind);
  CUdevice device = 0;

  // 1. This rank's memory.
  Status local;
  if (CUresult r = api.device_get(&device, ws.device); r != CUDA_SUCCESS) {
    local = driver_failure(api, "cuDeviceGet", r);
  }
  if (local.ok()) {
    local =
        granularity(api, ws.device, type, size, total_bytes, &m.granularity, &m.allocation_bytes);
  }
  if (local.ok()) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ws.device;
    prop.requestedHandleTypes = type;
    if (CUresult r =
            api.mem_create(&m.local, static_cast<std::size_t>(m.allocation_bytes), &prop, 0);
        r != CUDA_SUCCESS) {
      local = driver_failure(api,
                             kind == HandleKind::kFabric
                                 ? "cuMemCreate(FABRIC) (is the IMEX service running?)"
                                 : "cuMemCreate(POSIX_FILE_DESCRIPTOR)",
                             r);
    } else {
      m.local_created = true;
    }
  }
  if (Status s = common::agree(oob, local, timeout); !s.ok()) return s;

  // 2. Everyone's memory, imported.
  std::vector<CUmemGenericAllocationHandle> handles;
  std::vector<bool> valid;
  if (Status s = share_and_import(oob, api, kind, m.local, true, false, timeout, &handles, &valid);
      !s.ok()) {
    for (std::uint32_t r = 0; r < size; ++r) {
      if (valid.size() > r && valid[r]) api.mem_release(handles[r]);
    }
    return s;
  }
  for (std::uint32_t r = 0; r < size; ++r) {
    m.imported[r] = handles[r];
    m.imported_valid[r] = valid[r];
  }

  // 3. One range, rank r's memory at r x stride.
  const std::uint64_t stride = m.allocation_bytes;
  if (CUresult r = api.mem_address_reserve(&m.range, static_cast<std::size_t>(stride * size),
                                           static_cast<std::size_t>(m.granularity), 0, 0);
      r != CUDA_SUCCESS) {
    local = driver_failure(api, "cuMemAddressReserve", r);
  } else {
    m.range_reserved = true;
  }
  for (std::uint32_t r = 0; r < size && local.ok(); ++r) {
    const CUmemGenericAllocationHandle h = r == ws.rank ? m.local : m.imported[r];
    if (CUresult e = api.mem_map(m.range + r * stride, static_cast<std::size_t>(stride), 0, h, 0);
        e != CUDA_SUCCESS) {
      local = driver_failure(api, "cuMemMap", e);
    } else {
      m.mapped[r] = true;
    }
  }
  if (local.ok()) local = set_access(api, m.range, stride * size, ws.device);
  if (Status s = common::agree(oob, local, timeout); !s.ok()) return s;
  for (std::uint32_t r = 0; r < size; ++r) {
    ws.peers[r] = reinterpret_cast<char*>(static_cast<std::uintptr_t>(m.range + r * stride));
  }

  // 4. The multicast object: rank 0 creates it, every rank joins.
  if (ws.rank == 0) {
    CUmulticastObjectProp mc{};
    mc.numDevices = size;
    mc.size = static_cast<std::size_t>(stride);
    mc.handleTypes = type;
    if (CUresult r = api.multicast_create(&m.multicast, &mc); r != CUDA_SUCCESS) {
      local = driver_failure(api, "cuMulticastCreate", r);
    } else {
      m.multicast_valid = true;
    }
  }
  if (Status s = common::agree(oob, local, timeout); !s.ok()) return s;
  const Status shared =
      share_and_import(oob, api, kind, m.multicast, ws.rank == 0, true, timeout, &handles, &valid);
  // Recorded before looking at the outcome, so release_memory() frees an
  // import even when another rank failed (multicast objects are scarce).
  if (ws.rank != 0 && !valid.empty() && valid[0]) {
    m.multicast = handles[0];
    m.multicast_valid = true;
  }
  if (!shared.ok()) return shared;
  if (CUresult r = api.multicast_add_device(m.multicast, device); r != CUDA_SUCCESS) {
    local = driver_failure(api, "cuMulticastAddDevice", r);
  } else {
    m.multicast_added = true;
  }
  // Every device joins before any memory is bound.
  if (Status s = common::agree(oob, local, timeout); !s.ok()) return s;
  if (CUresult r =
          api.multicast_bind_mem(m.multicast, 0, m.local, 0, static_cast<std::size_t>(stride), 0);
      r != CUDA_SUCCESS) {
    local = driver_failure(api, "cuMulticastBindMem", r);
  } else {
    m.multicast_bound = true;
  }
  if (local.ok()) {
    if (CUresult r = api.mem_address_reserve(&m.multicast_va, static_cast<std::size_t>(stride),
                                             static_cast<std::size_t>(m.granularity), 0, 0);
        r != CUDA_SUCCESS) {
      local = driver_failure(api, "cuMemAddressReserve(multicast)", r);
    } else {
      m.multicast_reserved = true;
    }
  }
  if (local.ok()) {
    if (CUresult r =
            api.mem_map(m.multicast_va, static_cast<std::size_t>(stride), 0, m.multicast, 0);
        r != CUDA_SUCCESS) {
      local = driver_failure(api, "cuMemMap(multicast)", r);
    } else {
      m.multicast_mapped = true;
    }
  }
  if (local.ok()) local = set_access(api, m.multicast_va, stride, ws.device);
  if (Status s = common::agree(oob, local, timeout); !s.ok()) return s;
  ws.multicast = reinterpret_cast<char*>(static_cast<std::uintptr_t>(m.multicast_va));
  return Status();
}

void release_memory(const DriverApi& api, arbiter_workspace& ws) {
  MnnvlMemory& m = ws.memory;
  const std::uint64_t stride = m.allocation_bytes;
  if (m.multicast_mapped) api.mem_unmap(m.multicast_va, static_cast<std::size_t>(stride));
  if (m.multicast_reserved) api.mem_address_free(m.multicast_va, static_cast<std::size_t>(stride));
  if (m.multicast_bound) {
    CUdevice device = 0;
    if (api.device_get(&device, ws.device) == CUDA_SUCCESS) {
      api.multicast_unbind(m.multicast, device, 0, static_cast<std::size_t>(stride));
    }
  }
  if (m.multicast_valid) api.mem_release(m.multicast);
  for (std::uint32_t r = 0; r < kMaxRanks; ++r) {
    if (m.mapped[r]) api.mem_unmap(m.range + r * stride, static_cast<std::size_t>(stride));
    if (m.imported_valid[r]) api.mem_release(m.imported[r]);
  }
  if (m.range_reserved) {
    api.mem_address_free(m.range, static_cast<std::size_t>(stride * ws.world_size));
  }
  if (m.local_created) api.mem_release(m.local);
  m = MnnvlMemory{};
  ws.multicast = nullptr;
  for (char*& p : ws.peers) p = nullptr;
}

}  // namespace arbiter::mnnvl
