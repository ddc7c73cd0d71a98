// arbiter bench: measure every fused backend and algorithm, and the unfused
// baseline, over a sweep of call shapes, on every rank of a job; rank 0
// writes the CSV that `arbiter tune` and `arbiter plot` read.
//
// Per dtype one communicator (workspaces are per dtype), with fused
// workspaces sized for the sweep's largest message. Per point and option:
// one call (checked against the fp64 reference up to kMaxCheckedBytes), an
// all-gather of its outcome so that every rank takes the same branch, then
// the timed trials and an all-gather of their times.
#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>

#include "arbiter/registry.h"
#include "arbiter/size.h"
#include "bench_csv.h"
#include "bench_timing.h"
#include "cli.h"

#ifndef ARBITER_VERSION
#define ARBITER_VERSION "unknown"
#endif

namespace arbiter::cli {
namespace {

using namespace arbiter::cli::bench;
using Clock = std::chrono::steady_clock;

constexpr const char* kBenchUsage =
    "usage: arbiter launch --nproc N -- arbiter bench -o results.csv [OPTIONS]\n"
    "       ARBITER_BOOTSTRAP_PORT=P torchrun --nproc-per-node N --no-python \\\n"
    "           arbiter bench -o results.csv [OPTIONS]\n"
    "\n"
    "Runs on every rank of a job (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT as\n"
    "torchrun sets them; torchrun's store holds MASTER_PORT, so give the ranks another port\n"
    "in ARBITER_BOOTSTRAP_PORT. Under mpirun or srun, OMPI_COMM_WORLD_*, PMI_* or SLURM_*\n"
    "stand in for the first three; export MASTER_ADDR and MASTER_PORT.) Ranks use the GPU\n"
    "LOCAL_RANK when there is one (--device), else they are CPU ranks (shm).\n"
    "\n"
    "Measures, at every point of the sweep (dtype x pattern x hidden x tokens), every fused\n"
    "backend and algorithm of the tables' preference lists and the unfused baseline (the\n"
    "fallback, native), bypassing the policy. Each first call is checked against the fp64\n"
    "reference up to 1 MiB per rank. CPU ranks time `iterations` calls with the wall clock;\n"
    "GPU ranks capture them in a CUDA graph timed with events. Every trial starts after a\n"
    "barrier; the latency is the median over trials of the slowest rank's time per call.\n"
    "With --residual-replicated every call of a residual pattern carries\n"
    "ARBITER_RUN_RESIDUAL_REPLICATED (every rank passes the same residual_in, as under tensor\n"
    "parallelism); the CSV's residual column says which was measured. With --registered every\n"
    "option is measured again with the call's input and outputs in registered memory\n"
    "(Communicator::alloc_registered: the zero-copy path); the buffers column says which.\n"
    "\n"
    "Rank 0 writes the CSV (`arbiter tune` and `arbiter plot` read it) to -o FILE, else to\n"
    "stdout (under `arbiter launch`, stdout lines carry a rank prefix: use -o). Options\n"
    "that cannot take a point (not allowed by ARBITER_BACKENDS, unavailable, above a\n"
    "workspace, refused by the module) are rows with status skipped and the reason, so the\n"
    "same sweep always writes the same rows. Progress goes to stderr of rank 0.\n"
    "\n"
    "Exit 0: every row measured or skipped; 1: some row is an error (a failure, or a result\n"
    "that differs from the reference), or the job failed; 2: usage error.\n\n";

// Under mpirun or srun, RANK/WORLD_SIZE/LOCAL_RANK from the launcher's own
// variables (only when RANK is not set at all).
void adopt_launcher_environment() {
  if (std::getenv("RANK")) return;
  const char* const sets[][3] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}};
  for (const auto& names : sets) {
    const char* rank = std::getenv(names[0]);
    const char* size = std::getenv(names[1]);
    if (!rank || !size) continue;
    const char* local = std::getenv(names[2]);
    setenv("RANK", rank, 0);
    setenv("WORLD_SIZE", size, 0);
    setenv("LOCAL_RANK", local ? local : "0", 0);
    return;
  }
}

// True on every rank when `ok` holds on every rank.
bool all_agree(Bootstrap& boot, bool ok, std::chrono::milliseconds timeout) {
  const std::int32_t mine = ok ? 1 : 0;
  std::vector<std::int32_t> all(static_cast<std::size_t>(boot.world_size()));
  const BootstrapStatus s = boot.allgather(&mine, all.data(), sizeof mine, timeout);
  if (!s.ok()) throw std::runtime_error("the ranks could not agree: " + s.message);
  for (std::int32_t v : all) ok = ok && v == 1;
  return ok;
}

