// Two-shot: reduce-scatter by token slices, then every rank gets all tokens.
//
// The meeting (Workspace::meet(), the first synchronisation of every
// algorithm, which also compares the ranks' call signatures) makes every
// input copy visible before anyone sums; barrier 2 makes every rank's slice
// visible before anyone reads it, and also keeps a fast rank from
// overwriting its input copy (next call) while a slow one still sums from
// it. The next call's meeting likewise keeps the shared sums and staged
// outputs from being overwritten while a slow rank still reads them.
//
// Two ways to finish:
//   - by default each rank publishes its slice's sums, and every rank runs
//     the epilogue on every token with its own residual_in;
//   - with ARBITER_RUN_RESIDUAL_REPLICATED (residual_in the same on every
//     rank) each rank runs the epilogue on its slice only, straight from the
//     ranks' inputs into its own outputs, stages those outputs, and
//     copies the other slices' outputs from their owners: the epilogue's
//     work is split world_size ways instead of repeated on every rank.
// Both give the same bits: the same sums in the same order, the same
// epilogue, on the same residual.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "algorithms.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/partition.h"
#include "arbiter/common/rmsnorm.h"
#include "shared_layout.h"
#include "token_kernels.h"

namespace arbiter::shm {

std::array<StagedOutput, kStagedOutputs> staged_outputs(const arbiter_allreduce_args& args,
                                                        std::size_t row_bytes) {
  const bool quantized = args.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  return {{{static_cast<std::byte*>(args.allreduce_out), row_bytes},
           {static_cast<std::byte*>(args.residual_out), row_bytes},
           {static_cast<std::byte*>(args.norm_out), row_bytes},
           {quantized ? static_cast<std::byte*>(args.quant_out) : nullptr, args.hidden}}};
}

namespace {

// Tokens [first, end) of every output the call writes, copied into the
// staging slots (`stage`) or back out of them.
void copy_staged(Workspace& workspace, const std::array<StagedOutput, kStagedOutputs>& outputs,
                 std::uint32_t first, std::uint32_t end, bool stage) {
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (outputs[k].buffer == nullptr) continue;
    std::byte* const own = outputs[k].buffer + first * outputs[k].row_bytes;
    std::byte* const staged = workspace.staged_output(k) + first * outputs[k].row_bytes;
    const std::size_t bytes = (end - first) * outputs[k].row_bytes;
    if (stage) {
      std::memcpy(staged, own, bytes);
    } else {
      std::memcpy(own, staged, bytes);
    }
  }
}

// The epilogue on this rank's slice [first, end), then the other slices'
// outputs from their owners: through the staging slots, or with `owners`
// straight from the owners' registered outputs.
// The slice goes through the kernel a one-shot chunk of tokens at a time,
// each chunk's outputs staged right after it, while they are still in cache.
// 1 MiB, 2 ranks, AVX2: the epilogue and staging took 173-179 us per call
// against 186-199 for the whole slice at once; 8 interleaved launches,
// median 227 us against 233 end to end.
Status finish_replicated(Workspace& workspace, const arbiter_allreduce_args& args,
                         const std::byte* const* inputs, std::size_t row_bytes, std::uint32_t first,
                         std::uint32_t end, const OwnerOutputs* owners, Backoff& backoff) {
  const std::int32_t ranks = workspace.world_size();
  const std::byte* const* rows = workspace.rows_for_kernels(inputs, args.input);
  const auto outputs = staged_outputs(args, row_bytes);
  float* const row = workspace.row_scratch(args.hidden);
  const auto chunk_tokens = static_cast<std::uint32_t>(oneshot_chunk_tokens(row_bytes));
  for (std::uint32_t token = first; token < end; token += chunk_tokens) {
    const std::uint32_t stop = std::min(end, token + chunk_tokens);
    workspace.kernels().reduce_tokens(args, rows, ranks, token, stop - token, row);
    if (owners == nullptr) copy_staged(workspace, outputs, token, stop, /*stage=*/true);
  }
  workspace.fault_point("shm.call.barrier2");
  Status status =
      workspace.barrier(backoff, owners == nullptr ? "two-shot barrier 2 (slice outputs staged)"
                                                   : "two-shot barrier 2 (slice outputs written)");
  if (!status.ok()) return status;
  for (std::int32_t q = 0; q < ranks; ++q) {
    if (q == workspace.rank()) continue;
    const std::uint32_t begin = common::slice_begin(args.tokens, ranks, q);
    const std::uint32_t stop = common::slice_end(args.tokens, ranks, q);
    if (owners == nullptr) {
      copy_staged(workspace, outputs, begin, stop, /*stage=*/false);
      continue;
    }
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      if (outputs[k].buffer == nullptr) continue;
      const std::size_t offset = begin * outputs[k].row_bytes;
      std::memcpy(outputs[k].buffer + offset, owners->rows[k][q] + offset,
                  (stop - begin) * outputs[k].row_bytes);
    }
  }
  // The staged path needs no end barrier: the next call's meeting keeps the
  // slots until every peer has copied. Registered outputs are the caller's
  // as soon as this returns.
  if (owners == nullptr) return {};
  return workspace.barrier(backoff, "two-shot end barrier (peers copied this rank's outputs)");
}

}  // namespace

Status run_twoshot(Workspace& workspace, const arbiter_allreduce_args& args,
                   const std::byte* const* inputs, const OwnerOutputs* owners) {
  const arbiter_dtype dtype = workspace.dtype();
  const std::int32_t ranks = workspace.world_size();
  const std::uint32_t hidden = args.hidden;
  const std::size_t row_bytes = std::size_t{hidden} * common::dtype_size(dtype);
  const auto rank = static_cast<std::uint32_t>(workspace.rank());
  const std::uint32_t first = common::slice_begin(args.tokens, ranks, rank);
  const std::uint32_t end = common::slice_end(args.tokens, ranks, rank);

  // Only the other ranks' slices: this rank's own slice is read by nobody
  // else, and it reads it from args.input. A plain copy: the barrier orders
  // it before every peer's reads, and the sums start from +0.0
  // (token_kernels.h), so -0.0 needs no sanitising.
  // Registered inputs are read where they are.
  if (inputs == nullptr) {
    std::byte* const copy = workspace.twoshot_input(workspace.rank());
    const auto* input = static_cast<const std::byte*>(args.input);
    std::memcpy(copy, input, first * row_bytes);
    std::memcpy(copy + end * row_bytes, input + end * row_bytes, (args.tokens - end) * row_bytes);
    inputs = workspace.twoshot_inputs();
  }
  Backoff backoff = workspace.publish_call();
  workspace.fault_point("shm.call.published");
  Status status = workspace.meet_call(backoff, "two-shot input copy");
  if (!status.ok()) return status;
  workspace.fault_point("shm.call.met");

  if ((args.flags & ARBITER_RUN_RESIDUAL_REPLICATED) != 0 &&
      common::pattern_has_norm(args.pattern)) {
    return finish_replicated(workspace, args, inputs, row_bytes, first, end, owners, backoff);
  }
  std::byte* sums = workspace.sums();
  workspace.sum_inputs(workspace.rows_for_kernels(inputs, args.input), std::size_t{first} * hidden,
                       std::size_t{end} * hidden, sums);
  workspace.fault_point("shm.call.barrier2");
  status = workspace.barrier(backoff, "two-shot barrier 2 (slice sums published)");
  if (!status.ok()) return status;

  workspace.kernels().epilogue_tokens(args, sums, 0, args.tokens, workspace.row_scratch(hidden));
  return {};
}

}  // namespace arbiter::shm
