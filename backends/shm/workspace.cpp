#include "workspace.h"

#include <sched.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <string>

#include "arbiter/common/numeric.h"
#include "arbiter/common/stages.h"
#include "futex.h"
#include "token_kernels.h"

namespace arbiter::shm {

Workspace::Workspace(void* base, const Layout& layout, std::int32_t rank, std::int32_t world_size,
                     arbiter_dtype dtype, std::int64_t timeout_ms, const TokenKernels& kernels)
    : base_(base),
      layout_(layout),
      rank_(rank),
      world_size_(world_size),
      dtype_(dtype),
      timeout_ms_(timeout_ms),
      kernels_(kernels) {
  for (std::int32_t peer = 0; peer < world_size; ++peer) {
    twoshot_inputs_.push_back(twoshot_input(peer));
  }
}

// The object was unlinked at creation, so the memory goes away with the last
// rank's unmap; no rank has to wait for the others here.
Workspace::~Workspace() { munmap(base_, layout_.total); }

std::byte* Workspace::oneshot_slot(std::uint32_t parity, std::int32_t rank) {
  const std::size_t slot = static_cast<std::size_t>(parity) * world_size_ + rank;
  return static_cast<std::byte*>(base_) + layout_.oneshot + slot * layout_.slot_stride;
}

SequenceWord* Workspace::oneshot_sequence(std::uint32_t parity, std::int32_t rank,
                                          std::size_t chunk) {
  const std::size_t line =
      (static_cast<std::size_t>(parity) * world_size_ + rank) * layout_.oneshot_chunks + chunk;
  return reinterpret_cast<SequenceWord*>(static_cast<std::byte*>(base_) +
                                         layout_.oneshot_sequences + line * kLine);
}

std::byte* Workspace::twoshot_input(std::int32_t rank) {
  return static_cast<std::byte*>(base_) + layout_.twoshot_inputs +
         static_cast<std::size_t>(rank) * layout_.slot_stride;
}

const std::byte* const* Workspace::rows_for_kernels(const std::byte* const* shared, const void* own,
                                                    std::size_t first, std::size_t count,
                                                    std::size_t row_bytes) {
  const std::size_t bytes = count * row_bytes;
  const bool copy_peers = bytes <= kLocalRowBytes;
  if (copy_peers && local_rows_.empty()) {
    local_rows_.resize(kLocalRowBytes * static_cast<std::size_t>(world_size_));
  }
  for (std::int32_t q = 0; q < world_size_; ++q) {
    if (q == rank_ || !copy_peers) {
      kernel_rows_[q] = q == rank_ ? static_cast<const std::byte*>(own) : shared[q];
      continue;
    }
    std::byte* copy = local_rows_.data() + static_cast<std::size_t>(q) * kLocalRowBytes;
    std::memcpy(copy, shared[q] + first * row_bytes, bytes);
    // The kernels index rows from token 0: the address `first` rows before
    // the copy (computed as an integer; only rows from `first` on are read).
    kernel_rows_[q] = reinterpret_cast<const std::byte*>(reinterpret_cast<std::uintptr_t>(copy) -
                                                         first * row_bytes);
  }
  return kernel_rows_.data();
}

std::byte* Workspace::sums() { return static_cast<std::byte*>(base_) + layout_.sums; }

std::byte* Workspace::staged_output(std::size_t index) {
  return static_cast<std::byte*>(base_) + layout_.outputs + index * layout_.slot_stride;
}

Backoff Workspace::start_call() {
  // Where this rank runs now, for peers deciding whether to spin (backoff.h);
  // the line is written only when the rank has moved.
  const int cpu = sched_getcpu();
  const std::uint32_t mine = cpu >= 0 ? static_cast<std::uint32_t>(cpu) + 1 : 0;
  auto* cpus = static_cast<std::byte*>(base_) + layout_.cpus;
  std::atomic_ref<std::uint32_t> word(
      *reinterpret_cast<std::uint32_t*>(cpus + static_cast<std::size_t>(rank_) * kLine));
  if (word.load(std::memory_order_relaxed) != mine) word.store(mine, std::memory_order_relaxed);
  return Backoff(Backoff::Clock::now() + std::chrono::milliseconds(timeout_ms_),
                 &header().failed_rank, &header().sleepers, cpus, mine);
}

Status Workspace::barrier(Backoff& backoff, const char* what) {
  auto* flags = static_cast<std::byte*>(base_) + layout_.flags;
  auto flag_word = [&](std::int32_t rank) {
    return reinterpret_cast<std::uint32_t*>(flags + static_cast<std::size_t>(rank) * kLine);
  };
  barrier_flag_ = common::next_flag(barrier_flag_);
  // Release (and more): everything this rank wrote before the barrier is
  // visible to a peer that has seen the new flag (acquire below, on its
  // side); a peer asleep on the flag is woken.
  publish_and_wake(flag_word(rank_), barrier_flag_, sleepers());
  const std::uint32_t not_arrived = common::previous_flag(barrier_flag_);
  for (std::int32_t peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    std::atomic_ref<std::uint32_t> flag(*flag_word(peer));
    while (flag.load(std::memory_order_acquire) == not_arrived) {
      const WaitState state = backoff.pause(flag_word(peer), not_arrived, peer);
      if (state != WaitState::kKeepWaiting) {
        return wait_failed(
            state, std::string(what) + " (rank " + std::to_string(peer) + " has not arrived)");
      }
    }
    backoff.progress();
  }
  return {};
}

Status Workspace::wait_failed(WaitState state, const std::string& what) {
  std::atomic_ref<std::uint32_t> failed(header().failed_rank);
  const std::string call =
      "shm rank " + std::to_string(rank_) + ", call " + std::to_string(calls) + ": ";
  if (state == WaitState::kTimedOut) {
    std::uint32_t expected = 0;  // the first rank to give up is the one named
    failed.compare_exchange_strong(expected, static_cast<std::uint32_t>(rank_) + 1,
                                   std::memory_order_acq_rel);
    return {ARBITER_TIMEOUT, call + "timed out after " + std::to_string(timeout_ms_) +
                                 " ms waiting for " + what + "; the workspace is no longer usable"};
  }
  const std::uint32_t who = failed.load(std::memory_order_acquire);
  return {ARBITER_PEER_FAILED, call + "rank " + std::to_string(who - 1) +
                                   " gave up (timeout) while this rank waited for " + what +
                                   "; the workspace is no longer usable"};
}

Status Workspace::usable() {
  const std::uint32_t who =
      std::atomic_ref<std::uint32_t>(header().failed_rank).load(std::memory_order_acquire);
  if (who == 0) return {};
  return {ARBITER_PEER_FAILED, "shm: rank " + std::to_string(who - 1) +
                                   " timed out in an earlier call; this workspace can no "
                                   "longer be used (destroy it and create a new one)"};
}

void Workspace::sum_inputs(const std::byte* const* rows, std::size_t begin, std::size_t end,
                           void* out) {
  kernels_.sum_elements(dtype(), rows, world_size(), begin, end, out);
}

}  // namespace arbiter::shm
