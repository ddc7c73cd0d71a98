// The end of a wait that lasts a caller's timeout, whatever the timeout.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace arbiter::common {

// Longer timeouts wait this long: a timeout meant as "never" (1e10 s) would
// overflow the clock's 64-bit nanoseconds and end at once, or in the past.
inline constexpr std::int64_t kLongestWaitMs = std::int64_t{30} * 24 * 3600 * 1000;

// now + timeout_ms, the timeout capped at kLongestWaitMs (and at 0 below).
template <class Clock = std::chrono::steady_clock>
typename Clock::time_point deadline_after(std::int64_t timeout_ms) {
  return Clock::now() +
         std::chrono::milliseconds(std::clamp<std::int64_t>(timeout_ms, 0, kLongestWaitMs));
}

}  // namespace arbiter::common