template <class T>
std::vector<T> gather(Bootstrap& boot, const T& mine, std::chrono::milliseconds timeout,
                      const char* what) {
  std::vector<T> all(static_cast<std::size_t>(boot.world_size()));
  const BootstrapStatus s = boot.allgather(&mine, all.data(), sizeof(T), timeout);
  if (!s.ok()) throw std::runtime_error(std::string("exchanging ") + what + ": " + s.message);
  return all;
}

std::uint32_t count_hosts(Bootstrap& boot, std::chrono::milliseconds timeout) {
  struct Name {
    char text[256];
  } mine{};
  ::gethostname(mine.text, sizeof mine.text - 1);
  const std::vector<Name> all = gather(boot, mine, timeout, "host names");
  std::vector<std::string> hosts;
  for (const Name& n : all) {
    const std::string h(n.text, strnlen(n.text, sizeof n.text));
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  return static_cast<std::uint32_t>(hosts.size());
}

// The NCCL the nccl module loaded, if it did (never loads one itself).
std::string nccl_version() {
  void* handle = ::dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD);
  if (!handle) return "not loaded";
  using GetVersion = int (*)(int*);
  auto get = reinterpret_cast<GetVersion>(::dlsym(handle, "ncclGetVersion"));
  int version = 0;
  std::string text = "unknown";
  if (get && get(&version) == 0) {
    text = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
           std::to_string(version % 100);
  }
  ::dlclose(handle);
  return text;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string command_line(const Args& args) {
  std::string text = "arbiter bench";
  for (const std::string& a : args) {
    const bool plain = !a.empty() && a.find_first_of(" \t'\"\\$`") == std::string::npos;
    text += " " + (plain ? a : "'" + a + "'");
  }
  return text;
}

std::string us_text(double us) {
  char text[32];
  std::snprintf(text, sizeof text, us < 100 ? "%.1f us" : "%.0f us", us);
  return text;
}

std::string point_text(const Point& p) {
  return std::string(dtype_name(p.dtype)) + " " + std::string(pattern_name(p.pattern)) +
         " hidden " + std::to_string(p.hidden) + " x " + std::to_string(p.tokens) + " tokens (" +
         format_size(p.bytes) + (p.residual_replicated ? ", residual replicated" : "") + ")";
}

// Rank 0's progress on stderr: a bar on a terminal (or with --progress),
// otherwise one line per point.
class Progress {
 public:
  Progress(bool enabled, bool bar, std::size_t total)
      : enabled_(enabled), bar_(bar), total_(total) {}

  void step(const Point& p, const Option& o) {
    if (!enabled_ || !bar_) return;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * done_ / std::max<std::size_t>(total_, 1));
    std::string line = "\r[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "] " +
                       std::to_string(done_) + "/" + std::to_string(total_) + " " + point_text(p) +
                       ": " + o.label();
    if (line.size() > 110) line.resize(110);
    std::cerr << line << "\033[K" << std::flush;
  }
  void done(const Point& p, const std::vector<Row>& rows) {
    done_ += rows.size();
    if (!enabled_ || bar_) return;
    std::string line = "bench: [" + std::to_string(done_) + "/" + std::to_string(total_) + "] " +
                       point_text(p) + ":";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      line += (i ? ", " : " ") + r.option.label() + " " +
              (r.status == Row::Status::kOk        ? us_text(r.latency_us)
               : r.status == Row::Status::kSkipped ? std::string("skipped")
                                                   : std::string("ERROR"));
    }
    std::cerr << line << std::endl;
  }
  void finish() {
    if (enabled_ && bar_) std::cerr << "\r\033[K" << std::flush;
  }

 private:
  bool enabled_, bar_;
  std::size_t total_, done_ = 0;
};

// The outcome of a point's first call on one rank, all-gathered.
struct Verdict {
  std::int32_t status = ARBITER_OK;
  std::int32_t wrong = 0;  // ran, but differs from the reference
  char message[480] = {};
};

class Bench {
 public:
  Bench(Bootstrap& boot, Runner& runner, const Settings& settings)
      : boot_(boot), runner_(runner), settings_(settings) {
    timing_ = {*settings.warmup, *settings.trials, *settings.iterations};
  }

