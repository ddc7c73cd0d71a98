// Byte layout of one rank's trtllm workspace (one allocation, peer-mapped).
//
//   [control block: 128 B, local only]
//   [barrier flags: kMaxGridBlocks x world_size uint64 epochs, padded to 128 B]
//   [one-shot: 3 Lamport stages x world_size slots of slot_bytes]
//   [two-shot scratch: input area (slot_bytes), then sum area (slot_bytes)]
//   [registered barrier flags: kMaxGridBlocks x world_size x 16 B {epoch, key}]
//
// Every region and every slot starts on a 128-byte boundary, so 16-byte vector
// stores never straddle a cache line. slot_bytes is the per-rank message
// capacity rounded up to 128: min(max_message_bytes, max_tokens x hidden x
// element size). The one-shot region must be filled with the dtype's -0.0
// pattern (arbiter/common/sentinel.h: negative_zero_bits) and every peer must
// see it before the first call; everything else starts zeroed.
//
// One-shot call on stage s: rank r stores its message into slot r of stage s
// in every peer's workspace, resets slot_bytes-strided slots of stage
// stage_to_clear(s) in its own workspace to -0.0 over clear_bytes each (the
// previous one-shot call's message bytes, one range per slot), and polls its
// own stage s. Only one-shot calls advance `stage` and rewrite `clear_bytes`,
// so two-shot calls may be interleaved freely.
//
// Two-shot: rank r copies its message into its own input area; after a
// barrier, the owner of each token slice (common/partition.h) pulls that slice
// from every peer's input area, sums, and pushes the sum into every peer's sum
// area at the same offset; after a second barrier each rank reads its sum area.
//
// Barrier flags: word [block * world_size + peer] of rank r is written by
// `peer`'s CTA `block` (release, system scope) and read by rank r's CTA
// `block` (acquire). Values are 64-bit epochs that only grow (two per
// two-shot call, recorded in the control block), and a CTA waits until the
// word reaches its epoch: a peer ahead passes, a word left over from an
// earlier call with a larger grid is below the epoch and never looks like an
// arrival, and 64 bits never wrap. So grids may differ between calls.
//
// Registered calls (registered.h: the input read in place from every rank's
// registered memory) have barrier flags of their own, 16 bytes per word:
// the epoch as above (ControlBlock::registered_epoch) and the call's key
// (allocation, offset and shape: registered.h, call_key), written before the
// epoch. A copied
// call on one rank and a registered call on another therefore never pair
// (each waits for flags the other does not write, until the kernel's
// deadline), and a rank whose key differs is caught at the first barrier.
//
// All offsets are 64-bit: a stage can exceed 4 GiB at world size 16.
#pragma once

#include <cstdint>
#include <string>

#include "arbiter/common/host_device.h"
#include "arbiter/common/launch_config.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/size_math.h"
#include "arbiter/common/stages.h"
#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::trtllm {

using common::Result;
using common::Status;

inline constexpr std::uint64_t kSlotAlignment = 128;
// Grid blocks the barrier flags have room for: the launch configuration
// never exceeds it.
using common::kMaxGridBlocks;
// What one cudaMalloc shared through CUDA IPC is rounded up to: cudaMalloc
// may carve a small allocation out of a larger block, and CUDA IPC then
// shares the whole block, neighbours included (the CUDA programming guide's
// IPC section: share only allocations of a 2 MiB-aligned size).
inline constexpr std::uint64_t kIpcGranule = std::uint64_t{2} << 20;
// One slot's largest size: vector indices within a slot fit in 32 bits.
inline constexpr std::uint64_t kMaxSlotBytes = std::uint64_t{1} << 32;
// World sizes the kernels are instantiated for.
ARBITER_HD constexpr bool is_supported_world_size(std::int64_t world_size) {
  return world_size == 2 || world_size == 4 || world_size == 8 || world_size == 16;
}

// The local control block at offset 0. Zero-initialised by the host; the
// kernel's last arriving CTA (arrivals == grid blocks) advances it and resets
// `arrivals`, which is why the grid never exceeds one wave.
struct ControlBlock {
  std::uint32_t stage;             // Lamport stage the next one-shot call uses (0..2)
  std::uint32_t arrivals;          // CTAs of the current call that are done
  std::uint64_t clear_bytes;       // per slot: message bytes of the last one-shot call
  std::uint64_t barrier_epoch;     // epoch of the last two-shot barrier
  std::uint64_t registered_epoch;  // epoch of the last registered call's barrier
};
static_assert(sizeof(ControlBlock) <= kSlotAlignment);

