// The loopback GPU suite of a fused all-reduce module (trtllm, mnnvl): N
// virtual ranks on one GPU, one stream each, driven through the module's ABI
// as the host drives it and checked against the common CPU reference. A
// backend's test describes what differs (FusedSuite: shapes, what the
// workspace holds, what must be refused and why, what probe must say) and
// calls run_fused_suite() from main().
//
// For every world size and dtype, one workspace group runs every variant
// (support/fused_call.h) over the sweep's hidden sizes and token counts,
// one-shot and two-shot, and checks that
//  - outputs match the reference (FP8 and NVFP4 dequantised);
//  - every virtual rank gets the same bits, and one-shot the same bits as
//    two-shot (sums in fp32 in rank order on both);
//  - what the module cannot run is refused before launch with the reason,
//    and nothing hangs after it;
//  - the workspace reports its per-call capacity (max_message_bytes) and
//    refuses more;
//  - inputs that look like the Lamport sentinel (-0.0) or that flush-to-zero
//    would turn into it (negative subnormals) finish and sum correctly;
//  - in-place calls (outputs over input or residual_in, in_place_layouts.h)
//    give the bits of separate buffers, and a partial overlap is refused;
//  - 10,000 back-to-back calls and CUDA-graph replays (inputs changed
//    between replays) keep producing the right bits;
//  - a module with registered memory (ABI v2) gives, for an input in it,
//    the bits of the copied call, in place too, and the peers have read the
//    input when the call ends (registered_calls()).
// Every wait has a deadline: a hung kernel cannot be recovered, so the test
// names the case and exits.
//
// No Boost: this builds and runs where only CUDA is installed.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter_backend.h"
#include "device_buffers.h"
#include "fused_call.h"
#include "fused_inputs.h"
#include "fused_reference.h"
#include "gpu_check.h"
#include "graph_capture.h"
#include "in_place_layouts.h"
#include "loopback_group.h"
#include "module.h"
#include "parallel_for.h"

namespace arbiter::test {

struct Shape {
  std::uint32_t tokens = 0;
  std::uint32_t hidden = 0;
};

// One workspace group, as a suite's hooks see it.
struct GroupInfo {
  int world_size = 0;
  arbiter_dtype dtype = ARBITER_DTYPE_BF16;
  std::uint32_t capability = 0;
  std::uint32_t max_tokens = 0;  // the spec's
  std::uint32_t max_hidden = 0;
  std::uint64_t max_message_bytes = 0;  // the spec's: max_tokens x max_hidden x element size

  std::uint64_t element_size() const { return common::dtype_size(dtype); }
};

// A call the workspace cannot hold; run() must refuse it.
struct OversizedCall {
  arbiter_algorithm algorithm;
  Shape shape;
};

// What differs between the modules' suites.
struct FusedSuite {
  std::string backend;    // the module: libarbiter-<backend>.so
  std::string test_name;  // in the summary line
  std::vector<int> world_sizes;
  std::vector<arbiter_dtype> dtypes;
  std::vector<std::uint32_t> hiddens;       // the sweep: every hidden ...
  std::vector<std::uint32_t> token_counts;  // ... with every token count
  // Every group's workspace: max_tokens x max_hidden per call (the sweep's
  // largest shape); also the size of the test's buffers.
  std::uint32_t max_tokens = 0;
  std::uint32_t max_hidden = 0;
  std::vector<Variant> variants = kAllVariants;
  Shape back_to_back;  // residual_rmsnorm, back_to_back_calls calls
  Shape graph;         // residual_rmsnorm_fp8, captured and replayed graph_replays times
  Shape salted;        // every variant on -0.0 and subnormals
  // One-shot and two-shot agree on the sign of a zero sum too (a module that
  // sanitises -0.0 on both paths); otherwise tokens where every rank sends
  // -0.0 may differ between them in that sign only.
  bool zero_sign_exact = false;
  // The bytes per call max_message_bytes() must report for `algorithm`.
  std::function<std::uint64_t(const GroupInfo&, arbiter_algorithm)> capacity;
  // The fragment of the message run() must refuse `call` with ("" when only
  // ARBITER_UNSUPPORTED is known), or nothing when it must run.
  std::function<std::optional<std::string>(const GroupInfo&, const Call&)> refusal;
  // Calls above the workspace's capacity (each must be refused).
  std::function<std::vector<OversizedCall>(const GroupInfo&)> oversized;
  // What probe() on device 0 must say besides the device's capability,
  // fp16/bf16/fp32, one-shot and two-shot, and NVFP4 from capability 100 on.
  std::uint64_t world_size_mask = 0;
  std::uint32_t flags_set = 0;    // ARBITER_CAPS_* bits that must be set
  std::uint32_t flags_clear = 0;  // ... and that must not
  int back_to_back_calls = 10000;
  int graph_replays = 100;  // a multiple of kGraphInputSets

  int max_world_size() const {
    return world_sizes.empty() ? 0 : *std::max_element(world_sizes.begin(), world_sizes.end());
  }
  std::uint32_t side_tokens() const {
    return std::max({back_to_back.tokens, graph.tokens, salted.tokens});
  }
};

inline constexpr Variant kResidualRmsnorm{ARBITER_PATTERN_RESIDUAL_RMSNORM, true, false};
inline constexpr Variant kResidualRmsnormFp8{ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, true, false};

using std::chrono::milliseconds;
using std::chrono::seconds;

inline constexpr milliseconds kCallLimit{20000};
// The inputs change every graph_replays / kGraphInputSets replays.
inline constexpr int kGraphInputSets = 4;

struct RankBuffers {
  DeviceBuffer input;  // max_tokens x max_hidden: the sweep's inputs
  DeviceBuffer allreduce_out, residual_out, norm_out, quant_out, scale_out;
  DeviceBuffer side_input;     // side_tokens x max_hidden: back-to-back, graph, salted, in-place
  DeviceBuffer side_residual;  // side_tokens x max_hidden: the rank's own residual, in-place cases
};

struct SharedBuffers {  // read by every rank
  DeviceBuffer residual, gamma, fp8_scale, nvfp4_scale, side_residual;
};

// Device pointers to what one call reads.
struct DeviceInputs {
  std::vector<const void*> inputs;  // one per rank
  const void* residual = nullptr;
};

struct GroupStats {
  long calls = 0;    // execute(): run() on every rank, then checks
  long ran = 0;      // ... that ran and were checked
  long refused = 0;  // ... refused as expected
  long back_to_back = 0;
  long graph_replays = 0;
};

// One workspace group (world size x dtype) and the buffers of its ranks.
class GroupRunner {
 public:
  GroupRunner(const FusedSuite& suite, const arbiter_backend_v1_t& api,
              const arbiter_backend_memory_v2_t* memory, arbiter_dtype dtype, int world_size,
              std::uint32_t capability, const HostInputs& inputs,
              const std::vector<PinnedBuffer>& staging, Watchdog& watchdog)
      : suite_(suite),
        api_(api),
        memory_(memory),
        info_(make_info(suite, dtype, world_size, capability)),
        inputs_(inputs),
        staging_(staging),
        watchdog_(watchdog),
        group_(create_group()) {
    watchdog_.disarm();  // armed by create_group()
  }

