// Timing of arbiter-bench-fused: every virtual rank's K calls captured into
// one CUDA graph on its stream; a trial holds a side stream with a short
// spin kernel, records a start event there, makes every rank stream wait on
// it, launches every rank's graph, joins the rank streams back into the side
// stream and records a stop event. The time covers all ranks' K calls (host
// launch cost excluded), divided by K. Warm-up, then the trials; the median
// is reported with p10 and p90.
//
// Also what guards the timed work against hangs: waits with a deadline, and
// a watchdog for host calls blocked behind a hung kernel. Both end the
// process (exit 2): a kernel that never finishes cannot be recovered from.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace arbiter::bench {

using Clock = std::chrono::steady_clock;

// A CUDA call that failed; what the point or run was doing, and the error.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws Failure(what: error) unless e is cudaSuccess.
void check(cudaError_t e, const std::string& what);

// The p-quantile (0..1) of `values`, interpolated. REQUIRES: not empty.
double percentile(std::vector<double> values, double p);

// Ends the process (exit 2) when a phase overruns its limit: the backstop
// for what the polling waits cannot see, a host call (a launch, a copy)
// blocked behind a hung kernel.
class Watchdog {
 public:
  Watchdog();
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void arm(const std::string& what, double seconds);
  void disarm();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool armed_ = false;
  std::string what_;
  double limit_s_ = 0;
  Clock::time_point deadline_;
  std::thread thread_;  // last: starts once the members above exist
};

// Enqueues one call of rank `rank` on `stream`.
using Enqueue = std::function<cudaError_t(int rank, cudaStream_t stream)>;

struct Timing {
  std::vector<double> per_call_us;  // one per trial
  int iterations = 0;               // calls per rank per trial
  bool graphs = false;
};

// Streams and events of one world size, and the waits with a deadline.
class Timer {
 public:
  Timer(int ranks, double hang_timeout_s);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  const std::vector<cudaStream_t>& streams() const { return streams_; }
  int ranks() const { return static_cast<int>(streams_.size()); }

  // Every rank's stream done, or exit(2) naming what hung.
  void wait_all(const std::string& what);

  // One eager call on every rank (warm-up or the call a check reads).
  void run_once(const Enqueue& op, const std::string& what);

  // Times `trials` trials of `op` after a warm-up; throws Failure on a
  // failed call. Graphs when use_graphs and capture works, else plain
  // launches (Timing::graphs says which).
  Timing measure(const Enqueue& op, int trials, bool use_graphs, const std::string& what);

 private:
  void enqueue_eager(const Enqueue& op, int iterations, const std::string& what);
  double timed(const std::function<void()>& launch, std::uint32_t hold_us, const std::string& what);
  std::vector<cudaGraphExec_t> capture(const Enqueue& op, int k);
  void wait_event(cudaEvent_t event, const std::string& what);

  double hang_timeout_s_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> ends_;
};

}  // namespace arbiter::bench
