// Sleeping on a word of the shared mapping until a peer changes it (Linux
// futex on a MAP_SHARED mapping: the ranks are different processes), and
// waking such sleepers. A waiter registers in `sleepers` before it checks
// the word one last time; a publisher stores the word, then wakes only when
// someone is registered. Both sides are sequentially consistent, so at least
// one of them sees the other; a sleep also ends after `timeout`, so a missed
// wake costs at most that much. Elsewhere (not Linux) the sleep is a nap.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>

#include "shared_layout.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace arbiter::shm {

// Sleeps while *word == expected, at most `timeout`.
inline void sleep_while_equal(std::uint32_t* word, std::uint32_t expected, std::uint32_t* sleepers,
                              std::chrono::microseconds timeout) {
  std::atomic_ref<std::uint32_t> count(*sleepers);
  count.fetch_add(1, std::memory_order_seq_cst);
  if (std::atomic_ref<std::uint32_t>(*word).load(std::memory_order_seq_cst) == expected) {
    const timespec limit{0, static_cast<long>(timeout.count()) * 1000};
#if defined(__linux__)
    syscall(SYS_futex, word, FUTEX_WAIT, expected, &limit, nullptr, 0);
#else
    nanosleep(&limit, nullptr);
#endif
  }
  count.fetch_sub(1, std::memory_order_seq_cst);
}

// Stores `value` into *word (release and more) and wakes the sleepers on it.
inline void publish_and_wake(std::uint32_t* word, std::uint32_t value, std::uint32_t* sleepers) {
  std::atomic_ref<std::uint32_t>(*word).store(value, std::memory_order_seq_cst);
  if (std::atomic_ref<std::uint32_t>(*sleepers).load(std::memory_order_seq_cst) != 0) {
#if defined(__linux__)
    syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
#endif
  }
}

// Publishes a sequence number (shared_layout.h): the value, then its low
// half into the futex word, and wakes that word's sleepers. A reader that
// loads `wake` before `value` and still sees an old value is sure to see
// `wake` change, unless the two values are 2^32 apart: that sleep then ends
// at its timeout, and the next poll sees the value.
inline void publish_and_wake(SequenceWord* word, std::uint64_t value, std::uint32_t* sleepers) {
  std::atomic_ref<std::uint64_t>(word->value).store(value, std::memory_order_release);
  publish_and_wake(&word->wake, static_cast<std::uint32_t>(value), sleepers);
}

}  // namespace arbiter::shm
