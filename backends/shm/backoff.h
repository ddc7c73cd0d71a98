// Waiting on another process without starving it: spin briefly, then yield,
// then sleep in growing steps. CI runs 8 ranks on 2 cores, so a rank that
// only spins keeps the rank it waits for off the CPU.
//
// Every wait has a deadline and also stops when any rank has declared the
// workspace failed (a word in the shared mapping), so one stuck rank makes
// the others return instead of waiting out their own timeouts.
#pragma once

#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace arbiter::shm {

enum class WaitState { kKeepWaiting, kTimedOut, kPeerFailed };

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;

  // `failed_rank` is the shared word holding (rank + 1) of a rank that gave
  // up, or 0.
  Backoff(Clock::time_point deadline, std::uint32_t* failed_rank)
      : deadline_(deadline), failed_rank_(failed_rank) {}

  // Call after each poll that found nothing new.
  WaitState pause() {
    ++polls_;
    if (polls_ <= kSpinPolls) {
      cpu_relax();
      return WaitState::kKeepWaiting;
    }
    if (std::atomic_ref<std::uint32_t>(*failed_rank_).load(std::memory_order_acquire) != 0) {
      return WaitState::kPeerFailed;
    }
    if (Clock::now() >= deadline_) return WaitState::kTimedOut;
    if (polls_ <= kSpinPolls + kYieldPolls) {
      sched_yield();
    } else {
      // 2, 4, ... up to 64 microseconds: short enough to keep latency low
      // once the peer runs, long enough to hand it the core.
      const std::uint32_t step = polls_ - kSpinPolls - kYieldPolls;
      const long micros = step >= 6 ? 64 : (2L << (step - 1));
      const timespec pause{0, micros * 1000};
      nanosleep(&pause, nullptr);
    }
    return WaitState::kKeepWaiting;
  }

  // Call when a poll found progress: the next wait starts with spinning.
  void progress() { polls_ = 0; }

 private:
  static constexpr std::uint32_t kSpinPolls = 64;
  static constexpr std::uint32_t kYieldPolls = 64;

  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  Clock::time_point deadline_;
  std::uint32_t* failed_rank_;
  std::uint32_t polls_ = 0;
};

}  // namespace arbiter::shm
