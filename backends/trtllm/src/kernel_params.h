// What one launch of a trtllm kernel receives, by value (a few hundred bytes
// of kernel parameters; nothing else is read from host memory but the abort
// flag, and that only while a wait on a peer lasts).
//
// Every rank's workspace base is in peers[], as mapped in this process (an
// IPC mapping, or the plain pointer of a virtual rank in loopback mode); the
// offsets come from WorkspaceLayout. Buffers of the call are device pointers
// of the caller; the ones the pattern does not use are NULL.
#pragma once

#include <cstdint>

#include "arbiter/common/cuda/epilogue_params.h"
#include "arbiter/trtllm/workspace_layout.h"
#include "arbiter_backend.h"

namespace arbiter::trtllm {

inline constexpr std::uint32_t kMaxRanks = 16;

struct KernelParams {
  char* peers[kMaxRanks] = {};
  ControlBlock* control = nullptr;  // this rank's, inside peers[rank]
  std::uint32_t rank = 0;
  std::uint32_t world_size = 0;
  std::uint32_t tokens = 0;
  // Workspace layout (bytes from a workspace base).
  std::uint64_t flags_offset = 0;
  std::uint64_t oneshot_offset = 0;
  std::uint64_t stage_bytes = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t twoshot_input_offset = 0;
  std::uint64_t twoshot_sum_offset = 0;
  // A wait on a peer that takes longer than this traps (0: waits forever):
  // a lost peer then ends in a CUDA error instead of a silent hang.
  std::uint64_t spin_timeout_ns = 0;
  // This rank's abort flag, in host-mapped memory (device_ops.cuh, Spin):
  // once the host sets it, waits on peers stop.
  const std::uint32_t* abort_flag = nullptr;
  // The call: this rank's input, and everything the epilogue writes.
  const void* input = nullptr;
  // Registered calls (registered.h) only. sources[q]: rank q's input as
  // mapped in this process (its registered memory, at the call's offset),
  // read in place; all NULL on a copied call. call_key names the allocation
  // and offset; every rank's must be equal (checked at the first barrier).
  const char* sources[kMaxRanks] = {};
  std::uint64_t registered_flags_offset = 0;
  std::uint64_t call_key = 0;
  // Registered one-shot: an output is this rank's input (in place), so no
  // rank may write a token's outputs before every peer has read it.
  std::uint32_t input_overwritten = 0;
  common::EpilogueParams epilogue;
};

}  // namespace arbiter::trtllm
