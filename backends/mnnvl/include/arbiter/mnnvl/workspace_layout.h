// Byte layout of one rank's mnnvl workspace: one allocation (cuMem, bound to
// a multicast object; every peer's is mapped too), world sizes 2..64.
//
//   [control block: 128 B, local only, zero-initialised]
//   [buffer 0][buffer 1][buffer 2]      three Lamport buffers in rotation
//   buffer = [scatter area: scatter_bytes][broadcast area: broadcast_bytes]
//
// With M = message_capacity = min(max_message_bytes, max_tokens x hidden x
// element size) (the most one rank sends in one call) and row = hidden x
// element size of the spec:
//   scatter_bytes   = round_up(M + world_size x row, 128)
//   broadcast_bytes = round_up(M, 128)
// so every area and every buffer starts on a 128-byte boundary. Offsets are
// 64-bit everywhere; a buffer above kMaxBufferBytes is refused as absurd.
//
// Rotation (common/stages.h): the control block's `buffer` is b; a call
// writes buffer b of the ranks, resets buffer stage_to_clear(b) = (b + 2) % 3
// of its own workspace -- the previous call's -- to the sentinel over the
// control block's `clear` ranges, polls only its own copy of buffer b, and
// its last CTA sets buffer = next_stage(b), clear = this call's ranges,
// arrivals = 0. Everything written into a rank's buffer during a call is
// polled by that rank in that call, so the reset in the next call is safe.
//
// One-shot (m = tokens x row_bytes of the call): rank r stores its message
// once through the multicast address at offset r x m from the buffer's start
// (rank-major, contiguous), and every rank polls slots 0..ws-1 of its own
// copy. A call writes [0, ws x m) of the buffer, across both areas:
// per-call capacity floor(buffer_bytes / ws), rounded down to 16 bytes.
//
// Two-shot: token t belongs to rank t % ws. Rank r stores token t (unicast)
// into the owner's scatter area at row r x ceil(T / ws) + t / ws; the owner
// polls its rows of every rank, sums in rank order and stores the sum
// through the multicast address into row t of every rank's broadcast area.
// A call writes [0, ws x ceil(T / ws) x row_bytes) of the scatter area and
// [0, T x row_bytes) of the broadcast area: per-call capacity M, and the
// scatter rows must fit the area. ws x ceil(T / ws) <= T + ws - 1, so they
// always do when row_bytes is at most the spec's row; wider rows need the
// check (twoshot_scatter_bytes).
//
// The sentinel: every buffer starts filled with the 32-bit word 0x80000000
// (kLamportSentinel) whatever the dtype, and a reader knows a word arrived
// when it differs from it, compared on raw bits, never as a float: under
// flush-to-zero a pair of bf16 negative subnormals read as fp32 is a negative
// subnormal, flushes to -0.0 and "is" the sentinel (the GB200 hang). Senders
// sanitise every element (-0.0 -> +0.0), so no payload word can equal it:
// for fp32 the word is the element and only -0.0 has those bits; for fp16 and
// bf16 a word holds two elements, and 0x80000000 would need 0x8000 (-0.0) in
// its high element, which sanitising removes. Words are always whole pairs:
// every offset and every row is a multiple of 16 bytes.
#pragma once

#include <cstdint>
#include <string>

#include "arbiter/common/host_device.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/sentinel.h"
#include "arbiter/common/size_math.h"
#include "arbiter/common/stages.h"
#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::mnnvl {

using common::Result;
using common::Status;

inline constexpr std::uint32_t kMinWorldSize = 2;
inline constexpr std::uint32_t kMaxWorldSize = 64;
inline constexpr std::uint64_t kAreaAlignment = 128;
inline constexpr std::uint64_t kControlBytes = 128;
inline constexpr std::uint32_t kBuffers = common::kLamportStages;
// Larger buffers come only from a mistaken spec (1 TiB each).
inline constexpr std::uint64_t kMaxBufferBytes = std::uint64_t{1} << 40;
inline constexpr std::uint32_t kLamportSentinel = common::kNegativeZeroBits32;
// Per-call capacities are multiples of this (rows are 16-byte multiples).
inline constexpr std::uint64_t kCapacityGranule = 16;

