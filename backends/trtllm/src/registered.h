// Registered memory of one trtllm workspace (the ABI's arbiter_backend_v2_memory):
// symmetric device allocations that every rank maps, so a registered call
// reads its peers' inputs in place (oneshot_registered.cu, twoshot.cu).
//
// One allocation is one cudaMalloc per rank, exported with a CUDA IPC handle
// and opened by the peers of other processes (peers of this process, the
// loopback virtual ranks, use the plain pointer), exactly as the workspace
// itself is mapped (workspace.cpp).
//
// Lifetime. free() is local and only marks the allocation: this rank can no
// longer use it, but its own part stays allocated (a peer may still read
// it; CUDA IPC does not keep memory alive for the importers) and so do its
// mappings of the peers' parts (its own kernels enqueued before free() may
// still read them). The next collective alloc() waits for this rank's
// device, closes those mappings and reports the allocation freed; the parts
// of allocations every rank reported are then freed for real.
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
  // What a registered kernel's first barrier compares across ranks: key(),
  // and what sets how many barriers the call makes and what it computes
  // (tokens, hidden, algorithm, pattern, dtype), mixed into 64 bits. Ranks
  // that differ in any of them trap there instead of pairing barriers that
  // do not belong together (which would leave the epochs apart for good).
  static std::uint64_t call_key(const RegisteredAllocation& a, std::uint64_t offset,
                                const arbiter_allreduce_args& args) {
    std::uint64_t h = key(a, offset);
    const std::uint64_t fields[] = {
        args.tokens, args.hidden, static_cast<std::uint64_t>(args.algorithm),
        static_cast<std::uint64_t>(args.pattern), static_cast<std::uint64_t>(args.dtype)};
    for (std::uint64_t f : fields) {  // splitmix64 steps
      h += 0x9E3779B97F4A7C15ull ^ f;
      h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
      h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
      h ^= h >> 31;
    }
    return h;
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
  // Closes the mappings of freed allocations once this rank's device is
  // idle, and sets bit k of `bits` for each freed allocations_[k].
  void report_freed(std::uint8_t* bits);

  std::vector<RegisteredAllocation> allocations_;
  std::uint64_t made_ = 0;
};

}  // namespace arbiter::trtllm
