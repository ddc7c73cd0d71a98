// The sweep of arbiter-bench-fused; see bench_fused_runner.h.
#include "bench_fused_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "bench_fused_kernels.h"
#include "epilogue_launch.h"

namespace arbiter::bench {
namespace {

constexpr float kEps = 1e-6f;

const char* algorithm_key(arbiter_algorithm algorithm) {
  return algorithm == ARBITER_ALGORITHM_ONESHOT ? "oneshot" : "twoshot";
}

}  // namespace

void Bench::load_modules() {
  for (const std::string& name : o_.backends) {
    Module m;
    m.name = name;
    m.module = std::make_unique<test::BackendModule>(name);
    report_.comment("module " + name + ": " + m.module->path());
    if (m.module->api() == nullptr) {
      fail("the " + name + " module did not load: " + m.module->error() +
           "; its rows are left out");
    } else {
      const arbiter_probe_args probe{ARBITER_DEVICE_GPU, device_.ordinal};
      if (m.module->api()->probe(&probe, &m.caps) != ARBITER_OK) {
        fail(name + " probe: " + m.module->api()->last_error() + "; its rows are left out");
      } else {
        m.probed = true;
        char text[256];
        std::snprintf(text, sizeof text,
                      "module %s caps: capability %u, world sizes 0x%" PRIx64
                      ", dtypes 0x%x, patterns 0x%x, algorithms 0x%x, flags 0x%x",
                      name.c_str(), m.caps.capability, m.caps.world_size_mask, m.caps.dtype_mask,
                      m.caps.pattern_mask, m.caps.algorithm_mask, m.caps.flags);
        report_.comment(text);
      }
    }
    modules_.push_back(std::move(m));
  }
}

void Bench::run() {
  start_ = Clock::now();
  for (int ws : o_.world_sizes) {
    for (std::uint32_t hidden : o_.hiddens) {
      if (stopped_) return;
      run_shape(ws, hidden);
    }
  }
}

bool Bench::fused_supported(const Module& m, int ws, std::string* why) const {
  if (!m.probed) {
    *why = "module unavailable";
    return false;
  }
  if (ws >= 64 || ((m.caps.world_size_mask >> ws) & 1u) == 0) {
    *why = "world size " + std::to_string(ws) + " not in the module's caps";
    return false;
  }
  if (((m.caps.pattern_mask >> ARBITER_PATTERN_RESIDUAL_RMSNORM) & 1u) == 0 ||
      ((m.caps.dtype_mask >> ARBITER_DTYPE_BF16) & 1u) == 0) {
    *why = "residual_rmsnorm in bf16 not in the module's caps";
    return false;
  }
  return true;
}

void Bench::fail(const std::string& text) {
  failures_.push_back(text);
  report_.note("FAILED: " + text);
}

void Bench::run_shape(int ws, std::uint32_t hidden) {
  const std::vector<std::uint32_t> tokens = token_counts(o_, hidden);
  if (tokens.empty()) return;
  const std::string shape = "ws " + std::to_string(ws) + " hidden " + std::to_string(hidden);
  std::fprintf(stderr, "ws %d, hidden %u: %zu sizes\n", ws, hidden, tokens.size());
  Timer timer(ws, o_.hang_timeout_s);

  // Buffers for the largest size; halve until they fit.
  std::uint32_t capacity = tokens.back();
  while (!buffers_.allocate(ws, hidden, capacity)) {
    if (capacity == tokens.front()) {
      fail(shape + ": no memory for the buffers of even " + std::to_string(capacity) + " tokens");
      return;
    }
    report_.note(shape + ": buffers of " + std::to_string(capacity) +
                 " tokens do not fit; trying half");
    capacity = std::max(tokens.front(), capacity / 2);
  }
  watchdog_.arm(shape + ": filling buffers and creating workspaces", 4 * o_.hang_timeout_s);
  buffers_.fill(hidden, capacity);

  std::vector<Group> groups;
  for (const Module& m : modules_) {
    std::string why;
    if (!fused_supported(m, ws, &why)) {
      report_.note(shape + ": " + m.name + " skipped: " + why);
      continue;
    }
    Group g;
    g.module = &m;
    g.group = create_group(m, ws, hidden, capacity);
    if (g.group == nullptr) continue;
    if (m.module->memory() != nullptr) register_inputs(g, hidden, capacity);
    groups.push_back(std::move(g));
  }

  for (std::uint32_t t : tokens) {
    if (o_.budget_s > 0 &&
        std::chrono::duration<double>(Clock::now() - start_).count() > o_.budget_s) {
      report_.note("stopped early: the --budget of " + std::to_string(o_.budget_s) +
                   " s was reached before " + shape + " tokens " + std::to_string(t));
      stopped_ = true;
      break;
    }
    if (t > capacity) {
      report_.note(shape + " tokens " + std::to_string(t) + ": skipped, above the " +
                   std::to_string(capacity) + " tokens that fit in memory");
      continue;
    }
    watchdog_.arm(shape + " tokens " + std::to_string(t),
                  (2 + 2 * static_cast<double>(groups.size())) * o_.hang_timeout_s + o_.trials);
    run_point(timer, groups, ws, hidden, t);
  }
  watchdog_.arm(shape + ": destroying workspaces", 2 * o_.hang_timeout_s);
  groups.clear();  // collective destroy, before the buffers go
  buffers_.clear();
  watchdog_.disarm();
}

// Each rank's input copied into memory the module registers: the
// "<backend>-reg" rows. A failure is noted and leaves the rows out.
void Bench::register_inputs(Group& g, std::uint32_t hidden, std::uint32_t capacity) {
  const std::string shape = g.module->name + " ws " + std::to_string(g.group->size()) + " hidden " +
                            std::to_string(hidden);
  const std::uint64_t bytes = std::uint64_t{capacity} * hidden * kElementBytes;
  std::vector<void*> parts;
  std::string error;
  const std::int32_t status =
      g.group->alloc_registered(*g.module->module->memory(), bytes, &parts, &error);
  if (status != ARBITER_OK) {
    report_.note(shape + ": registered rows left out: alloc returned " + std::to_string(status) +
                 ": " + error);
    return;
  }
  for (int r = 0; r < g.group->size(); ++r) {
    check(cudaMemcpy(parts[r], buffers_.rank(r).input.get(), bytes, cudaMemcpyDeviceToDevice),
          "copying the input into registered memory");
  }
  // The copies may return before they land, on a stream the ranks' streams
  // do not wait for.
  check(cudaDeviceSynchronize(), "copying the input into registered memory");
  g.registered = parts;  // freed with the workspaces
}

std::unique_ptr<test::LoopbackGroup> Bench::create_group(const Module& m, int ws,
                                                         std::uint32_t hidden,
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
  const std::string shape =
      m.name + " ws " + std::to_string(ws) + " hidden " + std::to_string(hidden);
  const std::uint64_t row = std::uint64_t{hidden} * kElementBytes;
  const arbiter_backend_v1_t& api = *m.module->api();
  for (;;) {
    auto group = std::make_unique<test::LoopbackGroup>(api, spec);
    if (group->ok()) {
      std::string line = "workspace " + shape + ": max_tokens " + std::to_string(spec.max_tokens) +
                         ", max_message_bytes " + std::to_string(spec.max_message_bytes);
      if (api.max_message_bytes != nullptr) {
        line +=
            "; per call: one-shot " +
            std::to_string(api.max_message_bytes(group->workspace(0), ARBITER_ALGORITHM_ONESHOT)) +
            " bytes, two-shot " +
            std::to_string(api.max_message_bytes(group->workspace(0), ARBITER_ALGORITHM_TWOSHOT)) +
            " bytes";
      }
      report_.comment(line);
      return group;
    }
    const std::string error = group->error();
    if (group->disagreed()) {
      // Some ranks hold a workspace the others do not: destroying it is
      // collective and would wait forever; leave it.
      group.release();
      fail(shape + ": workspace creation: " + error);
      return nullptr;
    }
    group.reset();
    if (spec.max_message_bytes / 2 < row) {
      fail(shape + ": no workspace could be created: " + error);
      return nullptr;
    }
    report_.note(shape + ": workspace of " + format_bytes(spec.max_message_bytes) + " failed (" +
                 error + "); trying half");
    spec.max_message_bytes /= 2;
    spec.max_tokens = static_cast<std::uint32_t>(std::max<std::uint64_t>(
        1, std::min<std::uint64_t>(spec.max_tokens, spec.max_message_bytes / row)));
  }
}

void Bench::run_point(Timer& timer, std::vector<Group>& groups, int ws, std::uint32_t hidden,
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
    SumArgs a;
    for (int i = 0; i < ws; ++i) a.inputs[i] = buffers_.rank(i).input.get();
    a.ranks = ws;
    a.out = buffers_.rank(r).sum.get();
    a.count = std::size_t{tokens} * hidden;
    a.max_blocks = 4 * device_.sm_count;
    if (const cudaError_t e = sum_bf16(a, s); e != cudaSuccess) return e;
    arbiter::nccl::EpilogueParams e;
    e.dtype = ARBITER_DTYPE_BF16;
    e.tokens = tokens;
    e.hidden = hidden;
    e.sum = buffers_.rank(r).sum.get();
    e.residual_in = buffers_.rank(r).residual_in.get();
    e.residual_out = buffers_.rank(r).ref_residual_out.get();
    e.gamma = buffers_.gamma();
    e.eps = kEps;
    e.norm_out = buffers_.rank(r).ref_norm_out.get();
    return arbiter::nccl::launch_residual_rmsnorm(e, s);
  };
  const Enqueue copy = [&](int r, cudaStream_t s) {
    return cudaMemcpyAsync(buffers_.rank(r).sum.get(), buffers_.rank(r).input.get(), p.bytes,
                           cudaMemcpyDeviceToDevice, s);
  };

