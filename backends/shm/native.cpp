// The unfused path: a plain all-reduce through the shared buffer, then the
// residual add and norm (+quant) as a separate pass over the stored sums,
// the way NCCL followed by a norm kernel would run it. Same results, bit for
// bit, as the fused algorithms: the epilogue rounds the sum to the dtype
// first, and here it reads the already rounded sum.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "algorithms.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/rmsnorm.h"
#include "token_kernels.h"

namespace arbiter::shm {

Status run_native(Workspace& workspace, const arbiter_allreduce_args& args) {
  const arbiter_dtype dtype = workspace.dtype();
  const std::uint32_t hidden = args.hidden;
  const std::size_t elements = static_cast<std::size_t>(args.tokens) * hidden;
  const std::size_t bytes = elements * common::dtype_size(dtype);

  std::memcpy(workspace.twoshot_input(workspace.rank()), args.input, bytes);
  Backoff backoff = workspace.publish_call();
  workspace.fault_point("shm.call.published");
  Status status =
      workspace.meet_call(backoff, "unfused input copy (the first step of the unfused path)");
  if (!status.ok()) return status;
  workspace.fault_point("shm.call.met");

  // The sums go straight to allreduce_out unless that is residual_in (in
  // place, aliasing.h): the epilogue still has to read the residual there.
  const bool sum_in_place =
      args.allreduce_out != nullptr &&
      !(common::pattern_has_norm(args.pattern) && args.allreduce_out == args.residual_in);
  void* sums = sum_in_place ? args.allreduce_out : nullptr;
  if (sums == nullptr) {
    if (workspace.sum_buffer.size() < bytes) workspace.sum_buffer.resize(bytes);
    sums = workspace.sum_buffer.data();
  }
  // This rank's rows come from its input, in its cache (from its copy when
  // the sums overwrite that input, in place); the peers' from their slots.
  // Reading its own slot instead made the unfused 4 KiB call 1.35x slower
  // (2 ranks; docs/backends.md, "what the call signature check costs").
  const void* own = sums == args.input
                        ? static_cast<const void*>(workspace.twoshot_input(workspace.rank()))
                        : args.input;
  const std::byte* const* rows = workspace.rows_for_kernels(workspace.twoshot_inputs(), own);
  workspace.sum_inputs(rows, 0, elements, sums);
  // Nobody may overwrite its input copy (next call) while another rank sums.
  workspace.fault_point("shm.call.barrier2");
  status = workspace.barrier(backoff, "native barrier 2 (inputs read)");
  if (!status.ok()) return status;
  if (!common::pattern_has_norm(args.pattern)) return {};

  arbiter_allreduce_args norm_args = args;
  if (sum_in_place) norm_args.allreduce_out = nullptr;  // already written above
  workspace.kernels().epilogue_tokens(norm_args, sums, 0, args.tokens,
                                      workspace.row_scratch(hidden));
  return {};
}

}  // namespace arbiter::shm
