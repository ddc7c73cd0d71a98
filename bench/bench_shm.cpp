// arbiter-bench-shm: the shm backend's fused all-reduce + residual + RMSNorm
// against, in the same run, the same job done as separate steps (the
// backend's unfused path: sum through the shared buffer, then residual add,
// then norm) and against memcpy bandwidth on the same machine.
//
// Run one process per rank:
//   arbiter launch --nproc 4 -- arbiter-bench-shm [--from 4KiB] [--to 64MiB]
//                                                 [--hidden 1024] [--trials 15]
//                                                 [--load N] [--baseline MODULE]
// --load N: rank 0 keeps N busy processes (a spin loop each) running for
// the whole run, for figures on a loaded host. Their progress is measured
// too: rank 0 prints `# cotenant,BYTES,METHOD,Miter_per_s` after each
// method (the busy processes' iterations per second, summed, while that
// method was timed), and `# cotenant,0,idle,...` once while the ranks sleep.
// arbiter-bench-shm-mpi (built where CMake finds MPI) also times
// MPI_Allreduce of the same bytes (fp32) as method mpi_allreduce_fp32; run it
// under `mpirun -np N` (see FUSED.md).
// --baseline MODULE: another build of libarbiter-shm.so (say, of the commit
// before a change) timed in the same run, its trials interleaved with the
// current module's so that both see the same machine: each fused method
// gets a second row, METHOD@baseline. A machine whose speed swings 2-4x
// between minutes can still compare two builds this way.
// --baseline-wait POLICY: the same, against this module with its second
// workspace created under ARBITER_SHM_WAIT=POLICY (an A/B of wait policies
// in one run; the registered methods are not timed against it).
// Rank 0 prints a CSV: world_size, bytes (per rank), num_tokens, method,
// latency_us (median over trials of the slowest rank's per-call time, calls
// back to back), effective_GBps (bytes / latency), p90_us. Methods:
// fused_oneshot, fused_twoshot, fused_twoshot_replicated (two-shot told that
// every rank's residual is the same: each rank runs the epilogue on its own
// token slice only), registered_oneshot, registered_twoshot and
// registered_twoshot_replicated (the same calls with the input in the
// module's registered memory, ABI v2: read in place, no copy-in; not timed
// against --baseline), registered_twoshot_owners (registered_twoshot_replicated
// with residual_out and norm_out registered too: each rank writes its slice
// in place and copies the others from their owners, nothing staged; at every
// size, since the bench sets ARBITER_SHM_OWNERS_FROM=0 unless it is given),
// separate_steps, memcpy (the
// same bytes, all ranks at once), and once per run pingpong (a flag's round trip between ranks 0
// and 1 through shared memory: the floor of any wait on a peer). After the power-of-two sweep at
// --hidden, a decode-shaped (1 x 4096) and a prefill-shaped (4096 x 4096) row, where --to holds
// them.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/bootstrap.h"
#include "arbiter/registry.h"
#include "arbiter/size.h"
#if defined(ARBITER_BENCH_MPI)
#include "mpi_baseline.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::uint64_t from = 4 * arbiter::kKiB;
  std::uint64_t to = 64 * arbiter::kMiB;
  std::uint32_t hidden = 1024;
  int trials = 15;
  int load = 0;               // busy processes rank 0 keeps running for the whole run
  std::string baseline;       // another shm module, timed alongside
  std::string baseline_wait;  // or this module under another ARBITER_SHM_WAIT
};

[[noreturn]] void die(const std::string& message) {
  std::cerr << "arbiter-bench-shm: " << message << "\n";
  std::exit(1);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    auto size = [&](const std::string& text) {
      auto s = arbiter::parse_size(text, false);
      if (!s) die(a + ": " + s.error);
      return *s.value;
    };
    if (a == "--from")
      o.from = size(value());
    else if (a == "--to")
      o.to = size(value());
    else if (a == "--hidden")
      o.hidden = static_cast<std::uint32_t>(std::stoul(value()));
    else if (a == "--trials")
      o.trials = std::stoi(value());
    else if (a == "--load")
      o.load = std::stoi(value());
    else if (a == "--baseline")
      o.baseline = value();
    else if (a == "--baseline-wait")
      o.baseline_wait = value();
    else
      die("unknown option " + a +
          " (--from, --to, --hidden, --trials, --load, --baseline, --baseline-wait)");
  }
  if (!o.baseline.empty() && !o.baseline_wait.empty()) {
    die("--baseline and --baseline-wait compare against one thing each: give one of them");
  }
  if (o.hidden == 0 || o.trials < 3 || o.from > o.to || o.load < 0 || o.load > 64) {
    die("bad options");
  }
  return o;
}

