// Registered memory of one trtllm workspace (the ABI's arbiter_backend_v2_memory):
// symmetric device allocations that every rank maps, so a registered call
// reads its peers' inputs in place (oneshot_registered.cu, twoshot.cu).
//
// One allocation is one cudaMalloc per rank, exported with a CUDA IPC handle
// and opened by the peers of other processes (peers of this process, the
// loopback virtual ranks, use the plain pointer), exactly as the workspace
// itself is mapped (workspace.cpp).
//
// Lifetime. free() is local: this rank closes its mappings of the peers'
// parts and can no longer use the allocation, but its own part stays
// allocated, because a peer may still read it (CUDA IPC does not keep
// memory alive for the importers). Each collective alloc() exchanges which
// allocations every rank has freed; those parts are then freed for real.
// workspace_destroy() frees what is left, after every rank has unmapped.
//
// Thread-safety: the workspace's thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/common/fused_module.h"
#include "arbiter/common/registered_lookup.h"
#include "arbiter/common/status.h"
#include "arbiter_backend.h"
#include "kernel_params.h"

namespace arbiter::trtllm {

// cudaMalloc returns at least this alignment: enough for 16-byte vectors.
inline constexpr std::uint64_t kRegisteredAlignment = 256;

struct RegisteredAllocation {
  std::uint64_t serial = 0;         // the same on every rank: allocations made before it
  std::uint64_t bytes = 0;          // every rank's part
  char* local = nullptr;            // this rank's part (its cudaMalloc)
  char* parts[kMaxRanks] = {};      // every rank's part as mapped here (parts[rank]: own)
  bool ipc_opened[kMaxRanks] = {};  // mappings to close
  bool freed = false;               // free()d here; the own part waits for the peers'
};

// Where this rank's peers live, as the workspace found at creation.
struct RegisteredGroup {
  const common::FusedRank* rank = nullptr;
  const bool* same_process = nullptr;  // [world_size]: peers mapped by plain pointer
};

class RegisteredMemory {
 public:
  RegisteredMemory() = default;
  RegisteredMemory(const RegisteredMemory&) = delete;
  RegisteredMemory& operator=(const RegisteredMemory&) = delete;

  // Collective over the group's oob (every rank, same order, same bytes);
  // fails on every rank when it fails on any, with nothing left allocated.
  common::Status allocate(const RegisteredGroup& group, std::uint64_t bytes, void** local);
  // Local: `local` must be an allocation's start, not freed yet.
  common::Status release(void* local);

  // The allocation holding [pointer, pointer + bytes) of this rank's part,
  // or nullptr with `why` set.
  const RegisteredAllocation* find(const void* pointer, std::uint64_t bytes,
                                   std::string& why) const;
  // Equal on two ranks exactly when they passed the same allocation at the
  // same offset; never 0.
  static std::uint64_t key(const RegisteredAllocation& a, std::uint64_t offset) {
    return common::registered_key(a.serial, offset);
  }

  // The teardown halves (destroy_peer_mapped): close every mapping of a
  // peer's part; free every own part.
  void close_peer_mappings();
  void free_own();

 private:
  // Frees the own parts of allocations every rank has freed (`freed`: the
  // serials each rank reported, rank by rank).
  template <typename Hello>
  void reclaim(const std::vector<Hello>& all);

  std::vector<RegisteredAllocation> allocations_;
  std::uint64_t made_ = 0;
};

}  // namespace arbiter::trtllm
