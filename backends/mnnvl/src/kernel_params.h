// What one launch of an mnnvl kernel receives, by value.
//
// peers[q] is rank q's workspace as mapped in this process (one reserved
// range at a uniform stride on a real NVLink domain; plain allocations of
// the same process in loopback mode). `multicast` is the multicast mapping
// of the same layout: a store there lands in every rank's workspace. In
// loopback mode there is none (NULL) and the kernels store to every peer in
// turn instead, which runs the same protocol on one GPU.
#pragma once

#include <cstdint>

#include "arbiter/common/cuda/epilogue_params.h"
#include "arbiter/mnnvl/workspace_layout.h"

namespace arbiter::mnnvl {

inline constexpr std::uint32_t kMaxRanks = 64;

struct KernelParams {
  char* peers[kMaxRanks] = {};
  char* multicast = nullptr;
  ControlBlock* control = nullptr;  // this rank's, inside peers[rank]
  std::uint32_t rank = 0;
  std::uint32_t world_size = 0;
  std::uint32_t tokens = 0;
  std::uint64_t buffers_offset = 0;    // where buffer 0 starts
  std::uint64_t buffer_bytes = 0;      // one Lamport buffer
  std::uint64_t broadcast_offset = 0;  // the broadcast area, from a buffer's start
  // A wait on a peer longer than this traps (0: never).
  std::uint64_t spin_timeout_ns = 0;
  // This rank's abort flag, in host-mapped memory (device_ops.cuh, Spin):
  // once the host sets it, waits on peers stop.
  const std::uint32_t* abort_flag = nullptr;
  const void* input = nullptr;
  common::EpilogueParams epilogue;
};

}  // namespace arbiter::mnnvl
