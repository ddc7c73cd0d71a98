// arbiter-bench-trtllm: the trtllm module's fused all-reduce + residual +
// RMSNorm (one-shot and two-shot) against the unfused baseline (a plain sum
// kernel, then the nccl backend's residual + RMSNorm kernel) and against a
// device-to-device copy of the same bytes, all in one run.
//
// Loopback mode: `ws` virtual ranks of the module on one GPU (LoopbackGroup),
// each with its own stream and buffers. The numbers say how the kernels
// compare on one device's memory, not what NVLink between GPUs gives.
//
// Timing: each rank's K calls are captured into one CUDA graph on its stream.
// A trial holds a side stream with a short spin kernel, records a start event
// there, makes every rank stream wait on it, launches every rank's graph,
// joins the rank streams back into the side stream and records a stop event:
// the time covers all ranks' K calls (host launch cost excluded), divided by
// K. Warm-up, then --trials trials; the median is reported with p10 and p90.
//
// Output: CSV rows on stdout (or --csv FILE), provenance as '#' lines; a
// summary on stderr. Exit 0, 1 when something failed (module, workspace, a
// call, or a fused result that differs from the baseline), 2 on bad usage or
// a hung kernel, 77 with "SKIP: ..." when there is no CUDA device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "arbiter_backend.h"
#include "bench_trtllm_kernels.h"
#include "epilogue_launch.h"
#include "loopback_group.h"
#include "module.h"

#ifndef ARBITER_VERSION
#define ARBITER_VERSION "unknown"
#endif

namespace {

using Clock = std::chrono::steady_clock;
namespace bench = arbiter::bench;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint32_t kElementBytes = 2;  // bf16
constexpr float kEps = 1e-6f;
// Each trial's graph should run about this long; K = target / one call.
constexpr double kTargetTrialUs = 2000.0;
constexpr int kMaxIterations = 99;
// A multiple of the Lamport stages (3): a replay then starts on the stage its
// capture did, even for a module that tracked the stage on the host.
constexpr int kIterationQuantum = 3;

struct Options {
  std::vector<int> world_sizes{2, 4, 8};
  std::vector<std::uint32_t> hiddens{7168, 8192};
  std::uint64_t min_bytes = 16 * kKiB;
  std::uint64_t max_bytes = 64 * kMiB;
  std::uint64_t size_step = 2;
  int trials = 7;
  int device = 0;
  bool graphs = true;
  bool check = true;
  double budget_s = 0;         // 0: no limit
  double hang_timeout_s = 30;  // one wait on the GPU
  std::string csv;             // empty: stdout
  std::string command_line;
};

// ------------------------------------------------------------ small helpers

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Failure(what + ": " + cudaGetErrorString(e));
}

std::string format_bytes(std::uint64_t bytes) {
  char text[64];
  if (bytes >= kMiB && bytes % kMiB == 0) {
    std::snprintf(text, sizeof text, "%" PRIu64 " MiB", bytes / kMiB);
  } else if (bytes >= kKiB && bytes % kKiB == 0) {
    std::snprintf(text, sizeof text, "%" PRIu64 " KiB", bytes / kKiB);
  } else if (bytes >= kMiB) {
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / kMiB);
  } else if (bytes >= kKiB) {
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / kKiB);
  } else {
    std::snprintf(text, sizeof text, "%" PRIu64 " B", bytes);
  }
  return text;
}

bool parse_bytes(const std::string& text, std::uint64_t* out) {
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  const std::string unit = text.substr(used);
  std::uint64_t scale = 1;
  if (unit == "K" || unit == "KiB" || unit == "k") {
    scale = kKiB;
  } else if (unit == "M" || unit == "MiB") {
    scale = kMiB;
  } else if (unit == "G" || unit == "GiB") {
    scale = 1024 * kMiB;
  } else if (!unit.empty() && unit != "B") {
    return false;
  }
  *out = value * scale;
  return value != 0;
}

template <typename T>
bool parse_list(const std::string& text, std::vector<T>* out) {
  out->clear();
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    try {
      std::size_t used = 0;
      const long long value = std::stoll(text.substr(begin, end - begin), &used);
      if (used != end - begin || value <= 0) return false;
      out->push_back(static_cast<T>(value));
    } catch (const std::exception&) {
      return false;
    }
    begin = end + 1;
  }
  return !out->empty();
}