// Calls per timed trial: back to back, like MPI benchmarks time theirs, so
// that the skew of the barrier before a trial (tens of microseconds through
// the UCX bootstrap) is spread over many small calls.
int calls_per_trial(std::uint64_t bytes) {
  return static_cast<int>(std::clamp<std::uint64_t>((4 * arbiter::kMiB) / bytes, 1, 1000));
}

struct Summary {
  double median = 0.0;
  double p90 = 0.0;
};

// Median and 90th percentile of the per-trial maximum across ranks (a
// collective finishes when its slowest rank does).
Summary summary_of_max(arbiter::Bootstrap& boot, std::vector<double>& mine) {
  std::vector<double> all(mine.size() * static_cast<std::size_t>(boot.world_size()));
  if (!boot.allgather(mine.data(), all.data(), mine.size() * sizeof(double),
                      std::chrono::seconds(60))
           .ok()) {
    die("allgather of timings failed");
  }
  std::vector<double> worst(mine.size(), 0.0);
  for (std::size_t r = 0; r < static_cast<std::size_t>(boot.world_size()); ++r) {
    for (std::size_t t = 0; t < mine.size(); ++t) {
      worst[t] = std::max(worst[t], all[r * mine.size() + t]);
    }
  }
  std::sort(worst.begin(), worst.end());
  Summary summary;
  summary.median = worst[worst.size() / 2];
  summary.p90 = worst[std::min(worst.size() - 1, (worst.size() * 9) / 10)];
  return summary;
}

// Ranks 0 and 1 pass a counter back and forth through two cache lines of a
// shared mapping: the machine's floor for anything a rank must hear from
// another. Returns the round-trip times (us) of the trials on every rank.
std::vector<double> pingpong(arbiter::Bootstrap& boot, int trials) {
  constexpr int kRoundTrips = 2000;
  char name[64] = {};
  void* memory = MAP_FAILED;
  if (boot.rank() == 0) {
    std::snprintf(name, sizeof name, "/arbiter-bench-pingpong-%d", static_cast<int>(getpid()));
    const int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, 4096) != 0) die("pingpong: shm_open failed");
    memory = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  if (!boot.broadcast(name, sizeof name, 0, std::chrono::seconds(60)).ok()) die("broadcast failed");
  if (boot.rank() == 1) {
    const int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) die("pingpong: shm_open of rank 0's object failed");
    memory = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  if (!boot.barrier(std::chrono::seconds(60)).ok()) die("barrier failed");
  if (boot.rank() == 0) shm_unlink(name);
  if (boot.rank() < 2 && memory == MAP_FAILED) die("pingpong: mmap failed");
  auto line = [&](int index) {
    return std::atomic_ref<std::uint64_t>(
        *reinterpret_cast<std::uint64_t*>(static_cast<char*>(memory) + 64 * index));
  };
  std::vector<double> times;
  std::uint64_t count = 0;
  for (int t = -2; t < trials; ++t) {
    if (!boot.barrier(std::chrono::seconds(60)).ok()) die("barrier failed");
    const auto start = Clock::now();
    if (boot.rank() < 2) {
      const auto give_up = start + std::chrono::seconds(10);
      for (int i = 0; i < kRoundTrips; ++i) {
        ++count;
        if (boot.rank() == 0) line(0).store(count, std::memory_order_release);
        for (std::uint32_t spins = 1;
             line(boot.rank() == 0 ? 1 : 0).load(std::memory_order_acquire) != count; ++spins) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
          if ((spins & 4095u) == 0 && Clock::now() > give_up) die("pingpong: the peer stopped");
        }
        if (boot.rank() == 1) line(1).store(count, std::memory_order_release);
      }
    }
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (t >= 0) times.push_back(boot.rank() < 2 ? us / kRoundTrips : 0.0);
  }
  if (memory != MAP_FAILED) munmap(memory, 4096);
  return times;
}

