// The layout of the shared-memory object every rank maps.
//
//   [header 4 KiB][barrier flags: one 64-byte line per rank, padded to 4 KiB]
//   [CPUs: one 64-byte line per rank, padded to 4 KiB: (CPU + 1) where the
//    rank last started a call, for waits (backoff.h)]
//   [sequence lines: 2 parities x world_size x chunk lines, 64 bytes each,
//    padded to 4 KiB]
//   [one-shot: 2 parities x world_size slots][two-shot inputs: world_size slots]
//   [two-shot / native sums: 1 slot]
//   [two-shot outputs, for ARBITER_RUN_RESIDUAL_REPLICATED: allreduce_out,
//    residual_out, norm_out and quant_out of the slice, 1 slot each]
//
// A slot holds one rank's part of one slice of a call (slot_bytes, rounded
// up to 64): a call larger than a slot streams through the slots a slice of
// whole tokens at a time (module.cpp), so the mapping does not grow with the
// message.
//
// Every call (every slice of a streamed one), whatever its algorithm, has a
// number n, the same on every rank, and uses parity p = n % 2. Its first
// synchronisation is the same in every algorithm: each rank stores the
// call's signature into its sequence line (p, rank, chunk 0), then n + 1
// into that line's value with release order, and waits (acquire) until
// every peer's line holds n + 1, comparing their signatures with its own
// (workspace.h, meet()). One-shot publishes its chunk k of data the same
// way, in lines (p, rank, k). So ranks whose calls differ (and may have
// chosen different algorithms) always meet, and refuse the call alike.
// Rank 0 writes the header before anyone else maps the object; the rest
// starts zeroed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "arbiter/common/call_signature.h"