  void run_all(std::size_t group_index) {
    const auto start = std::chrono::steady_clock::now();
    const long failures_before = failure_count();
    const std::string name =
        suite_.backend + " ws " + std::to_string(world_size()) + " " + dtype_name(dtype());
    if (!ARBITER_CHECK(group_.ok(), name,
                       "workspace_create: status " << group_.status() << ": " << group_.error())) {
      return;
    }
    if (!allocate(name)) return;
    check_capacity(name);
    std::size_t shape = 0;
    for (std::uint32_t hidden : suite_.hiddens) {
      for (std::uint32_t tokens : suite_.token_counts) {
        sweep_shape(hidden, tokens, group_index + shape++);
      }
    }
    back_to_back();
    graph_replays();
    salted();
    in_place();
    oversized();
    if (memory_ != nullptr) {
      registered_calls();
      registered_above_capacity();
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "%s: %ld calls (%ld ran and checked, %ld refused as expected), %ld back-to-back calls, "
        "%ld graph replays, %ld failures, %.1f s\n",
        name.c_str(), stats_.calls, stats_.ran, stats_.refused, stats_.back_to_back,
        stats_.graph_replays, failure_count() - failures_before, elapsed);
    std::fflush(stdout);
  }

 private:
  static GroupInfo make_info(const FusedSuite& suite, arbiter_dtype dtype, int world_size,
                             std::uint32_t capability) {
    GroupInfo g;
    g.world_size = world_size;
    g.dtype = dtype;
    g.capability = capability;
    g.max_tokens = suite.max_tokens;
    g.max_hidden = suite.max_hidden;
    g.max_message_bytes =
        std::uint64_t{suite.max_tokens} * suite.max_hidden * common::dtype_size(dtype);
    return g;
  }

  int world_size() const { return info_.world_size; }
  arbiter_dtype dtype() const { return info_.dtype; }

  LoopbackGroup create_group() {
    arbiter_workspace_spec spec{};
    spec.world_size = world_size();
    spec.rank = 0;
    spec.device = 0;
    spec.nodes = 1;
    spec.max_tokens = info_.max_tokens;
    spec.hidden = info_.max_hidden;
    spec.dtype = dtype();
    spec.pattern_mask = 0xFu;
    spec.max_message_bytes = info_.max_message_bytes;
    spec.timeout_ms = 60000;
    watchdog_.arm(suite_.backend + " workspace_create, ws " + std::to_string(world_size()) + " " +
                      dtype_name(dtype()),
                  seconds(180));
    return LoopbackGroup(api_, spec);
  }

  bool allocate(const std::string& name) {
    const std::size_t elements = std::size_t{info_.max_tokens} * info_.max_hidden;
    const std::size_t bytes = elements * info_.element_size();
    const std::size_t side =
        std::size_t{suite_.side_tokens()} * info_.max_hidden * info_.element_size();
    const std::size_t scales = common::swizzled_128x4_bytes(
        info_.max_tokens, common::nvfp4_blocks_per_row(info_.max_hidden));
    bool ok = true;
    for (int r = 0; r < world_size(); ++r) {
      RankBuffers b;
      b.input = DeviceBuffer(bytes);
      b.allreduce_out = DeviceBuffer(bytes);
      b.residual_out = DeviceBuffer(bytes);
      b.norm_out = DeviceBuffer(bytes);
      b.quant_out = DeviceBuffer(elements);
      b.scale_out = DeviceBuffer(scales);
      b.side_input = DeviceBuffer(side);
      b.side_residual = DeviceBuffer(side);
      for (const DeviceBuffer* d : {&b.input, &b.allreduce_out, &b.residual_out, &b.norm_out,
                                    &b.quant_out, &b.scale_out, &b.side_input, &b.side_residual}) {
        ok = ok && d->get() != nullptr;
      }
      ranks_.push_back(std::move(b));
    }
    shared_.residual = DeviceBuffer(bytes);
    shared_.gamma = DeviceBuffer(info_.max_hidden * info_.element_size());
    shared_.fp8_scale = DeviceBuffer(sizeof(float));
    shared_.nvfp4_scale = DeviceBuffer(sizeof(float));
    shared_.side_residual = DeviceBuffer(side);
    for (const DeviceBuffer* d : {&shared_.residual, &shared_.gamma, &shared_.fp8_scale,
                                  &shared_.nvfp4_scale, &shared_.side_residual}) {
      ok = ok && d->get() != nullptr;
    }
    if (!ARBITER_CHECK(ok, name, "cudaMalloc of the test's buffers failed")) return false;

    cudaError_t e = cudaSuccess;
    const auto upload = [&](void* to, const void* from, std::size_t n) {
      if (e == cudaSuccess) e = cudaMemcpy(to, from, n, cudaMemcpyHostToDevice);
    };
    for (int r = 0; r < world_size(); ++r) {
      upload(ranks_[r].input.get(), inputs_.ranks[r].data(), bytes);
    }
    upload(shared_.residual.get(), inputs_.residual.data(), bytes);
    upload(shared_.gamma.get(), inputs_.gamma.data(), inputs_.gamma.size());
    upload(shared_.fp8_scale.get(), &kFp8Scale, sizeof(float));
    upload(shared_.nvfp4_scale.get(), &kNvfp4GlobalScale, sizeof(float));
    // A pageable upload may return before its DMA lands, on a stream the
    // ranks' non-blocking streams do not wait for.
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return ARBITER_CHECK(e == cudaSuccess, name, "upload: " << cudaGetErrorString(e));
  }

  DeviceInputs sweep_inputs() const {
    DeviceInputs in;
    for (const RankBuffers& b : ranks_) in.inputs.push_back(b.input.get());
    in.residual = shared_.residual.get();
    return in;
  }

  DeviceInputs side_inputs() const {
    DeviceInputs in;
    for (const RankBuffers& b : ranks_) in.inputs.push_back(b.side_input.get());
    in.residual = shared_.side_residual.get();
    return in;
  }

  HostView sweep_view() const {
    HostView view;
    for (int r = 0; r < world_size(); ++r) view.inputs.push_back(inputs_.ranks[r].data());
    view.residual = inputs_.residual.data();
    view.gamma = inputs_.gamma.data();
    return view;
  }

  Call base_call() const {
    Call c;
    c.world_size = world_size();
    c.dtype = dtype();
    return c;
  }

  std::vector<cudaStream_t> streams() const {
    std::vector<cudaStream_t> s;
    for (int r = 0; r < world_size(); ++r) s.push_back(group_.stream(r));
    return s;
  }

