// Registered memory of one shm workspace (the ABI's arbiter_backend_v2_memory):
// symmetric allocations that every rank maps whole, so a registered call
// reads its peers' inputs in place.
//
// One allocation of `bytes` per rank is one POSIX shared-memory object of
// world_size parts of `stride` bytes (bytes rounded up to a page); rank r's
// part is at r x stride. Rank 0 creates it and unlinks the name once every
// rank has mapped it, so the memory lives until the last rank unmaps it:
// free() is local, and a rank that frees early never faults a peer.
//
// Thread-safety: the workspace's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter_backend.h"
#include "status.h"

namespace arbiter::shm {

// Every part starts on a page: enough for any vector load, and what mmap gives.
inline constexpr std::uint64_t kRegisteredAlignment = 4096;

struct Allocation {
  std::uint64_t serial = 0;    // the same on every rank: allocations made before it
  std::byte* base = nullptr;   // the whole mapping: world_size x stride bytes
  std::uint64_t stride = 0;    // one rank's part, page-rounded
  std::uint64_t bytes = 0;     // what the caller asked for per rank
  std::uint64_t total = 0;     // mapped bytes
  std::byte* local = nullptr;  // this rank's part
};

class RegisteredMemory {
 public:
  RegisteredMemory() = default;
  ~RegisteredMemory();  // unmaps every allocation left
  RegisteredMemory(const RegisteredMemory&) = delete;
  RegisteredMemory& operator=(const RegisteredMemory&) = delete;

  // Collective over `oob` (every rank, same order, same bytes); fails on
  // every rank when it fails on any.
  Status allocate(const arbiter_oob& oob, std::int64_t timeout_ms, std::uint64_t bytes,
                  void** local);
  // Local: unmaps this rank's view. `local` must be an allocation's start.
  Status release(void* local);

  // The allocation holding [pointer, pointer + bytes) of this rank's part,
  // or nullptr with `why` set (allocates only then).
  const Allocation* find(const void* pointer, std::uint64_t bytes, std::string& why) const;

  // Identifies a registered input across ranks: equal on two ranks exactly
  // when they passed the same allocation at the same offset. Never 0 (0
  // means "not registered" in the sequence line).
  static std::uint64_t key(const Allocation& allocation, const void* input);

 private:
  std::vector<Allocation> allocations_;
  std::uint64_t made_ = 0;
};

}  // namespace arbiter::shm
