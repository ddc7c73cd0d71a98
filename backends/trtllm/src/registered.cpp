// Collective allocation of trtllm registered memory: every rank allocates
// its part and all-gathers a record (status, size, pointer, IPC handle, the
// allocations it has freed); every rank maps the others' parts and a second
// all-gather agrees that all did. As workspace creation does (workspace.cpp),
// with less to agree on.
#include "registered.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "arbiter/common/collective.h"
#include "arbiter/common/cuda_host.h"
#include "arbiter/common/registered_lookup.h"

namespace arbiter::trtllm {
namespace {

using common::cuda_message;
using common::Status;

constexpr std::size_t kReasonBytes = 240;
// Allocations whose state one record reports, by position: every rank's
// list holds the same allocations in the same order (made together,
// reclaimed together), so position k names the same allocation everywhere.
// Freed allocations past it are freed with the workspace.
constexpr std::size_t kTrackedAllocations = 4096;
constexpr std::uint64_t kMaxPartBytes = std::uint64_t{1} << 40;  // key() keeps offsets in 40 bits

struct AllocHello {
  std::int32_t status;
  std::uint32_t ipc_ok;  // cudaIpcGetMemHandle succeeded
  std::uint64_t bytes;
  std::uint64_t base;
  cudaIpcMemHandle_t handle;
  std::uint8_t freed[kTrackedAllocations / 8];  // bit k: allocations_[k] freed here
  char reason[kReasonBytes];
};

struct Outcome {
  std::int32_t status;
  char reason[kReasonBytes];
};

void close_mappings(RegisteredAllocation& a) {
  for (std::uint32_t q = 0; q < kMaxRanks; ++q) {
    if (a.ipc_opened[q]) cudaIpcCloseMemHandle(a.parts[q]);
    a.ipc_opened[q] = false;
    if (a.parts[q] != a.local) a.parts[q] = nullptr;
  }
  cudaGetLastError();
}

// Maps rank q's part of the allocation `hello` describes into `a`.
Status map_part(const RegisteredGroup& group, const AllocHello& hello, std::uint32_t q,
                RegisteredAllocation& a) {
  if (group.same_process[q]) {
    a.parts[q] = reinterpret_cast<char*>(static_cast<std::uintptr_t>(hello.base));
    return Status();
  }
  if (!hello.ipc_ok) {
    return Status(ARBITER_UNAVAILABLE, "trtllm alloc: rank " + std::to_string(q) +
                                           " could not export its part (cudaIpcGetMemHandle "
                                           "failed there)");
  }
  void* mapped = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&mapped, hello.handle, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    cudaGetLastError();
    return Status(ARBITER_UNAVAILABLE,
                  cuda_message("trtllm alloc: mapping rank " + std::to_string(q) +
                                   "'s part (cudaIpcOpenMemHandle)",
                               e));
  }
  a.parts[q] = static_cast<char*>(mapped);
  a.ipc_opened[q] = true;
  return Status();
}

}  // namespace