ARBITER_HD constexpr bool is_supported_world_size(std::int64_t world_size) {
  return world_size >= kMinWorldSize && world_size <= kMaxWorldSize;
}

ARBITER_HD constexpr bool is_sentinel(std::uint32_t word) { return word == kLamportSentinel; }

// What one call wrote into its buffer, to be reset to the sentinel by the
// next call: scatter_bytes from the buffer's start (a one-shot range runs on
// into the broadcast area, which follows contiguously), broadcast_bytes from
// the broadcast area's start. Multiples of 16. Trivial, so it may sit in
// __shared__ memory.
struct ClearRanges {
  std::uint64_t scatter_bytes;
  std::uint64_t broadcast_bytes;
};

// The local control block at offset 0, zero-initialised by the host (buffer
// 0 first, nothing to clear). Only this rank's kernels touch it.
struct ControlBlock {
  std::uint32_t buffer;    // 0..2: the buffer the next call uses
  std::uint32_t arrivals;  // CTAs of the current call that are done
  ClearRanges clear;       // what the last call wrote, reset in buffer (buffer + 2) % 3
};
static_assert(sizeof(ControlBlock) <= kControlBytes, "the control block has 128 bytes");

// ceil(tokens / world_size): rows each rank owns per sender in two-shot.
// REQUIRES: world_size > 0.
ARBITER_HD constexpr std::uint64_t twoshot_rows_per_rank(std::uint64_t tokens,
                                                         std::uint32_t world_size) {
  return common::div_round_up(tokens, world_size);
}

ARBITER_HD constexpr std::uint32_t twoshot_owner(std::uint32_t token, std::uint32_t world_size) {
  return token % world_size;
}

// Bytes of a buffer one one-shot call fills: ws x message_bytes.
ARBITER_HD constexpr std::uint64_t oneshot_bytes(std::uint32_t world_size,
                                                 std::uint64_t message_bytes) {
  return std::uint64_t{world_size} * message_bytes;
}

// Bytes of the owner's scatter area one two-shot call fills:
// ws x ceil(T / ws) x row_bytes. REQUIRES: world_size > 0, row_bytes <= 2^31
// (check_call admits rows of at most 2^17 bytes).
ARBITER_HD constexpr std::uint64_t twoshot_scatter_bytes(std::uint32_t world_size,
                                                         std::uint32_t tokens,
                                                         std::uint64_t row_bytes) {
  return std::uint64_t{world_size} * twoshot_rows_per_rank(tokens, world_size) * row_bytes;
}

ARBITER_HD constexpr ClearRanges oneshot_clear_ranges(std::uint32_t world_size,
                                                      std::uint64_t message_bytes) {
  return ClearRanges{oneshot_bytes(world_size, message_bytes), 0};
}

ARBITER_HD constexpr ClearRanges twoshot_clear_ranges(std::uint32_t world_size,
                                                      std::uint32_t tokens,
                                                      std::uint64_t row_bytes) {
  return ClearRanges{twoshot_scatter_bytes(world_size, tokens, row_bytes),
                     std::uint64_t{tokens} * row_bytes};
}

struct WorkspaceLayout {
  std::uint32_t world_size = 0;
  arbiter_dtype dtype = ARBITER_DTYPE_FP16;
  std::uint64_t row_bytes = 0;         // the spec's hidden x element size
  std::uint64_t message_capacity = 0;  // M: bytes one rank may send in one call
  std::uint64_t control_offset = 0;
  std::uint64_t control_bytes = 0;    // kControlBytes
  std::uint64_t buffers_offset = 0;   // buffer 0
  std::uint64_t scatter_bytes = 0;    // round_up(M + ws x row_bytes, 128)
  std::uint64_t broadcast_bytes = 0;  // round_up(M, 128)
  std::uint64_t buffer_bytes = 0;     // scatter_bytes + broadcast_bytes
  std::uint64_t buffers_bytes = 0;    // 3 x buffer_bytes: filled with the sentinel
  std::uint64_t total_bytes = 0;      // control + buffers (a 128-byte multiple)