  arbiter_allreduce_args args_for(const Call& c, int rank, const DeviceInputs& in) const {
    const RankBuffers& b = ranks_[rank];
    arbiter_allreduce_args a{};
    a.pattern = c.pattern();
    a.dtype = c.dtype;
    a.algorithm = c.algorithm;
    a.tokens = c.tokens;
    a.hidden = c.hidden;
    a.flags = (c.fp4() && c.variant.linear_scales ? ARBITER_RUN_NVFP4_LINEAR_SCALES : 0u) |
              (c.pdl ? ARBITER_RUN_PDL : 0u);
    a.input = in.inputs[rank];
    a.allreduce_out = c.writes_allreduce_out() ? b.allreduce_out.get() : nullptr;
    if (c.norm()) {
      a.residual_in = c.residual_in ? in.residual : nullptr;
      a.residual_out = c.writes_residual_out() ? b.residual_out.get() : nullptr;
      a.gamma = shared_.gamma.get();
      a.eps = kEps;
      a.weight_bias = c.weight_bias;
      a.norm_out = c.writes_norm_out() ? b.norm_out.get() : nullptr;
    }
    if (c.fp8() || c.fp4()) {
      a.quant_out = b.quant_out.get();
      a.scale =
          static_cast<const float*>(c.fp8() ? shared_.fp8_scale.get() : shared_.nvfp4_scale.get());
    }
    if (c.fp4()) a.scale_out = b.scale_out.get();
    return a;
  }

  std::vector<arbiter_allreduce_args> group_args(const Call& c, const DeviceInputs& in) const {
    std::vector<arbiter_allreduce_args> args;
    for (int r = 0; r < world_size(); ++r) args.push_back(args_for(c, r, in));
    return args;
  }

  // Waits for every rank's stream; a hang or a CUDA error (which leaves the
  // context unusable) ends the test.
  void wait_or_exit(const std::string& context, milliseconds limit) {
    std::string error;
    if (group_.wait(limit, &error)) return;
    fail_and_exit(context, error + (group_.hung() ? "" : " (the CUDA context is unusable)"));
  }

  // Ranks that disagree leave kernels that wait forever for their peers.
  void exit_if_hung(const std::string& context, const std::string& error) {
    if (group_.hung()) fail_and_exit(context, error + " (kernels left waiting for their peers)");
  }

  std::uint8_t* staging(int rank) const { return staging_[rank].get(); }

  // Runs `c` on every rank and waits. Returns rank 0's outputs after checking
  // that every other rank has the same bits; nothing when the call was
  // refused (expected or not).
  std::optional<HostOutputs> execute(const Call& c, const DeviceInputs& in) {
    const std::string name = c.name();
    const std::optional<std::string> refusal = suite_.refusal(info_, c);
    const std::vector<arbiter_allreduce_args> args = group_args(c, in);
    cudaError_t e = cudaSuccess;
    // Not for refused calls: an oversized one does not fit the buffers.
    for (int r = 0; r < world_size() && !refusal && e == cudaSuccess; ++r) {
      e = clear_outputs(args[r], c, group_.stream(r));
    }
    if (!ARBITER_CHECK(e == cudaSuccess, name, "cudaMemsetAsync: " << cudaGetErrorString(e))) {
      return std::nullopt;
    }
    watchdog_.arm(name, seconds(120));
    std::string error;
    const std::int32_t status = group_.run(args, &error);
    ++stats_.calls;
    exit_if_hung(name, error);
    if (refusal) {
      const bool refused =
          status == ARBITER_UNSUPPORTED && error.find(*refusal) != std::string::npos;
      ARBITER_CHECK(refused, name,
                    "expected ARBITER_UNSUPPORTED before launch"
                        << (refusal->empty() ? "" : " (\"" + *refusal + "...\")") << ", got status "
                        << status << (error.empty() ? "" : ": " + error));
      if (refused) ++stats_.refused;
    } else {
      ARBITER_CHECK(status == ARBITER_OK, name, "run: status " << status << ": " << error);
    }
    // Whatever was enqueued, even by mistake, must finish.
    if (status == ARBITER_OK) wait_or_exit(name, kCallLimit);
    watchdog_.disarm();
    if (status != ARBITER_OK || refusal) return std::nullopt;

    HostOutputs first = download(args[0], c, staging(0), name + " rank 0");
    compare_ranks(args, c, first, name);
    ++stats_.ran;
    return first;
  }

  // Checks that every rank but 0 has the bits of `want` (rank 0's), ranks in
  // parallel.
  void compare_ranks(const std::vector<arbiter_allreduce_args>& args, const Call& c,
                     const HostOutputs& want, const std::string& context) {
    parallel_for(static_cast<std::size_t>(world_size() - 1), [&](std::size_t k) {
      const int r = static_cast<int>(k) + 1;
      compare_device_outputs(args[r], c, want, staging(r),
                             context + ", rank " + std::to_string(r) + " vs rank 0");
    });
  }

  // Every variant, one-shot then two-shot, on the same inputs; the bits of
  // the two must agree. Returns the results to check against the reference.
  std::vector<Result> run_variants(Call c, const DeviceInputs& in, bool zero_sign_free,
                                   std::size_t rotation) {
    std::vector<Result> results;
    for (const Variant& v : suite_.variants) {
      const std::size_t k = rotation++;
      c.variant = v;
      if (c.norm()) {
        c.allreduce_out = k % 3 == 1;
        c.residual_out = k % 4 != 2;
        c.residual_in = k % 5 != 4;  // residual-free (ARBITER_CAPS_RESIDUAL_OPTIONAL)
      }
      c.pdl = k % 4 == 3;
      std::optional<Result> golden;
      for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
        c.algorithm = algorithm;
        std::optional<HostOutputs> out = execute(c, in);
        if (!out) continue;
        if (!golden) {
          golden = Result{c, std::move(*out), {}};
        } else {
          compare_outputs(*out, golden->out, c, zero_sign_free,
                          c.name() + " vs " + algorithm_name(golden->call.algorithm));
        }
      }
      if (!golden) continue;
      if (c.fp4()) golden->scales = linear_scales(golden->call, golden->out.scale_out.data());
      results.push_back(std::move(*golden));
    }
    return results;
  }

  void sweep_shape(std::uint32_t hidden, std::uint32_t tokens, std::size_t rotation) {
    Call c = base_call();
    c.hidden = hidden;
    c.tokens = tokens;
    c.weight_bias = rotation % 2 == 1 ? 1.0f : 0.0f;  // Gemma-style on every other shape
    // 9 per shape: the options rotate through every variant.
    check_results(run_variants(c, sweep_inputs(), false, rotation * 9), sweep_view());
  }

