// Waiting on another process without starving it: spin with `pause` for a
// few microseconds (a peer that is running arrives within them), then give
// the core away with sched_yield (a peer that is not running gets it), and
// only a wait past a millisecond sleeps, on a futex the peer's publish wakes
// (futex.h): no sleep on the fast path, where a timed nap costs 50+ us of
// timer slack. CI runs 8 ranks on 2 cores, so a rank that only spins keeps
// the rank it waits for off the CPU. The spin policy (wait_policy.h: the
// default where every rank has a CPU of its own) skips the yields instead,
// for a host where a co-tenant, not a peer, would take the core.
//
// A peer last seen on this rank's own CPU cannot make progress while this
// rank spins: such a wait skips the spin and yields at once. That is the
// common case on a busy or oversubscribed host, where the scheduler often
// puts two ranks on one core (and the spin would cost every call 20 us).
//
// Every wait has a deadline and also stops when any rank has recorded a
// fault in the workspace (a word in the shared mapping: a timeout, a dead
// peer, an abort), so one stuck rank makes the others return instead of
// waiting out their own timeouts. Once a wait has lasted a millisecond it
// also asks, every 10 ms, whether a peer process has died (liveness.h): a
// dead peer is noticed within milliseconds instead of at the deadline. None
// of this is on the fast path: a wait that succeeds within 64 polls reads
// neither the clock nor the fault word.
#pragma once

#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "arbiter/common/liveness.h"
#include "futex.h"
#include "shared_layout.h"
#include "wait_policy.h"

namespace arbiter::shm {

enum class WaitState {
  kKeepWaiting,
  kTimedOut,
  kFault,     // the workspace's fault word is set (by any rank, this one included)
  kPeerDied,  // dead_peer() names the rank
};

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;

  // `fault` is the shared fault word (faults.h), 0 while none;
  // `sleepers` counts the ranks asleep on a futex (futex.h). `cpus`
  // (optional) holds one word per rank, kLine apart: (CPU + 1) of where that
  // rank last started a call, or 0; `my_cpu` is ours, likewise. `liveness`
  // (optional) watches the peer processes. `policy` says what follows the
  // first spin (wait_policy.h).
  Backoff(Clock::time_point deadline, std::uint32_t* fault, std::uint32_t* sleepers,
          const std::byte* cpus = nullptr, std::uint32_t my_cpu = 0,
          const common::Liveness* liveness = nullptr, WaitPolicy policy = WaitPolicy::kYield)
      : deadline_(deadline),
        fault_(fault),
        sleepers_(sleepers),
        cpus_(cpus),
        my_cpu_(my_cpu),
        liveness_(liveness),
        policy_(policy) {}

  // Call after each poll that found nothing new. Long waits sleep until
  // *word != still (the peer's publish wakes them), at most a millisecond at
  // a time; without a word, they nap. `awaited` is the rank waited for
  // (-1: unknown).
  WaitState pause(std::uint32_t* word = nullptr, std::uint32_t still = 0,
                  std::int32_t awaited = -1) {
    if (polls_ == 0 && phase_ == Phase::kSpin && shares_my_cpu(awaited)) phase_ = Phase::kYield;
    if (phase_ == Phase::kSpin) {
      cpu_relax();
      // The clock, the failure word and the deadline every 64 polls only.
      if ((++polls_ & 63u) != 0) return WaitState::kKeepWaiting;
    }
    if (std::atomic_ref<std::uint32_t>(*fault_).load(std::memory_order_acquire) != 0) {
      return WaitState::kFault;
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline_) return WaitState::kTimedOut;
    if (!started_) {
      started_ = true;
      start_ = now;
      next_liveness_check_ = now + kFirstLivenessCheck;
    }
    const auto waited = now - start_;
    if (liveness_ != nullptr && now >= next_liveness_check_) {
      next_liveness_check_ = now + kLivenessInterval;
      dead_peer_ = liveness_->first_dead();
      if (dead_peer_ >= 0) return WaitState::kPeerDied;
    }
    if (phase_ == Phase::kSpin) {
      // kSpin keeps the core (a co-tenant would hold it for a time slice)
      // and sleeps only once the peer is clearly not coming soon.
      if (policy_ == WaitPolicy::kSpin) {
        if (waited >= kYieldFor) phase_ = Phase::kNap;
      } else if (waited >= kSpinFor) {
        phase_ = Phase::kYield;
      }
    } else if (phase_ == Phase::kYield) {
      sched_yield();
      if (waited >= kYieldFor) phase_ = Phase::kNap;
    } else if (word != nullptr) {
      sleep_while_equal(word, still, sleepers_, std::chrono::milliseconds(1));
    } else {
      const timespec nap{0, 50 * 1000};
      nanosleep(&nap, nullptr);
    }
    return WaitState::kKeepWaiting;
  }

  // After kPeerDied: the rank whose process is gone.
  std::int32_t dead_peer() const { return dead_peer_; }

  // Call when a poll found progress: the next wait starts with spinning.
  void progress() {
    polls_ = 0;
    phase_ = Phase::kSpin;
    started_ = false;
  }

 private:
  enum class Phase { kSpin, kYield, kNap };
  static constexpr auto kSpinFor = std::chrono::microseconds(20);
  static constexpr auto kYieldFor = std::chrono::milliseconds(1);
  // A wait this long asks whether a peer died, then again at each interval.
  static constexpr auto kFirstLivenessCheck = std::chrono::milliseconds(1);
  static constexpr auto kLivenessInterval = std::chrono::milliseconds(10);

  bool shares_my_cpu(std::int32_t rank) const {
    if (cpus_ == nullptr || my_cpu_ == 0 || rank < 0) return false;
    const auto* word =
        reinterpret_cast<const std::uint32_t*>(cpus_ + static_cast<std::size_t>(rank) * kLine);
    return std::atomic_ref<const std::uint32_t>(*word).load(std::memory_order_relaxed) == my_cpu_;
  }

  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  Clock::time_point deadline_;
  std::uint32_t* fault_;
  std::uint32_t* sleepers_;
  const std::byte* cpus_;
  std::uint32_t my_cpu_;
  const common::Liveness* liveness_;
  WaitPolicy policy_;
  std::int32_t dead_peer_ = -1;
  Clock::time_point next_liveness_check_;
  std::uint32_t polls_ = 0;
  Phase phase_ = Phase::kSpin;
  bool started_ = false;
  Clock::time_point start_;
};

}  // namespace arbiter::shm
