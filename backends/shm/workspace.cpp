#include "workspace.h"

#include <sched.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <string>
#include <utility>

#include "arbiter/common/deadline.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/stages.h"
#include "futex.h"
#include "token_kernels.h"

namespace arbiter::shm {

Workspace::Workspace(void* base, const Layout& layout, std::int32_t rank, std::int32_t world_size,
                     arbiter_dtype dtype, std::int64_t timeout_ms, const TokenKernels& kernels,
                     std::unique_ptr<common::Liveness> liveness)
    : base_(base),
      layout_(layout),
      rank_(rank),
      world_size_(world_size),
      dtype_(dtype),
      timeout_ms_(timeout_ms),
      kernels_(kernels),
      liveness_(std::move(liveness)) {
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

const std::byte* const* Workspace::rows_for_kernels(const std::byte* const* shared,
                                                    const void* own) {
  for (std::int32_t q = 0; q < world_size_; ++q) {
    kernel_rows_[q] = q == rank_ ? static_cast<const std::byte*>(own) : shared[q];
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
  return Backoff(common::deadline_after<Backoff::Clock>(timeout_ms_), &header().fault,
                 &header().sleepers, cpus, mine, liveness_.get(), wait_policy);
}

void Workspace::publish(std::uint32_t parity, std::size_t chunk, std::uint64_t value,
                        const common::CallSignature* call) {
  SequenceWord* line = oneshot_sequence(parity, rank_, chunk);
  // Ordered before the value by its release. Written only when it changed
  // (a model's calls repeat their shape): a peer already polling the line
  // would otherwise lose it twice per call, once for the signature and once
  // for the value, which cost 3-4% of a 4 KiB one-shot call.
  if (call != nullptr && !common::same_call(line->call, *call)) line->call = *call;
  if (call != nullptr && line->registered != registered_key) line->registered = registered_key;
  if (call != nullptr && line->registered_outputs != registered_outputs_key) {
    line->registered_outputs = registered_outputs_key;
  }
  publish_and_wake(line, value, sleepers());
}

Backoff Workspace::publish_call() {
  const std::uint64_t call = next_sequence();
  publish(static_cast<std::uint32_t>(call % 2), 0, call + 1, &signature);
  return start_call();
}

Status Workspace::meet_call(Backoff& backoff, const char* what) {
  // `sequence` is the value publish_call() published: call + 1.
  return meet(static_cast<std::uint32_t>((sequence - 1) % 2), sequence, signature, backoff, what);
}

Status Workspace::meet(std::uint32_t parity, std::uint64_t value, const common::CallSignature& mine,
                       Backoff& backoff, const char* what) {
  // Every peer is awaited even once a difference is known: a rank leaves a
  // call only after every peer has joined it, that is, left the call
  // before. Returning at the first difference let a rank refuse the next
  // call after meeting one peer only, start the call after that, and
  // overwrite its line of this parity before a slow peer had read it.
  std::int32_t differs = -1;
  common::CallSignature theirs{};
  std::int32_t registered_differs = -1;
  std::uint64_t their_key = 0;
  std::int32_t outputs_differ = -1;
  std::uint64_t their_outputs = 0;
  for (std::int32_t peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    if (Status s = await_line(parity, peer, 0, value, backoff,
                              [&] { return "rank " + std::to_string(peer) + "'s " + what; });
        !s.ok()) {
      return s;
    }
    // The acquire above orders this read after the peer's store of it.
    const common::CallSignature& line = oneshot_sequence(parity, peer, 0)->call;
    if (differs < 0 && !common::same_call(mine, line)) [[unlikely]] {
      differs = peer;
      theirs = line;
    }
    const std::uint64_t key = oneshot_sequence(parity, peer, 0)->registered;
    if (registered_differs < 0 && key != registered_key) [[unlikely]] {
      registered_differs = peer;
      their_key = key;
    }
    if (outputs_differ < 0 && oneshot_sequence(parity, peer, 0)->registered_outputs !=
                                  registered_outputs_key) [[unlikely]] {
      outputs_differ = peer;
      their_outputs = oneshot_sequence(parity, peer, 0)->registered_outputs;
    }
  }
  if (differs < 0 && registered_differs < 0 && outputs_differ < 0) [[likely]] {
    return {};
  }
  if (differs < 0 && registered_differs < 0) {
    // Both nonzero: registered outputs in other allocations or offsets.
    auto text = [](std::uint64_t k) {
      return k == 0 ? std::string("outputs in ordinary memory (staged)")
                    : "registered outputs (key " + std::to_string(k) + ")";
    };
    return {ARBITER_MISMATCH,
            "shm rank " + std::to_string(rank_) + ": " +
                common::mismatch_message(
                    "the outputs' memory: rank " + std::to_string(outputs_differ) + " has " +
                        text(their_outputs) + ", rank " + std::to_string(rank_) + " has " +
                        text(registered_outputs_key) +
                        " (a replicated two-shot call passes registered outputs, from the same "
                        "allocations at the same offsets, on every rank or on none)",
                    call)};
  }
  if (differs < 0) {
    auto text = [](std::uint64_t k) {
      if (k == 0) return std::string("unregistered memory");
      return "registered allocation #" + std::to_string(((k & ~kCopiedIn) >> 40) - 1) +
             " at offset " + std::to_string(k & ((std::uint64_t{1} << 40) - 1)) +
             ((k & kCopiedIn) != 0 ? " (copied in: the unfused path, or an output over it)" : "");
    };
    return {ARBITER_MISMATCH,
            "shm rank " + std::to_string(rank_) + ": " +
                common::mismatch_message(
                    "the input's memory: rank " + std::to_string(registered_differs) + " has " +
                        text(their_key) + ", rank " + std::to_string(rank_) + " has " +
                        text(registered_key) +
                        " (every rank passes the same registered allocation (arbiter_comm_alloc, "
                        "comm.empty()) at the same offset, "
                        "with the same in-place outputs, or none does)",
                    call)};
  }
  return {ARBITER_MISMATCH, "shm rank " + std::to_string(rank_) + ": " +
                                common::mismatch_message(
                                    common::call_difference(mine, rank_, theirs, differs), call)};
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
      // A peer that arrived and then left (see await_line()) has arrived.
      if (state != WaitState::kKeepWaiting &&
          (state == WaitState::kFault || flag.load(std::memory_order_acquire) == not_arrived)) {
        return wait_failed(state, backoff, peer,
                           "rank " + std::to_string(peer) + " at " + std::string(what));
      }
    }
    backoff.progress();
  }
  return {};
}

namespace {

constexpr const char* kNoLongerUsable =
    "; the workspace is no longer usable (destroy it; the survivors can create a new one over "
    "their own group)";

std::string rank_text(std::int32_t rank) {
  return rank < 0 ? std::string("a rank") : "rank " + std::to_string(rank);
}

// The error of a rank that finds `fault` recorded (by itself or a peer);
// `when` says what this rank was doing.
Status fault_status(const Fault& fault, std::int32_t self, bool self_aborted,
                    std::int64_t timeout_ms, const std::string& prefix, const std::string& when) {
  if (self_aborted) {
    return {ARBITER_ABORTED, prefix + "aborted (abort() was called on this rank) " + when +
                                 "; the workspace is no longer usable (destroy it)"};
  }
  switch (fault.kind) {
    case FaultKind::kAborted:
      // Its abort() or its close() after a failed call (a call, or an
      // allocation that timed out): both stop the workspace for every rank.
      return {ARBITER_PEER_FAILED, prefix + rank_text(fault.culprit) +
                                       " aborted the communicator (abort(), or close() after a "
                                       "failed call or allocation) " +
                                       when + kNoLongerUsable};
    case FaultKind::kDied:
      return {ARBITER_PEER_FAILED,
              prefix + rank_text(fault.culprit) + " died (its process is gone; noticed by rank " +
                  std::to_string(fault.reporter) + ") " + when + kNoLongerUsable};
    case FaultKind::kTimeout:
    default: {
      // A peer's own timeout, which may differ from this rank's: not named.
      const std::string who = fault.reporter == self
                                  ? "this rank gave up after " + std::to_string(timeout_ms) + " ms"
                                  : rank_text(fault.reporter) + " gave up (at its timeout)";
      return {ARBITER_PEER_FAILED,
              prefix + who + " waiting for " +
                  (fault.culprit < 0 ? std::string("a peer") : rank_text(fault.culprit)) +
                  " (it did not arrive: stopped, hung, or making a call the others do not make) " +
                  when + kNoLongerUsable};
    }
  }
}

}  // namespace

Status Workspace::wait_failed(WaitState state, const Backoff& backoff, std::int32_t awaited,
                              const std::string& what) {
  std::atomic_ref<std::uint32_t> word(header().fault);
  const std::string prefix =
      "shm rank " + std::to_string(rank_) + ", call " + std::to_string(call) + ": ";
  auto record = [&](FaultKind kind, std::int32_t culprit) {
    std::uint32_t expected = 0;  // the first fault recorded is the one every rank names
    word.compare_exchange_strong(expected, encode_fault({kind, culprit, rank_}),
                                 std::memory_order_acq_rel);
  };
  if (state == WaitState::kTimedOut && !aborted()) {
    record(FaultKind::kTimeout, awaited);
    return {ARBITER_TIMEOUT,
            prefix + "timed out after " + std::to_string(timeout_ms_) + " ms waiting for " + what +
                " (it did not arrive: stopped, hung, or making a call the others do not "
                "make)" +
                kNoLongerUsable};
  }
  if (state == WaitState::kPeerDied && !aborted()) {
    const std::int32_t dead = backoff.dead_peer();
    record(FaultKind::kDied, dead);
    return {ARBITER_PEER_FAILED,
            prefix + "rank " + std::to_string(dead) +
                " died (its process is gone; only its parent, e.g. the launcher, learns its exit "
                "code or signal) while this rank waited for " +
                what + kNoLongerUsable};
  }
  return fault_status(decode_fault(word.load(std::memory_order_acquire)), rank_, aborted(),
                      timeout_ms_, prefix, "while this rank waited for " + what);
}

Status Workspace::usable() {
  const std::uint32_t word =
      std::atomic_ref<std::uint32_t>(header().fault).load(std::memory_order_acquire);
  if (word == 0 && !aborted()) [[likely]] {
    return {};
  }
  return fault_status(decode_fault(word), rank_, aborted(), timeout_ms_,
                      "shm rank " + std::to_string(rank_) + ", call " + std::to_string(call) + ": ",
                      "before this call");
}

void Workspace::abort() {
  aborted_.store(true, std::memory_order_release);
  std::uint32_t expected = 0;
  std::atomic_ref<std::uint32_t>(header().fault)
      .compare_exchange_strong(expected, encode_fault({FaultKind::kAborted, rank_, rank_}),
                               std::memory_order_acq_rel);
}

void Workspace::sum_inputs(const std::byte* const* rows, std::size_t begin, std::size_t end,
                           void* out) {
  kernels_.sum_elements(dtype(), rows, world_size(), begin, end, out);
}

}  // namespace arbiter::shm