struct WorkspaceLayout {
  std::uint32_t world_size = 0;
  arbiter_dtype dtype = ARBITER_DTYPE_FP16;
  std::uint64_t message_capacity = 0;  // bytes one rank may send in one call
  std::uint64_t slot_bytes = 0;        // message_capacity rounded up to 128
  std::uint64_t control_offset = 0;
  std::uint64_t control_bytes = 0;
  std::uint64_t flags_offset = 0;
  std::uint64_t flags_bytes = 0;
  std::uint64_t oneshot_offset = 0;
  std::uint64_t stage_bytes = 0;    // world_size x slot_bytes
  std::uint64_t oneshot_bytes = 0;  // 3 x stage_bytes
  std::uint64_t twoshot_offset = 0;
  std::uint64_t twoshot_bytes = 0;  // 2 x slot_bytes
  std::uint64_t registered_flags_offset = 0;
  std::uint64_t registered_flags_bytes = 0;
  std::uint64_t total_bytes = 0;  // sum of the regions (all 128-byte multiples)

  // What the workspace's one cudaMalloc takes: total_bytes rounded up to
  // kIpcGranule, so that peers' IPC mappings hold this allocation alone
  // (compute_workspace_layout checks that it fits in 64 bits).
  ARBITER_HD constexpr std::uint64_t allocation_bytes() const {
    return common::round_up(total_bytes, kIpcGranule);
  }

  ARBITER_HD constexpr std::uint64_t stage_offset(std::uint32_t stage) const {
    return oneshot_offset + stage * stage_bytes;
  }
  // Slot of `rank` in `stage`: where that rank's one-shot message lands.
  ARBITER_HD constexpr std::uint64_t slot_offset(std::uint32_t stage, std::uint32_t rank) const {
    return stage_offset(stage) + rank * slot_bytes;
  }
  ARBITER_HD constexpr std::uint64_t flag_offset(std::uint32_t block, std::uint32_t peer) const {
    return flags_offset + (std::uint64_t{block} * world_size + peer) * sizeof(std::uint64_t);
  }
  // The {epoch, key} word of a registered call's barrier (16 bytes).
  ARBITER_HD constexpr std::uint64_t registered_flag_offset(std::uint32_t block,
                                                            std::uint32_t peer) const {
    return registered_flags_offset + (std::uint64_t{block} * world_size + peer) * 16;
  }
  ARBITER_HD constexpr std::uint64_t twoshot_input_offset() const { return twoshot_offset; }
  ARBITER_HD constexpr std::uint64_t twoshot_sum_offset() const {
    return twoshot_offset + slot_bytes;
  }
};

enum class LayoutError {
  kNone = 0,
  kWorldSize,   // not 2, 4, 8 or 16
  kDtype,       // not fp16, bf16 or fp32
  kZeroSize,    // max_message_bytes, max_tokens or hidden is 0
  kSlotTooBig,  // message capacity above kMaxSlotBytes
  kOverflow,    // a region or the total does not fit in 64 bits
};

namespace detail {

using common::checked_add;
using common::checked_mul;
using common::round_up;

}  // namespace detail

