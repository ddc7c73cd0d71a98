// One rank's view of the shared workspace, and what its algorithms share:
// slot addresses, the first meeting of every call (with its signature), the
// barrier, fault handling, the per-call deadline.
//
// Thread-safety: one thread at a time per workspace (the rank's), as the ABI
// requires, except abort(), which any thread may call at any time while the
// workspace exists. Different processes coordinate only through the mapping.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/common/call_signature.h"
#include "arbiter/common/fault_injection.h"
#include "arbiter/common/liveness.h"
#include "arbiter_backend.h"
#include "backoff.h"
#include "faults.h"
#include "owners_threshold.h"
#include "registered.h"
#include "shared_layout.h"
#include "status.h"
#include "token_kernels.h"
#include "wait_policy.h"

namespace arbiter::shm {

class Workspace {
 public:
  // Takes ownership of a mapping of layout.total bytes at `base`.
  // `liveness` watches the peers' processes (empty for one rank).
  Workspace(void* base, const Layout& layout, std::int32_t rank, std::int32_t world_size,
            arbiter_dtype dtype, std::int64_t timeout_ms, const TokenKernels& kernels,
            std::unique_ptr<common::Liveness> liveness);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  std::int32_t rank() const { return rank_; }
  std::int32_t world_size() const { return world_size_; }
  arbiter_dtype dtype() const { return dtype_; }
  std::int64_t timeout_ms() const { return timeout_ms_; }
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

  // What the kernels read, as the `rows` of TokenKernels: rank q's token t
  // at result[q] + t x row_bytes. This rank's rows come from `own`, its
  // input (in its cache; two-shot does not copy its own slice in), a peer's
  // from `shared[q]` in the mapping. Small peers' rows were once copied into
  // host scratch first (4 KiB one-shot, 2 ranks: 1.6 us against 1.75); on
  // 2026-12-05 the direct reads were faster at 4 and 8 KiB, for every
  // algorithm, at 2 and 4 ranks (docs/backends.md), so nothing is copied.
  const std::byte* const* rows_for_kernels(const std::byte* const* shared, const void* own);

  // A backoff whose deadline is timeout_ms from now, for one run().
  Backoff start_call();

  // The number of the next algorithm call (a streamed call takes one per
  // slice), the same on every rank: call n uses parity n % 2 and publishes
  // n + 1 (shared_layout.h). Never wraps.
  std::uint64_t next_sequence() { return sequence++; }

  // Stores `value` into this rank's sequence line (parity, chunk), after
  // `call` (the signature, chunk 0 only; NULL: leave it) and after
  // whatever the caller wrote before, and wakes sleepers.
  void publish(std::uint32_t parity, std::size_t chunk, std::uint64_t value,
               const common::CallSignature* call);

  // Waits until `peer`'s sequence line (parity, chunk) holds `value`.
  // describe() names what is awaited, for errors only (it allocates).
  template <class Describe>
  Status await_line(std::uint32_t parity, std::int32_t peer, std::size_t chunk, std::uint64_t value,
                    Backoff& backoff, Describe describe) {
    SequenceWord* line = oneshot_sequence(parity, peer, chunk);
    for (;;) {
      // `wake` first: if the value is still old, so is what a sleep waits on.
      const std::uint32_t wake =
          std::atomic_ref<std::uint32_t>(line->wake).load(std::memory_order_acquire);
      if (std::atomic_ref<std::uint64_t>(line->value).load(std::memory_order_acquire) == value) {
        break;
      }
      const WaitState state = backoff.pause(&line->wake, wake, peer);
      if (state != WaitState::kKeepWaiting) {
        // The peer may have published between the poll above and pause()'s
        // checks, and then left (its process ended with the job, or the
        // deadline passed just then): what it published counts.
        if (state != WaitState::kFault &&
            std::atomic_ref<std::uint64_t>(line->value).load(std::memory_order_acquire) == value) {
          break;
        }
        return wait_failed(state, backoff, peer, describe());
      }
    }
    backoff.progress();
    return {};
  }

