// One GPU rank of the end-to-end tests, run through `arbiter launch`: the
// default tables decide, the communicator dispatches to the trtllm module
// (fused) or the nccl module (fallback), and results are checked against
// the fp64 reference and across ranks, bit for bit.
//
// The GPU is LOCAL_RANK, or GPU 0 for every rank in the shared-GPU test mode
// (ARBITER_TEST_SHARED_GPU=1, set by the test where there are fewer GPUs
// than ranks). Modes:
//   cases   (C++) every pattern and dtype at 1, 7 and 128 tokens, and at
//           the edges the tables draw (every pattern in bf16, the norm in
//           fp16 and fp32): the last one-shot and the first two-shot size
//           where both are fused, the last fused size, and the first size
//           above the fused cap (on the fallback, or refused in the
//           shared-GPU mode); NVFP4 runs where the device has it and is
//           refused with the reason where it does not
//   c_api   the C API with every option at zero but the device and shape:
//           a norm and a plain all-reduce
//   check   the check mode (options.check_calls): a call whose token count
//           differs on the last rank is refused on every rank before any
//           kernel is enqueued, the next call runs; and the mode's cost per
//           call at 1, 4 and 16 tokens (bf16, hidden 4096), against the same
//           calls without it, trials interleaved
//   abort   rank 1 never launches call 5 (ARBITER_TEST_FAULT=1:gpu.call.start
//           @5:skip, set by the test): rank 0's kernel waits for it until a
//           thread calls abort(); the stream must then end without a CUDA
//           error, rank 1 hear of the abort within a second (the host's
//           fault board), every later call fail at once, teardown wait on
//           nobody, device memory come back, and a new communicator run right
//
// Prints "decision <what>: <backend> <algorithm> fused|unfused: ok|<problem>"
// (rank 0, or any rank with a problem), "refused <what>: <message>" for
// refusals, then "rank R: OK" and exits 0 when everything holds.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/arbiter.h"
#include "arbiter/bootstrap.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/common/reference.h"
#include "arbiter/communicator.h"