  // One option at one point: every rank returns the same row (rank 0's
  // words). Sets `fatal` when the job can no longer continue (a collective
  // failed, or ranks disagreed).
  // `no_registered`: why the registered options cannot run ("" when they can).
  Row measure(Communicator& comm, const Point& p, const Option& o,
              std::optional<Reference>& reference, const std::string& no_registered, bool& fatal) {
    Row row;
    row.point = p;
    row.option = o;
    row.trials = timing_.trials;
    row.iterations = timing_.iterations;
    if (o.registered && !no_registered.empty()) {
      row.status = Row::Status::kSkipped;
      row.reason = "no registered buffers: " + no_registered;
      return row;
    }
    const Buffers& buffers = o.registered ? runner_.registered_buffers() : runner_.buffers();
    const arbiter_allreduce_args args = make_args(p, buffers);
    const bool checked = p.bytes <= kMaxCheckedBytes;
    if (checked) runner_.poison(p, buffers);
    const Communicator::Result r = runner_.call(comm, o, args);
    Verdict mine;
    mine.status = r.status;
    std::string text = r.error;
    if (r.status == ARBITER_OK && checked) {
      if (!reference) reference.emplace(p, boot_.world_size());
      text = reference->check(runner_.read_outputs(p, buffers));
      mine.wrong = text.empty() ? 0 : 1;
    }
    std::snprintf(mine.message, sizeof mine.message, "%s", text.c_str());
    const std::vector<Verdict> all = gather(boot_, mine, settings_.timeout, "call outcomes");

    bool refused = true, ran = true;
    int failed = -1, wrong = -1;
    for (std::size_t k = 0; k < all.size(); ++k) {
      refused = refused && all[k].status == ARBITER_UNSUPPORTED;
      ran = ran && all[k].status == ARBITER_OK;
      if (all[k].status != ARBITER_OK && failed < 0) failed = static_cast<int>(k);
      if (all[k].wrong && wrong < 0) wrong = static_cast<int>(k);
    }
    if (refused) {
      row.status = Row::Status::kSkipped;
      row.reason = all[0].message;
      return row;
    }
    if (!ran) {  // a failure, or some ranks ran while others refused
      const Verdict& v = all[static_cast<std::size_t>(failed)];
      row.status = Row::Status::kError;
      row.reason = "rank " + std::to_string(failed) + ": status " + std::to_string(v.status) +
                   ": " + v.message;
      fatal = true;
      return row;
    }
    if (wrong >= 0) {
      row.status = Row::Status::kError;
      row.reason = "rank " + std::to_string(wrong) +
                   " differs from the reference: " + all[static_cast<std::size_t>(wrong)].message;
      return row;
    }

    const Timed timed = runner_.time(comm, boot_, o, args, timing_, settings_.timeout);
    struct Outcome {
      std::int32_t status;
      char message[480];
    } outcome{timed.status, {}};
    std::snprintf(outcome.message, sizeof outcome.message, "%s", timed.error.c_str());
    const std::vector<Outcome> outcomes =
        gather(boot_, outcome, settings_.timeout, "trial outcomes");
    for (std::size_t k = 0; k < outcomes.size(); ++k) {
      if (outcomes[k].status != ARBITER_OK) {
        row.status = Row::Status::kError;
        row.reason = "rank " + std::to_string(k) + ": timing failed: " + outcomes[k].message;
        fatal = true;
        return row;
      }
    }
    // Every rank holds `trials` values now: the slowest rank defines each trial.
    std::vector<double> all_us(timed.per_call_us.size() * all.size());
    const BootstrapStatus s =
        boot_.allgather(timed.per_call_us.data(), all_us.data(),
                        timed.per_call_us.size() * sizeof(double), settings_.timeout);
    if (!s.ok()) throw std::runtime_error("exchanging trial times: " + s.message);
    std::vector<double> slowest(timed.per_call_us.size(), 0.0);
    for (std::size_t k = 0; k < all.size(); ++k) {
      for (std::size_t t = 0; t < slowest.size(); ++t) {
        slowest[t] = std::max(slowest[t], all_us[k * slowest.size() + t]);
      }
    }
    row.latency_us = percentile(slowest, 0.5);
    row.p10_us = percentile(slowest, 0.1);
    row.p90_us = percentile(slowest, 0.9);
    return row;
  }

 private:
  Bootstrap& boot_;
  Runner& runner_;
  const Settings& settings_;
  Timing timing_;
};

}  // namespace