void print_usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: arbiter-bench-trtllm [options]\n"
      "  --ws LIST          world sizes (virtual ranks on one GPU), default 2,4,8\n"
      "  --hidden LIST      hidden sizes, default 7168,8192\n"
      "  --min BYTES        smallest per-rank message, default 16KiB\n"
      "  --max BYTES        largest per-rank message (and the workspace's), default 64MiB\n"
      "  --trials N         timed trials per point (median, p10, p90), default 7\n"
      "  --quick            smoke run: hidden 7168, every 8th size, 3 trials\n"
      "                     (options given explicitly still apply)\n"
      "  --csv PATH         write the CSV there instead of stdout\n"
      "  --device N         CUDA device, default 0\n"
      "  --budget SECONDS   start no new point after this long; 0: no limit (default)\n"
      "  --hang-timeout S   a GPU wait longer than this is a hung kernel: exit 2 (default 30)\n"
      "  --no-graphs        time plain launches instead of CUDA graphs\n"
      "  --no-check         do not compare fused outputs with the baseline's\n");
}

bool parse_options(int argc, char** argv, Options* o) {
  bool quick = false;
  bool hidden_given = false;
  bool trials_given = false;
  for (int i = 0; i < argc; ++i) o->command_line += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](std::string* out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", arg.c_str());
        return false;
      }
      *out = argv[++i];
      return true;
    };
    std::string v;
    const auto bad = [&] {
      std::fprintf(stderr, "error: bad value for %s: '%s'\n", arg.c_str(), v.c_str());
      return false;
    };
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      std::exit(0);
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--no-graphs") {
      o->graphs = false;
    } else if (arg == "--no-check") {
      o->check = false;
    } else if (arg == "--ws") {
      if (!value(&v)) return false;
      if (!parse_list(v, &o->world_sizes)) return bad();
      for (int ws : o->world_sizes) {
        if (ws < 1 || ws > bench::kMaxBenchRanks) {
          std::fprintf(stderr, "error: --ws %d: 1 to %d ranks\n", ws, bench::kMaxBenchRanks);
          return false;
        }
      }
    } else if (arg == "--hidden") {
      if (!value(&v)) return false;
      if (!parse_list(v, &o->hiddens)) return bad();
      hidden_given = true;
      for (std::uint32_t h : o->hiddens) {
        if (h % 8 != 0) {
          std::fprintf(stderr, "error: --hidden %u: a multiple of 8 (16-byte bf16 rows)\n", h);
          return false;
        }
      }
    } else if (arg == "--min") {
      if (!value(&v)) return false;
      if (!parse_bytes(v, &o->min_bytes)) return bad();
    } else if (arg == "--max") {
      if (!value(&v)) return false;
      if (!parse_bytes(v, &o->max_bytes)) return bad();
    } else if (arg == "--trials") {
      if (!value(&v)) return false;
      o->trials = std::atoi(v.c_str());
      trials_given = true;
      if (o->trials < 1) return bad();
    } else if (arg == "--csv") {
      if (!value(&v)) return false;
      o->csv = v;
    } else if (arg == "--device") {
      if (!value(&v)) return false;
      o->device = std::atoi(v.c_str());
    } else if (arg == "--budget") {
      if (!value(&v)) return false;
      o->budget_s = std::atof(v.c_str());
    } else if (arg == "--hang-timeout") {
      if (!value(&v)) return false;
      o->hang_timeout_s = std::atof(v.c_str());
      if (o->hang_timeout_s <= 0) return bad();
    } else {
      std::fprintf(stderr, "error: unknown option %s\n", arg.c_str());
      return false;
    }
  }
  if (o->min_bytes > o->max_bytes) {
    std::fprintf(stderr, "error: --min is above --max\n");
    return false;
  }
  if (quick) {
    o->size_step = 8;
    if (!hidden_given) o->hiddens = {7168};
    if (!trials_given) o->trials = 3;
  }
  return true;
}

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : p_(other.p_) { other.p_ = nullptr; }

  // false when the memory is not there (the error is cleared).
  bool allocate(std::size_t bytes) {
    reset();
    if (cudaMalloc(&p_, bytes) != cudaSuccess) {
      p_ = nullptr;
      cudaGetLastError();
      return false;
    }
    return true;
  }
  void reset() {
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
  }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

struct RankBuffers {
  DeviceBuffer input, residual_in, residual_out, norm_out;
  DeviceBuffer sum, ref_residual_out, ref_norm_out;  // baseline
};

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const double index = p * static_cast<double>(values.size() - 1);
  const std::size_t low = static_cast<std::size_t>(std::floor(index));
  const std::size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (index - static_cast<double>(low));
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string cuda_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// Ends the process when a phase overruns its limit: the backstop for what the
// polling waits cannot see, a host call (a launch, a copy) blocked behind a
// hung kernel.
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

  void arm(const std::string& what, double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    what_ = what;
    limit_s_ = seconds;
    deadline_ = Clock::now() +
                std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    armed_ = true;
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
      } else if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ &&
                 Clock::now() >= deadline_) {
        std::fprintf(stderr, "error: %s took longer than %.0f s: a kernel is hung; exiting\n",
                     what_.c_str(), limit_s_);
        std::fflush(nullptr);
        std::_Exit(2);
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool armed_ = false;
  std::string what_;
  double limit_s_ = 0;
  Clock::time_point deadline_;
  std::thread thread_;  // last: starts once the members above exist
};