  // The workspace says what one call may take, and refuses more (oversized()).
  void check_capacity(const std::string& name) {
    if (!ARBITER_CHECK(api_.max_message_bytes != nullptr, name, "max_message_bytes is NULL")) {
      return;
    }
    const std::uint64_t want_one = suite_.capacity(info_, ARBITER_ALGORITHM_ONESHOT);
    const std::uint64_t want_two = suite_.capacity(info_, ARBITER_ALGORITHM_TWOSHOT);
    for (int r = 0; r < world_size(); ++r) {
      const arbiter_workspace* ws = group_.workspace(r);
      const std::uint64_t one = api_.max_message_bytes(ws, ARBITER_ALGORITHM_ONESHOT);
      const std::uint64_t two = api_.max_message_bytes(ws, ARBITER_ALGORITHM_TWOSHOT);
      const std::uint64_t native = api_.max_message_bytes(ws, ARBITER_ALGORITHM_NATIVE);
      ARBITER_CHECK(one == want_one && two == want_two && native == 0, name << " rank " << r,
                    "max_message_bytes: one-shot " << one << ", two-shot " << two << ", native "
                                                   << native << "; expected " << want_one << ", "
                                                   << want_two << ", 0");
    }
  }

  void oversized() {
    Call c = base_call();
    c.variant = kResidualRmsnorm;
    c.inputs = "oversized";
    for (const OversizedCall& o : suite_.oversized(info_)) {
      c.algorithm = o.algorithm;
      c.tokens = o.shape.tokens;
      c.hidden = o.shape.hidden;
      ARBITER_CHECK(suite_.refusal(info_, c).has_value(), c.name(),
                    "the suite's oversized call is not one it expects refused");
      execute(c, sweep_inputs());
    }
  }

  // 10,000 calls without a wait in between, one-shot and two-shot
  // alternating (and with and without PDL); the last must still give the
  // bits of a lone call.
  void back_to_back() {
    Call c = base_call();
    c.variant = kResidualRmsnorm;  // every element output
    c.tokens = suite_.back_to_back.tokens;
    c.hidden = suite_.back_to_back.hidden;
    c.allreduce_out = true;
    c.residual_out = true;
    c.inputs = "back-to-back";
    std::optional<HostOutputs> golden = execute(c, sweep_inputs());
    if (!golden) return;
    check_results({Result{c, *golden, {}}}, sweep_view());

    std::vector<std::vector<arbiter_allreduce_args>> args(4);  // [algorithm + 2 * pdl]
    for (int k = 0; k < 4; ++k) {
      Call ck = c;
      ck.algorithm = k % 2 == 0 ? ARBITER_ALGORITHM_ONESHOT : ARBITER_ALGORITHM_TWOSHOT;
      ck.pdl = k >= 2;
      args[k] = group_args(ck, sweep_inputs());
    }
    const std::string name =
        std::to_string(suite_.back_to_back_calls) + " back-to-back calls of " + c.name();
    cudaError_t e = cudaSuccess;
    for (int r = 0; r < world_size() && e == cudaSuccess; ++r) {
      e = clear_outputs(args[0][r], c, group_.stream(r));
    }
    if (!ARBITER_CHECK(e == cudaSuccess, name, "cudaMemsetAsync: " << cudaGetErrorString(e))) {
      return;
    }
    watchdog_.arm(name, seconds(300));
    for (int i = 0; i < suite_.back_to_back_calls; ++i) {
      std::string error;
      const int k = (i % 2) + 2 * ((i / 2) % 2);
      const std::int32_t status = group_.run(args[k], &error);
      ++stats_.back_to_back;
      exit_if_hung(name, error);
      if (!ARBITER_CHECK(status == ARBITER_OK, name,
                         "call " << i << ": status " << status << ": " << error)) {
        break;
      }
    }
    wait_or_exit(name, milliseconds(240000));
    watchdog_.disarm();
    const int last =
        ((suite_.back_to_back_calls - 1) % 2) + 2 * (((suite_.back_to_back_calls - 1) / 2) % 2);
    parallel_for(static_cast<std::size_t>(world_size()), [&](std::size_t r) {
      compare_device_outputs(args[last][r], c, *golden, staging(static_cast<int>(r)),
                             name + ", rank " + std::to_string(r) + " vs a lone call");
    });
  }