  try {
    timer.run_once(baseline, where + " baseline");
    const Timing base = timer.measure(baseline, o_.trials, o_.graphs, where + " baseline");
    p.median_us["baseline"] = percentile(base.per_call_us, 0.5);
    report_.row(p, "baseline", "sum+norm", false, base, "-");

    const Timing c = timer.measure(copy, o_.trials, o_.graphs, where + " copy");
    p.median_us["copy"] = percentile(c.per_call_us, 0.5);
    // A reference, not an option to tune between.
    report_.copy_reference(p, c);
  } catch (const Failure& e) {
    fail(where + ": " + e.what());
    throw;  // a failed baseline or copy is a CUDA error: nothing after it is trustworthy
  }

  for (const Group& g : groups) {
    for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
      std::string why;
      if (admits(g, algorithm, p, &why)) {
        run_fused(timer, g, p, algorithm, where, false);
      } else if (!why.empty()) {
        report_.comment(where + " " + g.module->name + " " + algorithm_key(algorithm) +
                        ": not run: " + why);
      }
      // Registered: no per-call capacity (two-shot is sliced by the module).
      const bool too_few_tokens = g.module->name == "trtllm" &&
                                  algorithm == ARBITER_ALGORITHM_TWOSHOT &&
                                  p.tokens < static_cast<std::uint32_t>(p.ws);
      if (!g.registered.empty() && !too_few_tokens) {
        run_fused(timer, g, p, algorithm, where, true);
      }
    }
  }
  points_.push_back(p);
  std::fprintf(stderr, "  %-34s", (where + " (" + format_bytes(p.bytes) + ")").c_str());
  const char* separator = "";
  for (const auto& [key, us] : p.median_us) {
    std::fprintf(stderr, "%s %s %.1f us", separator, key.c_str(), us);
    separator = ",";
  }
  std::fprintf(stderr, "\n");
}

