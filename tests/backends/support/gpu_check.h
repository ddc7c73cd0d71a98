// A minimal check harness for the GPU tests, which build where only CUDA is
// installed (no Boost).
//
//   int main() {
//     arbiter::test::require_device_or_skip();  // exits 77 ("SKIP: ...") without one
//     ...
//     ARBITER_CHECK(status == ARBITER_OK, "case " << name, "run: " << error);
//     ...
//     return arbiter::test::finish("backends_trtllm_gpu");  // 0 pass, 1 fail
//   }
//
// Every failing check is printed with its case description; all of them are
// counted. Checks may be made from several threads at once. A Watchdog ends
// the process with a message when a phase overruns its deadline: a hung
// kernel (or a launch blocked behind one) cannot be recovered in-process.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

namespace arbiter::test {

// ctest's SKIP_RETURN_CODE for these tests.
inline constexpr int kSkipExitCode = 77;
// Failures printed in full; later ones are only counted.
inline constexpr long kMaxPrintedFailures = 200;

struct CheckCounters {
  std::atomic<long> checks{0};
  std::atomic<long> failures{0};
  std::mutex print;
};

inline CheckCounters& check_counters() {
  static CheckCounters counters;
  return counters;
}

// Prints `line` whole, even when other threads print too.
inline void print_line(const std::string& line) {
  std::lock_guard<std::mutex> lock(check_counters().print);
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

// Counts a check; on failure prints "FAIL: <context>: <what>". Returns ok.
inline bool check(bool ok, const std::string& context, const std::string& what) {
  CheckCounters& c = check_counters();
  c.checks.fetch_add(1, std::memory_order_relaxed);
  if (ok) return true;
  const long n = c.failures.fetch_add(1) + 1;
  if (n <= kMaxPrintedFailures) {
    print_line("FAIL: " + context + ": " + what);
  } else if (n == kMaxPrintedFailures + 1) {
    print_line("(further failures are counted, not printed)");
  }
  return false;
}

inline long failure_count() { return check_counters().failures.load(); }

// ARBITER_CHECK(condition, context << ..., message << ...): the message is
// only built when the check fails.
#define ARBITER_CHECK(condition, context, message)                                    \
  ([&]() -> bool {                                                                    \
    if (condition) return ::arbiter::test::check(true, std::string(), std::string()); \
    std::ostringstream context_;                                                      \
    context_ << context;                                                              \
    std::ostringstream message_;                                                      \
    message_ << message;                                                              \
    return ::arbiter::test::check(false, context_.str(), message_.str());             \
  }())

// The number of CUDA devices; exits with kSkipExitCode and the reason when
// there is none (a failing cudaGetDeviceCount leaves the count unchanged:
// error 35, insufficient driver, on a machine without a driver).
inline int require_device_or_skip() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    std::printf("SKIP: no CUDA device: %s\n", cudaGetErrorString(e));
    std::fflush(stdout);
    std::exit(kSkipExitCode);
  }
  if (count < 1) {
    std::printf("SKIP: no CUDA device: cudaGetDeviceCount found none\n");
    std::fflush(stdout);
    std::exit(kSkipExitCode);
  }
  return count;
}

// Prints the summary; 0 when no check failed, 1 otherwise.
inline int finish(const char* name) {
  const long checks = check_counters().checks.load();
  const long failures = check_counters().failures.load();
  std::printf("%s: %s, %ld checks, %ld failed\n", name, failures == 0 ? "PASS" : "FAIL", checks,
              failures);
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

// Ends the process (exit code 1) when a phase is still armed at its
// deadline, printing the phase's description. One phase at a time.
class Watchdog {
 public:
  Watchdog() : thread_([this] { loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void arm(const std::string& what, std::chrono::seconds limit) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      what_ = what;
      limit_ = limit;
      deadline_ = std::chrono::steady_clock::now() + limit;
      armed_ = true;
    }
    cv_.notify_all();
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      if (!armed_) {
        cv_.wait(lock);
        continue;
      }
      const auto deadline = deadline_;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && armed_ && !stop_ &&
          deadline_ == deadline) {
        std::printf(
            "FAIL: HANG: %s did not finish within %lld s; a hung kernel cannot be "
            "recovered, exiting\n",
            what_.c_str(), static_cast<long long>(limit_.count()));
        std::fflush(stdout);
        std::_Exit(1);
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::string what_;
  std::chrono::seconds limit_{0};
  std::chrono::steady_clock::time_point deadline_;
  bool armed_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it reads
};

}  // namespace arbiter::test