  // Each rank's call captured into its own graph, replayed
  // suite_.graph_replays times; the inputs change between replays (same device buffers).
  void graph_replays() {
    Call c = base_call();
    c.variant = kResidualRmsnormFp8;  // with norm_out
    c.tokens = suite_.graph.tokens;
    c.hidden = suite_.graph.hidden;
    c.allreduce_out = true;
    c.residual_out = true;
    c.weight_bias = 1.0f;
    c.inputs = "graph";
    // Input sets: [set][rank], salted like the sweep's.
    std::vector<std::vector<Bytes>> sets(kGraphInputSets);
    for (int s = 0; s < kGraphInputSets; ++s) {
      for (int r = 0; r < world_size(); ++r) {
        sets[s].push_back(random_elements(
            c.elements(), dtype(), -1.0f, 1.0f,
            777u + 100u * static_cast<std::uint32_t>(s) + static_cast<std::uint32_t>(r), r));
      }
    }
    DeviceInputs in = side_inputs();
    in.residual = shared_.residual.get();

    for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
      c.algorithm = algorithm;
      const std::string name = "CUDA graph of " + c.name();
      const std::vector<arbiter_allreduce_args> args = group_args(c, in);
      watchdog_.arm(name, seconds(300));

      RankGraphs graphs;
      std::string error;
      std::int32_t status = ARBITER_INTERNAL;
      const std::string capture_error = graphs.capture(streams(), [&] {
        status = group_.run(args, &error);
        return status == ARBITER_OK;
      });
      exit_if_hung(name, error);
      bool ok = ARBITER_CHECK(capture_error.empty(), name, "capture: " << capture_error) &&
                ARBITER_CHECK(status == ARBITER_OK, name,
                              "run during capture: status " << status << ": " << error);
      const int per_set = suite_.graph_replays / kGraphInputSets;
      for (int i = 0; i < suite_.graph_replays && ok; ++i) {
        const int set = std::min(i / per_set, kGraphInputSets - 1);
        cudaError_t e = cudaSuccess;
        if (i % per_set == 0 && i / per_set < kGraphInputSets) {
          // New inputs in the same buffers, and outputs reset to 0xFF.
          for (int r = 0; r < world_size() && e == cudaSuccess; ++r) {
            e = cudaMemcpyAsync(ranks_[r].side_input.get(), sets[set][r].data(), c.bytes(),
                                cudaMemcpyHostToDevice, group_.stream(r));
            if (e == cudaSuccess) e = clear_outputs(args[r], c, group_.stream(r));
          }
        }
        if (e == cudaSuccess) e = graphs.launch();
        ok = ARBITER_CHECK(e == cudaSuccess, name, "replay " << i << ": " << cudaGetErrorString(e));
        if (ok) ++stats_.graph_replays;
        const bool last_of_set = (i + 1) % per_set == 0 || i + 1 == suite_.graph_replays;
        if (!ok || !last_of_set) continue;
        const std::string context =
            name + ", replay " + std::to_string(i) + ", input set " + std::to_string(set);
        wait_or_exit(context, kCallLimit);
        const HostOutputs first = download(args[0], c, staging(0), context + ", rank 0");
        compare_ranks(args, c, first, context);
        Call checked = c;
        const std::string label =
            "graph replay " + std::to_string(i) + ", input set " + std::to_string(set);
        checked.inputs = label.c_str();
        HostView view;
        for (int r = 0; r < world_size(); ++r) view.inputs.push_back(sets[set][r].data());
        view.residual = inputs_.residual.data();
        view.gamma = inputs_.gamma.data();
        check_results({Result{checked, first, {}}}, view);
      }
      wait_or_exit(name, kCallLimit);
      watchdog_.disarm();
    }
  }

  // Payloads that look like the Lamport sentinel, or that flush-to-zero would
  // turn into it, on every rank at once (make_salted_inputs).
  void salted() {
    Call c = base_call();
    c.tokens = suite_.salted.tokens;
    c.hidden = suite_.salted.hidden;
    c.inputs = "salted (-0.0, subnormals)";
    const SaltedInputs salted =
        make_salted_inputs(dtype(), world_size(), c.tokens, c.hidden,
                           4242u + static_cast<std::uint32_t>(world_size()));
    cudaError_t e = cudaMemcpyAsync(shared_.side_residual.get(), salted.residual.data(), c.bytes(),
                                    cudaMemcpyHostToDevice, group_.stream(0));
    for (int r = 0; r < world_size() && e == cudaSuccess; ++r) {
      e = cudaMemcpyAsync(ranks_[r].side_input.get(), salted.ranks[r].data(), c.bytes(),
                          cudaMemcpyHostToDevice, group_.stream(r));
    }
    if (!ARBITER_CHECK(e == cudaSuccess, c.name(), "upload: " << cudaGetErrorString(e))) return;
    wait_or_exit(c.name() + " (upload)", kCallLimit);

    HostView view;
    for (const Bytes& b : salted.ranks) view.inputs.push_back(b.data());
    view.residual = salted.residual.data();
    view.gamma = inputs_.gamma.data();
    for (float weight_bias : {0.0f, 1.0f}) {
      c.weight_bias = weight_bias;
      check_results(
          run_variants(c, side_inputs(), !suite_.zero_sign_exact, weight_bias == 0.0f ? 0 : 1),
          view);
    }
  }

  // The aliasing contract (arbiter_backend.h): outputs written over the
  // call's input or residual_in give the bits of separate buffers, and a
  // partial overlap is refused before launch. Each rank's input and residual
  // are first copied into its side buffers, which the call then overwrites.
  void in_place() {
    Call c = base_call();
    c.tokens = suite_.salted.tokens;
    c.hidden = suite_.salted.hidden;
    c.inputs = "in-place";
    for (const InPlaceLayout& layout : kInPlaceLayouts) {
      c.variant = Variant{layout.pattern, layout.norm_out != Place::kNone, false};
      c.allreduce_out = layout.allreduce_out != Place::kNone;
      c.residual_out = layout.residual_out != Place::kNone;
      for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
        c.algorithm = algorithm;
        const std::optional<HostOutputs> want = execute(c, sweep_inputs());
        if (!want) continue;
        const std::string name = c.name() + " in place (" + place_names(layout) + ")";
        std::vector<arbiter_allreduce_args> args = group_args(c, sweep_inputs());
        cudaError_t e = cudaSuccess;
        for (int r = 0; r < world_size() && e == cudaSuccess; ++r) {
          RankBuffers& b = ranks_[r];
          // The separate-buffer call left its results in the own buffers.
          e = clear_outputs(args[r], c, group_.stream(r));
          if (e == cudaSuccess) {
            e = cudaMemcpyAsync(b.side_input.get(), b.input.get(), c.bytes(),
                                cudaMemcpyDeviceToDevice, group_.stream(r));
          }
          if (e == cudaSuccess) {
            e = cudaMemcpyAsync(b.side_residual.get(), shared_.residual.get(), c.bytes(),
                                cudaMemcpyDeviceToDevice, group_.stream(r));
          }
          arbiter_allreduce_args& a = args[r];
          a.input = b.side_input.get();
          if (c.norm()) a.residual_in = b.side_residual.get();
          a.allreduce_out = place_output(layout.allreduce_out, b.allreduce_out.get(),
                                         b.side_input.get(), b.side_residual.get());
          a.residual_out = place_output(layout.residual_out, b.residual_out.get(),
                                        b.side_input.get(), b.side_residual.get());
          a.norm_out = place_output(layout.norm_out, b.norm_out.get(), b.side_input.get(),
                                    b.side_residual.get());
        }
        if (!ARBITER_CHECK(e == cudaSuccess, name, "copy: " << cudaGetErrorString(e))) return;
        watchdog_.arm(name, seconds(120));
        std::string error;
        const std::int32_t status = group_.run(args, &error);
        ++stats_.calls;
        exit_if_hung(name, error);
        ARBITER_CHECK(status == ARBITER_OK, name, "run: status " << status << ": " << error);
        if (status == ARBITER_OK) wait_or_exit(name, kCallLimit);
        watchdog_.disarm();
        if (status != ARBITER_OK) continue;
        ++stats_.ran;
        parallel_for(static_cast<std::size_t>(world_size()), [&](std::size_t r) {
          compare_device_outputs(args[r], c, *want, staging(static_cast<int>(r)),
                                 name + ", rank " + std::to_string(r) + " vs separate buffers");
        });
      }
    }
    // norm_out 16 bytes into input: every rank refuses, nothing is enqueued.
    c.variant = kResidualRmsnorm;
    c.algorithm = ARBITER_ALGORITHM_ONESHOT;
    std::vector<arbiter_allreduce_args> args = group_args(c, sweep_inputs());
    for (arbiter_allreduce_args& a : args) {
      a.norm_out = const_cast<char*>(static_cast<const char*>(a.input)) + 16;
    }
    const std::string name = c.name() + " with norm_out 16 bytes into input";
    std::string error;
    const std::int32_t status = group_.run(args, &error);
    ++stats_.calls;
    exit_if_hung(name, error);
    if (ARBITER_CHECK(status == ARBITER_INVALID_ARGUMENT &&
                          error.find("norm_out overlaps input") != std::string::npos,
                      name,
                      "expected ARBITER_INVALID_ARGUMENT (\"norm_out overlaps input\"), got "
                          << status << ": " << error)) {
      ++stats_.refused;
    }
  }

  // Registered memory (ABI v2): each rank's sweep input copied into its part
  // of one allocation, at an offset, then
  //  - every variant, one-shot and two-shot, on two shapes: run_registered
  //    gives every rank the bits of the copied call (run());
  //  - in place (norm_out and residual_out over the registered input, many
  //    tokens per CTA): the same bits;
  //  - each rank overwrites its input right after its call, 50 times: the
  //    results stay exact (the peers had read it when the call ended);
  //  - an input crossing the end of the allocation, or not registered, is
  //    refused on every rank with nothing enqueued;
  //  - free on every rank, then a new allocation (which frees the old parts
  //    for real) serves a call.
  void registered_calls() {
    const std::uint64_t offset = 4096;  // calls at an offset into the parts
    const std::uint64_t bytes =
        std::uint64_t{info_.max_tokens} * info_.max_hidden * info_.element_size();
    const std::string name = suite_.backend + " registered, ws " + std::to_string(world_size()) +
                             " " + dtype_name(dtype());
    std::vector<void*> parts;
    std::string error;
    watchdog_.arm(name + " alloc", seconds(120));
    std::int32_t status = group_.alloc_registered(*memory_, offset + bytes, &parts, &error);
    watchdog_.disarm();
    if (!ARBITER_CHECK(status == ARBITER_OK, name, "alloc: status " << status << ": " << error)) {
      return;
    }
    DeviceInputs registered = sweep_inputs();
    for (int r = 0; r < world_size(); ++r) {
      registered.inputs[r] = static_cast<const char*>(parts[r]) + offset;
    }
    const auto load_inputs = [&](std::uint64_t n) {
      cudaError_t e = cudaSuccess;
      for (int r = 0; r < world_size() && e == cudaSuccess; ++r) {
        e = cudaMemcpyAsync(const_cast<void*>(registered.inputs[r]), ranks_[r].input.get(), n,
                            cudaMemcpyDeviceToDevice, group_.stream(r));
      }
      return e;
    };
    // Runs `args` registered on every rank and compares each rank's outputs
    // with `want`. The outputs are cleared first, then the inputs loaded
    // (an output may be the input).
    const auto run_and_compare = [&](const Call& c, const std::vector<arbiter_allreduce_args>& args,
                                     const HostOutputs& want, const std::string& context) {
      cudaError_t e = cudaSuccess;
      for (int r = 0; r < world_size() && e == cudaSuccess; ++r) {
        e = clear_outputs(args[r], c, group_.stream(r));
      }
      if (e == cudaSuccess) e = load_inputs(c.bytes());
      if (!ARBITER_CHECK(e == cudaSuccess, context, "cudaMemsetAsync: " << cudaGetErrorString(e))) {
        return false;
      }
      watchdog_.arm(context, seconds(120));
      std::string why;
      const std::int32_t rc = group_.run_registered(*memory_, args, &why);
      ++stats_.calls;
      exit_if_hung(context, why);
      ARBITER_CHECK(rc == ARBITER_OK, context, "run_registered: status " << rc << ": " << why);
      if (rc == ARBITER_OK) wait_or_exit(context, kCallLimit);
      watchdog_.disarm();
      if (rc != ARBITER_OK) return false;
      ++stats_.ran;
      parallel_for(static_cast<std::size_t>(world_size()), [&](std::size_t r) {
        compare_device_outputs(args[r], c, want, staging(static_cast<int>(r)),
                               context + ", rank " + std::to_string(r) + " vs the copied call");
      });
      return true;
    };
    // Every variant and algorithm, against the copied call.
    const std::uint32_t hiddens[] = {suite_.hiddens.front(), suite_.hiddens.back()};
    std::size_t rotation = 0;
    for (std::uint32_t hidden : hiddens) {
      for (std::uint32_t tokens : {suite_.token_counts.front(), suite_.token_counts.back()}) {
        Call c = base_call();
        c.hidden = hidden;
        c.tokens = tokens;
        c.inputs = "registered";
        for (const Variant& v : suite_.variants) {
          const std::size_t k = rotation++;
          c.variant = v;
          if (c.norm()) {
            c.allreduce_out = k % 3 == 1;
            c.residual_out = k % 4 != 2;
            c.residual_in = k % 5 != 4;
          }
          c.pdl = k % 4 == 3;
          for (arbiter_algorithm algorithm :
               {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
            c.algorithm = algorithm;
            const std::optional<HostOutputs> want = execute(c, sweep_inputs());
            if (!want) continue;
            run_and_compare(c, group_args(c, registered), *want, c.name() + " registered");
          }
        }
      }
    }

    // In place: norm_out over the registered input (vLLM's layout), with the
    // most tokens, so that each CTA handles several.
    for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
      Call c = base_call();
      c.variant = kResidualRmsnorm;
      c.tokens = suite_.max_tokens;
      c.hidden = suite_.hiddens.front();
      c.residual_out = true;
      c.algorithm = algorithm;
      c.inputs = "registered, norm_out over the input";
      const std::optional<HostOutputs> want = execute(c, sweep_inputs());
      if (!want) continue;
      std::vector<arbiter_allreduce_args> args = group_args(c, registered);
      for (arbiter_allreduce_args& a : args) a.norm_out = const_cast<void*>(a.input);
      run_and_compare(c, args, *want, c.name() + " registered in place");
      // Only rank 0 in place: the ranks take different barrier paths
      // (oneshot_registered.cu) and must still meet.
      args = group_args(c, registered);
      args[0].norm_out = const_cast<void*>(args[0].input);
      run_and_compare(c, args, *want, c.name() + " registered, rank 0 alone in place");
    }
    // The input is overwritten on each rank's stream right after its call.
    {
      Call c = base_call();
      c.variant = kResidualRmsnorm;
      c.tokens = suite_.back_to_back.tokens;
      c.hidden = suite_.back_to_back.hidden;
      c.allreduce_out = true;
      c.residual_out = true;
      c.inputs = "registered, input overwritten after each call";
      for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
        c.algorithm = algorithm;
        const std::optional<HostOutputs> want = execute(c, sweep_inputs());
        if (!want) continue;
        const std::vector<arbiter_allreduce_args> args = group_args(c, registered);
        for (int i = 0; i < 50; ++i) {
          const std::string context = c.name() + ", call " + std::to_string(i);
          if (!ARBITER_CHECK(load_inputs(c.bytes()) == cudaSuccess, context, "copy")) return;
          cudaError_t e = cudaSuccess;
          for (int r = 0; r < world_size() && e == cudaSuccess; ++r) {
            e = clear_outputs(args[r], c, group_.stream(r));
          }
          std::string why;
          const std::int32_t rc = group_.run_registered(*memory_, args, &why);
          ++stats_.calls;
          exit_if_hung(context, why);
          if (!ARBITER_CHECK(rc == ARBITER_OK, context, "run_registered: " << rc << ": " << why)) {
            break;
          }
          // NaN bits over the input, as soon as this rank's kernel ends.
          for (int r = 0; r < world_size() && e == cudaSuccess; ++r) {
            e = cudaMemsetAsync(const_cast<void*>(registered.inputs[r]), 0xFF, c.bytes(),
                                group_.stream(r));
          }
          if (!ARBITER_CHECK(e == cudaSuccess, context, cudaGetErrorString(e))) return;
          wait_or_exit(context, kCallLimit);
          ++stats_.ran;
          parallel_for(static_cast<std::size_t>(world_size()), [&](std::size_t r) {
            compare_device_outputs(args[r], c, *want, staging(static_cast<int>(r)),
                                   context + ", rank " + std::to_string(r));
          });
        }
      }
    }

    // Misuse: refused on every rank, nothing enqueued.
    {
      Call c = base_call();
      c.variant = kResidualRmsnorm;
      c.tokens = 2;
      c.hidden = suite_.hiddens.front();
      c.algorithm = ARBITER_ALGORITHM_ONESHOT;
      std::vector<arbiter_allreduce_args> args = group_args(c, registered);
      for (int r = 0; r < world_size(); ++r) {
        args[r].input = static_cast<const char*>(parts[r]) + offset + bytes - c.bytes() / 2;
      }
      std::string why;
      std::int32_t rc = group_.run_registered(*memory_, args, &why);
      ++stats_.calls;
      exit_if_hung(name, why);
      if (ARBITER_CHECK(
              rc == ARBITER_INVALID_ARGUMENT && why.find("crosses the end") != std::string::npos,
              name, "an input crossing the end: status " << rc << ": " << why)) {
        ++stats_.refused;
      }
      args = group_args(c, sweep_inputs());
      rc = group_.run_registered(*memory_, args, &why);
      ++stats_.calls;
      exit_if_hung(name, why);
      if (ARBITER_CHECK(rc == ARBITER_INVALID_ARGUMENT &&
                            why.find("not in memory registered") != std::string::npos,
                        name, "an unregistered input: status " << rc << ": " << why)) {
        ++stats_.refused;
      }
    }

    // Free (local), allocate anew, call once more.
    for (int r = 0; r < world_size(); ++r) {
      const std::int32_t rc = memory_->free(group_.workspace(r), parts[r]);
      ARBITER_CHECK(rc == ARBITER_OK, name, "free on rank " << r << ": " << rc);
      const std::int32_t again = memory_->free(group_.workspace(r), parts[r]);
      ARBITER_CHECK(again == ARBITER_INVALID_ARGUMENT, name, "a second free: " << again);
    }
    watchdog_.arm(name + " second alloc", seconds(120));
    status = group_.alloc_registered(*memory_, bytes, &parts, &error);
    watchdog_.disarm();
    if (!ARBITER_CHECK(status == ARBITER_OK, name, "second alloc: " << status << ": " << error)) {
      return;
    }
    for (int r = 0; r < world_size(); ++r) registered.inputs[r] = parts[r];
    Call c = base_call();
    c.variant = kResidualRmsnorm;
    c.tokens = suite_.token_counts.back();
    c.hidden = suite_.hiddens.back();
    c.algorithm = ARBITER_ALGORITHM_ONESHOT;
    c.inputs = "registered, second allocation";
    if (const std::optional<HostOutputs> want = execute(c, sweep_inputs())) {
      run_and_compare(c, group_args(c, registered), *want, c.name());
    }
    // The workspaces free what is left when the group is destroyed.
  }

  // A registered call larger than the workspace's per-call capacity: a
  // second group whose workspace holds a third of the call runs it whole
  // (one-shot reads in place: the bits of the copied call on the main group)
  // or in slices (two-shot). A slice may launch with a larger cluster than
  // the whole call (the launch configuration follows the token count: fp32
  // at hidden 1024 on an H200, 32-token slices, clusters of 2), and its sum
  // of squares then adds the partials in another order, so two-shot is held
  // to the reference's bounds and to every rank having rank 0's bits.
  void registered_above_capacity() {
    Call c = base_call();
    c.variant = kResidualRmsnorm;
    c.tokens = 128;
    c.hidden = suite_.hiddens.front();
    c.allreduce_out = true;
    c.residual_out = true;
    c.inputs = "registered, 3x the workspace's capacity";
    const std::string name = suite_.backend + " registered above capacity, ws " +
                             std::to_string(world_size()) + " " + dtype_name(dtype());
    arbiter_workspace_spec spec{};
    spec.world_size = world_size();
    spec.device = 0;
    spec.nodes = 1;
    spec.max_tokens = c.tokens / 3;
    spec.hidden = c.hidden;
    spec.dtype = dtype();
    spec.pattern_mask = 0xFu;
    spec.max_message_bytes = std::uint64_t{spec.max_tokens} * c.hidden * info_.element_size();
    spec.timeout_ms = 60000;
    watchdog_.arm(name + ": workspace_create", seconds(180));
    LoopbackGroup small(api_, spec);
    watchdog_.disarm();
    if (!ARBITER_CHECK(small.ok(), name, "workspace_create: " << small.error())) return;
    std::vector<void*> parts;
    std::string error;
    watchdog_.arm(name + ": alloc", seconds(120));
    const std::int32_t status = small.alloc_registered(*memory_, c.bytes(), &parts, &error);
    watchdog_.disarm();
    if (!ARBITER_CHECK(status == ARBITER_OK, name, "alloc: " << status << ": " << error)) return;
    for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
      c.algorithm = algorithm;
      const bool sliced = algorithm == ARBITER_ALGORITHM_TWOSHOT;
      std::optional<HostOutputs> want;
      if (!sliced && !(want = execute(c, sweep_inputs()))) continue;
      DeviceInputs in = sweep_inputs();
      for (int r = 0; r < world_size(); ++r) in.inputs[r] = parts[r];
      const std::vector<arbiter_allreduce_args> args = group_args(c, in);
      const std::string context = c.name() + " on " + name;
      cudaError_t e = cudaSuccess;
      for (int r = 0; r < world_size() && e == cudaSuccess; ++r) {
        e = clear_outputs(args[r], c, small.stream(r));
        if (e == cudaSuccess) {
          e = cudaMemcpyAsync(parts[r], ranks_[r].input.get(), c.bytes(), cudaMemcpyDeviceToDevice,
                              small.stream(r));
        }
      }
      if (!ARBITER_CHECK(e == cudaSuccess, context, cudaGetErrorString(e))) return;
      watchdog_.arm(context, seconds(120));
      const std::int32_t rc = small.run_registered(*memory_, args, &error);
      ++stats_.calls;
      if (small.hung()) fail_and_exit(context, error + " (kernels left waiting for their peers)");
      ARBITER_CHECK(rc == ARBITER_OK, context, "run_registered: " << rc << ": " << error);
      if (rc == ARBITER_OK && !small.wait(kCallLimit, &error)) fail_and_exit(context, error);
      watchdog_.disarm();
      if (rc != ARBITER_OK) continue;
      ++stats_.ran;
      if (sliced) {
        const HostOutputs first = download(args[0], c, staging(0), context + ", rank 0");
        compare_ranks(args, c, first, context);
        check_results({Result{c, first, {}}}, sweep_view());
        continue;
      }
      parallel_for(static_cast<std::size_t>(world_size()), [&](std::size_t r) {
        compare_device_outputs(args[r], c, *want, staging(static_cast<int>(r)),
                               context + ", rank " + std::to_string(r) + " vs the copied call");
      });
    }
  }

  static std::string place_names(const InPlaceLayout& layout) {
    const auto where = [](Place p) {
      return p == Place::kNone    ? "none"
             : p == Place::kOwn   ? "own"
             : p == Place::kInput ? "input"
                                  : "residual_in";
    };
    return std::string("allreduce_out: ") + where(layout.allreduce_out) +
           ", residual_out: " + where(layout.residual_out) +
           ", norm_out: " + where(layout.norm_out);
  }

  const FusedSuite& suite_;
  const arbiter_backend_v1_t& api_;
  const arbiter_backend_memory_v2_t* memory_;  // NULL: the module has no registered memory
  const GroupInfo info_;
  const HostInputs& inputs_;
  const std::vector<PinnedBuffer>& staging_;  // one per rank, max_tokens x max_hidden x 4 bytes
  Watchdog& watchdog_;
  LoopbackGroup group_;
  std::vector<RankBuffers> ranks_;  // after group_: freed before the workspaces
  SharedBuffers shared_;
  GroupStats stats_;
};

