#include "fork_stamp.h"

#include <pthread.h>
#include <unistd.h>

#include <mutex>

namespace arbiter {

std::atomic<std::uint64_t> g_fork_generation{0};

std::uint64_t fork_generation() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(nullptr, nullptr,
                   [] { g_fork_generation.fetch_add(1, std::memory_order_relaxed); });
  });
  return g_fork_generation.load(std::memory_order_relaxed);
}

ForkStamp::ForkStamp() : pid(getpid()) {}

}  // namespace arbiter