  // Offsets from the start of a workspace (any rank's, or the multicast
  // mapping: all share the layout).
  ARBITER_HD constexpr std::uint64_t buffer_offset(std::uint32_t buffer) const {
    return buffers_offset + buffer * buffer_bytes;
  }
  ARBITER_HD constexpr std::uint64_t scatter_offset(std::uint32_t buffer) const {
    return buffer_offset(buffer);
  }
  ARBITER_HD constexpr std::uint64_t broadcast_offset(std::uint32_t buffer) const {
    return buffer_offset(buffer) + scatter_bytes;
  }
  // Where `rank`'s one-shot message of message_bytes starts.
  ARBITER_HD constexpr std::uint64_t oneshot_slot_offset(std::uint32_t buffer, std::uint32_t rank,
                                                         std::uint64_t message_bytes) const {
    return buffer_offset(buffer) + rank * message_bytes;
  }
  // Where `sender` stores token `token` of a two-shot call of `tokens`
  // tokens, in the workspace of its owner (twoshot_owner).
  ARBITER_HD constexpr std::uint64_t scatter_row_offset(std::uint32_t buffer, std::uint32_t sender,
                                                        std::uint32_t token, std::uint32_t tokens,
                                                        std::uint64_t row_bytes) const {
    return scatter_offset(buffer) +
           (sender * twoshot_rows_per_rank(tokens, world_size) + token / world_size) * row_bytes;
  }
  // Where the sum of token `token` lands in every rank's workspace.
  ARBITER_HD constexpr std::uint64_t broadcast_row_offset(std::uint32_t buffer, std::uint32_t token,
                                                          std::uint64_t row_bytes) const {
    return broadcast_offset(buffer) + token * row_bytes;
  }
};

enum class LayoutError {
  kNone = 0,
  kWorldSize,     // not 2..64
  kDtype,         // not fp16, bf16 or fp32
  kZeroSize,      // max_message_bytes, max_tokens or hidden is 0
  kBufferTooBig,  // a buffer above kMaxBufferBytes
  kOverflow,      // a size does not fit in 64 bits (an absurd hidden)
};

// The layout for a workspace spec, or why there is none. Fills *out only on
// kNone. Pure arithmetic, identical on every rank given the same spec.
ARBITER_HD constexpr LayoutError compute_workspace_layout(
    std::int64_t world_size, std::uint64_t max_message_bytes, std::int64_t dtype,
    std::uint64_t max_tokens, std::uint64_t hidden, WorkspaceLayout* out) {
  using common::checked_add;
  using common::checked_mul;
  using common::checked_round_up;
  if (!is_supported_world_size(world_size)) return LayoutError::kWorldSize;
  if (!common::is_valid_dtype(dtype)) return LayoutError::kDtype;
  if (max_message_bytes == 0 || max_tokens == 0 || hidden == 0) return LayoutError::kZeroSize;
  const auto type = static_cast<arbiter_dtype>(dtype);
  const auto ranks = static_cast<std::uint64_t>(world_size);

  WorkspaceLayout layout;
  layout.world_size = static_cast<std::uint32_t>(world_size);
  layout.dtype = type;
  if (!checked_mul(hidden, common::dtype_size(type), &layout.row_bytes)) {
    return LayoutError::kOverflow;
  }
  std::uint64_t largest_call = 0;  // max_tokens x row_bytes
  if (!checked_mul(max_tokens, layout.row_bytes, &largest_call)) {
    largest_call = ~std::uint64_t{0};  // cannot be sent anyway; max_message_bytes bounds it
  }
  layout.message_capacity = max_message_bytes < largest_call ? max_message_bytes : largest_call;
  if (layout.message_capacity > kMaxBufferBytes) return LayoutError::kBufferTooBig;

  std::uint64_t padding = 0;  // ws x row_bytes: what ceil(T / ws) rows add at most
  std::uint64_t scatter_need = 0;
  if (!checked_mul(ranks, layout.row_bytes, &padding) ||
      !checked_add(layout.message_capacity, padding, &scatter_need) ||
      !checked_round_up(scatter_need, kAreaAlignment, &layout.scatter_bytes)) {
    return LayoutError::kOverflow;
  }
  // M <= 2^40: no overflow from here on once the buffer is bounded.
  layout.broadcast_bytes = common::round_up(layout.message_capacity, kAreaAlignment);
  if (layout.scatter_bytes > kMaxBufferBytes ||
      layout.scatter_bytes + layout.broadcast_bytes > kMaxBufferBytes) {
    return LayoutError::kBufferTooBig;
  }
  layout.buffer_bytes = layout.scatter_bytes + layout.broadcast_bytes;
  layout.control_offset = 0;
  layout.control_bytes = kControlBytes;
  layout.buffers_offset = layout.control_offset + layout.control_bytes;
  layout.buffers_bytes = kBuffers * layout.buffer_bytes;
  layout.total_bytes = layout.buffers_offset + layout.buffers_bytes;
  *out = layout;
  return LayoutError::kNone;
}