// The fragment of the message every fused module refuses an NVFP4 call
// with below capability 100 or in fp32 (call_checks.h), or nothing.
inline std::optional<std::string> nvfp4_refusal(const GroupInfo& g, const Call& c) {
  if (c.fp4() && g.capability < kMinNvfp4Capability) {
    return std::string("NVFP4 needs capability >= 100");
  }
  if (c.fp4() && c.dtype == ARBITER_DTYPE_FP32) return std::string("NVFP4");
  return std::nullopt;
}

// probe() on device 0: what the module claims, against the device and the
// suite. Returns false when the module cannot run here at all; exits with
// kSkipExitCode and the reason below capability 90.
inline bool check_probe(const FusedSuite& suite, const arbiter_backend_v1_t& api,
                        std::uint32_t capability) {
  arbiter_probe_args args{ARBITER_DEVICE_GPU, 0};
  arbiter_backend_caps caps{};
  const std::int32_t status = api.probe(&args, &caps);
  if (status != ARBITER_OK) {
    if (capability < 90) {
      std::printf("SKIP: %s does not run on capability %u: %s\n", suite.backend.c_str(), capability,
                  api.last_error());
      std::fflush(stdout);
      std::exit(kSkipExitCode);
    }
    check(false, "probe(device 0)", "status " + std::to_string(status) + ": " + api.last_error());
    return false;
  }
  const std::uint32_t patterns = capability >= kMinNvfp4Capability ? 0xFu : 0x7u;
  ARBITER_CHECK(caps.device_kind == ARBITER_DEVICE_GPU, "probe",
                "device_kind " << caps.device_kind);
  ARBITER_CHECK(caps.capability == capability, "probe",
                "capability " << caps.capability << ", the device says " << capability);
  ARBITER_CHECK(caps.world_size_mask == suite.world_size_mask, "probe",
                "world_size_mask 0x" << std::hex << caps.world_size_mask << ", expected 0x"
                                     << suite.world_size_mask);
  ARBITER_CHECK(caps.dtype_mask == 0x7u, "probe", "dtype_mask 0x" << std::hex << caps.dtype_mask);
  ARBITER_CHECK(caps.pattern_mask == patterns, "probe",
                "pattern_mask 0x" << std::hex << caps.pattern_mask << ", expected 0x" << patterns);
  ARBITER_CHECK(
      caps.algorithm_mask == 0x3u, "probe",
      "algorithm_mask 0x" << std::hex << caps.algorithm_mask << ", expected one-shot and two-shot");
  const std::uint32_t flags_set = suite.flags_set | ARBITER_CAPS_RESIDUAL_OPTIONAL;
  ARBITER_CHECK((caps.flags & flags_set) == flags_set, "probe",
                "flags 0x" << std::hex << caps.flags << " lack 0x" << flags_set);
  ARBITER_CHECK((caps.flags & suite.flags_clear) == 0, "probe",
                "flags 0x" << std::hex << caps.flags << " hold 0x"
                           << (caps.flags & suite.flags_clear) << ", which " << suite.backend
                           << " must not claim");
  return true;
}

