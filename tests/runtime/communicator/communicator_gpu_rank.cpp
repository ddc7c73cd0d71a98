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
//
// Prints "decision <what>: <backend> <algorithm> fused|unfused: ok|<problem>"
// (rank 0, or any rank with a problem), "refused <what>: <message>" for
// refusals, then "rank R: OK" and exits 0 when everything holds.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
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
  } else {
    std::fprintf(stderr, "unknown mode %s (cases, c_api)\n", mode.c_str());
    return 2;
  }
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::printf("error: %s\n", e.what());
  return 1;
}
