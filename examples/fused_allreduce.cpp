// arbiter-example-fused: what a framework does with arbiter, on CPU or GPU ranks.
//
//   arbiter launch --nproc 4 -- arbiter-example-fused                 # CPU ranks (shm)
//   arbiter launch --nproc 2 -- arbiter-example-fused --device cuda   # GPU ranks
//
// Each rank joins the group (UCX bootstrap from the launcher's environment),
// loads the policy (embedded defaults + ARBITER_CONFIG + ARBITER_BACKENDS),
// creates a communicator (the shm backend on CPU ranks; trtllm fused and
// nccl as the fallback on GPUs), runs fused all-reduce + residual + RMSNorm
// on several sizes, checks every output against the fp64 reference and that
// every rank got the same bits, and rank 0 prints each decision. Exits
// non-zero on any mismatch.
//
// GPU ranks use GPU LOCAL_RANK. With fewer GPUs than ranks every rank uses
// GPU 0 through arbiter's shared-GPU test mode (ARBITER_TEST_SHARED_GPU=1,
// set here): correct but slow, and without the nccl fallback (NCCL refuses
// two ranks on one GPU), so calls above the fused cap are refused; they are
// reported, not counted as failures. For trying arbiter on one GPU only.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef ARBITER_EXAMPLE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "arbiter/bootstrap.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/reference.h"
#include "arbiter/communicator.h"
#include "arbiter/size.h"

namespace {

constexpr std::uint32_t kHidden = 2880;  // gpt-oss: partial warps on GPUs
constexpr std::uint32_t kMaxTokens = 2048;

// Every rank can rebuild every other rank's input, so each can compute the
// reference for the whole group.
std::vector<std::uint16_t> make_input(int rank, std::uint32_t tokens) {
  std::vector<std::uint16_t> v(std::size_t{tokens} * kHidden);
  std::uint32_t state = 2654435761u * static_cast<std::uint32_t>(rank + 1);
  for (auto& x : v) {
    state = state * 1664525u + 1013904223u;
    const float value = static_cast<float>(static_cast<int>(state >> 9) % 2001 - 1000) / 500.0f;
    x = arbiter::common::float_to_bf16_bits(value);
  }
  return v;
}

std::uint64_t hash(const void* data, std::size_t bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < bytes; ++i) {
    h = (h ^ static_cast<const unsigned char*>(data)[i]) * 0x100000001b3ull;
  }
  return h;
}

// Where the tensors live: host memory, or one GPU (with its stream).
class Memory {
 public:
  virtual ~Memory() = default;
  // A buffer holding a copy of `bytes` bytes at `host` (nullptr: zeroed).
  virtual void* place(const void* host, std::size_t bytes) = 0;
  // Copies `bytes` from a buffer place() returned back to `host`.
  virtual void fetch(void* host, const void* placed, std::size_t bytes) = 0;
  virtual void* stream() { return nullptr; }
  virtual void release_all() = 0;
};

class HostMemory final : public Memory {
 public:
  void* place(const void* host, std::size_t bytes) override {
    buffers_.emplace_back(bytes);
    if (host != nullptr) std::memcpy(buffers_.back().data(), host, bytes);
    return buffers_.back().data();
  }
  void fetch(void* host, const void* placed, std::size_t bytes) override {
    std::memcpy(host, placed, bytes);
  }
  void release_all() override { buffers_.clear(); }

 private:
  std::vector<std::vector<unsigned char>> buffers_;
};

#ifdef ARBITER_EXAMPLE_CUDA
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