namespace {

using Bytes = std::vector<std::uint8_t>;
using arbiter::Algorithm;
using arbiter::Backend;

Bytes make_input(int seed, std::size_t count, arbiter_dtype dtype) {
  Bytes v(count * arbiter::common::dtype_size(dtype));
  std::uint32_t state = 2654435761u * static_cast<std::uint32_t>(seed + 11);
  for (std::size_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    const float value = static_cast<float>(static_cast<int>(state >> 9) % 2001 - 1000) / 400.0f;
    arbiter::common::store_element(v.data(), i, dtype, value);
  }
  return v;
}

std::uint64_t hash(const Bytes& v, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (std::uint8_t b : v) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device buffer of `bytes`, zeroed, or a copy of `host`.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    check_cuda(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes), "cudaMalloc");
    check_cuda(cudaMemset(ptr_, 0, bytes), "cudaMemset");
  }
  explicit DeviceBuffer(const Bytes& host) : DeviceBuffer(host.size()) {
    check_cuda(cudaMemcpy(ptr_, host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  Bytes to_host() const {
    Bytes out(bytes_);
    check_cuda(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

struct Case {
  arbiter_pattern pattern;
  arbiter_dtype dtype;
  std::uint32_t tokens;
  std::uint32_t hidden;
};

std::string describe(const Case& c) {
  return std::string(arbiter::pattern_name(static_cast<arbiter::Pattern>(c.pattern))) + " " +
         std::string(arbiter::dtype_name(static_cast<arbiter::Dtype>(c.dtype))) + " " +
         std::to_string(c.tokens) + "x" + std::to_string(c.hidden);
}

// What one call ran and whether it was right.
struct Outcome {
  std::string decision;  // "trtllm oneshot fused"
  arbiter_status status = ARBITER_OK;
  std::string problem;  // "" when right on this rank and equal on all
};

// Runs one call through `call` (the C++ communicator or the C API) on
// device buffers and checks every output the pattern writes.
using CallFn = std::function<arbiter_status(const arbiter_allreduce_args&, std::string* decision,
                                            std::string* error)>;

Outcome run_case(arbiter::Bootstrap& boot, const Case& c, const CallFn& call, cudaStream_t stream) {
  Outcome out;
  const std::size_t count = std::size_t{c.tokens} * c.hidden;
  const std::size_t bytes = count * arbiter::common::dtype_size(c.dtype);
  std::vector<Bytes> inputs;
  for (int r = 0; r < boot.world_size(); ++r) inputs.push_back(make_input(r, count, c.dtype));
  const Bytes residual = make_input(1000, count, c.dtype);
  const Bytes gamma = make_input(2000, c.hidden, c.dtype);
  const float scale_value = 0.5f;
  const bool fp8 = c.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  const bool fp4 = c.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  const std::uint32_t blocks = arbiter::common::nvfp4_blocks_per_row(c.hidden);
  DeviceBuffer input(inputs[static_cast<std::size_t>(boot.rank())]);
  DeviceBuffer residual_in(residual);
  DeviceBuffer gamma_d(gamma);
  DeviceBuffer allreduce_out(bytes);
  DeviceBuffer residual_out(bytes);
  DeviceBuffer norm_out(bytes);
  DeviceBuffer quant_out(fp8 ? count : fp4 ? count / 2 : 0);
  DeviceBuffer scale_out(fp4 ? std::size_t{c.tokens} * blocks : 0);
  Bytes scale_bytes(sizeof scale_value);
  std::memcpy(scale_bytes.data(), &scale_value, sizeof scale_value);
  DeviceBuffer scale(scale_bytes);

  arbiter_allreduce_args a{};
  a.pattern = c.pattern;
  a.dtype = c.dtype;
  a.tokens = c.tokens;
  a.hidden = c.hidden;
  a.input = input.get();
  a.eps = 1e-6f;
  if (c.pattern == ARBITER_PATTERN_ALLREDUCE) {
    a.allreduce_out = allreduce_out.get();
  } else {
    a.residual_in = residual_in.get();
    a.residual_out = residual_out.get();
    a.gamma = gamma_d.get();
    a.norm_out = norm_out.get();
    if (fp8 || fp4) {
      a.quant_out = quant_out.get();
      a.scale = static_cast<const float*>(scale.get());
    }
    if (fp4) {
      a.scale_out = scale_out.get();
      a.flags = ARBITER_RUN_NVFP4_LINEAR_SCALES;
    }
  }
  std::string error;
  out.status = call(a, &out.decision, &error);
  if (out.status != ARBITER_OK) {
    out.problem = error;
    return out;
  }
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    out.status = ARBITER_INTERNAL;
    out.problem = std::string("stream: ") + cudaGetErrorString(e);
    return out;
  }
  arbiter::common::ReferenceCase rc;
  rc.pattern = c.pattern;
  rc.dtype = c.dtype;
  rc.tokens = c.tokens;
  rc.hidden = c.hidden;
  for (const auto& in : inputs) rc.inputs.push_back(in.data());
  rc.residual_in = residual.data();
  rc.gamma = gamma.data();
  rc.eps = a.eps;
  rc.scale = scale_value;
  rc.linear_scales = true;
  const auto ref = arbiter::common::compute_reference(rc);
  const Bytes got_sum = allreduce_out.to_host();
  const Bytes got_residual = residual_out.to_host();
  const Bytes got_norm = norm_out.to_host();
  const Bytes got_quant = quant_out.to_host();
  const Bytes got_scales = scale_out.to_host();
  using arbiter::common::check_output;
  if (c.pattern == ARBITER_PATTERN_ALLREDUCE) {
    out.problem =
        check_output(got_sum.data(), c.dtype, ref.sum, ref.sum_bound, c.hidden, "allreduce_out");
  } else {
    out.problem = check_output(got_residual.data(), c.dtype, ref.residual, ref.residual_bound,
                               c.hidden, "residual_out");
    if (out.problem.empty()) {
      out.problem =
          check_output(got_norm.data(), c.dtype, ref.norm, ref.norm_bound, c.hidden, "norm_out");
    }
    if (out.problem.empty() && fp8) {
      out.problem = arbiter::common::check_fp8(got_quant.data(), ref, scale_value, c.hidden);
    }
    if (out.problem.empty() && fp4) {
      out.problem = arbiter::common::check_nvfp4(got_quant.data(), got_scales.data(), rc, ref);
    }
  }
  const std::uint64_t mine =
      hash(got_scales, hash(got_quant, hash(got_norm, hash(got_residual, hash(got_sum)))));
  std::vector<std::uint64_t> all(static_cast<std::size_t>(boot.world_size()));
  if (!boot.allgather(&mine, all.data(), sizeof mine, std::chrono::seconds(120)).ok()) {
    out.problem = "allgather of result hashes failed";
    return out;
  }
  for (std::uint64_t h : all) {
    if (h != all[0] && out.problem.empty()) out.problem = "ranks hold different bits";
  }
  return out;
}

bool shared_gpu_mode() {
  const char* v = std::getenv("ARBITER_TEST_SHARED_GPU");
  return v != nullptr && std::string(v) == "1";
}

struct Device {
  int ordinal = 0;
  std::uint32_t capability = 0;
};

Device pick_device() {
  Device d;
  const char* local = std::getenv("LOCAL_RANK");
  d.ordinal = shared_gpu_mode() || local == nullptr ? 0 : std::atoi(local);
  check_cuda(cudaSetDevice(d.ordinal), "cudaSetDevice");
  int major = 0;
  int minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d.ordinal);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d.ordinal);
  d.capability = static_cast<std::uint32_t>(major * 10 + minor);
  return d;
}

// The largest token count in [1, limit] for which `holds` is true, given
// that it holds from 1 up to some point and not after; 0 if not even at 1.
std::uint32_t last_where(std::uint32_t limit, const std::function<bool(std::uint32_t)>& holds) {
  if (!holds(1)) return 0;
  std::uint32_t lo = 1;          // holds
  std::uint32_t hi = limit + 1;  // treated as failing
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    (holds(mid) ? lo : hi) = mid;
  }
  return lo;
}

int run_cases(arbiter::Bootstrap& boot, const Device& device) {
  const bool shared = shared_gpu_mode();
  const arbiter::Policy policy = arbiter::Policy::from_environment();
  arbiter::DiscoverOptions discover = arbiter::DiscoverOptions::from_environment();
  discover.probe = {ARBITER_DEVICE_GPU, device.ordinal};
  const arbiter::Registry registry = arbiter::Registry::discover(discover);
  constexpr std::uint32_t kMaxTokens = 8192;
  int failures = 0;
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  for (arbiter::Dtype dtype :
       {arbiter::Dtype::kBf16, arbiter::Dtype::kFp16, arbiter::Dtype::kFp32}) {
    const auto adt = static_cast<arbiter_dtype>(dtype);
    const std::uint32_t hidden = dtype == arbiter::Dtype::kFp32 ? 4096 : 7168;
    arbiter::CommunicatorOptions o;  // every pattern asked for
    o.capability = arbiter::Capability::sm(static_cast<std::uint16_t>(device.capability));
    o.device = device.ordinal;
    o.max_tokens = kMaxTokens;
    o.hidden = hidden;
    o.dtype = dtype;
    o.timeout = std::chrono::seconds(120);
    arbiter::Communicator comm(*boot.oob(), policy, registry, o);
    if (boot.rank() == 0) {
      for (const std::string& why : comm.dropped()) std::printf("dropped %s\n", why.c_str());
    }
    const CallFn call = [&](const arbiter_allreduce_args& a, std::string* decision,
                            std::string* error) {
      const auto r = comm.allreduce_fusion(a, stream);
      const auto& d = r.decision;
      *decision = d.backend == Backend::kNone
                      ? std::string("none")
                      : std::string(arbiter::backend_name(d.backend)) + " " +
                            std::string(arbiter::algorithm_name(d.algorithm)) +
                            (d.fused ? " fused" : " unfused");
      *error = r.error;
      return r.status;
    };
    auto decide = [&](arbiter_pattern p, std::uint32_t tokens) {
      arbiter_allreduce_args a{};
      a.pattern = p;
      a.dtype = adt;
      a.tokens = tokens;
      a.hidden = hidden;
      return comm.decide(a);
    };
    for (arbiter_pattern p :
         {ARBITER_PATTERN_ALLREDUCE, ARBITER_PATTERN_RESIDUAL_RMSNORM,
          ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4}) {
      const bool fp4 = p == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
      if (fp4 && dtype == arbiter::Dtype::kFp32) continue;  // NVFP4 takes 16-bit inputs
      const std::uint32_t fused_last =
          last_where(kMaxTokens, [&](std::uint32_t t) { return decide(p, t).fused; });
      std::vector<std::uint32_t> sizes = {1, 7, 128};
      if (fp4 && device.capability < 100) {
        // No backend runs NVFP4 below capability 100: refused, every rank.
        const Outcome r = run_case(boot, Case{p, adt, 4, hidden}, call, stream);
        const bool refused =
            r.status == ARBITER_UNSUPPORTED &&
            r.problem.find("does not run residual_rmsnorm_fp4 (NVFP4)") != std::string::npos;
        if (!refused) {
          ++failures;
          std::printf("rank %d: nvfp4 on capability %u: expected a refusal, got status %d: %s\n",
                      boot.rank(), device.capability, r.status, r.problem.c_str());
        } else if (boot.rank() == 0) {
          std::printf("refused nvfp4 %s: %s\n", std::string(arbiter::dtype_name(dtype)).c_str(),
                      r.problem.c_str());
        }
        continue;
      }
      // The edges move tens of MiB per rank: every pattern in bf16, the
      // norm alone in the other dtypes (the small sizes cover the rest).
      const bool edges = dtype == arbiter::Dtype::kBf16 || p == ARBITER_PATTERN_RESIDUAL_RMSNORM;
      if (edges && fused_last > 0) {
        // The one-shot/two-shot edge, where the tables draw one below the
        // fused cap; then the cap itself and the first size above it.
        const std::uint32_t oneshot_last = last_where(fused_last, [&](std::uint32_t t) {
          return decide(p, t).algorithm == Algorithm::kOneshot;
        });
        if (oneshot_last < fused_last) {
          sizes.push_back(oneshot_last);
          sizes.push_back(oneshot_last + 1);
        }
        sizes.push_back(fused_last);
        if (fused_last < kMaxTokens) sizes.push_back(fused_last + 1);
      }
      for (std::uint32_t tokens : sizes) {
        const Case c{p, adt, tokens, hidden};
        const arbiter::Decision expected = decide(p, tokens);
        const Outcome r = run_case(boot, c, call, stream);
        if (expected.backend == Backend::kNone && shared) {
          // Above the fused cap with the fallback dropped by the mode.
          const bool refused = r.status == ARBITER_UNSUPPORTED &&
                               r.problem.find("shared-GPU test mode") != std::string::npos &&
                               r.problem.find("above the fused cap") != std::string::npos;
          if (!refused) {
            ++failures;
            std::printf("rank %d: %s: expected the shared-GPU mode's refusal, got %d: %s\n",
                        boot.rank(), describe(c).c_str(), r.status, r.problem.c_str());
          } else if (boot.rank() == 0) {
            std::printf("refused %s: %s\n", describe(c).c_str(), r.problem.c_str());
          }
          continue;
        }
        if (!r.problem.empty()) ++failures;
        if (boot.rank() == 0 || !r.problem.empty()) {
          std::printf("decision %s: %s: %s\n", describe(c).c_str(), r.decision.c_str(),
                      r.problem.empty() ? "ok" : r.problem.c_str());
        }
      }
    }
  }
  cudaStreamDestroy(stream);
  return failures;
}

// The C API exactly as a C caller with defaults would use it.
int run_c_api(arbiter::Bootstrap& boot, const Device& device) {
  arbiter_policy* policy = nullptr;
  if (arbiter_policy_from_environment(&policy) != ARBITER_OK) {
    std::printf("rank %d: policy: %s\n", boot.rank(), arbiter_last_error());
    return 1;
  }
  arbiter_comm_options o{};
  o.capability = device.capability;
  o.device = device.ordinal;
  o.hidden = 4096;
  o.dtype = ARBITER_DTYPE_BF16;
  arbiter_comm* comm = nullptr;
  // Over the test's own group: the launcher's port can be joined only once.
  const int32_t created = arbiter_comm_create(boot.oob(), policy, &o, &comm);
  arbiter_policy_free(policy);
  if (created != ARBITER_OK) {
    std::printf("rank %d: arbiter_comm_create with default options: %s\n", boot.rank(),
                arbiter_last_error());
    return 1;
  }
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const CallFn call = [&](const arbiter_allreduce_args& a, std::string* decision,
                          std::string* error) {
    arbiter_decision used{};
    const int32_t status = arbiter_comm_allreduce_fusion(comm, &a, stream, &used);
    *decision = std::string(arbiter_backend_name(used.backend)) + " " +
                (used.algorithm == ARBITER_ALGORITHM_ONESHOT   ? "oneshot"
                 : used.algorithm == ARBITER_ALGORITHM_TWOSHOT ? "twoshot"
                                                               : "native") +
                (used.fused ? " fused" : " unfused");
    if (status != ARBITER_OK) *error = arbiter_last_error();
    return static_cast<arbiter_status>(status);
  };
  int failures = 0;
  for (const Case& c : {Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_DTYPE_BF16, 3, 4096},
                        Case{ARBITER_PATTERN_ALLREDUCE, ARBITER_DTYPE_BF16, 64, 4096}}) {
    const Outcome r = run_case(boot, c, call, stream);
    if (!r.problem.empty()) ++failures;
    if (boot.rank() == 0 || !r.problem.empty()) {
      std::printf("decision c_api %s: %s: %s\n", describe(c).c_str(), r.decision.c_str(),
                  r.problem.empty() ? "ok" : r.problem.c_str());
    }
  }
  cudaStreamDestroy(stream);
  arbiter_comm_destroy(comm);
  return failures;
}