// ------------------------------------------------------------ timing

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
  Timer(int ranks, double hang_timeout_s) : hang_timeout_s_(hang_timeout_s) {
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
  ~Timer() {
    for (cudaEvent_t e : ends_) cudaEventDestroy(e);
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(side_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  const std::vector<cudaStream_t>& streams() const { return streams_; }
  int ranks() const { return static_cast<int>(streams_.size()); }

  // Every rank's stream done, or exit(2) naming what hung: a kernel that
  // never finishes cannot be recovered from in this process.
  void wait_all(const std::string& what) {
    for (int r = 0; r < ranks(); ++r) {
      check(cudaEventRecord(ends_[r], streams_[r]), "cudaEventRecord");
      wait_event(ends_[r], what + ", rank " + std::to_string(r));
    }
  }

  // One eager call on every rank (warm-up or the call a check reads).
  void run_once(const Enqueue& op, const std::string& what) {
    for (int r = 0; r < ranks(); ++r) check(op(r, streams_[r]), what);
    wait_all(what);
  }

  // Times `trials` trials of `op` after a warm-up; throws on a failed call.
  Timing measure(const Enqueue& op, int trials, bool use_graphs, const std::string& what) {
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

 private:
  void enqueue_eager(const Enqueue& op, int iterations, const std::string& what) {
    for (int i = 0; i < iterations; ++i) {
      for (int r = 0; r < ranks(); ++r) check(op(r, streams_[r]), what);
    }
  }

  // Milliseconds from the start event (after a hold of the side stream) until
  // every rank stream has finished what launch() enqueued.
  template <typename Launch>
  double timed(const Launch& launch, std::uint32_t hold_us, const std::string& what) {
    check(bench::delay(hold_us, side_), "delay kernel");
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

  // One graph per rank stream of k calls; empty when capture fails (then
  // the caller times plain launches and says so).
  std::vector<cudaGraphExec_t> capture(const Enqueue& op, int k) {
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

  void wait_event(cudaEvent_t event, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(hang_timeout_s_);
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

  double hang_timeout_s_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> ends_;
};

// ------------------------------------------------------------ the run

struct Device {
  int ordinal = 0;
  std::string name;
  std::uint32_t capability = 0;
  int sm_count = 0;
};

struct Point {  // one (ws, hidden, tokens)
  int ws = 0;
  std::uint32_t hidden = 0;
  std::uint32_t tokens = 0;
  std::uint64_t bytes = 0;
  std::map<std::string, double> median_us;  // "oneshot", "twoshot", "baseline", "copy"
};

class Bench {
 public:
  Bench(const Options& o, const Device& d, std::FILE* csv) : o_(o), device_(d), csv_(csv) {}

  // Loads and probes the module; writes what it found as '#' lines.
  void load_module() {
    module_ = std::make_unique<arbiter::test::BackendModule>("trtllm");
    std::fprintf(csv_, "# module: %s\n", module_->path().c_str());
    if (module_->api() == nullptr) {
      fail("the trtllm module did not load: " + module_->error() + "; only the baseline runs");
      return;
    }
    const arbiter_probe_args probe{ARBITER_DEVICE_GPU, device_.ordinal};
    if (module_->api()->probe(&probe, &caps_) != ARBITER_OK) {
      fail(std::string("trtllm probe: ") + module_->api()->last_error() +
           "; only the baseline runs");
      return;
    }
    probed_ = true;
    std::fprintf(csv_,
                 "# module caps: capability %u, world sizes 0x%" PRIx64
                 ", dtypes 0x%x, patterns 0x%x, algorithms 0x%x, flags 0x%x\n",
                 caps_.capability, caps_.world_size_mask, caps_.dtype_mask, caps_.pattern_mask,
                 caps_.algorithm_mask, caps_.flags);
  }

  void run() {
    start_ = Clock::now();
    for (int ws : o_.world_sizes) {
      for (std::uint32_t hidden : o_.hiddens) {
        if (stopped_) return;
        run_shape(ws, hidden);
      }
    }
  }

  int exit_code() const { return failures_ == 0 ? 0 : 1; }
  void print_summary() const;

 private:
  bool fused_supported(int ws, std::string* why) const {
    if (!probed_) {
      *why = "module unavailable";
      return false;
    }
    if (ws >= 64 || ((caps_.world_size_mask >> ws) & 1u) == 0) {
      *why = "world size " + std::to_string(ws) + " not in the module's caps";
      return false;
    }
    if (((caps_.pattern_mask >> ARBITER_PATTERN_RESIDUAL_RMSNORM) & 1u) == 0 ||
        ((caps_.dtype_mask >> ARBITER_DTYPE_BF16) & 1u) == 0) {
      *why = "residual_rmsnorm in bf16 not in the module's caps";
      return false;
    }
    return true;
  }

  void note(const std::string& text) {
    std::fprintf(csv_, "# %s\n", text.c_str());
    std::fflush(csv_);
    std::fprintf(stderr, "  %s\n", text.c_str());
  }
  void fail(const std::string& text) {
    ++failures_;
    failure_lines_.push_back(text);
    note("FAILED: " + text);
  }

  // Token counts of the sweep for `hidden`: max(1, bytes / row), deduplicated.
  std::vector<std::uint32_t> token_counts(std::uint32_t hidden) const {
    std::vector<std::uint32_t> tokens;
    const std::uint64_t row = std::uint64_t{hidden} * kElementBytes;
    for (std::uint64_t b = o_.min_bytes; b <= o_.max_bytes; b *= o_.size_step) {
      const std::uint32_t t = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, b / row));
      if (tokens.empty() || tokens.back() != t) tokens.push_back(t);
      if (b > o_.max_bytes / o_.size_step) break;
    }
    return tokens;
  }

  // Buffers for `tokens` tokens on every rank; false (all freed) when the
  // memory is not there.
  bool allocate(int ws, std::uint32_t hidden, std::uint32_t tokens) {
    const std::size_t bytes = std::size_t{tokens} * hidden * kElementBytes;
    buffers_.clear();
    buffers_.resize(ws);
    bool ok = gamma_.allocate(std::size_t{hidden} * kElementBytes) &&
              counts_.allocate(4 * sizeof(unsigned long long));
    for (RankBuffers& b : buffers_) {
      for (DeviceBuffer* d : {&b.input, &b.residual_in, &b.residual_out, &b.norm_out, &b.sum,
                              &b.ref_residual_out, &b.ref_norm_out}) {
        ok = ok && d->allocate(bytes);
      }
    }
    if (!ok) buffers_.clear();
    return ok;
  }

  void fill(std::uint32_t hidden, std::uint32_t tokens) {
    const std::size_t count = std::size_t{tokens} * hidden;
    // Inputs are multiples of 1/8 in [-2, 2]: every partial sum of up to 16
    // of them is exact in fp32 and in bf16, so the sum (and residual_out) has
    // one right answer whatever order a kernel adds in.
    for (std::size_t r = 0; r < buffers_.size(); ++r) {
      const auto seed = static_cast<std::uint32_t>(r);
      check(bench::fill_bf16(buffers_[r].input.get(), count, 2 * seed + 1, -2.0f, 0.125f, 33,
                             nullptr),
            "fill");
      check(bench::fill_bf16(buffers_[r].residual_in.get(), count, 1000 + seed, -1.0f, 1.0f / 64,
                             129, nullptr),
            "fill");
    }
    check(bench::fill_bf16(gamma_.get(), hidden, 77, 0.5f, 1.0f / 128, 129, nullptr), "fill");
    check(cudaDeviceSynchronize(), "fill");
  }

  void run_shape(int ws, std::uint32_t hidden) {
    const std::vector<std::uint32_t> tokens = token_counts(hidden);
    if (tokens.empty()) return;
    std::fprintf(stderr, "ws %d, hidden %u: %zu sizes\n", ws, hidden, tokens.size());
    Timer timer(ws, o_.hang_timeout_s);

    // Buffers for the largest size; halve until they fit.
    std::uint32_t capacity = tokens.back();
    while (!allocate(ws, hidden, capacity)) {
      if (capacity == tokens.front()) {
        fail("ws " + std::to_string(ws) + " hidden " + std::to_string(hidden) +
             ": no memory for the buffers of even " + std::to_string(capacity) + " tokens");
        return;
      }
      note("ws " + std::to_string(ws) + " hidden " + std::to_string(hidden) + ": buffers of " +
           std::to_string(capacity) + " tokens do not fit; trying half");
      capacity = std::max(tokens.front(), capacity / 2);
    }
    const std::string shape = "ws " + std::to_string(ws) + " hidden " + std::to_string(hidden);
    watchdog_.arm(shape + ": filling buffers and creating workspaces", 4 * o_.hang_timeout_s);
    fill(hidden, capacity);

    std::unique_ptr<arbiter::test::LoopbackGroup> group;
    std::string why;
    if (fused_supported(ws, &why)) {
      group = create_group(ws, hidden, capacity);
    } else {
      note("ws " + std::to_string(ws) + ": fused skipped: " + why);
    }

    for (std::uint32_t t : tokens) {
      if (o_.budget_s > 0 &&
          std::chrono::duration<double>(Clock::now() - start_).count() > o_.budget_s) {
        note("stopped early: the --budget of " + std::to_string(o_.budget_s) +
             " s was reached before ws " + std::to_string(ws) + " hidden " +
             std::to_string(hidden) + " tokens " + std::to_string(t));
        stopped_ = true;
        break;
      }
      if (t > capacity) {
        note("ws " + std::to_string(ws) + " hidden " + std::to_string(hidden) + " tokens " +
             std::to_string(t) + ": skipped, above the " + std::to_string(capacity) +
             " tokens that fit in memory");
        continue;
      }
      watchdog_.arm(shape + " tokens " + std::to_string(t), 2 * o_.hang_timeout_s + o_.trials);
      run_point(timer, group.get(), ws, hidden, t);
    }
    watchdog_.arm(shape + ": destroying workspaces", 2 * o_.hang_timeout_s);
    group.reset();  // collective destroy, before the buffers go
    buffers_.clear();
    watchdog_.disarm();
  }

  std::unique_ptr<arbiter::test::LoopbackGroup> create_group(int ws, std::uint32_t hidden,
                                                             std::uint32_t max_tokens) {
    arbiter_workspace_spec spec{};
    spec.world_size = ws;
    spec.rank = 0;
    spec.device = device_.ordinal;
    spec.nodes = 1;
    spec.max_tokens = max_tokens;
    spec.hidden = hidden;
    spec.dtype = ARBITER_DTYPE_BF16;
    spec.pattern_mask = 1u << ARBITER_PATTERN_RESIDUAL_RMSNORM;
    spec.max_message_bytes = o_.max_bytes;
    spec.timeout_ms = 60000;
    const std::uint64_t row = std::uint64_t{hidden} * kElementBytes;
    for (;;) {
      auto group = std::make_unique<arbiter::test::LoopbackGroup>(*module_->api(), spec);
      if (group->ok()) {
        std::fprintf(csv_,
                     "# workspace ws %d hidden %u: max_tokens %u, max_message_bytes %" PRIu64 "\n",
                     ws, hidden, spec.max_tokens, spec.max_message_bytes);
        return group;
      }
      const std::string error = group->error();
      if (group->disagreed()) {
        // Some ranks hold a workspace the others do not: destroying it is
        // collective and would wait forever; leave it.
        group.release();
        fail("ws " + std::to_string(ws) + ": workspace creation: " + error);
        return nullptr;
      }
      group.reset();
      if (spec.max_message_bytes / 2 < row) {
        fail("ws " + std::to_string(ws) + " hidden " + std::to_string(hidden) +
             ": no workspace could be created: " + error);
        return nullptr;
      }
      note("ws " + std::to_string(ws) + " hidden " + std::to_string(hidden) + ": workspace of " +
           format_bytes(spec.max_message_bytes) + " failed (" + error + "); trying half");
      spec.max_message_bytes /= 2;
      spec.max_tokens = static_cast<std::uint32_t>(std::max<std::uint64_t>(
          1, std::min<std::uint64_t>(spec.max_tokens, spec.max_message_bytes / row)));
    }
  }

  void emit(const Point& p, const char* pattern, const char* backend, const char* algorithm,
            int fused, const Timing& t, const std::string& check) {
    std::fprintf(
        csv_, "%u,%d,1,bf16,%u,%u,%" PRIu64 ",%s,%s,%s,%d,%.3f,%.3f,%.3f,%zu,%s,%d,%s,%s\n",
        device_.capability, p.ws, p.hidden, p.tokens, p.bytes, pattern, backend, algorithm, fused,
        percentile(t.per_call_us, 0.5), percentile(t.per_call_us, 0.1),
        percentile(t.per_call_us, 0.9), t.per_call_us.size(), csv_field(device_.name).c_str(),
        t.iterations, t.graphs ? "graph" : "launch", check.c_str());
    std::fflush(csv_);
  }

  void run_point(Timer& timer, arbiter::test::LoopbackGroup* group, int ws, std::uint32_t hidden,
                 std::uint32_t tokens) {
    Point p;
    p.ws = ws;
    p.hidden = hidden;
    p.tokens = tokens;
    p.bytes = std::uint64_t{tokens} * hidden * kElementBytes;
    const std::string where = "ws " + std::to_string(ws) + " hidden " + std::to_string(hidden) +
                              " tokens " + std::to_string(tokens);

    // Baseline: sum kernel, then the nccl backend's residual + RMSNorm. Its
    // outputs (ref_*) are what the fused results are compared with.
    const Enqueue baseline = [&](int r, cudaStream_t s) {
      bench::SumArgs a;
      for (int i = 0; i < ws; ++i) a.inputs[i] = buffers_[i].input.get();
      a.ranks = ws;
      a.out = buffers_[r].sum.get();
      a.count = std::size_t{tokens} * hidden;
      a.max_blocks = 4 * device_.sm_count;
      if (const cudaError_t e = bench::sum_bf16(a, s); e != cudaSuccess) return e;
      arbiter::nccl::EpilogueParams e;
      e.dtype = ARBITER_DTYPE_BF16;
      e.tokens = tokens;
      e.hidden = hidden;
      e.sum = buffers_[r].sum.get();
      e.residual_in = buffers_[r].residual_in.get();
      e.residual_out = buffers_[r].ref_residual_out.get();
      e.gamma = gamma_.get();
      e.eps = kEps;
      e.norm_out = buffers_[r].ref_norm_out.get();
      return arbiter::nccl::launch_residual_rmsnorm(e, s);
    };
    const Enqueue copy = [&](int r, cudaStream_t s) {
      return cudaMemcpyAsync(buffers_[r].sum.get(), buffers_[r].input.get(), p.bytes,
                             cudaMemcpyDeviceToDevice, s);
    };

    try {
      timer.run_once(baseline, where + " baseline");
      const Timing base = timer.measure(baseline, o_.trials, o_.graphs, where + " baseline");
      p.median_us["baseline"] = percentile(base.per_call_us, 0.5);
      emit(p, "residual_rmsnorm", "baseline", "sum+norm", 0, base, "-");

      const Timing c = timer.measure(copy, o_.trials, o_.graphs, where + " copy");
      p.median_us["copy"] = percentile(c.per_call_us, 0.5);
      // A reference, not an option to tune between: a comment line that
      // `arbiter tune` skips: "# copy,ws,hidden,tokens,bytes,memcpy d2d,
      // median_us,p10_us,p90_us".
      std::fprintf(csv_, "# copy,%d,%u,%u,%" PRIu64 ",memcpy d2d,%.3f,%.3f,%.3f\n", p.ws, p.hidden,
                   p.tokens, p.bytes, percentile(c.per_call_us, 0.5),
                   percentile(c.per_call_us, 0.1), percentile(c.per_call_us, 0.9));
    } catch (const Failure& e) {
      fail(where + ": " + e.what());
      throw;  // a failed baseline or copy is a CUDA error: nothing after it is trustworthy
    }

    if (group != nullptr) {
      run_fused(timer, *group, p, ARBITER_ALGORITHM_ONESHOT, where);
      if (tokens >= static_cast<std::uint32_t>(ws)) {
        run_fused(timer, *group, p, ARBITER_ALGORITHM_TWOSHOT, where);
      }
    }
    points_.push_back(p);
    std::fprintf(stderr, "  %-34s", (where + " (" + format_bytes(p.bytes) + ")").c_str());
    for (const char* k : {"oneshot", "twoshot", "baseline", "copy"}) {
      const auto it = p.median_us.find(k);
      if (it != p.median_us.end()) std::fprintf(stderr, " %s %.1f us", k, it->second);
    }
    std::fprintf(stderr, "\n");
  }

  void run_fused(Timer& timer, arbiter::test::LoopbackGroup& group, Point& p,
                 arbiter_algorithm algorithm, const std::string& where) {
    const char* name = algorithm == ARBITER_ALGORITHM_ONESHOT ? "oneshot" : "twoshot";
    const std::string what = where + " " + name;
    std::vector<arbiter_allreduce_args> args(p.ws);
    for (int r = 0; r < p.ws; ++r) {
      arbiter_allreduce_args& a = args[r];
      a = arbiter_allreduce_args{};
      a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
      a.dtype = ARBITER_DTYPE_BF16;
      a.algorithm = algorithm;
      a.tokens = p.tokens;
      a.hidden = p.hidden;
      a.input = buffers_[r].input.get();
      a.residual_in = buffers_[r].residual_in.get();
      a.residual_out = buffers_[r].residual_out.get();
      a.gamma = gamma_.get();
      a.eps = kEps;
      a.norm_out = buffers_[r].norm_out.get();
    }
    // First through LoopbackGroup::run(): it notices ranks that disagree.
    std::string error;
    const std::int32_t status = group.run(args, &error, &timer.streams());
    if (group.hung()) {
      fail(what + ": " + error + "; the enqueued kernels can never finish, so the run stops");
      std::fflush(nullptr);
      std::_Exit(2);
    }
    if (status == ARBITER_UNSUPPORTED) {
      note(what + ": not run: " + error);
      return;
    }
    if (status != ARBITER_OK) {
      fail(what + ": run() returned " + std::to_string(status) + ": " + error);
      return;
    }
    std::string run_error;  // the first refusal, for the messages below
    const Enqueue op = [&](int r, cudaStream_t s) -> cudaError_t {
      if (module_->api()->run(group.workspace(r), &args[r], s) == ARBITER_OK) return cudaSuccess;
      if (run_error.empty()) {
        run_error = "run() on rank " + std::to_string(r) + ": " + module_->api()->last_error();
      }
      return cudaErrorUnknown;
    };
    try {
      timer.wait_all(what);
      const std::string result = o_.check ? compare(p, what) : "-";
      const Timing t = timer.measure(op, o_.trials, o_.graphs, what);
      if (o_.graphs && !t.graphs) {
        note(what + ": timed plain launches, graph capture failed" +
             (run_error.empty() ? std::string() : " (" + run_error + ")"));
      }
      p.median_us[name] = percentile(t.per_call_us, 0.5);
      emit(p, "residual_rmsnorm", "trtllm", name, 1, t, result);
    } catch (const Failure& e) {
      fail(what + ": " + e.what() + (run_error.empty() ? std::string() : " (" + run_error + ")"));
      throw;
    }
  }

  // Compares every rank's fused residual_out (bit for bit: the inputs make
  // the sum exact) and norm_out (within 2^-7 relative: the sum of squares may
  // be added in another order) with the baseline's.
  std::string compare(Point& p, const std::string& what) {
    const std::size_t count = std::size_t{p.tokens} * p.hidden;
    auto* counts = static_cast<unsigned long long*>(counts_.get());
    check(cudaMemset(counts, 0, 4 * sizeof(unsigned long long)), "cudaMemset");
    for (int r = 0; r < p.ws; ++r) {
      check(bench::compare_bf16(buffers_[r].residual_out.get(), buffers_[r].ref_residual_out.get(),
                                count, 0.0f, 0.0f, counts, nullptr),
            "compare");
      check(bench::compare_bf16(buffers_[r].norm_out.get(), buffers_[r].ref_norm_out.get(), count,
                                1.0f / 128, 1e-30f, counts + 2, nullptr),
            "compare");
    }
    unsigned long long host[4] = {};
    check(cudaMemcpy(host, counts, sizeof host, cudaMemcpyDeviceToHost), "compare");
    if (host[1] != 0 || host[3] != 0) {
      fail(what + ": the fused result differs from the baseline: " + std::to_string(host[1]) +
           " residual_out and " + std::to_string(host[3]) + " norm_out elements (of " +
           std::to_string(count * p.ws) + ") beyond tolerance");
      return "mismatch";
    }
    return host[2] == 0 ? "exact" : "close";
  }

  const Options& o_;
  const Device& device_;
  std::FILE* csv_;
  std::unique_ptr<arbiter::test::BackendModule> module_;
  arbiter_backend_caps caps_{};
  bool probed_ = false;
  Clock::time_point start_;
  bool stopped_ = false;
  std::vector<RankBuffers> buffers_;
  DeviceBuffer gamma_;
  DeviceBuffer counts_;
  std::vector<Point> points_;
  int failures_ = 0;
  std::vector<std::string> failure_lines_;
  Watchdog watchdog_;
};

// Per point: each option's median, the best fused option's speed-up over
// the baseline, and the share of copy bandwidth it reaches. "Bytes moved"
// is the group's message, ws x bytes, counted alike for the fused call, the
// baseline and the copy (ws concurrent cudaMemcpyAsync of `bytes` each), so
// "%copy" = copy time / fused time at the same size, and "%peak" compares
// with the fastest copy of the whole run.
void Bench::print_summary() const {
  double peak = 0;  // bytes/us of the best copy
  for (const Point& p : points_) {
    const auto it = p.median_us.find("copy");
    if (it != p.median_us.end() && it->second > 0) {
      peak = std::max(peak, static_cast<double>(p.ws) * p.bytes / it->second);
    }
  }
  std::fprintf(stderr,
               "\nsummary (median us; speedup = baseline / best fused; GB/s = ws x bytes / time; "
               "%%copy = copy time / fused time; %%peak = vs the fastest copy, %.0f GB/s)\n",
               peak / 1e3);
  std::fprintf(stderr, "%3s %6s %6s %10s %9s %9s %9s %9s  %-8s %7s %8s %6s %6s\n", "ws", "hidden",
               "tokens", "bytes", "oneshot", "twoshot", "baseline", "copy", "best", "speedup",
               "GB/s", "%copy", "%peak");
  for (const Point& p : points_) {
    const auto get = [&](const char* k) {
      const auto it = p.median_us.find(k);
      return it == p.median_us.end() ? std::optional<double>() : std::optional<double>(it->second);
    };
    const auto cell = [](std::optional<double> v) {
      char text[32];
      if (v) {
        std::snprintf(text, sizeof text, "%9.1f", *v);
      } else {
        std::snprintf(text, sizeof text, "%9s", "-");
      }
      return std::string(text);
    };
    const auto one = get("oneshot");
    const auto two = get("twoshot");
    const auto base = get("baseline");
    const auto copy = get("copy");
    std::optional<double> best;
    std::string best_name = "-";
    if (one) {
      best = one;
      best_name = "oneshot";
    }
    if (two && (!best || *two < *best)) {
      best = two;
      best_name = "twoshot";
    }
    std::fprintf(stderr, "%3d %6u %6u %10s %s %s %s %s  %-8s", p.ws, p.hidden, p.tokens,
                 format_bytes(p.bytes).c_str(), cell(one).c_str(), cell(two).c_str(),
                 cell(base).c_str(), cell(copy).c_str(), best_name.c_str());
    if (best && base && copy) {
      const double moved = static_cast<double>(p.ws) * p.bytes;
      std::fprintf(stderr, " %6.2fx %8.1f %5.0f%% %5.0f%%\n", *base / *best, moved / *best / 1e3,
                   100.0 * *copy / *best, peak > 0 ? 100.0 * moved / *best / peak : 0.0);
    } else {
      std::fprintf(stderr, " %7s %8s %6s %6s\n", "-", "-", "-", "-");
    }
  }
  if (stopped_) std::fprintf(stderr, "(stopped early: --budget reached)\n");
  for (const std::string& f : failure_lines_) std::fprintf(stderr, "FAILED: %s\n", f.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  arbiter::test::prepare_loopback_environment();
  Options o;
  if (!parse_options(argc, argv, &o)) {
    print_usage(stderr);
    return 2;
  }
  int count = 0;  // a failing cudaGetDeviceCount leaves it unchanged
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "the device count is 0");
    return 77;
  }
  if (o.device < 0 || o.device >= count) {
    std::fprintf(stderr, "error: --device %d: %d device(s) visible\n", o.device, count);
    return 2;
  }

  std::FILE* csv = stdout;
  if (!o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    if (csv == nullptr) {
      std::fprintf(stderr, "error: cannot write %s\n", o.csv.c_str());
      return 2;
    }
  }
  try {
    check(cudaSetDevice(o.device), "cudaSetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
    Device d;
    d.ordinal = o.device;
    d.name = prop.name;
    d.capability = static_cast<std::uint32_t>(prop.major * 10 + prop.minor);
    d.sm_count = prop.multiProcessorCount;
    int driver = 0;
    int runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    char bus[32] = "?";
    cudaDeviceGetPCIBusId(bus, sizeof bus, o.device);

    std::fprintf(csv, "# arbiter-bench-trtllm, arbiter %s\n", ARBITER_VERSION);
    std::fprintf(csv, "# date: %s\n", utc_now().c_str());
    std::fprintf(csv, "# command: %s\n", o.command_line.c_str());
    std::fprintf(csv,
                 "# device %d: %s, capability %d.%d, %d SMs, %.1f GiB, PCI %s; driver %s, "
                 "runtime %s\n",
                 o.device, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                 static_cast<double>(prop.totalGlobalMem) / (1024.0 * kMiB), bus,
                 cuda_version(driver).c_str(), cuda_version(runtime).c_str());
    std::fprintf(csv,
                 "# loopback: ws virtual ranks on this one GPU, one stream each; bytes = "
                 "tokens x hidden x 2 per rank; latency = one call on every rank, median of "
                 "trials (us)\n");
    Bench bench(o, d, csv);
    bench.load_module();
    std::fprintf(csv,
                 "capability,world_size,nodes,dtype,hidden,num_tokens,bytes,pattern,backend,"
                 "algorithm,fused,latency_us,p10_us,p90_us,trials,device,iterations,timing,"
                 "check\n");
    std::fflush(csv);

    int rc = 0;
    try {
      bench.run();
      rc = bench.exit_code();
    } catch (const Failure& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      rc = 1;
    }
    bench.print_summary();
    if (csv != stdout) std::fclose(csv);
    return rc;
  } catch (const Failure& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (csv != stdout) std::fclose(csv);
    return 1;
  }
}