// `count` processes that spin on the CPU until this object goes away, so
// that figures under load are reproducible (a host never idle: tokenizers,
// the scheduler, other workers). Each also dies with its parent, and counts
// its iterations in a shared word, so that a wait policy's cost to them is
// measured too.
class BusyProcesses {
 public:
  explicit BusyProcesses(int count) {
    if (count == 0) return;
    void* area = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) die("--load: mmap failed");
    counters_ = static_cast<std::uint64_t*>(area);
    for (int i = 0; i < count; ++i) {
      const pid_t pid = fork();
      if (pid < 0) die("--load: fork failed");
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        std::atomic_ref<std::uint64_t> counter(counters_[i * 8]);  // a line each
        for (;;) {
          volatile std::uint64_t spin = 0;
          for (int k = 0; k < 4096; ++k) spin = spin + 1;
          counter.fetch_add(4096, std::memory_order_relaxed);
        }
      }
      children_.push_back(pid);
    }
  }
  ~BusyProcesses() {
    for (pid_t pid : children_) kill(pid, SIGKILL);
    for (pid_t pid : children_) waitpid(pid, nullptr, 0);
    if (counters_ != nullptr) munmap(counters_, 4096);
  }
  bool any() const { return !children_.empty(); }
  // Iterations of every busy process so far.
  std::uint64_t iterations() const {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < children_.size(); ++i) {
      sum += std::atomic_ref<std::uint64_t>(counters_[i * 8]).load(std::memory_order_relaxed);
    }
    return sum;
  }
  BusyProcesses(const BusyProcesses&) = delete;
  BusyProcesses& operator=(const BusyProcesses&) = delete;

 private:
  std::vector<pid_t> children_;
  std::uint64_t* counters_ = nullptr;
};

// The busy processes' iterations per second (millions) between start() and
// rate(); nothing without busy processes.
class CotenantMeter {
 public:
  explicit CotenantMeter(const BusyProcesses* load) : load_(load) {}
  void start() {
    if (load_ == nullptr || !load_->any()) return;
    at_ = Clock::now();
    count_ = load_->iterations();
  }
  void print(std::uint64_t bytes, const char* method) const {
    if (load_ == nullptr || !load_->any()) return;
    const double seconds = std::chrono::duration<double>(Clock::now() - at_).count();
    std::printf("# cotenant,%llu,%s,%.1f\n", static_cast<unsigned long long>(bytes), method,
                static_cast<double>(load_->iterations() - count_) / seconds / 1e6);
  }

 private:
  const BusyProcesses* load_;
  Clock::time_point at_{};
  std::uint64_t count_ = 0;
};

// Times one shape in every method and memcpy; rank 0 prints the rows.
class Runner {
 public:
  Runner(arbiter::Bootstrap& boot, const arbiter_backend_v1_t& shm, arbiter_workspace* ws,
         const Options& opt, const arbiter_backend_memory_v2_t* memory,
         const arbiter_backend_v1_t* baseline = nullptr, arbiter_workspace* baseline_ws = nullptr)
      : boot_(boot),
        shm_(shm),
        ws_(ws),
        opt_(opt),
        baseline_(baseline),
        baseline_ws_(baseline_ws),
        memory_(memory) {
    const std::size_t max_elems = opt.to / 2;
    input_.resize(max_elems);
    residual_.assign(max_elems, 0x3F00);  // 0.5
    residual_out_.resize(max_elems);
    norm_out_.resize(max_elems);
    copy_dst_.resize(max_elems);
    gamma_.assign(std::max<std::size_t>(opt.hidden, kShapeHidden), 0x3F80);  // 1.0
    for (std::size_t i = 0; i < max_elems; ++i) {
      input_[i] = static_cast<std::uint16_t>(0x3C00 + (i * 7 + boot.rank()) % 256);  // ~1.0..1.5
    }
    // The registered input: the same values in memory every rank maps.
    if (memory_ != nullptr) {
      void* area = nullptr;
      // The input, then residual_out and norm_out for registered_twoshot_owners.
      if (memory_->alloc(ws_, 3 * opt.to, &area) != ARBITER_OK) {
        die(std::string("registered alloc: ") + shm_.last_error());
      }
      registered_ = area;
      std::memcpy(registered_, input_.data(), max_elems * 2);
    }
  }
  // Before the workspace goes (its destroy would free it too).
  void free_registered() {
    if (registered_ != nullptr) memory_->free(ws_, registered_);
    registered_ = nullptr;
  }

  static constexpr std::uint32_t kShapeHidden = 4096;