arbiter::CommunicatorOptions gpu_options(const Device& device, bool check_calls) {
  arbiter::CommunicatorOptions o;
  o.capability = arbiter::Capability::sm(static_cast<std::uint16_t>(device.capability));
  o.device = device.ordinal;
  o.max_tokens = 64;
  o.hidden = 4096;
  o.dtype = arbiter::Dtype::kBf16;
  o.timeout = std::chrono::seconds(60);
  o.check_calls = check_calls;
  return o;
}

const arbiter::Registry& gpu_registry(const Device& device) {
  static const arbiter::Registry registry = [&] {
    arbiter::DiscoverOptions discover = arbiter::DiscoverOptions::from_environment();
    discover.probe = {ARBITER_DEVICE_GPU, device.ordinal};
    return arbiter::Registry::discover(discover);
  }();
  return registry;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int run_check(arbiter::Bootstrap& boot, const Device& device) {
  const arbiter::Policy policy = arbiter::Policy::from_environment();
  arbiter::Communicator plain(*boot.oob(), policy, gpu_registry(device),
                              gpu_options(device, false));
  arbiter::Communicator checked(*boot.oob(), policy, gpu_registry(device),
                                gpu_options(device, true));
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const std::size_t elements = std::size_t{16} * 4096;
  DeviceBuffer input(make_input(boot.rank(), elements, ARBITER_DTYPE_BF16));
  DeviceBuffer output(elements * 2);
  auto args = [&](std::uint32_t tokens) {
    arbiter_allreduce_args a{};
    a.pattern = ARBITER_PATTERN_ALLREDUCE;
    a.dtype = ARBITER_DTYPE_BF16;
    a.tokens = tokens;
    a.hidden = 4096;
    a.input = input.get();
    a.allreduce_out = output.get();
    return a;
  };
  int failures = 0;
  // The last rank passes 4 tokens where the others pass 8: refused before
  // any kernel is enqueued (without the check, trtllm's one-shot kernels
  // would wait for 8 tokens from a rank that sends 4: a hang).
  const bool odd = boot.rank() == boot.world_size() - 1;
  const auto refused = checked.allreduce_fusion(args(odd ? 4 : 8), stream);
  const bool ok =
      refused.status == ARBITER_MISMATCH &&
      refused.error.find("check mode: call 0 differs across ranks in tokens") != std::string::npos;
  std::printf("check refused: status %d: %s\n", refused.status, refused.error.c_str());
  if (!ok) ++failures;
  const auto next = checked.allreduce_fusion(args(8), stream);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (next.status != ARBITER_OK) {
    ++failures;
    std::printf("rank %d: the call after the refusal: %s\n", boot.rank(), next.error.c_str());
  }
  // The cost: 200 calls back to back per trial, 5 trials, with and without
  // the check alternating; the median per-call time of each.
  constexpr int kCalls = 200;
  constexpr int kTrials = 5;
  for (std::uint32_t tokens : {1u, 4u, 16u}) {
    std::vector<double> with, without;
    for (int trial = -1; trial < kTrials; ++trial) {
      for (arbiter::Communicator* comm : {&plain, &checked}) {
        if (!boot.barrier(std::chrono::seconds(60)).ok()) throw std::runtime_error("barrier");
        const auto start = std::chrono::steady_clock::now();
        for (int c = 0; c < kCalls; ++c) {
          const auto r = comm->allreduce_fusion(args(tokens), stream);
          if (r.status != ARBITER_OK) throw std::runtime_error("timed call: " + r.error);
        }
        check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        const double us = seconds_since(start) * 1e6 / kCalls;
        if (trial >= 0) (comm == &plain ? without : with).push_back(us);
      }
    }
    std::sort(with.begin(), with.end());
    std::sort(without.begin(), without.end());
    if (boot.rank() == 0) {
      std::printf(
          "check mode cost at %u tokens (bf16, hidden 4096, %d ranks, 5 trials of %d calls): "
          "without %.2f us/call [%.2f-%.2f], with %.2f us/call [%.2f-%.2f], +%.2f us\n",
          tokens, boot.world_size(), kCalls, without[kTrials / 2], without.front(), without.back(),
          with[kTrials / 2], with.front(), with.back(), with[kTrials / 2] - without[kTrials / 2]);
    }
  }
  cudaStreamDestroy(stream);
  return failures;
}

std::size_t free_device_memory() {
  std::size_t free = 0;
  std::size_t total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

int run_abort(arbiter::Bootstrap& boot, const Device& device) {
  const arbiter::Policy policy = arbiter::Policy::from_environment();
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const std::size_t elements = std::size_t{16} * 4096;
  DeviceBuffer input(make_input(boot.rank(), elements, ARBITER_DTYPE_BF16));
  DeviceBuffer output(elements * 2);
  arbiter_allreduce_args a{};
  a.pattern = ARBITER_PATTERN_ALLREDUCE;
  a.dtype = ARBITER_DTYPE_BF16;
  a.tokens = 1;
  a.hidden = 4096;
  a.input = input.get();
  a.allreduce_out = output.get();
  int failures = 0;
  auto fail = [&](const std::string& what) {
    ++failures;
    std::printf("rank %d: %s\n", boot.rank(), what.c_str());
  };
  // Device-wide free memory, taken while every rank holds only its context
  // and buffers (the ranks may share the GPU).
  if (!boot.barrier(std::chrono::seconds(60)).ok()) throw std::runtime_error("barrier");
  const std::size_t free_before = free_device_memory();
  {
    auto comm = std::make_unique<arbiter::Communicator>(*boot.oob(), policy, gpu_registry(device),
                                                        gpu_options(device, false));
    for (int call = 0; call < 5; ++call) {
      const auto r = comm->allreduce_fusion(a, stream);
      if (r.status != ARBITER_OK) throw std::runtime_error("warm-up call: " + r.error);
      if (r.decision.backend != Backend::kTrtllm && r.decision.backend != Backend::kMnnvl) {
        fail("1 token did not go to a fused GPU backend; the test proves nothing");
      }
    }
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (!boot.barrier(std::chrono::seconds(60)).ok()) throw std::runtime_error("barrier");
    // Call 5: rank 1 returns without launching (the test's fault hook).
    const auto r = comm->allreduce_fusion(a, stream);
    if (r.status != ARBITER_OK) fail("call 5: " + r.error);
    if (boot.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (cudaStreamQuery(stream) != cudaErrorNotReady) {
        fail("rank 0's kernel did not wait for rank 1 (is ARBITER_TEST_FAULT set?)");
      }
      std::atomic<long long> aborted_at{0};
      std::thread watchdog([&] {
        aborted_at = std::chrono::steady_clock::now().time_since_epoch().count();
        comm->abort();
      });
      watchdog.join();
      cudaError_t e = cudaErrorNotReady;
      while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        if (std::chrono::steady_clock::now().time_since_epoch().count() - aborted_at >
            10'000'000'000LL) {
          break;
        }
      }
      const double ms =
          static_cast<double>(std::chrono::steady_clock::now().time_since_epoch().count() -
                              aborted_at) /
          1e6;
      if (e != cudaSuccess) fail(std::string("after abort(): ") + cudaGetErrorString(e));
      std::printf(
          "abort: the kernel waiting on rank 1 (never launched) returned %.3f ms after "
          "abort()\n",
          ms);
      if (ms > 100.0)
        fail("the waiting kernel returned " + std::to_string(ms) + " ms after abort()");
    }
    // Rank 0's abort() is on its host's fault board: rank 1 hears of it
    // within a second (the watch reads the board every 100 ms).
    if (!boot.barrier(std::chrono::seconds(60)).ok()) throw std::runtime_error("barrier");
    if (boot.rank() == 1) {
      const auto met = std::chrono::steady_clock::now();
      while (!comm->faulted() && seconds_since(met) < 2.0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::printf("abort: rank 1 learnt of rank 0's abort() %.3f ms after the barrier\n",
                  seconds_since(met) * 1e3);
      const auto told = comm->allreduce_fusion(a, stream);
      if (told.status != ARBITER_PEER_FAILED ||
          told.error.find("rank 0 aborted the communicator") == std::string::npos ||
          seconds_since(met) > 1.0) {
        fail("rank 1 after rank 0's abort(): status " + std::to_string(told.status) + ": " +
             told.error);
      }
      comm->abort();  // as a watchdog on this rank would
    }
    const auto refused_at = std::chrono::steady_clock::now();
    const auto later = comm->allreduce_fusion(a, stream);
    if (later.status != ARBITER_ABORTED || seconds_since(refused_at) > 0.01) {
      fail("a call after abort(): status " + std::to_string(later.status) + ": " + later.error);
    }
    const auto teardown = std::chrono::steady_clock::now();
    comm.reset();
    std::printf("abort: rank %d: teardown %.3f ms\n", boot.rank(), seconds_since(teardown) * 1e3);
    if (seconds_since(teardown) > 2.0) fail("teardown after abort() waited");
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after abort");
  if (!boot.barrier(std::chrono::seconds(60)).ok()) throw std::runtime_error("barrier");
  const std::size_t free_after = free_device_memory();
  std::printf(
      "abort: rank %d: free device memory %zu MiB before creation, %zu MiB after teardown\n",
      boot.rank(), free_before >> 20, free_after >> 20);
  if (free_after + (std::size_t{16} << 20) < free_before) fail("device memory did not come back");
  // The context is healthy: a new communicator over the same group runs right.
  // ARBITER_TEST_FAULT stays armed (each module read it once): call 5 of any
  // workspace on rank 1 would skip. run_case makes one call, far below it.
  arbiter::Communicator again(*boot.oob(), policy, gpu_registry(device),
                              gpu_options(device, false));
  const CallFn call = [&](const arbiter_allreduce_args& x, std::string* decision,
                          std::string* error) {
    const auto r = again.allreduce_fusion(x, stream);
    *decision = std::string(arbiter::backend_name(r.decision.backend));
    *error = r.error;
    return r.status;
  };
  const Outcome o = run_case(
      boot, Case{ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_DTYPE_BF16, 7, 4096}, call, stream);
  if (!o.problem.empty()) fail("a new communicator after abort: " + o.problem);
  cudaStreamDestroy(stream);
  return failures;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "cases";
  const Device device = pick_device();
  int failures = 0;
  if (mode == "cases") {
    arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment();
    failures = run_cases(boot, device);
    if (failures == 0) std::printf("rank %d: OK\n", boot.rank());
  } else if (mode == "c_api") {
    arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment();
    failures = run_c_api(boot, device);
    if (failures == 0) std::printf("rank %d: OK\n", boot.rank());
  } else if (mode == "check") {
    arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment();
    failures = run_check(boot, device);
    if (failures == 0) std::printf("rank %d: OK\n", boot.rank());
  } else if (mode == "abort") {
    arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment();
    failures = run_abort(boot, device);
    if (failures == 0) std::printf("rank %d: OK\n", boot.rank());
  } else {
    std::fprintf(stderr, "unknown mode %s (cases, c_api, check, abort)\n", mode.c_str());
    return 2;
  }
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::printf("error: %s\n", e.what());
  return 1;
}
