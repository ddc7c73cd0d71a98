// One GPU rank of the end-to-end test, run through `arbiter launch` with one
// rank per GPU (device = LOCAL_RANK): the policy decides, the communicator
// dispatches to the trtllm module (fused) or the nccl module (fallback), and
// the results are checked against the CPU reference and across ranks.
//
// Prints "decision <tokens> <pattern>: <backend> <algorithm> fused|unfused:
// ok|<problem>" for every case (rank 0, or any rank with a problem), then
// "rank R: OK" and exits 0 when every case is right and equal on all ranks.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "arbiter/bootstrap.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/reference.h"
#include "arbiter/communicator.h"

namespace {

using Bytes = std::vector<std::uint8_t>;

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

std::uint64_t hash(const Bytes& v) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::uint8_t b : v) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

// A device copy of `host` (or an empty buffer of host.size() bytes).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    cudaMemset(ptr_, 0, bytes);
  }
  explicit DeviceBuffer(const Bytes& host) : DeviceBuffer(host.size()) {
    cudaMemcpy(ptr_, host.data(), host.size(), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  Bytes to_host() const {
    Bytes out(bytes_);
    cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost);
    return out;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

std::string run_case(arbiter::Bootstrap& boot, arbiter::Communicator& comm, cudaStream_t stream,
                     arbiter_pattern pattern, std::uint32_t tokens, std::uint32_t hidden,
                     std::string* decision) {
  const arbiter_dtype dtype = ARBITER_DTYPE_BF16;
  const std::size_t count = std::size_t{tokens} * hidden;
  std::vector<Bytes> inputs;
  for (int r = 0; r < boot.world_size(); ++r) inputs.push_back(make_input(r, count, dtype));
  const Bytes residual = make_input(1000, count, dtype);
  const Bytes gamma = make_input(2000, hidden, dtype);
  const std::size_t bytes = count * arbiter::common::dtype_size(dtype);
  DeviceBuffer input(inputs[static_cast<std::size_t>(boot.rank())]);
  DeviceBuffer residual_in(residual);
  DeviceBuffer gamma_d(gamma);
  DeviceBuffer out(bytes);
  DeviceBuffer residual_out(bytes);
  DeviceBuffer norm_out(bytes);

  arbiter_allreduce_args a{};
  a.pattern = pattern;
  a.dtype = dtype;
  a.tokens = tokens;
  a.hidden = hidden;
  a.input = input.get();
  a.eps = 1e-6f;
  if (pattern == ARBITER_PATTERN_ALLREDUCE) {
    a.allreduce_out = out.get();
  } else {
    a.residual_in = residual_in.get();
    a.residual_out = residual_out.get();
    a.gamma = gamma_d.get();
    a.norm_out = norm_out.get();
  }
  const auto result = comm.allreduce_fusion(a, stream);
  const auto& d = result.decision;
  *decision = std::string(arbiter::backend_name(d.backend)) + " " +
              std::string(arbiter::algorithm_name(d.algorithm)) + (d.fused ? " fused" : " unfused");
  if (result.status != ARBITER_OK) {
    return "status " + std::to_string(result.status) + ": " + result.error;
  }
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    return std::string("stream: ") + cudaGetErrorString(e);
  }
  arbiter::common::ReferenceCase rc;
  rc.pattern = pattern;
  rc.dtype = dtype;
  rc.tokens = tokens;
  rc.hidden = hidden;
  for (const auto& in : inputs) rc.inputs.push_back(in.data());
  rc.residual_in = residual.data();
  rc.gamma = gamma.data();
  rc.eps = a.eps;
  const auto ref = arbiter::common::compute_reference(rc);
  std::string problem;
  Bytes got_out = out.to_host();
  Bytes got_residual = residual_out.to_host();
  Bytes got_norm = norm_out.to_host();
  if (pattern == ARBITER_PATTERN_ALLREDUCE) {
    problem = arbiter::common::check_output(got_out.data(), dtype, ref.sum, ref.sum_bound, hidden,
                                            "allreduce_out");
  } else {
    problem = arbiter::common::check_output(got_residual.data(), dtype, ref.residual,
                                            ref.residual_bound, hidden, "residual_out");
    if (problem.empty()) {
      problem = arbiter::common::check_output(got_norm.data(), dtype, ref.norm, ref.norm_bound,
                                              hidden, "norm_out");
    }
  }
  const std::uint64_t mine = hash(got_out) ^ hash(got_norm) * 3 ^ hash(got_residual) * 5;
  std::vector<std::uint64_t> all(static_cast<std::size_t>(boot.world_size()));
  if (!boot.allgather(&mine, all.data(), sizeof mine, std::chrono::seconds(60)).ok()) {
    return "allgather of result hashes failed";
  }
  for (std::uint64_t h : all) {
    if (h != all[0] && problem.empty()) problem = "ranks hold different bits";
  }
  return problem;
}

}  // namespace

int main() try {
  arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment();
  const char* local = std::getenv("LOCAL_RANK");
  const int device = local != nullptr ? std::atoi(local) : 0;
  if (cudaSetDevice(device) != cudaSuccess) {
    std::printf("rank %d: cannot use GPU %d\n", boot.rank(), device);
    return 1;
  }
  int major = 0;
  int minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);

  const arbiter::Policy policy = arbiter::Policy::from_environment();
  arbiter::DiscoverOptions discover = arbiter::DiscoverOptions::from_environment();
  discover.probe = {ARBITER_DEVICE_GPU, device};
  const arbiter::Registry registry = arbiter::Registry::discover(discover);

  arbiter::CommunicatorOptions o;
  o.capability = arbiter::Capability::sm(static_cast<std::uint16_t>(major * 10 + minor));
  o.device = device;
  o.max_tokens = 1024;
  o.hidden = 7168;
  o.dtype = arbiter::Dtype::kBf16;
  o.timeout = std::chrono::seconds(120);
  arbiter::Communicator comm(*boot.oob(), policy, registry, o);
  for (const std::string& why : comm.dropped()) std::printf("dropped %s\n", why.c_str());

  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  int failures = 0;
  for (arbiter_pattern pattern : {ARBITER_PATTERN_ALLREDUCE, ARBITER_PATTERN_RESIDUAL_RMSNORM}) {
    for (std::uint32_t tokens : {1u, 7u, 128u, 1024u}) {
      std::string decision;
      const std::string problem = run_case(boot, comm, stream, pattern, tokens, 7168, &decision);
      if (!problem.empty()) ++failures;
      if (boot.rank() == 0 || !problem.empty()) {
        std::printf("decision %u %s: %s: %s\n", tokens,
                    pattern == ARBITER_PATTERN_ALLREDUCE ? "allreduce" : "residual_rmsnorm",
                    decision.c_str(), problem.empty() ? "ok" : problem.c_str());
      }
    }
  }
  cudaStreamDestroy(stream);
  if (failures == 0) std::printf("rank %d: OK\n", boot.rank());
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::printf("error: %s\n", e.what());
  return 1;
}