  // The busy processes to measure beside each method (rank 0's; none elsewhere).
  void measure_load(const BusyProcesses* load) { load_ = load; }

  void shape(std::uint32_t tokens, std::uint32_t hidden) {
    const std::uint64_t bytes = std::uint64_t{tokens} * hidden * 2;
    struct Method {
      const char* name;
      arbiter_algorithm algorithm;
      std::uint32_t flags;
      bool registered = false;
      bool outputs_registered = false;
    };
    // Every rank's residual is the same here, as in tensor parallelism.
    const Method methods[] = {
        {"fused_oneshot", ARBITER_ALGORITHM_ONESHOT, 0},
        {"fused_twoshot", ARBITER_ALGORITHM_TWOSHOT, 0},
        {"fused_twoshot_replicated", ARBITER_ALGORITHM_TWOSHOT, ARBITER_RUN_RESIDUAL_REPLICATED},
        {"registered_oneshot", ARBITER_ALGORITHM_ONESHOT, 0, true},
        {"registered_twoshot", ARBITER_ALGORITHM_TWOSHOT, 0, true},
        {"registered_twoshot_replicated", ARBITER_ALGORITHM_TWOSHOT,
         ARBITER_RUN_RESIDUAL_REPLICATED, true},
        {"registered_twoshot_owners", ARBITER_ALGORITHM_TWOSHOT, ARBITER_RUN_RESIDUAL_REPLICATED,
         true, true},
        {"separate_steps", ARBITER_ALGORITHM_NATIVE, 0}};
    for (const Method& m : methods) {
      if (m.registered && registered_ == nullptr) continue;
      arbiter_allreduce_args a{};
      a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
      a.dtype = ARBITER_DTYPE_BF16;
      a.algorithm = m.algorithm;
      a.flags = m.flags;
      a.tokens = tokens;
      a.hidden = hidden;
      a.input = m.registered ? registered_ : input_.data();
      a.residual_in = residual_.data();
      a.residual_out = residual_out_.data();
      a.gamma = gamma_.data();
      a.eps = 1e-6f;
      a.norm_out = norm_out_.data();
      if (m.outputs_registered) {
        a.residual_out = static_cast<std::byte*>(registered_) + opt_.to;
        a.norm_out = static_cast<std::byte*>(registered_) + 2 * opt_.to;
      }
      bool skipped = false;
      auto call_on = [&](const arbiter_backend_v1_t& module, arbiter_workspace* ws) {
        const std::int32_t status =
            m.registered ? memory_->run_registered(ws, &a, nullptr) : module.run(ws, &a, nullptr);
        if (status == ARBITER_UNSUPPORTED) {
          skipped = true;  // every rank gets the same answer for the same shape
          return false;
        }
        if (status != ARBITER_OK) die(std::string(m.name) + ": " + module.last_error());
        return true;
      };
      std::vector<double> times, baseline_times;
      CotenantMeter meter(load_);
      meter.start();
      if (baseline_ != nullptr && !m.registered) {
        time_pair(
            bytes, [&] { return call_on(shm_, ws_); },
            [&] { return call_on(*baseline_, baseline_ws_); }, times, baseline_times);
      } else {
        times = time_calls(bytes, [&] { return call_on(shm_, ws_); });
      }
      if (skipped) {
        if (boot_.rank() == 0) {
          std::printf("%d,%llu,%u,%s,skipped,,\n", boot_.world_size(),
                      static_cast<unsigned long long>(bytes), tokens, m.name);
        }
        continue;
      }
      if (boot_.rank() == 0) meter.print(bytes, m.name);
      print(bytes, tokens, m.name, summary_of_max(boot_, times));
      if (baseline_ != nullptr && !m.registered) {
        print(bytes, tokens, (std::string(m.name) + "@baseline").c_str(),
              summary_of_max(boot_, baseline_times));
      }
    }
#if defined(ARBITER_BENCH_MPI)
    {
      CotenantMeter meter(load_);
      meter.start();
      std::vector<double> mpi_times = time_calls(bytes, [&] { return mpi_(bytes); });
      if (boot_.rank() == 0) meter.print(bytes, "mpi_allreduce_fp32");
      print(bytes, tokens, "mpi_allreduce_fp32", summary_of_max(boot_, mpi_times));
    }
#endif
    // memcpy of the same bytes, all ranks at once, for the machine's bandwidth.
    std::vector<double> times = time_calls(bytes, [&] {
      std::memcpy(copy_dst_.data(), input_.data(), bytes);
      asm volatile("" : : "r"(copy_dst_.data()) : "memory");
      return true;
    });
    print(bytes, tokens, "memcpy", summary_of_max(boot_, times));
    std::fflush(stdout);
  }