  // The first meeting of every call, in every algorithm: waits until every
  // peer has published `value` in its chunk-0 line of `parity` (REQUIRES:
  // this rank has, with `mine`), and compares their signatures with `mine`.
  // ARBITER_MISMATCH, naming the field and the ranks, when one differs:
  // nothing of the call may then be read or written, and the workspace
  // stays usable (every rank refuses alike). Returns only once every peer
  // has joined (or a wait failed), refused or not. `what` names the data
  // awaited.
  Status meet(std::uint32_t parity, std::uint64_t value, const common::CallSignature& mine,
              Backoff& backoff, const char* what);

  // An algorithm call that meets its peers once, on chunk 0's line (every
  // algorithm but the copy path's one-shot, which publishes chunk by
  // chunk): publish_call() takes the next sequence number, publishes it with
  // this call's signature and starts the call's backoff (publishing first,
  // so peers wait least); meet_call() then meets every peer on it.
  Backoff publish_call();
  Status meet_call(Backoff& backoff, const char* what);

  // Waits until every rank has reached the same barrier (flags cycling
  // through three values). `what` names the barrier in errors.
  Status barrier(Backoff& backoff, const char* what);

  // Turns a stopped wait into a Status naming `what` was awaited (from rank
  // `awaited`, -1 if none in particular). A timeout or a dead peer is also
  // recorded in the fault word, which stops every rank's waits.
  Status wait_failed(WaitState state, const Backoff& backoff, std::int32_t awaited,
                     const std::string& what);

  // OK, or why this workspace can no longer be used.
  Status usable();

  // Thread-safe (any thread, while the workspace exists). Records an abort
  // by this rank in the fault word: this rank's waits return
  // ARBITER_ABORTED, its peers' ARBITER_PEER_FAILED naming it, each within
  // a millisecond or two (the backoff's slowest poll), and every later
  // run() fails at once.
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // Algorithm calls so far (slices count one each): see next_sequence().
  std::uint64_t sequence = 0;
  // The number of the current (or last) run() on this rank, from 0, the
  // same on every rank; `runs` counts them.
  std::uint64_t call = 0;
  std::uint64_t runs = 0;
  // The current run()'s signature (every slice of a streamed call carries
  // the whole call's).
  common::CallSignature signature{};

  // The current call's registered-input key (SequenceWord::registered),
  // published and compared with the signature; 0 for unregistered calls.
  std::uint64_t registered_key = 0;
  // How this rank's waits behave past their first spin (ARBITER_SHM_WAIT,
  // read once at creation).
  WaitPolicy wait_policy = WaitPolicy::kYield;
  static constexpr std::uint64_t kCopiedIn = std::uint64_t{1} << 63;
  // The current call's registered-outputs key (SequenceWord::registered_outputs):
  // nonzero when a replicated two-shot copies outputs from their owners.
  std::uint64_t registered_outputs_key = 0;
  // Calls of at least this many bytes per rank take the owners' path
  // (owners_threshold.h; ARBITER_SHM_OWNERS_FROM, the same on every rank).
  std::uint64_t owners_from_bytes = kDefaultOwnersFromBytes;
  // Registered memory (registered.h) and the oob it is allocated over (the
  // host keeps it valid until workspace_destroy()).
  RegisteredMemory registered;
  const arbiter_oob* oob = nullptr;

  // Test-only fault injection (fault_injection.h) at `step` of the current call.
  void fault_point(const char* step) const {
    if (faults_armed_) common::FaultInjection::get().at(step, rank_, call);
  }

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
  std::unique_ptr<common::Liveness> liveness_;
  std::atomic<bool> aborted_{false};
  bool faults_armed_ = common::FaultInjection::get().armed();
  std::uint32_t barrier_flag_ = 0;
  std::vector<const std::byte*> twoshot_inputs_;
  std::vector<float> row_scratch_;
  std::array<const std::byte*, kMaxRanks> kernel_rows_{};
};

// Collective over oob: see workspace_create.cpp.
Status create_workspace(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                        Workspace** out);

}  // namespace arbiter::shm
