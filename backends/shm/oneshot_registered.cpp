// One-shot on registered inputs: the copy path (oneshot.cpp) without the
// copy-in. The inputs already sit in memory every rank maps, so a rank
// publishes the call (chunk 0's line, with its signature and registered
// key) once, meets every peer, and sums straight from the peers' inputs.
//
// Why the barrier at the end: the copy path's slots belong to the
// workspace, and the meeting of the call after next protects them; a
// registered input belongs to the caller, who may overwrite it as soon as
// run returns (the next layer writes its output there). So a rank returns
// only once every peer has finished reading it.
//
// The per-chunk sequence lines of the copy path are not used: every chunk
// is published at once. A copy-path call after this one still finds them
// older than its own number (sequence numbers only grow).
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "algorithms.h"
#include "arbiter/common/numeric.h"
#include "token_kernels.h"

namespace arbiter::shm {

Status run_oneshot_registered(Workspace& workspace, const arbiter_allreduce_args& args,
                              const std::byte* const* inputs) {
  const std::int32_t ranks = workspace.world_size();
  const std::size_t row_bytes = std::size_t{args.hidden} * common::dtype_size(workspace.dtype());
  const std::size_t chunk_tokens = oneshot_chunk_tokens(row_bytes);
  Backoff backoff = workspace.publish_call();
  workspace.fault_point("shm.call.published");
  Status status = workspace.meet_call(backoff, "registered one-shot input");
  if (!status.ok()) return status;
  workspace.fault_point("shm.call.met");
  float* row = workspace.row_scratch(args.hidden);
  for (std::size_t first = 0; first < args.tokens; first += chunk_tokens) {
    const std::size_t tokens = std::min<std::size_t>(chunk_tokens, args.tokens - first);
    workspace.kernels().reduce_tokens(args, workspace.rows_for_kernels(inputs, args.input), ranks,
                                      first, tokens, row);
  }
  workspace.fault_point("shm.call.barrier2");
  return workspace.barrier(backoff, "registered one-shot end (peers done reading inputs)");
}

}  // namespace arbiter::shm