int cmd_bench(const Args& args) {
  po::options_description desc("arbiter bench options");
  add_config_option(desc);
  add_options(desc);
  desc.add_options()("help,h", "this help");
  const po::variables_map vm = parse(args, desc);
  if (vm.count("help")) {
    std::cout << kBenchUsage << desc;
    return kExitOk;
  }
  Settings settings = read_settings(vm);

  adopt_launcher_environment();
  Bootstrap boot = Bootstrap::from_environment(settings.timeout);
  const bool leader = boot.rank() == 0;
  const auto timeout = settings.timeout;
  if (boot.world_size() < 2) {
    throw UsageError{"an all-reduce needs at least 2 ranks; start " +
                     std::string("`arbiter launch --nproc N -- arbiter bench ...` (or torchrun)")};
  }

  // The device: the GPU LOCAL_RANK when there is one (and --device allows).
  std::unique_ptr<Runner> runner;
  std::string no_gpu = "this arbiter was built without CUDA";
  if (settings.device != DeviceChoice::kCpu) {
#ifdef ARBITER_BENCH_CUDA
    runner = make_cuda_runner(boot.local_rank(), no_gpu);
#endif
  }
  const bool gpu_missing = settings.device == DeviceChoice::kGpu && !runner;
  if (!runner) runner = make_host_runner();
  const DeviceKind kind = runner->info().kind;
  {
    // Every rank must be a CPU rank, or every rank a GPU rank.
    const std::int32_t mine = gpu_missing ? -1 : static_cast<std::int32_t>(kind);
    const std::vector<std::int32_t> kinds = gather(boot, mine, timeout, "device kinds");
    auto text = [](std::int32_t k) {
      return k < 0 ? std::string("no GPU")
                   : std::string(device_kind_name(static_cast<DeviceKind>(k)));
    };
    for (std::size_t k = 1; k < kinds.size(); ++k) {
      if (kinds[k] != kinds[0]) {
        throw std::runtime_error("ranks differ: rank 0 has " + text(kinds[0]) + ", rank " +
                                 std::to_string(k) + " " + text(kinds[k]) +
                                 " (give --device cpu or --device gpu)");
      }
    }
    if (gpu_missing) throw std::runtime_error("--device gpu: " + no_gpu);
  }
  resolve(settings, kind);

  std::optional<Policy> policy = load_policy(vm);
  if (!all_agree(boot, policy.has_value(), timeout)) {
    if (leader) std::cerr << "arbiter bench: the tables do not load on every rank\n";
    return kExitFailed;
  }
  const std::uint32_t hosts = count_hosts(boot, timeout);
  RunContext context;
  context.capability = runner->info().capability;
  context.world_size = boot.world_size();
  context.nodes = settings.nodes.value_or(hosts);
  context.device = runner->info().name;
  if (context.nodes > static_cast<std::uint32_t>(boot.world_size())) {
    throw UsageError{"--nodes " + std::to_string(context.nodes) + " is more than the " +
                     std::to_string(boot.world_size()) + " ranks"};
  }

  DiscoverOptions discover = DiscoverOptions::from_environment();
  discover.probe = {static_cast<arbiter_device_kind>(kind), runner->info().device};
  const Registry registry = Registry::discover(discover);
  const std::vector<Point> points = make_sweep(settings);
  const std::vector<Option> options = options_for(policy->tables(), kind, settings.registered);

  // Rank 0's output; every rank learns whether it opened.
  std::ofstream file;
  if (leader && !settings.output.empty()) {
    errno = 0;
    file.open(settings.output, std::ios::binary | std::ios::trunc);
    if (!file) std::cerr << write_error(settings.output, "results") << "\n";
  }
  if (!all_agree(boot, settings.output.empty() || !leader || file.is_open(), timeout)) {
    return kExitUsage;
  }
  std::ostream& out = settings.output.empty() ? std::cout : file;
  CsvWriter csv(out);
  if (leader) {
    std::string available;
    for (const ModuleInfo& m : registry.modules()) {
      if (m.available) available += (available.empty() ? "" : ", ") + m.name;
    }
    const char* backends_env = std::getenv("ARBITER_BACKENDS");
    csv.provenance({
        {"tool", "arbiter bench"},
        {"device", runner->info().name},
        {"driver", runner->info().driver},
        {"nccl", kind == DeviceKind::kGpu ? nccl_version() : "not used (CPU ranks)"},
        {"hosts", std::to_string(hosts)},
        {"capability", capability_name(context.capability)},
        {"world_size", std::to_string(context.world_size)},
        {"nodes", std::to_string(context.nodes)},
        {"modules_available", available.empty() ? "none" : available},
        {"arbiter_backends", backends_env ? backends_env : "(unset)"},
        {"residual", settings.residual_replicated
                         ? "replicated: the residual patterns' calls carry "
                           "ARBITER_RUN_RESIDUAL_REPLICATED (every rank passes the same "
                           "residual_in)"
                         : "distinct: no call carries ARBITER_RUN_RESIDUAL_REPLICATED"},
        {"buffers", settings.registered
                        ? "copied and registered: every option measured with ordinary buffers, "
                          "then with the input and outputs in registered memory"
                        : "copied: ordinary buffers (the module copies the input in)"},
        {"tables", policy->fingerprint_hex()},
        {"timing", std::string(kind == DeviceKind::kGpu
                                   ? "CUDA graph of `iterations` calls per trial, CUDA events"
                                   : "wall clock around `iterations` calls per trial") +
                       ", barrier before each trial; warmup " + std::to_string(*settings.warmup) +
                       ", trials " + std::to_string(*settings.trials) + ", iterations " +
                       std::to_string(*settings.iterations)},
        {"latency", "median over trials of the slowest rank's time per call; p10/p90 likewise"},
        {"arbiter_version", ARBITER_VERSION},
        {"date", utc_now()},
        {"command", command_line(args)},
    });
    csv.header();
  }

  const bool tty = ::isatty(2) == 1;
  Progress progress(leader, tty || settings.progress, points.size() * options.size());
  Bench bench(boot, *runner, settings);
  const Clock::time_point started = Clock::now();
  std::size_t counts[3] = {0, 0, 0};
  bool fatal = false;
  for (Dtype dtype : settings.dtypes) {
    std::vector<Point> mine;
    for (const Point& p : points) {
      if (p.dtype == dtype) mine.push_back(p);
    }
    if (mine.empty()) continue;
    CommunicatorOptions co;
    co.capability = context.capability;
    co.nodes = context.nodes;
    co.nvlink_domain = context.nodes == 1 || settings.nvlink_domain;
    co.multicast = settings.multicast;
    co.device = runner->info().device;
    co.dtype = dtype;
    co.pattern_mask = 0;
    std::uint64_t largest = 0;
    for (const Point& p : mine) {
      co.max_tokens = std::max(co.max_tokens, p.tokens);
      co.hidden = std::max(co.hidden, p.hidden);
      co.pattern_mask |= 1u << static_cast<int>(p.pattern);
      largest = std::max(largest, p.bytes);
    }
    co.fused_workspace_bytes = std::min(largest, kMaxWorkspaceBytes);
    co.timeout = timeout;
    runner->prepare(mine, boot.rank());
    Communicator comm(*boot.oob(), *policy, registry, co);
    std::string no_registered;
    if (settings.registered) {
      // Collective; a rank whose allocation failed makes every rank skip the
      // registered options (its reason in rank 0's rows when it is rank 0).
      no_registered = runner->prepare_registered(comm);
      if (!all_agree(boot, no_registered.empty(), timeout)) {
        runner->release_registered(comm);
        if (no_registered.empty()) no_registered = "the registered allocation failed on a peer";
      }
    }
    for (const Point& p : mine) {
      std::optional<Reference> reference;
      std::vector<Row> rows;
      for (const Option& o : options) {
        progress.step(p, o);
        rows.push_back(bench.measure(comm, p, o, reference, no_registered, fatal));
        if (leader) csv.row(context, rows.back());
        ++counts[static_cast<int>(rows.back().status)];
        if (fatal) break;
      }
      progress.done(p, rows);
      if (fatal) break;
    }
    runner->release_registered(comm);
    if (fatal) break;
  }
  progress.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  if (leader) {
    if (fatal) csv.comment("stopped: the job failed (see the last row); later points not measured");
    if (file.is_open()) {
      errno = 0;
      file.close();
      if (!file) {
        std::cerr << write_error(settings.output, "results") << "\n";
        return kExitFailed;
      }
    }
    char summary[256];
    std::snprintf(summary, sizeof summary,
                  "arbiter bench: %zu rows (%zu measured, %zu skipped, %zu errors) in %.1f s%s%s\n",
                  counts[0] + counts[1] + counts[2], counts[0], counts[1], counts[2], seconds,
                  settings.output.empty() ? "" : " -> ", settings.output.c_str());
    std::cerr << summary;
  }
  // A launcher stops the other ranks when one exits non-zero: rank 0 has
  // closed its file before anyone leaves. (After a failed collective the
  // group is unusable: no barrier then.)
  if (!fatal) (void)boot.barrier(timeout);
  return counts[2] == 0 && !fatal ? kExitOk : kExitFailed;
}

}  // namespace arbiter::cli