Status RegisteredMemory::allocate(const RegisteredGroup& group, std::uint64_t bytes, void** local) {
  *local = nullptr;
  // Room for the record first: once every rank has mapped every part, no
  // push_back below may fail on one rank alone (its list, and the serials,
  // would no longer line up with its peers').
  allocations_.reserve(allocations_.size() + 1);
  const common::FusedRank& me = *group.rank;
  const arbiter_oob& oob = me.oob;
  AllocHello mine{};
  mine.bytes = bytes;
  // Checked alike on every rank (same bytes), so all refuse together.
  Status status;
  if (bytes == 0 || bytes > kMaxPartBytes) {
    status = Status(ARBITER_INVALID_ARGUMENT, "trtllm alloc: " + std::to_string(bytes) +
                                                  " bytes per rank; ask for 1 byte to 1 TiB");
  }
  common::DeviceScope scope;
  if (status.ok()) status = common::use_device(scope, me.device);
  if (status.ok()) report_freed(mine.freed);
  void* base = nullptr;
  if (status.ok()) {
    // Rounded up to kIpcGranule (workspace_layout.h), so a peer's mapping
    // holds this part alone and a second part never shares a block another
    // process has opened already (bytes <= 1 TiB: no overflow).
    const std::uint64_t reserved = common::round_up(bytes, kIpcGranule);
    if (cudaError_t e = cudaMalloc(&base, reserved); e != cudaSuccess) {
      cudaGetLastError();
      base = nullptr;
      status = Status(ARBITER_UNAVAILABLE,
                      cuda_message("trtllm alloc: cudaMalloc(" + std::to_string(reserved) +
                                       " bytes of registered memory, " + std::to_string(bytes) +
                                       " asked, rounded up to 2 MiB); allocate less",
                                   e));
    }
  }
  if (base != nullptr) {
    mine.base = reinterpret_cast<std::uintptr_t>(base);
    mine.ipc_ok = cudaIpcGetMemHandle(&mine.handle, base) == cudaSuccess ? 1 : 0;
    cudaGetLastError();
  }
  std::vector<AllocHello> all;
  Status s = common::gather_records(oob, mine, status, me.timeout_ms, &all);
  if (s.ok()) reclaim(all);  // every rank's record arrived
  for (std::size_t q = 1; q < all.size() && s.ok(); ++q) {
    if (all[q].bytes != all[0].bytes) {
      s = Status(ARBITER_MISMATCH, "trtllm alloc: rank " + std::to_string(q) + " asked for " +
                                       std::to_string(all[q].bytes) + " bytes, rank 0 for " +
                                       std::to_string(all[0].bytes) +
                                       " (every rank must allocate the same size)");
    }
  }
  if (!s.ok()) {
    if (base != nullptr) cudaFree(base);
    cudaGetLastError();
    return s;
  }

  RegisteredAllocation a;
  a.bytes = bytes;
  a.local = static_cast<char*>(base);
  Status mapped;
  for (std::uint32_t q = 0; q < me.world_size && mapped.ok(); ++q) {
    if (q == me.rank) {
      a.parts[q] = a.local;
    } else {
      mapped = map_part(group, all[q], q, a);
    }
  }
  Outcome outcome{};
  outcome.status = mapped.code();
  common::put_reason(outcome, mapped.message());
  std::vector<Outcome> outcomes(me.world_size);
  std::int32_t rc =
      oob.allgather(oob.ctx, &outcome, outcomes.data(), sizeof(Outcome), me.timeout_ms);
  s = rc == ARBITER_OK ? common::verdict(outcomes, oob.rank)
                       : common::exchange_failed(oob, "allgather", rc);
  if (!s.ok()) {
    // A peer may have mapped this rank's part already: wait for everyone to
    // unmap before freeing it.
    close_mappings(a);
    if (rc == ARBITER_OK) oob.barrier(oob.ctx, me.timeout_ms);
    cudaFree(base);
    cudaGetLastError();
    return s;
  }
  a.serial = made_++;
  allocations_.push_back(a);
  *local = base;
  return Status();
}

void RegisteredMemory::report_freed(std::uint8_t* bits) {
  // The kernels this rank enqueued before free() may still read the peers'
  // parts through these mappings (free() is not stream-ordered): wait for
  // them, then close the mappings. Only then may the owners free the parts.
  const bool any = std::any_of(allocations_.begin(), allocations_.end(),
                               [](const RegisteredAllocation& a) { return a.freed; });
  if (!any) return;
  cudaDeviceSynchronize();
  cudaGetLastError();
  for (std::size_t k = 0; k < allocations_.size(); ++k) {
    RegisteredAllocation& a = allocations_[k];
    if (!a.freed) continue;
    close_mappings(a);
    if (k < kTrackedAllocations) bits[k / 8] |= static_cast<std::uint8_t>(1u << (k % 8));
  }
}

template <typename Hello>
void RegisteredMemory::reclaim(const std::vector<Hello>& all) {
  const std::size_t tracked = std::min(allocations_.size(), kTrackedAllocations);
  for (std::size_t k = tracked; k-- > 0;) {
    const bool everywhere = std::all_of(
        all.begin(), all.end(), [&](const Hello& h) { return (h.freed[k / 8] >> (k % 8)) & 1u; });
    if (!everywhere) continue;
    cudaFree(allocations_[k].local);
    cudaGetLastError();
    allocations_.erase(allocations_.begin() + static_cast<std::ptrdiff_t>(k));
  }
}

Status RegisteredMemory::release(void* local) {
  const auto at =
      std::find_if(allocations_.begin(), allocations_.end(), [&](const RegisteredAllocation& a) {
        return !a.freed && a.local == static_cast<char*>(local);
      });
  if (at == allocations_.end()) {
    return Status(ARBITER_INVALID_ARGUMENT,
                  "trtllm free: the pointer is not the start of an allocation of this workspace "
                  "(freed twice, a view into one, or another communicator's)");
  }
  // The mappings close at the next alloc() (report_freed), after this
  // rank's kernels, which may still read through them, are done.
  at->freed = true;
  return Status();
}

const RegisteredAllocation* RegisteredMemory::find(const void* pointer, std::uint64_t bytes,
                                                   std::string& why) const {
  return common::find_registered(allocations_, pointer, bytes, why,
                                 [](const RegisteredAllocation& a) { return !a.freed; });
}

void RegisteredMemory::close_peer_mappings() {
  for (RegisteredAllocation& a : allocations_) close_mappings(a);
}

void RegisteredMemory::free_own() {
  for (RegisteredAllocation& a : allocations_) cudaFree(a.local);
  cudaGetLastError();
  allocations_.clear();
}

}  // namespace arbiter::trtllm