// The most one rank may send in one call of `algorithm` (0 for native, or
// for a layout not made by compute_workspace_layout). One-shot: a ws-th of
// one buffer, never the whole workspace (only one buffer of three serves a
// call; vLLM #50932 divided the whole workspace and overran it). Two-shot:
// M; a call must also pass twoshot_scatter_bytes <= scatter_bytes.
ARBITER_HD constexpr std::uint64_t per_call_capacity(const WorkspaceLayout& layout,
                                                     arbiter_algorithm algorithm) {
  if (layout.world_size == 0) return 0;
  switch (algorithm) {
    case ARBITER_ALGORITHM_ONESHOT:
      return layout.buffer_bytes / layout.world_size / kCapacityGranule * kCapacityGranule;
    case ARBITER_ALGORITHM_TWOSHOT:
      return layout.message_capacity;
    default:
      return 0;
  }
}

// Bytes to allocate for total_bytes at the allocation granularity
// (cuMemGetAllocationGranularity / cuMulticastGetGranularity); 0 when the
// granularity is 0 or the rounded size does not fit in 64 bits.
ARBITER_HD constexpr std::uint64_t allocation_bytes(std::uint64_t total_bytes,
                                                    std::uint64_t granularity) {
  std::uint64_t rounded = 0;
  if (granularity == 0 || !common::checked_round_up(total_bytes, granularity, &rounded)) return 0;
  return rounded;
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
                    "mnnvl workspace: world size " + n(world_size) + " is not in 2..64");
    case LayoutError::kDtype:
      return Status(ARBITER_UNSUPPORTED,
                    "mnnvl workspace: dtype " + n(dtype) + " is not fp16, bf16 or fp32");
    case LayoutError::kZeroSize:
      return Status(ARBITER_INVALID_ARGUMENT, "mnnvl workspace: max_message_bytes (" +
                                                  n(max_message_bytes) + "), max_tokens (" +
                                                  n(max_tokens) + ") and hidden (" + n(hidden) +
                                                  ") must all be > 0");
    case LayoutError::kBufferTooBig:
      return Status(ARBITER_UNSUPPORTED,
                    "mnnvl workspace: a Lamport buffer (2 x M + world size x hidden x element "
                    "size bytes, M = min(max_message_bytes " +
                        n(max_message_bytes) + ", max_tokens " + n(max_tokens) + " x hidden " +
                        n(hidden) + " x element size)) at world size " + n(world_size) +
                        " exceeds " + n(kMaxBufferBytes) +
                        " bytes; lower max_message_bytes or max_tokens");
    case LayoutError::kOverflow:
      break;
  }
  return Status(ARBITER_UNSUPPORTED, "mnnvl workspace: the size for world size " + n(world_size) +
                                         ", hidden " + n(hidden) + " and " + n(max_message_bytes) +
                                         " message bytes overflows 64 bits; lower hidden");
}

}  // namespace arbiter::mnnvl