  void print(std::uint64_t bytes, std::uint32_t tokens, const char* method, const Summary& us) {
    if (boot_.rank() != 0) return;
    std::printf("%d,%llu,%u,%s,%.2f,%.3f,%.2f\n", boot_.world_size(),
                static_cast<unsigned long long>(bytes), tokens, method, us.median,
                us.median > 0 ? static_cast<double>(bytes) / us.median / 1e3 : 0.0, us.p90);
  }

 private:
  // Per-call times of the trials (two warm-up trials first); `call` returns
  // false to stop (the shape is refused).
  template <class Call>
  std::vector<double> time_calls(std::uint64_t bytes, Call call) {
    std::vector<double> times;
    const int calls = calls_per_trial(bytes);
    for (int t = -2; t < opt_.trials; ++t) {
      if (!boot_.barrier(std::chrono::seconds(60)).ok()) die("barrier failed");
      const auto start = Clock::now();
      for (int c = 0; c < calls; ++c) {
        if (!call()) return {};
      }
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (t >= 0) times.push_back(us / calls);
    }
    return times;
  }

  // Trials of `first` and `second` alternating (two warm-up pairs first),
  // so that both see the same state of the machine.
  template <class First, class Second>
  void time_pair(std::uint64_t bytes, First first, Second second, std::vector<double>& first_times,
                 std::vector<double>& second_times) {
    const int calls = calls_per_trial(bytes);
    for (int t = -2; t < opt_.trials; ++t) {
      for (int which = 0; which < 2; ++which) {
        if (!boot_.barrier(std::chrono::seconds(60)).ok()) die("barrier failed");
        const auto start = Clock::now();
        for (int c = 0; c < calls; ++c) {
          if (!(which == 0 ? first() : second())) return;
        }
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
        if (t >= 0) (which == 0 ? first_times : second_times).push_back(us / calls);
      }
    }
  }

  arbiter::Bootstrap& boot_;
  const arbiter_backend_v1_t& shm_;
  arbiter_workspace* ws_;
  const Options& opt_;
  const arbiter_backend_v1_t* baseline_;
  arbiter_workspace* baseline_ws_;
  const arbiter_backend_memory_v2_t* memory_;  // nullptr: a v1 module, no registered rows
  void* registered_ = nullptr;
  const BusyProcesses* load_ = nullptr;
#if defined(ARBITER_BENCH_MPI)
  arbiter_bench::MpiAllreduce mpi_{opt_.to};
#endif
  std::vector<std::uint16_t> input_, residual_, residual_out_, norm_out_, gamma_, copy_dst_;
};

}  // namespace

