// Lamport one-shot over one shared copy of three stages.
//
// Unlike the GPU kernels, all ranks poll the same stage memory, so a rank
// cannot clear its slot of the previous stage: a slow peer may still be
// polling it and would wait forever. Instead each rank resets its slot of the
// next stage before publishing into the current one. That stage was last
// used two calls ago, and a rank only starts this call after every rank has
// published the previous one, so every rank has finished reading the one
// before. A peer that sees this call's data (acquire) also sees the reset
// (written before it, release), so nobody reads stale data in the next call.
#include <cstddef>
#include <cstdint>
#include <string>

#include "algorithms.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/rmsnorm.h"
#include "arbiter/common/sentinel.h"
#include "arbiter/common/stages.h"
#include "slot_io.h"

namespace arbiter::shm {

namespace {

// Adds rank `peer`'s slot to `sums` (or assigns, for rank 0), waiting for
// each word until none of its elements is -0.0 any more. The dtype is a
// template argument so the per-element conversions compile without a switch.
template <arbiter_dtype kDtype>
Status accumulate_slot(Workspace& workspace, Backoff& backoff, std::int32_t peer,
                       std::uint32_t stage, std::uint64_t bytes, float* sums) {
  constexpr arbiter_dtype dtype = kDtype;
  std::byte* slot = workspace.oneshot_slot(stage, peer);
  const bool first = peer == 0;
  auto what = [&](std::uint64_t offset) {
    return "rank " + std::to_string(peer) + "'s one-shot data (stage " + std::to_string(stage) +
           ", byte " + std::to_string(offset) + " of " + std::to_string(bytes) + ")";
  };
  const std::uint64_t words = bytes / 8;
  float values[4];
  std::size_t element = 0;
  for (std::uint64_t w = 0; w < words; ++w) {
    auto word = shared_word<std::uint64_t>(slot + w * 8);
    std::uint64_t value = word.load(std::memory_order_acquire);
    while (common::word_has_negative_zero(value, dtype)) {
      const WaitState state = backoff.pause();
      if (state != WaitState::kKeepWaiting) return workspace.wait_failed(state, what(w * 8));
      value = word.load(std::memory_order_acquire);
    }
    backoff.progress();
    const int lanes = decode_word(value, dtype, values);
    for (int lane = 0; lane < lanes; ++lane, ++element) {
      sums[element] = first ? values[lane] : sums[element] + values[lane];
    }
  }
  const std::size_t element_bytes = common::dtype_size(dtype);
  for (std::uint64_t offset = words * 8; offset < bytes; offset += element_bytes, ++element) {
    std::uint32_t bits;
    for (;;) {
      bits = element_bytes == 4
                 ? shared_word<std::uint32_t>(slot + offset).load(std::memory_order_acquire)
                 : shared_word<std::uint16_t>(slot + offset).load(std::memory_order_acquire);
      if (!common::is_negative_zero_bits(bits, dtype)) break;
      const WaitState state = backoff.pause();
      if (state != WaitState::kKeepWaiting) return workspace.wait_failed(state, what(offset));
    }
    const float value = common::dtype_bits_to_float(bits, dtype);
    sums[element] = first ? value : sums[element] + value;
  }
  return {};
}

}  // namespace

Status run_oneshot(Workspace& workspace, const arbiter_allreduce_args& args) {
  const arbiter_dtype dtype = workspace.dtype();
  const std::size_t elements = static_cast<std::size_t>(args.tokens) * args.hidden;
  const std::uint64_t bytes = elements * common::dtype_size(dtype);
  const std::uint32_t stage = workspace.stage;
  const std::uint32_t next = common::next_stage(stage);
  const std::int32_t rank = workspace.rank();

  clear_slot(workspace.oneshot_slot(next, rank), workspace.written_bytes[next], dtype);
  workspace.written_bytes[next] = 0;
  write_sanitized(workspace.oneshot_slot(stage, rank), args.input, bytes, dtype);
  workspace.written_bytes[stage] = bytes;

  if (workspace.accumulator.size() < elements) workspace.accumulator.resize(elements);
  float* sums = workspace.accumulator.data();
  Backoff backoff = workspace.start_call();
  // Fixed rank order: every rank adds the same floats in the same order and
  // gets the same bits.
  for (std::int32_t peer = 0; peer < workspace.world_size(); ++peer) {
    Status status =
        dtype == ARBITER_DTYPE_FP16
            ? accumulate_slot<ARBITER_DTYPE_FP16>(workspace, backoff, peer, stage, bytes, sums)
        : dtype == ARBITER_DTYPE_BF16
            ? accumulate_slot<ARBITER_DTYPE_BF16>(workspace, backoff, peer, stage, bytes, sums)
            : accumulate_slot<ARBITER_DTYPE_FP32>(workspace, backoff, peer, stage, bytes, sums);
    if (!status.ok()) return status;
  }
  workspace.stage = next;

  for (std::uint32_t token = 0; token < args.tokens; ++token) {
    common::apply_epilogue_token(args, token, sums + static_cast<std::size_t>(token) * args.hidden);
  }
  return {};
}

}  // namespace arbiter::shm