class DeviceMemory final : public Memory {
 public:
  explicit DeviceMemory(int device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~DeviceMemory() override {
    release_all();
    cudaStreamDestroy(stream_);
  }
  void* place(const void* host, std::size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    buffers_.push_back(p);
    check(host ? cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) : cudaMemset(p, 0, bytes),
          "cudaMemcpy");
    return p;
  }
  void fetch(void* host, const void* placed, std::size_t bytes) override {
    check(cudaStreamSynchronize(stream_), "the all-reduce on its stream");
    check(cudaMemcpy(host, placed, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  void* stream() override { return stream_; }
  void release_all() override {
    for (void* p : buffers_) cudaFree(p);
    buffers_.clear();
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<void*> buffers_;
};
#endif

struct Setup {
  arbiter::Capability capability = arbiter::Capability::cpu();
  int device = -1;
  bool shared_gpu = false;
  std::string where = "CPU ranks";
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// The GPU this rank uses; throws with the reason when there is none.
Setup cuda_setup() {
#ifdef ARBITER_EXAMPLE_CUDA
  int gpus = 0;  // unchanged by a failing call
  if (const cudaError_t e = cudaGetDeviceCount(&gpus); e != cudaSuccess || gpus == 0) {
    throw std::runtime_error(std::string("--device cuda: no CUDA device (") +
                             (e != cudaSuccess ? cudaGetErrorString(e) : "none visible") +
                             "); run without --device cuda for CPU ranks");
  }
  Setup s;
  const int local_world = env_int("LOCAL_WORLD_SIZE", env_int("WORLD_SIZE", 1));
  s.shared_gpu = gpus < local_world;
  // Read when the communicator is created: the modules then accept ranks of
  // several processes on GPU 0, and the runtime drops nccl.
  if (s.shared_gpu) setenv("ARBITER_TEST_SHARED_GPU", "1", 1);
  s.device = s.shared_gpu ? 0 : env_int("LOCAL_RANK", 0);
  int major = 0;
  int minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s.device),
        "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, s.device),
        "cudaDeviceGetAttribute");
  s.capability = arbiter::Capability::sm(static_cast<std::uint16_t>(major * 10 + minor));
  s.where =
      "GPU ranks (capability " + std::to_string(major) + "." + std::to_string(minor) +
      (s.shared_gpu ? "), all on GPU 0 in arbiter's shared-GPU test mode (" + std::to_string(gpus) +
                          " GPU(s) for " + std::to_string(local_world) + " ranks; no nccl fallback)"
                    : "), one GPU per rank");
  return s;
#else
  throw std::runtime_error(
      "--device cuda: this build of the example has no CUDA (the CUDA toolkit was not found when "
      "it was configured); run without --device cuda for CPU ranks");
#endif
}

void usage() {
  std::fprintf(stderr,
               "usage: arbiter launch --nproc N -- arbiter-example-fused [--device cpu|cuda]\n");
}

}  // namespace

int main(int argc, char** argv) try {
  bool cuda = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device" && i + 1 < argc &&
        (std::string(argv[i + 1]) == "cpu" || std::string(argv[i + 1]) == "cuda")) {
      cuda = std::string(argv[++i]) == "cuda";
    } else if (arg == "-h" || arg == "--help") {
      usage();
      return 0;
    } else {
      usage();
      return 2;
    }
  }
  const Setup setup = cuda ? cuda_setup() : Setup{};
  arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment();
  const arbiter::Policy policy = arbiter::Policy::from_environment();
  arbiter::DiscoverOptions discover = arbiter::DiscoverOptions::from_environment();
  discover.probe = {cuda ? ARBITER_DEVICE_GPU : ARBITER_DEVICE_CPU, setup.device};
  const arbiter::Registry registry = arbiter::Registry::discover(discover);

  arbiter::CommunicatorOptions options;
  options.capability = setup.capability;
  options.device = setup.device;
  options.max_tokens = kMaxTokens;
  options.hidden = kHidden;
  options.dtype = arbiter::Dtype::kBf16;
  arbiter::Communicator comm(*boot.oob(), policy, registry, options);
#ifdef ARBITER_EXAMPLE_CUDA
  std::unique_ptr<Memory> memory = cuda ? std::unique_ptr<Memory>(new DeviceMemory(setup.device))
                                        : std::unique_ptr<Memory>(new HostMemory);
#else
  std::unique_ptr<Memory> memory(new HostMemory);
#endif
  const bool lead = boot.rank() == 0;
  if (lead) {
    std::printf("%d %s, tables %s; backends with a workspace:", boot.world_size(),
                setup.where.c_str(), policy.fingerprint_hex().c_str());
    for (int b = 0; b < arbiter::kBackendCount; ++b) {
      if ((comm.usable_mask() >> b) & 1u) {
        std::printf(" %s",
                    std::string(arbiter::backend_name(static_cast<arbiter::Backend>(b))).c_str());
      }
    }
    std::printf("\n");
  }

