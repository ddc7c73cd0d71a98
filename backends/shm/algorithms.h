// The three ways the shm backend runs one call. Each is collective, and
// each begins with the same meeting (Workspace::meet()): every rank
// publishes the call's signature in the same line, whatever its algorithm,
// so a call that differs across ranks (and may have led them to different
// algorithms) is refused on every rank before anything is summed.
//
// REQUIRES (checked by run() in module.cpp): args valid for the workspace,
// tokens > 0, message bytes <= the workspace's slot_bytes(), and
// workspace.signature set to the (whole) call's.
// All three produce bit-identical outputs for the same inputs: the sum is
// accumulated in fp32 in rank order from +0.0 (token_kernels.h), then the
// epilogue of arbiter/common/rmsnorm.h runs on it.
#pragma once

#include <array>
#include <cstddef>

#include "arbiter_backend.h"
#include "status.h"
#include "workspace.h"

namespace arbiter::shm {

// One-shot: chunk by chunk, publish into this rank's slot of the call's
// parity with a sequence number, wait for every peer's, sum, epilogue per
// token. No barrier, no clearing (oneshot.cpp).
Status run_oneshot(Workspace& workspace, const arbiter_allreduce_args& args);

// The outputs a replicated two-shot call exchanges, in staging-slot order
// (allreduce_out, residual_out, norm_out, quant_out), with the bytes of one
// token of each; NULL outputs (and quant_out outside the fp8 pattern) are
// skipped.
struct StagedOutput {
  std::byte* buffer;
  std::size_t row_bytes;
};
std::array<StagedOutput, kStagedOutputs> staged_outputs(const arbiter_allreduce_args& args,
                                                        std::size_t row_bytes);

// Every rank's outputs of a replicated two-shot call whose outputs are all
// registered: rows[k][q] is rank q's output k (staged_outputs() order) as
// this rank maps it, nullptr where the call writes none.
struct OwnerOutputs {
  std::byte* rows[kStagedOutputs][kMaxRanks];
};

// Two-shot: copy in, barrier, sum this rank's token slice from every rank,
// publish it, barrier, epilogue over all tokens. With `inputs` (every
// rank's input in registered memory, in rank order) there is no copy-in:
// the slices are summed from the peers' inputs in place. Barrier 2 already
// follows every read of a peer's input, so no barrier is added.
// With `owners` (replicated calls only) each rank writes its slice's outputs
// straight into its registered outputs and copies the other slices from
// their owners' outputs instead of a staging area; a barrier at the end then
// keeps a rank from returning (and its caller from overwriting an output)
// while a peer still copies from it.
Status run_twoshot(Workspace& workspace, const arbiter_allreduce_args& args,
                   const std::byte* const* inputs = nullptr, const OwnerOutputs* owners = nullptr);

// One-shot on registered inputs (`inputs`: every rank's, in rank order, read
// in place): publish the call, meet, sum and run the epilogue chunk by chunk
// straight from the peers' inputs, then a barrier, so that no rank returns
// (and overwrites its input) while a peer still reads it. REQUIRES: no
// output overlaps args.input (a rank would overwrite what peers still read;
// module.cpp copies such calls in instead). Any message size: nothing goes
// through the slots.
Status run_oneshot_registered(Workspace& workspace, const arbiter_allreduce_args& args,
                              const std::byte* const* inputs);

// Unfused: a plain all-reduce through the shared buffer into allreduce_out
// (or host scratch), then residual + norm (+quant) as a separate pass.
Status run_native(Workspace& workspace, const arbiter_allreduce_args& args);

}  // namespace arbiter::shm
