// Timing of arbiter-bench-fused; see bench_fused_timing.h.
#include "bench_fused_timing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "bench_fused_kernels.h"

namespace arbiter::bench {
namespace {

// Each trial's graph should run about this long; K = target / one call.
constexpr double kTargetTrialUs = 2000.0;
constexpr int kMaxIterations = 99;
// A multiple of the Lamport stages (3): a replay then starts on the stage its
// capture did, even for a module that tracked the stage on the host.
constexpr int kIterationQuantum = 3;

}  // namespace

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Failure(what + ": " + cudaGetErrorString(e));
}

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const double index = p * static_cast<double>(values.size() - 1);
  const std::size_t low = static_cast<std::size_t>(std::floor(index));
  const std::size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (index - static_cast<double>(low));
}

// ------------------------------------------------------------ Watchdog

Watchdog::Watchdog() : thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::arm(const std::string& what, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  what_ = what;
  limit_s_ = seconds;
  deadline_ = Clock::now() +
              std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  armed_ = true;
  cv_.notify_all();
}

void Watchdog::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ &&
               Clock::now() >= deadline_) {
      std::fprintf(stderr, "error: %s took longer than %.0f s: a kernel is hung; exiting\n",
                   what_.c_str(), limit_s_);
      std::fflush(nullptr);
      std::_Exit(2);
    }
  }
}

// ------------------------------------------------------------ Timer

Timer::Timer(int ranks, double hang_timeout_s) : hang_timeout_s_(hang_timeout_s) {
  check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreate(&start_), "cudaEventCreate");
  check(cudaEventCreate(&stop_), "cudaEventCreate");
  streams_.assign(ranks, nullptr);
  ends_.assign(ranks, nullptr);
  for (int r = 0; r < ranks; ++r) {
    check(cudaStreamCreateWithFlags(&streams_[r], cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&ends_[r], cudaEventDisableTiming), "cudaEventCreate");
  }
}

Timer::~Timer() {
  for (cudaEvent_t e : ends_) cudaEventDestroy(e);
  for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
  cudaStreamDestroy(side_);
}

void Timer::wait_all(const std::string& what) {
  for (int r = 0; r < ranks(); ++r) {
    check(cudaEventRecord(ends_[r], streams_[r]), "cudaEventRecord");
    wait_event(ends_[r], what + ", rank " + std::to_string(r));
  }
}

void Timer::run_once(const Enqueue& op, const std::string& what) {
  for (int r = 0; r < ranks(); ++r) check(op(r, streams_[r]), what);
  wait_all(what);
}

Timing Timer::measure(const Enqueue& op, int trials, bool use_graphs, const std::string& what) {
  Timing t;
  // One eager call as the unit: K calls make a trial of ~kTargetTrialUs.
  const double one_us = 1000.0 * timed([&] { enqueue_eager(op, 1, what); }, 300, what);
  int k = static_cast<int>(std::ceil(kTargetTrialUs / std::max(one_us, 1.0)));
  k = std::clamp(k, 1, kMaxIterations);
  k = (k + kIterationQuantum - 1) / kIterationQuantum * kIterationQuantum;
  t.iterations = k;

  std::vector<cudaGraphExec_t> execs;
  if (use_graphs) execs = capture(op, k);
  t.graphs = !execs.empty();
  const auto launch = [&] {
    if (t.graphs) {
      for (int r = 0; r < ranks(); ++r) check(cudaGraphLaunch(execs[r], streams_[r]), what);
    } else {
      enqueue_eager(op, k, what);
    }
  };
  // Hold the side stream long enough for the host to enqueue everything.
  const std::uint32_t hold_us =
      t.graphs ? 200 : static_cast<std::uint32_t>(std::min(50000, 100 + 5 * k * ranks()));
  try {
    timed(launch, hold_us, what);  // warm-up
    for (int i = 0; i < trials; ++i) {
      t.per_call_us.push_back(1000.0 * timed(launch, hold_us, what) / k);
    }
  } catch (...) {
    for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
    throw;
  }
  for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
  return t;
}

void Timer::enqueue_eager(const Enqueue& op, int iterations, const std::string& what) {
  for (int i = 0; i < iterations; ++i) {
    for (int r = 0; r < ranks(); ++r) check(op(r, streams_[r]), what);
  }
}

// Milliseconds from the start event (after a hold of the side stream) until
// every rank stream has finished what launch() enqueued.
double Timer::timed(const std::function<void()>& launch, std::uint32_t hold_us,
                    const std::string& what) {
  check(delay(hold_us, side_), "delay kernel");
  check(cudaEventRecord(start_, side_), "cudaEventRecord");
  for (cudaStream_t s : streams_) check(cudaStreamWaitEvent(s, start_, 0), "cudaStreamWaitEvent");
  launch();
  for (int r = 0; r < ranks(); ++r) {
    check(cudaEventRecord(ends_[r], streams_[r]), "cudaEventRecord");
    check(cudaStreamWaitEvent(side_, ends_[r], 0), "cudaStreamWaitEvent");
  }
  check(cudaEventRecord(stop_, side_), "cudaEventRecord");
  wait_event(stop_, what);
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
  return ms;
}

// One graph per rank stream of k calls; empty when capture fails (then the
// caller times plain launches and says so).
std::vector<cudaGraphExec_t> Timer::capture(const Enqueue& op, int k) {
  std::vector<cudaGraphExec_t> execs;
  for (int r = 0; r < ranks(); ++r) {
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamBeginCapture(streams_[r], cudaStreamCaptureModeRelaxed);
    for (int i = 0; i < k && e == cudaSuccess; ++i) e = op(r, streams_[r]);
    const cudaError_t end = cudaStreamEndCapture(streams_[r], &graph);
    if (e == cudaSuccess) e = end;
    cudaGraphExec_t exec = nullptr;
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "  note: graph capture failed (%s); timing plain launches\n",
                   cudaGetErrorString(e));
      cudaGetLastError();
      for (cudaGraphExec_t x : execs) cudaGraphExecDestroy(x);
      return {};
    }
    execs.push_back(exec);
  }
  return execs;
}

void Timer::wait_event(cudaEvent_t event, const std::string& what) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(hang_timeout_s_));
  for (;;) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) check(e, what);
    if (Clock::now() > deadline) {
      std::fprintf(stderr,
                   "error: %s did not finish within %.0f s: a kernel is hung (the GPU is left "
                   "as it is; this process exits)\n",
                   what.c_str(), hang_timeout_s_);
      std::fflush(nullptr);
      std::_Exit(2);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace arbiter::bench