namespace arbiter::shm {

inline constexpr std::uint32_t kMagic = 0x4D485341u;  // "ASHM"
inline constexpr std::uint32_t kLayoutVersion = 9;
inline constexpr std::size_t kLine = 64;
inline constexpr std::size_t kPage = 4096;
inline constexpr std::int32_t kMaxRanks = 64;  // above the ABI's largest world size, 63

// Lives at offset 0 of the mapping. Plain fields are written once by rank 0
// before the others map; `fault` is accessed only through atomic_ref.
struct SharedHeader {
  std::uint32_t magic;
  std::uint32_t layout_version;
  std::int32_t world_size;
  std::uint32_t dtype;
  std::uint64_t slot_bytes;
  std::uint64_t total_bytes;
  // The first fault any rank saw (faults.h), or 0. Once set the workspace is
  // dead: every waiter returns and every later run() fails.
  alignas(kLine) std::uint32_t fault;
  // Ranks asleep on a futex in the mapping right now (futex.h): publishers
  // wake only when it is not 0. Accessed only through atomic_ref.
  alignas(kLine) std::uint32_t sleepers;
};
static_assert(sizeof(SharedHeader) <= kPage);

// A sequence number in the mapping: readers poll `value`, and waits that
// sleep do so on `wake`, a futex word (32 bits) the publisher sets to the
// value's low half after the value (futex.h). 64 bits, so a line last
// written many calls ago can never hold the number being waited for: with
// 32 bits a line that no call had reached for 2^32 calls, or one never
// written, matched and its stale data was summed as the peer's.
// `call` (chunk-0 lines only) is the call's signature, stored before the
// value: a reader that sees the value sees it in the line it already holds,
// so comparing it costs no extra cache miss.
struct SequenceWord {
  std::uint64_t value;
  std::uint32_t wake;
  std::uint32_t unused;
  common::CallSignature call;
  // Chunk 0 only, beside `call`: the registered input's key
  // (RegisteredMemory::key(), bit 63 set when the module copied it in after
  // all), 0 for a call on unregistered memory. Compared like `call`.
  std::uint64_t registered;
  // Chunk 0 only: the registered outputs' key when a replicated two-shot
  // reads its peers' outputs from their owners, else 0. Compared likewise.
  std::uint64_t registered_outputs;
};
static_assert(sizeof(SequenceWord) <= kLine, "one sequence word per line");

// The largest slot: a rank's share of one slice. Calls beyond it stream
// (one more synchronisation per MiB per rank, well under 1% of moving it),
// and the mapping stays (3 x world size + 5) x 1 MiB at most: 29 MiB at 8
// ranks, whatever the fused cap.
inline constexpr std::uint64_t kMaxSlotBytes = std::uint64_t{1} << 20;

// The slot for a workspace asked to take `max_message_bytes` per call with
// rows of `row_bytes`: at most kMaxSlotBytes, at least one row.
inline std::uint64_t slot_bytes_for(std::uint64_t max_message_bytes, std::uint64_t row_bytes) {
  const std::uint64_t slot = max_message_bytes < kMaxSlotBytes ? max_message_bytes : kMaxSlotBytes;
  return slot > row_bytes ? slot : row_bytes;
}

// One-shot moves a message in chunks of whole tokens of about this many
// bytes (at least one token): a chunk is summed while it is still in cache,
// and readers start on chunk 0 while its writers copy chunk 1.
inline constexpr std::size_t kOneshotChunkBytes = 32 * 1024;

// Tokens per one-shot chunk for rows of `row_bytes` (> 0).
inline std::size_t oneshot_chunk_tokens(std::size_t row_bytes) {
  return row_bytes >= kOneshotChunkBytes ? 1 : kOneshotChunkBytes / row_bytes;
}

// The most chunks a slice of at most `slot_bytes` takes, for any row size:
// a chunk holds more than half of kOneshotChunkBytes, or one whole row
// longer than that.
inline std::size_t oneshot_max_chunks(std::uint64_t slot_bytes) {
  return static_cast<std::size_t>((2 * slot_bytes + kOneshotChunkBytes - 1) / kOneshotChunkBytes);
}

struct Layout {
  std::uint64_t slot_bytes = 0;  // what a slot holds
  std::size_t slot_stride = 0;   // slot_bytes rounded up to a line
  // Sequence lines per (parity, rank): one per chunk, plus one so that the
  // ranks' lines are not a multiple of 4 KiB apart (a store to one's own
  // line then delayed the load of a peer's by 4K aliasing).
  std::size_t oneshot_chunks = 0;
  std::size_t flags = 0;  // offsets from the start of the mapping
  std::size_t cpus = 0;
  std::size_t oneshot_sequences = 0;
  std::size_t oneshot = 0;
  std::size_t twoshot_inputs = 0;
  std::size_t sums = 0;
  std::size_t outputs = 0;  // kStagedOutputs slots
  std::size_t total = 0;
};

inline std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The outputs a replicated two-shot stages: allreduce_out, residual_out,
// norm_out, quant_out (at most a slot: one byte per element).
inline constexpr std::size_t kStagedOutputs = 4;

// The largest max_message_bytes a spec may ask for, and the largest slot.
inline constexpr std::uint64_t kMaxMessageBytes = std::uint64_t{1} << 46;  // 64 TiB

// nullopt when the sizes overflow.
inline std::optional<Layout> compute_layout(std::int32_t world_size, std::uint64_t slot_bytes) {
  if (world_size <= 0 || slot_bytes == 0 || slot_bytes > kMaxMessageBytes) return std::nullopt;
  const auto ranks = static_cast<std::size_t>(world_size);
  Layout layout;
  layout.slot_bytes = slot_bytes;
  layout.slot_stride = round_up(slot_bytes, kLine);
  layout.oneshot_chunks = oneshot_max_chunks(slot_bytes) + 1;
  layout.flags = kPage;
  layout.cpus = layout.flags + round_up(ranks * kLine, kPage);
  layout.oneshot_sequences = layout.cpus + round_up(ranks * kLine, kPage);
  layout.oneshot =
      layout.oneshot_sequences + round_up(2 * ranks * layout.oneshot_chunks * kLine, kPage);
  layout.twoshot_inputs = layout.oneshot + 2 * ranks * layout.slot_stride;
  layout.sums = layout.twoshot_inputs + ranks * layout.slot_stride;
  layout.outputs = layout.sums + layout.slot_stride;
  layout.total = round_up(layout.outputs + kStagedOutputs * layout.slot_stride, kPage);
  return layout;
}

}  // namespace arbiter::shm
