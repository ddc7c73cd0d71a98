// arbiter-bench-shm: the shm backend's fused all-reduce + residual + RMSNorm
// against, in the same run, the same job done as separate steps (the
// backend's unfused path: sum through the shared buffer, then residual add,
// then norm) and against memcpy bandwidth on the same machine.
//
// Run one process per rank:
//   arbiter launch --nproc 4 -- arbiter-bench-shm [--from 4KiB] [--to 64MiB]
//                                                 [--hidden 1024] [--trials 15]
// Rank 0 prints a CSV (documented columns below) and a summary table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "arbiter/bootstrap.h"
#include "arbiter/registry.h"
#include "arbiter/size.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::uint64_t from = 4 * arbiter::kKiB;
  std::uint64_t to = 64 * arbiter::kMiB;
  std::uint32_t hidden = 1024;
  int trials = 15;
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
    else
      die("unknown option " + a + " (--from, --to, --hidden, --trials)");
  }
  if (o.hidden == 0 || o.trials < 3 || o.from > o.to) die("bad options");
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

}  // namespace

int main(int argc, char** argv) {
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
  arbiter_workspace* ws = nullptr;
  if (shm->workspace_create(boot.oob(), &spec, &ws) != ARBITER_OK) {
    die(std::string("workspace_create: ") + shm->last_error());
  }

  const std::size_t max_elems = opt.to / 2;
  std::vector<std::uint16_t> input(max_elems), residual(max_elems), residual_out(max_elems),
      norm_out(max_elems), gamma(hidden, 0x3F80 /* 1.0 */), copy_dst(max_elems);
  for (std::size_t i = 0; i < max_elems; ++i) {
    input[i] = static_cast<std::uint16_t>(0x3C00 + (i * 7 + boot.rank()) % 256);  // ~1.0..1.5
    residual[i] = 0x3F00;                                                         // 0.5
  }

  struct Method {
    const char* name;
    arbiter_algorithm algorithm;
  };
  const Method methods[] = {{"fused_oneshot", ARBITER_ALGORITHM_ONESHOT},
                            {"fused_twoshot", ARBITER_ALGORITHM_TWOSHOT},
                            {"separate_steps", ARBITER_ALGORITHM_NATIVE}};
  if (boot.rank() == 0) {
    std::printf(
        "# arbiter-bench-shm: world_size=%d hidden=%u dtype=bf16 pattern=residual_rmsnorm "
        "trials=%d\n",
        boot.world_size(), hidden, opt.trials);
    std::printf("world_size,bytes,num_tokens,method,latency_us,effective_GBps,p90_us\n");
  }
  for (std::uint64_t bytes = opt.from; bytes <= opt.to; bytes *= 2) {
    const auto tokens = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, bytes / token_bytes));
    const std::uint64_t real_bytes = std::uint64_t{tokens} * token_bytes;
    for (const Method& m : methods) {
      arbiter_allreduce_args a{};
      a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
      a.dtype = ARBITER_DTYPE_BF16;
      a.algorithm = m.algorithm;
      a.tokens = tokens;
      a.hidden = hidden;
      a.input = input.data();
      a.residual_in = residual.data();
      a.residual_out = residual_out.data();
      a.gamma = gamma.data();
      a.eps = 1e-6f;
      a.norm_out = norm_out.data();
      std::vector<double> times;
      bool skipped = false;
      const int calls = calls_per_trial(real_bytes);
      for (int t = -2; t < opt.trials && !skipped; ++t) {  // two warm-up trials
        if (!boot.barrier(std::chrono::seconds(60)).ok()) die("barrier failed");
        const auto start = Clock::now();
        for (int c = 0; c < calls; ++c) {
          const std::int32_t status = shm->run(ws, &a, nullptr);
          if (status == ARBITER_UNSUPPORTED) {
            skipped = true;  // every rank gets the same answer for the same shape
            break;
          }
          if (status != ARBITER_OK) die(std::string(m.name) + ": " + shm->last_error());
        }
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
        if (t >= 0) times.push_back(us / calls);
      }
      if (skipped) {
        if (boot.rank() == 0) {
          std::printf("%d,%llu,%u,%s,skipped,\n", boot.world_size(),
                      static_cast<unsigned long long>(real_bytes), tokens, m.name);
        }
        continue;
      }
      const Summary us = summary_of_max(boot, times);
      if (boot.rank() == 0) {
        std::printf("%d,%llu,%u,%s,%.1f,%.3f,%.1f\n", boot.world_size(),
                    static_cast<unsigned long long>(real_bytes), tokens, m.name, us.median,
                    static_cast<double>(real_bytes) / us.median / 1e3, us.p90);
      }
    }
    // memcpy of the same bytes, all ranks at once, for the machine's bandwidth.
    std::vector<double> times;
    const int calls = calls_per_trial(real_bytes);
    for (int t = -2; t < opt.trials; ++t) {
      if (!boot.barrier(std::chrono::seconds(60)).ok()) die("barrier failed");
      const auto start = Clock::now();
      for (int c = 0; c < calls; ++c) {
        std::memcpy(copy_dst.data(), input.data(), real_bytes);
        asm volatile("" : : "r"(copy_dst.data()) : "memory");
      }
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (t >= 0) times.push_back(us / calls);
    }
    const Summary us = summary_of_max(boot, times);
    if (boot.rank() == 0) {
      std::printf("%d,%llu,%u,memcpy,%.1f,%.3f,%.1f\n", boot.world_size(),
                  static_cast<unsigned long long>(real_bytes), tokens, us.median,
                  static_cast<double>(real_bytes) / us.median / 1e3, us.p90);
      std::fflush(stdout);
    }
  }
  shm->workspace_destroy(ws);
  return 0;
}