  std::vector<std::uint16_t> gamma(kHidden);
  for (std::uint32_t i = 0; i < kHidden; ++i) {
    gamma[i] = arbiter::common::float_to_bf16_bits(0.5f + static_cast<float>(i % 7) / 8.0f);
  }
  int failures = 0;
  for (std::uint32_t tokens : {1u, 7u, 64u, 182u, 183u, 600u, kMaxTokens}) {
    const std::size_t count = std::size_t{tokens} * kHidden;
    const std::size_t bytes = count * sizeof(std::uint16_t);
    std::vector<std::vector<std::uint16_t>> inputs;
    for (int r = 0; r < boot.world_size(); ++r) inputs.push_back(make_input(r, tokens));
    const std::vector<std::uint16_t> residual = make_input(1000, tokens);
    std::vector<std::uint16_t> residual_out(count), norm_out(count);

    arbiter_allreduce_args a{};
    a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
    a.dtype = ARBITER_DTYPE_BF16;
    a.tokens = tokens;
    a.hidden = kHidden;
    a.input = memory->place(inputs[static_cast<std::size_t>(boot.rank())].data(), bytes);
    a.residual_in = memory->place(residual.data(), bytes);
    a.residual_out = memory->place(nullptr, bytes);
    a.gamma = memory->place(gamma.data(), kHidden * sizeof(std::uint16_t));
    a.eps = 1e-6f;
    a.norm_out = memory->place(nullptr, bytes);
    const arbiter::Communicator::Result result = comm.allreduce_fusion(a, memory->stream());
    const arbiter::Decision& d = result.decision;
    if (result.status == ARBITER_UNSUPPORTED && setup.shared_gpu) {
      // Every rank refuses alike: nothing ran, nobody waits.
      if (lead) {
        std::printf("tokens %4u x hidden %u = %9s: refused in the shared-GPU test mode: %s\n",
                    tokens, kHidden, arbiter::format_size(bytes).c_str(), result.error.c_str());
      }
      memory->release_all();
      continue;
    }
    std::string problem = result.status == ARBITER_OK ? "" : result.error;
    if (problem.empty()) {
      memory->fetch(residual_out.data(), a.residual_out, bytes);
      memory->fetch(norm_out.data(), a.norm_out, bytes);
      arbiter::common::ReferenceCase c;
      c.pattern = a.pattern;
      c.dtype = a.dtype;
      c.tokens = tokens;
      c.hidden = kHidden;
      for (const auto& in : inputs) c.inputs.push_back(in.data());
      c.residual_in = residual.data();
      c.gamma = gamma.data();
      c.eps = a.eps;
      const arbiter::common::ReferenceOutputs ref = arbiter::common::compute_reference(c);
      problem = arbiter::common::check_output(residual_out.data(), a.dtype, ref.residual,
                                              ref.residual_bound, kHidden, "residual_out");
      if (problem.empty()) {
        problem = arbiter::common::check_output(norm_out.data(), a.dtype, ref.norm, ref.norm_bound,
                                                kHidden, "norm_out");
      }
    }
    memory->release_all();
    // Every rank must hold the same bits.
    const std::uint64_t mine = hash(norm_out.data(), bytes) ^ hash(residual_out.data(), bytes);
    std::vector<std::uint64_t> all(static_cast<std::size_t>(boot.world_size()));
    if (!boot.allgather(&mine, all.data(), sizeof mine, std::chrono::seconds(60)).ok()) {
      throw std::runtime_error("allgather of result hashes failed");
    }
    for (std::uint64_t h : all) {
      if (h != all[0] && problem.empty()) problem = "ranks hold different bits";
    }
    if (!problem.empty()) ++failures;
    if (lead || !problem.empty()) {
      std::printf("tokens %4u x hidden %u = %9s: %s %s %s -> %s\n", tokens, kHidden,
                  arbiter::format_size(bytes).c_str(),
                  std::string(arbiter::backend_name(d.backend)).c_str(),
                  std::string(arbiter::algorithm_name(d.algorithm)).c_str(),
                  d.fused ? "fused" : "unfused", problem.empty() ? "OK" : problem.c_str());
    }
  }
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "arbiter-example-fused: " << e.what() << "\n";
  return 1;
}
