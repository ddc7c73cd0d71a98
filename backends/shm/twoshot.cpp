// Two-shot: reduce-scatter by token slices, then every rank reads all sums.
//
// Barrier 1 makes every input copy visible before anyone sums; barrier 2
// makes every slice sum visible before anyone runs the epilogue, and also
// keeps a fast rank from overwriting its input copy (next call) while a slow
// one still sums from it. The next call's barrier 1 likewise keeps the sums
// region from being overwritten while a slow rank still reads it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "algorithms.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/partition.h"
#include "token_kernels.h"

namespace arbiter::shm {

Status run_twoshot(Workspace& workspace, const arbiter_allreduce_args& args) {
  const arbiter_dtype dtype = workspace.dtype();
  const std::int32_t ranks = workspace.world_size();
  const std::uint32_t hidden = args.hidden;
  const std::size_t elements = static_cast<std::size_t>(args.tokens) * hidden;

  // A plain copy: the barrier orders it before every peer's reads, and the
  // sums start from +0.0 (token_kernels.h), so -0.0 needs no sanitising.
  std::memcpy(workspace.twoshot_input(workspace.rank()), args.input,
              elements * common::dtype_size(dtype));
  Backoff backoff = workspace.start_call();
  Status status = workspace.barrier(backoff, "two-shot barrier 1 (inputs copied)");
  if (!status.ok()) return status;

  const auto rank = static_cast<std::uint32_t>(workspace.rank());
  const std::size_t begin = std::size_t{common::slice_begin(args.tokens, ranks, rank)} * hidden;
  const std::size_t end = std::size_t{common::slice_end(args.tokens, ranks, rank)} * hidden;
  std::byte* sums = workspace.sums();
  workspace.sum_inputs(begin, end, sums);
  status = workspace.barrier(backoff, "two-shot barrier 2 (slice sums published)");
  if (!status.ok()) return status;

  std::vector<float>& row = workspace.accumulator;
  if (row.size() < hidden) row.resize(hidden);
  workspace.kernels().epilogue_tokens(args, sums, 0, args.tokens, row.data());
  return {};
}

}  // namespace arbiter::shm