// ARBITER_GPU_SUITE=small: a suite short enough for compute-sanitizer
// (scripts/device-check.sh): world sizes 2 and 8 (those the suite has),
// bf16, the first two hidden sizes with 7 and 20 tokens (two-shot refused
// and run at 8 ranks), 50 back-to-back calls, 8 graph replays.
inline FusedSuite small_if_asked(FusedSuite suite) {
  const char* mode = std::getenv("ARBITER_GPU_SUITE");
  if (mode == nullptr || std::string(mode) != "small") return suite;
  std::vector<int> sizes;
  for (int w : suite.world_sizes) {
    if (w == 2 || w == 8) sizes.push_back(w);
  }
  suite.world_sizes = sizes;
  suite.dtypes = {ARBITER_DTYPE_BF16};
  if (suite.hiddens.size() > 2) suite.hiddens.resize(2);
  suite.token_counts = {7, 20};
  suite.back_to_back_calls = 50;
  suite.graph_replays = 2 * kGraphInputSets;
  std::printf("%s: small suite (ARBITER_GPU_SUITE=small)\n", suite.test_name.c_str());
  return suite;
}

// The whole suite on device 0; returns main()'s exit code. Call
// prepare_loopback_environment() first thing in main(), before this.
inline int run_fused_suite(const FusedSuite& full) {
  const FusedSuite suite = small_if_asked(full);
  test_name() = suite.test_name;
  require_device_or_skip();
  const auto start = std::chrono::steady_clock::now();
  BackendModule module(suite.backend);
  if (!check(module.api() != nullptr, "dlopen " + module.path(), module.error())) {
    return finish(suite.test_name.c_str());
  }
  const arbiter_backend_v1_t& api = *module.api();
  int major = 0;
  int minor = 0;
  cudaSetDevice(0);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  const auto capability = static_cast<std::uint32_t>(major * 10 + minor);
  std::printf("%s on device 0: capability %u; NVFP4 cases %s\n", suite.backend.c_str(), capability,
              capability >= kMinNvfp4Capability ? "run" : "must be refused");
  std::fflush(stdout);
  if (!check_probe(suite, api, capability)) return finish(suite.test_name.c_str());

  // Host staging for downloads, one per rank, large enough for any output.
  const int ranks = suite.max_world_size();
  std::vector<PinnedBuffer> staging;
  staging.reserve(ranks);
  for (int r = 0; r < ranks; ++r) {
    staging.emplace_back(std::size_t{suite.max_tokens} * suite.max_hidden * sizeof(float));
    if (staging.back().get() == nullptr) fail_and_exit("cudaMallocHost", "no pinned host memory");
  }
  Watchdog watchdog;
  std::size_t group_index = 0;
  for (arbiter_dtype dtype : suite.dtypes) {
    const HostInputs inputs = make_inputs(dtype, ranks, suite.max_tokens, suite.max_hidden);
    for (int world_size : suite.world_sizes) {
      GroupRunner runner(suite, api, module.memory(), dtype, world_size, capability, inputs,
                         staging, watchdog);
      runner.run_all(group_index++);
    }
  }
  std::printf("%s: %.1f s in all\n", suite.test_name.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return finish(suite.test_name.c_str());
}

}  // namespace arbiter::test