int main(int argc, char** argv) {
#if defined(ARBITER_BENCH_MPI)
  MPI_Init(&argc, &argv);
  arbiter_bench::rendezvous_from_mpi();
#endif
  const Options opt = parse(argc, argv);
  arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment();
  arbiter::DiscoverOptions discover = arbiter::DiscoverOptions::from_environment();
  discover.probe = {ARBITER_DEVICE_CPU, -1};
  const arbiter::Registry registry = arbiter::Registry::discover(discover);
  const arbiter_backend_v1_t* shm = registry.backend(arbiter::Backend::kShm);
  if (!shm) die("the shm backend module is not available (see `arbiter plugins`)");

  const std::uint32_t hidden = opt.hidden;
  const std::size_t token_bytes = std::size_t{hidden} * 2;  // bf16
  arbiter_workspace_spec spec{};
  spec.world_size = boot.world_size();
  spec.rank = boot.rank();
  spec.device = -1;
  spec.nodes = 1;
  spec.max_tokens = static_cast<std::uint32_t>(opt.to / token_bytes);
  spec.hidden = hidden;
  spec.dtype = ARBITER_DTYPE_BF16;
  spec.pattern_mask = 1u << ARBITER_PATTERN_RESIDUAL_RMSNORM;
  spec.max_message_bytes = opt.to;
  spec.timeout_ms = 60000;
  // registered_twoshot_owners times the owners' path at every size (the
  // module's default starts it at 64 KiB); the other methods register no
  // outputs, so the setting does not touch them.
  setenv("ARBITER_SHM_OWNERS_FROM", "0", /*overwrite=*/0);
  arbiter_workspace* ws = nullptr;
  if (shm->workspace_create(boot.oob(), &spec, &ws) != ARBITER_OK) {
    die(std::string("workspace_create: ") + shm->last_error());
  }
  const arbiter_backend_v1_t* baseline = nullptr;
  arbiter_workspace* baseline_ws = nullptr;
  if (!opt.baseline.empty()) {
    void* handle = dlopen(opt.baseline.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) die("--baseline: " + std::string(dlerror()));
    baseline = static_cast<const arbiter_backend_v1_t*>(dlsym(handle, ARBITER_BACKEND_SYMBOL_V1));
    if (baseline == nullptr) die("--baseline: " + opt.baseline + " is not an arbiter module");
    if (baseline->workspace_create(boot.oob(), &spec, &baseline_ws) != ARBITER_OK) {
      die(std::string("--baseline workspace_create: ") + baseline->last_error());
    }
  } else if (!opt.baseline_wait.empty()) {
    // The same module, its second workspace created under the other policy
    // (the module reads ARBITER_SHM_WAIT at creation only).
    const char* current = std::getenv("ARBITER_SHM_WAIT");
    const std::string kept = current == nullptr ? "" : current;
    setenv("ARBITER_SHM_WAIT", opt.baseline_wait.c_str(), 1);
    baseline = shm;
    if (baseline->workspace_create(boot.oob(), &spec, &baseline_ws) != ARBITER_OK) {
      die(std::string("--baseline-wait workspace_create: ") + baseline->last_error());
    }
    if (current == nullptr) {
      unsetenv("ARBITER_SHM_WAIT");
    } else {
      setenv("ARBITER_SHM_WAIT", kept.c_str(), 1);
    }
  }
  Runner runner(boot, *shm, ws, opt, registry.memory(arbiter::Backend::kShm), baseline,
                baseline_ws);
  const BusyProcesses load(boot.rank() == 0 ? opt.load : 0);
  runner.measure_load(&load);
  if (boot.rank() == 0) {
    std::printf(
        "# arbiter-bench-shm: world_size=%d hidden=%u dtype=bf16 pattern=residual_rmsnorm "
        "trials=%d load=%d wait=%s owners_from=%s baseline=%s%s\n",
        boot.world_size(), hidden, opt.trials, opt.load,
        std::getenv("ARBITER_SHM_WAIT") != nullptr ? std::getenv("ARBITER_SHM_WAIT") : "auto",
        std::getenv("ARBITER_SHM_OWNERS_FROM"), opt.baseline_wait.empty() ? "" : "wait=",
        !opt.baseline_wait.empty() ? opt.baseline_wait.c_str()
        : opt.baseline.empty()     ? "none"
                                   : opt.baseline.c_str());
    std::printf("world_size,bytes,num_tokens,method,latency_us,effective_GBps,p90_us\n");
  }
  if (load.any()) {
    // The busy processes alone, the ranks asleep: what they get idle.
    CotenantMeter idle(&load);
    idle.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    idle.print(0, "idle");
  }
  std::vector<double> round_trips = pingpong(boot, opt.trials);
  runner.print(8, 0, "pingpong", summary_of_max(boot, round_trips));
  for (std::uint64_t bytes = opt.from; bytes <= opt.to; bytes *= 2) {
    runner.shape(static_cast<std::uint32_t>(std::max<std::uint64_t>(1, bytes / token_bytes)),
                 hidden);
  }
  // A decode-shaped call (1 token) and a prefill-shaped one (4096 tokens),
  // hidden 4096, where the workspace holds them.
  if (boot.rank() == 0) std::printf("# decode and prefill shapes: hidden=4096\n");
  for (std::uint32_t tokens : {1u, 4096u}) {
    if (std::uint64_t{tokens} * Runner::kShapeHidden * 2 <= opt.to) {
      runner.shape(tokens, Runner::kShapeHidden);
    }
  }
  runner.free_registered();
  shm->workspace_destroy(ws);
  if (baseline_ws != nullptr) baseline->workspace_destroy(baseline_ws);
#if defined(ARBITER_BENCH_MPI)
  MPI_Finalize();
#endif
  return 0;
}