// The layout for a workspace spec, or why there is none. Fills *out only on
// kNone. Pure arithmetic; identical on every rank given the same spec.
ARBITER_HD constexpr LayoutError compute_workspace_layout(
    std::int64_t world_size, std::uint64_t max_message_bytes, std::int64_t dtype,
    std::uint64_t max_tokens, std::uint64_t hidden, WorkspaceLayout* out) {
  using detail::checked_add;
  using detail::checked_mul;
  if (!is_supported_world_size(world_size)) return LayoutError::kWorldSize;
  if (!common::is_valid_dtype(dtype)) return LayoutError::kDtype;
  if (max_message_bytes == 0 || max_tokens == 0 || hidden == 0) return LayoutError::kZeroSize;
  const auto type = static_cast<arbiter_dtype>(dtype);
  const auto ranks = static_cast<std::uint64_t>(world_size);

  std::uint64_t largest_call = 0;  // max_tokens x hidden x element size
  if (!checked_mul(max_tokens, hidden, &largest_call) ||
      !checked_mul(largest_call, common::dtype_size(type), &largest_call)) {
    largest_call = ~std::uint64_t{0};  // cannot be sent anyway; max_message_bytes bounds it
  }
  WorkspaceLayout layout;
  layout.world_size = static_cast<std::uint32_t>(world_size);
  layout.dtype = type;
  layout.message_capacity = max_message_bytes < largest_call ? max_message_bytes : largest_call;
  if (layout.message_capacity > kMaxSlotBytes) return LayoutError::kSlotTooBig;
  layout.slot_bytes = detail::round_up(layout.message_capacity, kSlotAlignment);

  layout.control_offset = 0;
  layout.control_bytes = kSlotAlignment;
  layout.flags_offset = layout.control_offset + layout.control_bytes;
  layout.flags_bytes =
      detail::round_up(kMaxGridBlocks * ranks * sizeof(std::uint64_t), kSlotAlignment);
  layout.oneshot_offset = layout.flags_offset + layout.flags_bytes;
  if (!checked_mul(ranks, layout.slot_bytes, &layout.stage_bytes) ||
      !checked_mul(common::kLamportStages, layout.stage_bytes, &layout.oneshot_bytes) ||
      !checked_add(layout.oneshot_offset, layout.oneshot_bytes, &layout.twoshot_offset) ||
      !checked_mul(2, layout.slot_bytes, &layout.twoshot_bytes) ||
      !checked_add(layout.twoshot_offset, layout.twoshot_bytes, &layout.registered_flags_offset)) {
    return LayoutError::kOverflow;
  }
  layout.registered_flags_bytes = detail::round_up(kMaxGridBlocks * ranks * 16, kSlotAlignment);
  std::uint64_t allocation = 0;  // allocation_bytes(), checked here
  if (!checked_add(layout.registered_flags_offset, layout.registered_flags_bytes,
                   &layout.total_bytes) ||
      !common::checked_round_up(layout.total_bytes, kIpcGranule, &allocation)) {
    return LayoutError::kOverflow;
  }
  *out = layout;
  return LayoutError::kNone;
}

// The most one rank may send in one call of `algorithm` (0 for native: this
// backend does not run it). One-shot: one stage slot; two-shot: the scratch
// input area. Both are message_capacity; the kernels never write past it.
ARBITER_HD constexpr std::uint64_t per_call_capacity(const WorkspaceLayout& layout,
                                                     arbiter_algorithm algorithm) {
  return algorithm == ARBITER_ALGORITHM_ONESHOT || algorithm == ARBITER_ALGORITHM_TWOSHOT
             ? layout.message_capacity
             : 0;
}

// Host form of compute_workspace_layout with a message that says what to do.
inline Result<WorkspaceLayout> make_workspace_layout(std::int64_t world_size,
                                                     std::uint64_t max_message_bytes,
                                                     std::int64_t dtype, std::uint64_t max_tokens,
                                                     std::uint64_t hidden) {
  WorkspaceLayout layout;
  const auto n = [](auto v) { return std::to_string(v); };
  switch (
      compute_workspace_layout(world_size, max_message_bytes, dtype, max_tokens, hidden, &layout)) {
    case LayoutError::kNone:
      return layout;
    case LayoutError::kWorldSize:
      return Status(ARBITER_UNSUPPORTED,
                    "trtllm workspace: world size " + n(world_size) + " is not one of 2, 4, 8, 16");
    case LayoutError::kDtype:
      return Status(ARBITER_UNSUPPORTED,
                    "trtllm workspace: dtype " + n(dtype) + " is not fp16, bf16 or fp32");
    case LayoutError::kZeroSize:
      return Status(ARBITER_INVALID_ARGUMENT, "trtllm workspace: max_message_bytes (" +
                                                  n(max_message_bytes) + "), max_tokens (" +
                                                  n(max_tokens) + ") and hidden (" + n(hidden) +
                                                  ") must all be > 0");
    case LayoutError::kSlotTooBig:
      return Status(ARBITER_UNSUPPORTED,
                    "trtllm workspace: a per-rank message capacity of min(max_message_bytes " +
                        n(max_message_bytes) + ", max_tokens x hidden x element size) exceeds " +
                        n(kMaxSlotBytes) + " bytes; lower max_message_bytes or max_tokens");
    case LayoutError::kOverflow:
      break;
  }
  return Status(ARBITER_UNSUPPORTED, "trtllm workspace: the size for world size " + n(world_size) +
                                         " and " + n(max_message_bytes) +
                                         " message bytes overflows 64 bits");
}

}  // namespace arbiter::trtllm
