// One-shot over double-buffered slots, chunk by chunk, with sequence numbers.
//
// Call n (workspace.h's next_sequence(), the same on every rank) uses parity
// p = n % 2. Each rank copies each chunk k of its input into its slot of
// parity p and stores n + 1 into its sequence line for (p, k) with release
// order; chunk 0's line also carries the call's signature. The lines are
// 64-bit (SequenceWord), so a line holds n + 1 only once call n has
// published it, however long ago it was last written. Then it meets every
// peer on chunk 0 (Workspace::meet(): every peer's line holds n + 1 and
// carries the same signature, or the call is refused on every rank before
// anything is summed), and, chunk by chunk, waits (acquire) until every
// peer's line for (p, k) holds n + 1, sums the chunk's tokens over the ranks
// in rank order into one fp32 row (from +0.0, as two-shot and native sum, so
// an all -0.0 column gives +0.0 everywhere) and applies the epilogue to each
// token while the row is in cache (token_kernels.h).
//
// Why a rank may overwrite its slot and lines of parity p in call n: every
// peer has left call n - 2, the last one that read them. A rank starts call
// n only after it has met every peer in call n - 1 (whatever its algorithm),
// which each peer joined only after it had finished call n - 2. So there is
// no sentinel, no clearing pass and no barrier at the end.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "algorithms.h"
#include "arbiter/common/numeric.h"
#include "futex.h"
#include "token_kernels.h"

namespace arbiter::shm {

Status run_oneshot(Workspace& workspace, const arbiter_allreduce_args& args) {
  const arbiter_dtype dtype = workspace.dtype();
  const std::int32_t ranks = workspace.world_size();
  const std::int32_t rank = workspace.rank();
  const std::uint32_t hidden = args.hidden;
  const std::size_t row_bytes = std::size_t{hidden} * common::dtype_size(dtype);
  const std::size_t chunk_tokens = oneshot_chunk_tokens(row_bytes);
  const std::uint64_t call = workspace.next_sequence();
  const auto parity = static_cast<std::uint32_t>(call % 2);
  const std::uint64_t published = call + 1;

  float* row = workspace.row_scratch(hidden);
  // Each rank's slot of this parity; a row of peer q is slots[q] + t * row_bytes.
  const std::byte* slots[kMaxRanks];
  for (std::int32_t q = 0; q < ranks; ++q) slots[q] = workspace.oneshot_slot(parity, q);
  std::byte* mine = workspace.oneshot_slot(parity, rank);
  const auto* input = static_cast<const std::byte*>(args.input);

  // Publish every chunk of this rank's input first (the data, then the
  // sequence number): a rank never waits before all its data is out, so a
  // peer that is descheduled mid-call costs the others one wait, not one
  // per chunk. Peers start on chunk 0 as soon as it is published.
  for (std::size_t first = 0, chunk = 0; first < args.tokens; first += chunk_tokens, ++chunk) {
    const std::size_t tokens = std::min<std::size_t>(chunk_tokens, args.tokens - first);
    std::memcpy(mine + first * row_bytes, input + first * row_bytes, tokens * row_bytes);
    workspace.publish(parity, chunk, published, chunk == 0 ? &workspace.signature : nullptr);
  }
  workspace.fault_point("shm.call.published");
  Backoff backoff = workspace.start_call();
  Status met =
      workspace.meet(parity, published, workspace.signature, backoff, "one-shot data (chunk 0)");
  if (!met.ok()) return met;
  workspace.fault_point("shm.call.met");
  // Then, chunk by chunk, every peer's data and the sums.
  for (std::size_t first = 0, chunk = 0; first < args.tokens; first += chunk_tokens, ++chunk) {
    const std::size_t tokens = std::min<std::size_t>(chunk_tokens, args.tokens - first);
    for (std::int32_t q = 0; q < ranks && chunk > 0; ++q) {
      if (q == rank) continue;
      if (Status s = workspace.await_line(parity, q, chunk, published, backoff,
                                          [&] {
                                            return "rank " + std::to_string(q) +
                                                   "'s one-shot data (chunk " +
                                                   std::to_string(chunk) + ", tokens " +
                                                   std::to_string(first) + "-" +
                                                   std::to_string(first + tokens - 1) + ")";
                                          });
          !s.ok()) {
        return s;
      }
    }
    workspace.kernels().reduce_tokens(args, workspace.rows_for_kernels(slots, args.input), ranks,
                                      first, tokens, row);
  }
  return {};
}

}  // namespace arbiter::shm
