// One rank's view of the shared workspace, and what its algorithms share:
// slot addresses, the barrier, failure handling, the per-call deadline.
//
// Thread-safety: one thread at a time per workspace (the rank's), as the ABI
// requires. Different processes coordinate only through the mapping.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter_backend.h"
#include "backoff.h"
#include "shared_layout.h"
#include "status.h"
#include "token_kernels.h"

namespace arbiter::shm {

class Workspace {
 public:
  // Takes ownership of a mapping of layout.total bytes at `base`.
  Workspace(void* base, const Layout& layout, std::int32_t rank, std::int32_t world_size,
            arbiter_dtype dtype, std::int64_t timeout_ms, const TokenKernels& kernels);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  std::int32_t rank() const { return rank_; }
  std::int32_t world_size() const { return world_size_; }
  arbiter_dtype dtype() const { return dtype_; }
  // The per-token arithmetic this rank runs (token_kernels.h).
  const TokenKernels& kernels() const { return kernels_; }
  // What one algorithm call takes per rank; run() streams larger calls
  // through it a slice of whole tokens at a time.
  std::uint64_t slot_bytes() const { return layout_.slot_bytes; }

  SharedHeader& header() { return *static_cast<SharedHeader*>(base_); }
  std::byte* oneshot_slot(std::uint32_t parity, std::int32_t rank);
  // The sequence word of `rank`'s chunk `chunk` of one-shot parity `parity`.
  SequenceWord* oneshot_sequence(std::uint32_t parity, std::int32_t rank, std::size_t chunk);
  // Ranks asleep on a futex in this mapping (futex.h).
  std::uint32_t* sleepers() { return &header().sleepers; }
  std::byte* twoshot_input(std::int32_t rank);
  // Every rank's two-shot input, in rank order (fixed for the workspace).
  const std::byte* const* twoshot_inputs() const { return twoshot_inputs_.data(); }
  std::byte* sums();
  // Staging for output `index` (0 allreduce_out, 1 residual_out, 2 norm_out,
  // 3 quant_out) of a replicated two-shot slice.
  std::byte* staged_output(std::size_t index);
  // Elements [begin, end) of every rank's input (`rows`, as twoshot_inputs()
  // or rows_for_kernels() give them), summed in fp32 in rank order and
  // stored as the workspace's dtype into `out` (same indices): the one
  // summation two-shot and the unfused path share.
  void sum_inputs(const std::byte* const* rows, std::size_t begin, std::size_t end, void* out);

  // What the kernels read for tokens [first, first + count) of every rank,
  // as the `rows` of TokenKernels: rank q's token t at result[q] + t x
  // row_bytes. This rank's rows come from `own`, its input (in its cache,
  // and two-shot does not copy its own slice in); a peer's from `shared[q]`
  // in the mapping, except that rows of at most kLocalRowBytes are first
  // copied into host scratch, one memcpy per peer, which fetches the lines
  // from the peer's core many at a time where the kernel's own loads come
  // one line per 32 bf16 values amid the arithmetic. 4 KiB one-shot, 2
  // ranks, eight interleaved runs: median 1.6 us against 1.75, and 2.8-3.2
  // us against 3.6-5.0 while the VM's cores were contended; from 16 KiB on
  // the extra pass costs as much as it saves, and more at 64 KiB.
  const std::byte* const* rows_for_kernels(const std::byte* const* shared, const void* own,
                                           std::size_t first, std::size_t count,
                                           std::size_t row_bytes);
  static constexpr std::size_t kLocalRowBytes = 8 * 1024;

  // A backoff whose deadline is timeout_ms from now, for one run().
  Backoff start_call();

  // Waits until every rank has reached the same barrier (flags cycling
  // through three values). `what` names the barrier in errors.
  Status barrier(Backoff& backoff, const char* what);

  // Turns a stopped wait into a Status naming `what` was awaited; a timeout
  // also marks the workspace failed for every rank.
  Status wait_failed(WaitState state, const std::string& what);

  // OK, or why this workspace can no longer be used.
  Status usable();

  // One-shot calls so far, the same on every rank: call n uses parity
  // n % 2 and publishes (n + 1) mod 2^32.
  std::uint64_t oneshot_calls = 0;
  std::uint64_t calls = 0;  // run() calls so far, for messages

  // A row of `hidden` floats of host scratch for the kernels (grown, never
  // shrunk, so calls of one shape allocate once).
  float* row_scratch(std::uint32_t hidden) {
    if (row_scratch_.size() < hidden) row_scratch_.resize(hidden);
    return row_scratch_.data();
  }
  // Host scratch for the unfused path's sums (grown, never shrunk).
  std::vector<std::byte> sum_buffer;

 private:
  void* base_;
  Layout layout_;
  std::int32_t rank_;
  std::int32_t world_size_;
  arbiter_dtype dtype_;
  std::int64_t timeout_ms_;
  const TokenKernels& kernels_;
  std::uint32_t barrier_flag_ = 0;
  std::vector<const std::byte*> twoshot_inputs_;
  std::vector<float> row_scratch_;
  std::vector<std::byte> local_rows_;  // kLocalRowBytes per rank, made at first use
  std::array<const std::byte*, kMaxRanks> kernel_rows_{};
};

// Collective over oob: see workspace_create.cpp.
Status create_workspace(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                        Workspace** out);

}  // namespace arbiter::shm