// Whether `g`'s workspace takes `p` with `algorithm`; otherwise why not
// ("" for what is simply not measured: trtllm two-shot below ws tokens).
bool Bench::admits(const Group& g, arbiter_algorithm algorithm, const Point& p,
                   std::string* why) const {
  if (g.module->name == "trtllm" && algorithm == ARBITER_ALGORITHM_TWOSHOT &&
      p.tokens < static_cast<std::uint32_t>(p.ws)) {
    return false;  // trtllm two-shot needs tokens >= world size
  }
  const arbiter_backend_v1_t& api = *g.module->module->api();
  if (api.max_message_bytes == nullptr) return true;  // run() says
  const std::uint64_t capacity = api.max_message_bytes(g.group->workspace(0), algorithm);
  if (p.bytes <= capacity) return true;
  *why = format_bytes(p.bytes) + " is above the workspace's " + algorithm_key(algorithm) +
         " capacity of " + format_bytes(capacity) + " per call";
  return false;
}

void Bench::run_fused(Timer& timer, const Group& g, Point& p, arbiter_algorithm algorithm,
                      const std::string& where, bool registered) {
  const std::string& backend = g.module->name;
  // The summary's column: "<backend>-reg" for the registered rows.
  const std::string column = backend + (registered ? "-reg" : "");
  const arbiter_backend_memory_v2_t* memory = g.module->module->memory();
  const char* name = algorithm_key(algorithm);
  const std::string what = where + " " + column + " " + name;
  const arbiter_backend_v1_t& api = *g.module->module->api();
  test::LoopbackGroup& group = *g.group;
  std::vector<arbiter_allreduce_args> args(p.ws);
  for (int r = 0; r < p.ws; ++r) {
    arbiter_allreduce_args& a = args[r];
    a = arbiter_allreduce_args{};
    a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
    a.dtype = ARBITER_DTYPE_BF16;
    a.algorithm = algorithm;
    a.tokens = p.tokens;
    a.hidden = p.hidden;
    a.input = registered ? g.registered[r] : buffers_.rank(r).input.get();
    a.residual_in = buffers_.rank(r).residual_in.get();
    a.residual_out = buffers_.rank(r).residual_out.get();
    a.gamma = buffers_.gamma();
    a.eps = kEps;
    a.norm_out = buffers_.rank(r).norm_out.get();
  }
  // NaN bits in the outputs, so that a call that writes nothing (the
  // registered rows follow the copied ones into the same buffers) fails the
  // check.
  for (int r = 0; r < p.ws; ++r) {
    check(cudaMemset(args[r].residual_out, 0xFF, p.bytes), "clearing the outputs");
    check(cudaMemset(args[r].norm_out, 0xFF, p.bytes), "clearing the outputs");
  }
  check(cudaDeviceSynchronize(), "clearing the outputs");
  // First through LoopbackGroup::run(): it notices ranks that disagree.
  std::string error;
  const std::int32_t status = registered
                                  ? group.run_registered(*memory, args, &error, &timer.streams())
                                  : group.run(args, &error, &timer.streams());
  if (group.hung()) {
    fail(what + ": " + error + "; the enqueued kernels can never finish, so the run stops");
    std::fflush(nullptr);
    std::_Exit(2);
  }
  if (status == ARBITER_UNSUPPORTED) {
    report_.note(what + ": not run: " + error);
    return;
  }
  if (status != ARBITER_OK) {
    fail(what + ": run() returned " + std::to_string(status) + ": " + error);
    return;
  }
  std::string run_error;  // the first refusal, for the messages below
  const Enqueue op = [&](int r, cudaStream_t s) -> cudaError_t {
    const std::int32_t rc = registered ? memory->run_registered(group.workspace(r), &args[r], s)
                                       : api.run(group.workspace(r), &args[r], s);
    if (rc == ARBITER_OK) return cudaSuccess;
    if (run_error.empty())
      run_error = "run() on rank " + std::to_string(r) + ": " + api.last_error();
    return cudaErrorUnknown;
  };
  try {
    timer.wait_all(what);
    const std::string result = o_.check ? compare(p, what) : "-";
    const Timing t = timer.measure(op, o_.trials, o_.graphs, what);
    if (o_.graphs && !t.graphs) {
      report_.note(what + ": timed plain launches, graph capture failed" +
                   (run_error.empty() ? std::string() : " (" + run_error + ")"));
    }
    p.median_us[option_key(column, name)] = percentile(t.per_call_us, 0.5);
    report_.row(p, backend, name, true, t, result, registered ? "registered" : "copied");
  } catch (const Failure& e) {
    fail(what + ": " + e.what() + (run_error.empty() ? std::string() : " (" + run_error + ")"));
    throw;
  }
}

// Compares every rank's fused residual_out (bit for bit: the inputs make the
// sum exact) and norm_out (within 2^-7 relative: the sum of squares may be
// added in another order) with the baseline's.
std::string Bench::compare(const Point& p, const std::string& what) {
  const std::size_t count = std::size_t{p.tokens} * p.hidden;
  unsigned long long* counts = buffers_.counts();
  check(cudaMemset(counts, 0, 4 * sizeof(unsigned long long)), "cudaMemset");
  for (int r = 0; r < p.ws; ++r) {
    RankBuffers& b = buffers_.rank(r);
    check(compare_bf16(b.residual_out.get(), b.ref_residual_out.get(), count, 0.0f, 0.0f, counts,
                       nullptr),
          "compare");
    check(compare_bf16(b.norm_out.get(), b.ref_norm_out.get(), count, 1.0f / 128, 1e-30f,
                       counts + 2, nullptr),
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

}  // namespace arbiter::bench
