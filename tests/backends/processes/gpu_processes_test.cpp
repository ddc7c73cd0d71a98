// A GPU module with one rank per process: what the loopback suites (every
// rank in one process) cannot reach. trtllm maps its peers through CUDA IPC
// handles, mnnvl exchanges POSIX file descriptors, maps them with the VMM
// API and probes multicast, nccl runs a real multi-process communicator.
// Every dtype and pattern the module offers, one-shot and two-shot (nccl:
// native), is checked against the fp64 reference on every rank, and every
// rank must hold the same bits. A module with registered memory (ABI v2:
// trtllm) also runs calls whose input lies in it, read by the peers through
// their CUDA IPC mappings: two small allocations (so a second part never
// shares a block a peer opened already), in place too, and an allocation
// made after a free (the next alloc closes the freed mappings).
//
//   backends_gpu_processes_test --backend NAME [--ranks N]
//       forks N rank processes (default 2) that meet through shared memory;
//   backends_gpu_processes_test --backend NAME --lonely
//       two ranks, rank 1 never calls: rank 0's kernel must give up after
//       the kernel timeout and print which module and peer it waited for;
//   arbiter launch --nproc N -- backends_gpu_processes_test --backend NAME
//       this process is the rank RANK of WORLD_SIZE and meets the others
//       through the UCX bootstrap (builds with the runtime only).
//
// Rank r uses GPU LOCAL_RANK (r when forked). ARBITER_TEST_SHARED_GPU=1 puts
// every rank on GPU 0 (bench/FUSED.md, "Multi-process GPU tests"): kernels of
// different processes then share the GPU by time slices, slowly but
// correctly; nccl refuses two ranks on one GPU, mnnvl needs multicast, and
// each then skips with the module's reason.
//
// Exit: 0 passed, 1 failed, 77 skipped with the reason. No Boost.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/common/cuda_host.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/common/reference.h"
#include "arbiter_backend.h"
#include "device_buffers.h"
#include "fork_ranks.h"
#include "fused_inputs.h"
#include "gpu_check.h"
#include "module.h"
#ifdef ARBITER_TEST_HAVE_BOOTSTRAP
#include "arbiter/bootstrap.h"
#endif

namespace {

using arbiter::test::Bytes;
using arbiter::test::DeviceBuffer;
namespace common = arbiter::common;

constexpr std::int64_t kTimeoutMs = 120000;
constexpr std::uint32_t kMaxTokens = 64;
constexpr std::uint32_t kMaxHidden = 4096;
constexpr float kEps = 1e-6f;
constexpr const char* kSkip = "skip: ";

struct Options {
  std::string backend;
  int ranks = 2;
  bool lonely = false;  // rank 1 never calls: rank 0 must time out, naming its module
};

bool shared_gpu() {
  const char* v = std::getenv("ARBITER_TEST_SHARED_GPU");
  return v != nullptr && std::string(v) == "1";
}

std::string skip(const std::string& why) { return kSkip + why; }

// One call, as every rank makes it.
struct Case {
  arbiter_dtype dtype;
  arbiter_pattern pattern;
  arbiter_algorithm algorithm;
  std::uint32_t tokens;
  std::uint32_t hidden;
  bool allreduce_out;  // norm patterns: also the sum

  std::string name() const {
    return "dtype " + std::to_string(dtype) + " pattern " + std::to_string(pattern) +
           " algorithm " + std::to_string(algorithm) + " tokens " + std::to_string(tokens) +
           " hidden " + std::to_string(hidden) + (allreduce_out ? " +allreduce_out" : "");
  }
  std::size_t elements() const { return std::size_t{tokens} * hidden; }
  std::size_t bytes() const { return elements() * common::dtype_size(dtype); }
  bool norm() const { return pattern != ARBITER_PATTERN_ALLREDUCE; }
  bool fp8() const { return pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8; }
  bool fp4() const { return pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4; }
  float scale() const { return fp4() ? 512.0f : 0.008f; }
  std::size_t quant_bytes() const { return fp4() ? elements() / 2 : elements(); }
  std::size_t scale_bytes() const {
    return common::swizzled_128x4_bytes(tokens, common::nvfp4_blocks_per_row(hidden));
  }
};

// The call's kind and shape; the buffers are the caller's.
arbiter_allreduce_args args_of(const Case& c) {
  arbiter_allreduce_args a{};
  a.pattern = c.pattern;
  a.dtype = c.dtype;
  a.algorithm = c.algorithm;
  a.tokens = c.tokens;
  a.hidden = c.hidden;
  return a;
}

std::uint32_t seed_of(const Case& c) { return 1000u * c.dtype + 100u * c.pattern + c.tokens; }

Bytes input_of(const Case& c, int rank) {
  return arbiter::test::random_elements(c.elements(), c.dtype, -1.0f, 1.0f,
                                        seed_of(c) + 7u * static_cast<std::uint32_t>(rank), rank);
}

// What one rank's call wrote, downloaded.
struct Outputs {
  Bytes allreduce_out, residual_out, norm_out, quant_out, scale_out;
};

std::uint64_t fnv1a(std::uint64_t h, const Bytes& bytes) {
  for (std::uint8_t b : bytes) h = (h ^ b) * 0x100000001B3ull;
  return h;
}

// Where a registered call's input lies (run_registered), and whether
// norm_out is that input (vLLM's in-place call).
struct Registered {
  const arbiter_backend_memory_v2_t* memory = nullptr;
  std::byte* input = nullptr;
  bool in_place = false;
};

// Runs `c` on this rank (registered: with the input in registered memory);
// checks the outputs against the reference over every rank's input. Returns
// "" or what is wrong; `hash` gets the output bits.
std::string run_case(const arbiter_backend_v1_t& api, arbiter_workspace* ws, const Case& c,
                     int rank, int world_size, cudaStream_t stream, std::uint64_t* hash,
                     const Registered& registered = {}) {
  const Bytes input = input_of(c, rank);
  const Bytes residual =
      arbiter::test::random_elements(c.elements(), c.dtype, -1.0f, 1.0f, seed_of(c) + 999u, -1);
  const Bytes gamma = arbiter::test::random_elements(c.hidden, c.dtype, 0.5f, 1.5f, 77u, -1);
  const float scale = c.scale();
  DeviceBuffer d_input(c.bytes()), d_residual(c.bytes()), d_gamma(gamma.size()), d_sum(c.bytes()),
      d_residual_out(c.bytes()), d_norm(c.bytes()), d_quant(c.elements()),
      d_scales(c.scale_bytes()), d_scale(sizeof(float));
  for (const DeviceBuffer* m : {&d_input, &d_residual, &d_gamma, &d_sum, &d_residual_out, &d_norm,
                                &d_quant, &d_scales, &d_scale}) {
    if (m->get() == nullptr) return "cudaMalloc failed";
  }
  cudaMemcpy(d_input.get(), input.data(), input.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_residual.get(), residual.data(), residual.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_gamma.get(), gamma.data(), gamma.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_scale.get(), &scale, sizeof scale, cudaMemcpyHostToDevice);
  if (registered.memory != nullptr) {
    cudaMemcpy(registered.input, input.data(), input.size(), cudaMemcpyHostToDevice);
  }
  // A copy from pageable memory may still be in flight when cudaMemcpy
  // returns, and the call's stream does not wait for the default stream.
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    return std::string("upload: ") + cudaGetErrorString(e);
  }

  arbiter_allreduce_args a = args_of(c);
  a.input = d_input.get();
  if (registered.memory != nullptr) a.input = registered.input;
  a.allreduce_out = !c.norm() || c.allreduce_out ? d_sum.get() : nullptr;
  if (c.norm()) {
    a.residual_in = d_residual.get();
    a.residual_out = d_residual_out.get();
    a.gamma = d_gamma.get();
    a.eps = kEps;
    a.norm_out = registered.in_place ? registered.input : d_norm.get();
  }
  if (c.fp8() || c.fp4()) {
    a.quant_out = d_quant.get();
    a.scale = static_cast<const float*>(d_scale.get());
  }
  if (c.fp4()) a.scale_out = d_scales.get();
  if (const std::int32_t s = registered.memory != nullptr
                                 ? registered.memory->run_registered(ws, &a, stream)
                                 : api.run(ws, &a, stream);
      s != ARBITER_OK) {
    return "run: status " + std::to_string(s) + ": " + api.last_error();
  }
  // A kernel waiting for a peer that never comes shows up here, not as a hung test.
  if (common::Status s = common::wait_for_stream(stream, kTimeoutMs, "the call"); !s.ok()) {
    return s.message();
  }

  Outputs out;
  auto download = [](const void* from, std::size_t bytes) {
    Bytes b(bytes);
    cudaMemcpy(b.data(), from, bytes, cudaMemcpyDeviceToHost);
    return b;
  };
  if (a.allreduce_out) out.allreduce_out = download(a.allreduce_out, c.bytes());
  if (c.norm()) {
    out.residual_out = download(a.residual_out, c.bytes());
    out.norm_out = download(a.norm_out, c.bytes());
  }
  if (a.quant_out) out.quant_out = download(a.quant_out, c.quant_bytes());
  if (a.scale_out) out.scale_out = download(a.scale_out, c.scale_bytes());

  std::vector<Bytes> inputs;
  common::ReferenceCase rc;
  rc.pattern = c.pattern;
  rc.dtype = c.dtype;
  rc.tokens = c.tokens;
  rc.hidden = c.hidden;
  for (int r = 0; r < world_size; ++r) inputs.push_back(input_of(c, r));
  for (const Bytes& in : inputs) rc.inputs.push_back(in.data());
  rc.residual_in = residual.data();
  rc.gamma = gamma.data();
  rc.eps = kEps;
  rc.scale = scale;
  const common::ReferenceOutputs ref = common::compute_reference(rc);
  std::string e;
  if (!out.allreduce_out.empty()) {
    e = common::check_output(out.allreduce_out.data(), c.dtype, ref.sum, ref.sum_bound, c.hidden,
                             "allreduce_out");
  }
  if (e.empty() && c.norm()) {
    e = common::check_output(out.residual_out.data(), c.dtype, ref.residual, ref.residual_bound,
                             c.hidden, "residual_out");
  }
  if (e.empty() && c.norm()) {
    e = common::check_output(out.norm_out.data(), c.dtype, ref.norm, ref.norm_bound, c.hidden,
                             "norm_out");
  }
  if (e.empty() && c.fp8()) e = common::check_fp8(out.quant_out.data(), ref, scale, c.hidden);
  if (e.empty() && c.fp4()) {
    e = common::check_nvfp4(out.quant_out.data(), out.scale_out.data(), rc, ref);
  }
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const Bytes* b :
       {&out.allreduce_out, &out.residual_out, &out.norm_out, &out.quant_out, &out.scale_out}) {
    h = fnv1a(h, *b);
  }
  *hash = h;
  return e;
}

// run_case, then every rank's output bits compared over the oob.
std::string run_and_compare(const arbiter_backend_v1_t& api, arbiter_workspace* ws, const Case& c,
                            int rank, int world_size, cudaStream_t stream, const arbiter_oob& oob,
                            const Registered& registered = {}) {
  std::uint64_t hash = 0;
  std::string problem = run_case(api, ws, c, rank, world_size, stream, &hash, registered);
  std::vector<std::uint64_t> all(world_size);
  if (problem.empty() &&
      oob.allgather(oob.ctx, &hash, all.data(), sizeof hash, kTimeoutMs) != ARBITER_OK) {
    problem = std::string("oob allgather: ") + oob.last_error(oob.ctx);
  }
  for (int r = 1; problem.empty() && r < world_size; ++r) {
    if (all[r] != all[0]) problem = "rank " + std::to_string(r) + "'s bits differ";
  }
  return problem;
}

// Whether the module on this machine cannot do what the test asks, for a
// reason it names the same on every rank (then the case is a skip).
bool expected_refusal(const std::string& backend, std::int32_t status, const std::string& error) {
  std::string lower = error;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (backend == "nccl") {
    // NCCL refuses two ranks on one GPU ("Duplicate GPU detected", an
    // invalid usage); any other failure (a broken exchange, bad init
    // arguments, a timeout) is a failure. A rank whose own init got past
    // the check hears it from a peer (PEER_FAILED, the peer's reason).
    return shared_gpu() && (status == ARBITER_UNAVAILABLE || status == ARBITER_PEER_FAILED) &&
           (lower.find("invalid usage") != std::string::npos ||
            lower.find("duplicate gpu") != std::string::npos);
  }
  if (backend == "mnnvl") {
    // No multicast here (a single H200): mnnvl must say so, on every rank.
    return (status == ARBITER_UNAVAILABLE || status == ARBITER_UNSUPPORTED) &&
           lower.find("multicast") != std::string::npos;
  }
  return false;
}

// What every rank sets up first: its GPU, the module, what it offers, a
// stream. `outcome` is "" when ready, else a skip or a failure.
struct RankSetup {
  int device = 0;
  std::unique_ptr<arbiter::test::BackendModule> module;
  arbiter_backend_caps caps{};
  cudaStream_t stream = nullptr;
  std::string outcome;

  const arbiter_backend_v1_t& api() const { return *module->api(); }
  ~RankSetup() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

void set_up(const Options& o, int world_size, int local_rank, RankSetup& r) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    r.outcome = skip("no CUDA device");
    return;
  }
  r.device = shared_gpu() ? 0 : local_rank;
  if (r.device >= devices) {
    r.outcome = skip(std::to_string(world_size) + " ranks need " + std::to_string(world_size) +
                     " GPUs, this machine has " + std::to_string(devices) +
                     "; ARBITER_TEST_SHARED_GPU=1 runs them all on GPU 0");
    return;
  }
  if (cudaSetDevice(r.device) != cudaSuccess) {
    r.outcome = "cudaSetDevice failed";
    return;
  }
  r.module = std::make_unique<arbiter::test::BackendModule>(o.backend);
  if (r.module->api() == nullptr) {
    r.outcome = r.module->path() + ": " + r.module->error();
    return;
  }
  arbiter_probe_args probe{ARBITER_DEVICE_GPU, r.device};
  if (r.api().probe(&probe, &r.caps) != ARBITER_OK) {
    r.outcome = skip(o.backend + ": " + r.api().last_error());
  } else if (((r.caps.world_size_mask >> world_size) & 1u) == 0) {
    r.outcome = skip(o.backend + " does not take world size " + std::to_string(world_size));
  } else if (cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking) != cudaSuccess) {
    r.outcome = "cudaStreamCreate failed";
  }
}

// Creates this rank's workspace for `dtype`; "" or a skip or a failure.
std::string create(const Options& o, const RankSetup& r, const arbiter_oob& oob,
                   arbiter_dtype dtype, arbiter_workspace** ws) {
  arbiter_workspace_spec spec{};
  spec.world_size = oob.size;
  spec.rank = oob.rank;
  spec.device = r.device;
  spec.nodes = 1;
  spec.max_tokens = kMaxTokens;
  spec.hidden = kMaxHidden;
  spec.dtype = dtype;
  spec.pattern_mask = r.caps.pattern_mask;
  spec.max_message_bytes = std::uint64_t{kMaxTokens} * kMaxHidden * common::dtype_size(dtype);
  spec.timeout_ms = kTimeoutMs;
  if (const std::int32_t s = r.api().workspace_create(&oob, &spec, ws); s != ARBITER_OK) {
    const std::string error = r.api().last_error();
    if (expected_refusal(o.backend, s, error)) return skip(o.backend + ": " + error);
    return "workspace_create (dtype " + std::to_string(dtype) + "): status " + std::to_string(s) +
           ": " + error;
  }
  return "";
}

// Registered calls (ABI v2) on the bf16 workspace `ws`: one-shot and
// two-shot, plain and residual + RMSNorm, in place too, with the input in
// the first or the second of two 1 MiB allocations (at another offset), then
// in an allocation made after the first was freed. Counts cases in `ran`.
std::string registered_phase(const RankSetup& setup, arbiter_workspace* ws, int rank,
                             int world_size, const arbiter_oob& oob, int* ran) {
  const arbiter_backend_memory_v2_t* memory = setup.module->memory();
  const arbiter_backend_v1_t& api = setup.api();
  constexpr std::uint64_t kPart = std::uint64_t{1} << 20;
  auto failed = [&](const char* what, std::int32_t status) {
    return std::string(what) + ": status " + std::to_string(status) + ": " + api.last_error();
  };
  void* parts[2] = {nullptr, nullptr};
  for (void*& part : parts) {
    if (const std::int32_t s = memory->alloc(ws, kPart, &part); s != ARBITER_OK) {
      return failed("registered alloc", s);
    }
  }
  auto run_all = [&](std::byte* input, const char* where) -> std::string {
    for (arbiter_pattern pattern : {ARBITER_PATTERN_ALLREDUCE, ARBITER_PATTERN_RESIDUAL_RMSNORM}) {
      for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
        for (std::uint32_t tokens : {1u, 33u}) {
          if (algorithm == ARBITER_ALGORITHM_TWOSHOT && tokens < std::uint32_t(world_size))
            continue;
          for (bool in_place : {false, true}) {
            if (in_place && pattern == ARBITER_PATTERN_ALLREDUCE) continue;
            const Case c{ARBITER_DTYPE_BF16, pattern, algorithm, tokens, 2880u, false};
            const std::string problem = run_and_compare(api, ws, c, rank, world_size, setup.stream,
                                                        oob, Registered{memory, input, in_place});
            if (!problem.empty()) {
              return std::string("registered (") + where + (in_place ? ", in place" : "") + ") " +
                     c.name() + ": " + problem;
            }
            ++*ran;
          }
        }
      }
    }
    return "";
  };
  std::string problem = run_all(static_cast<std::byte*>(parts[0]), "first allocation");
  if (problem.empty()) {
    problem = run_all(static_cast<std::byte*>(parts[1]) + 4096, "second allocation, offset 4096");
  }
  if (!problem.empty()) return problem;
  // Free the first; the next alloc reclaims it on every rank.
  if (const std::int32_t s = memory->free(ws, parts[0]); s != ARBITER_OK) {
    return failed("registered free", s);
  }
  void* after = nullptr;
  if (const std::int32_t s = memory->alloc(ws, kPart, &after); s != ARBITER_OK) {
    return failed("registered alloc after a free", s);
  }
  problem = run_all(static_cast<std::byte*>(after), "allocated after a free");
  if (!problem.empty()) return problem;
  for (void* part : {parts[1], after}) {
    if (const std::int32_t s = memory->free(ws, part); s != ARBITER_OK) {
      return failed("registered free", s);
    }
  }
  return "";
}

// One rank: every case of every dtype, each in its own workspace per dtype.
std::string rank_body(const Options& o, int rank, int world_size, int local_rank,
                      const arbiter_oob& oob) {
  RankSetup setup;
  set_up(o, world_size, local_rank, setup);
  if (!setup.outcome.empty()) return setup.outcome;
  const arbiter_backend_v1_t& api = setup.api();
  const arbiter_backend_caps& caps = setup.caps;
  const cudaStream_t stream = setup.stream;
  const int device = setup.device;
  std::vector<arbiter_algorithm> algorithms;
  for (arbiter_algorithm al :
       {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT, ARBITER_ALGORITHM_NATIVE}) {
    if ((caps.algorithm_mask >> al) & 1u) algorithms.push_back(al);
  }
  int ran = 0;
  for (arbiter_dtype dtype : {ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP16, ARBITER_DTYPE_FP32}) {
    arbiter_workspace* ws = nullptr;
    if (std::string e = create(o, setup, oob, dtype, &ws); !e.empty()) return e;
    std::string problem;
    for (arbiter_pattern pattern :
         {ARBITER_PATTERN_ALLREDUCE, ARBITER_PATTERN_RESIDUAL_RMSNORM,
          ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4}) {
      if (((caps.pattern_mask >> pattern) & 1u) == 0) continue;
      if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4 && dtype == ARBITER_DTYPE_FP32) continue;
      for (arbiter_algorithm algorithm : algorithms) {
        for (std::uint32_t tokens : {1u, 5u, 33u}) {
          if (algorithm == ARBITER_ALGORITHM_TWOSHOT && tokens < std::uint32_t(world_size))
            continue;
          for (std::uint32_t hidden : {1024u, 2880u}) {
            const Case c{dtype, pattern, algorithm, tokens, hidden, (tokens + hidden) % 3 == 0};
            problem = run_and_compare(api, ws, c, rank, world_size, stream, oob);
            if (!problem.empty()) {
              problem = c.name() + ": " + problem;
              break;
            }
            ++ran;
          }
          if (!problem.empty()) break;
        }
        if (!problem.empty()) break;
      }
      if (!problem.empty()) break;
    }
    if (problem.empty() && dtype == ARBITER_DTYPE_BF16 && setup.module->memory() != nullptr) {
      problem = registered_phase(setup, ws, rank, world_size, oob, &ran);
    }
    // A failed call may have left peers' kernels waiting: exit without the
    // collective teardown, the parent (or launcher) collects the result.
    if (!problem.empty()) return problem;
    api.workspace_destroy(ws);
  }
  std::printf("%s rank %d of %d (GPU %d): %d cases passed\n", o.backend.c_str(), rank, world_size,
              device, ran);
  std::fflush(stdout);
  return "";
}

// Rank 1 creates its workspace and never calls: rank 0's kernel must give
// up after the kernel timeout (3 s here) with a CUDA error, having printed
// which module and which peer it waited for (device_ops.cuh, Spin).
std::string lonely_body(const Options& o, int rank, int local_rank, const arbiter_oob& oob) {
  setenv("ARBITER_KERNEL_TIMEOUT_MS", "3000", 1);
  RankSetup setup;
  set_up(o, 2, local_rank, setup);
  if (!setup.outcome.empty()) return setup.outcome;
  if (o.backend == "nccl") return skip("nccl's kernels do not wait for peers");
  arbiter_workspace* ws = nullptr;
  if (std::string e = create(o, setup, oob, ARBITER_DTYPE_BF16, &ws); !e.empty()) return e;
  std::string problem;
  if (rank == 0) {
    // Device printf goes to stdout: into a file for the length of the call.
    const char* tmp = std::getenv("TMPDIR");
    std::string path = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/arbiter-lonely-";
    path += "XXXXXX";  // mkstemp's template
    const int file = mkstemp(path.data());
    std::fflush(stdout);
    const int saved = dup(STDOUT_FILENO);
    if (file < 0 || saved < 0 || dup2(file, STDOUT_FILENO) < 0) return "redirecting stdout failed";
    const Case c{
        ARBITER_DTYPE_BF16, ARBITER_PATTERN_ALLREDUCE, ARBITER_ALGORITHM_ONESHOT, 1, 1024, false};
    DeviceBuffer in(c.bytes()), out(c.bytes());
    arbiter_allreduce_args a = args_of(c);
    a.input = in.get();
    a.allreduce_out = out.get();
    const std::int32_t status = setup.api().run(ws, &a, setup.stream);
    const common::Status waited = status == ARBITER_OK
                                      ? common::wait_for_stream(setup.stream, 60000, "the call")
                                      : common::Status();
    std::fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    std::string printed;
    char buffer[4096];
    for (ssize_t n;
         (n = pread(file, buffer, sizeof buffer, static_cast<off_t>(printed.size()))) > 0;) {
      printed.append(buffer, static_cast<std::size_t>(n));
    }
    close(file);
    unlink(path.c_str());
    const std::string expected = "arbiter " + o.backend + ": rank 0 waited over 3000 ms for rank 1";
    if (status != ARBITER_OK) {
      problem = "run: status " + std::to_string(status) + ": " + setup.api().last_error();
    } else if (waited.ok() || waited.code() == ARBITER_TIMEOUT) {
      problem = "the kernel did not give up on the missing rank: " +
                (waited.ok() ? std::string("it finished") : waited.message());
    } else if (printed.find(expected) == std::string::npos) {
      problem = "the kernel failed (" + waited.message() + ") without printing \"" + expected +
                "...\"; it printed: \"" + printed + "\"";
    } else {
      std::printf("%s: rank 0 gave up as expected: %s", o.backend.c_str(), printed.c_str());
    }
  }
  // Rank 1 stays until rank 0 is done. The context of rank 0 is lost: no
  // collective teardown, the processes exit.
  if (oob.barrier(oob.ctx, kTimeoutMs) != ARBITER_OK && problem.empty() && rank == 1) {
    problem = std::string("oob barrier: ") + oob.last_error(oob.ctx);
  }
  return problem;
}

// `results` of ranks first_rank, first_rank + 1, ...: exit code and lines.
int report(const Options& o, int world_size, const std::vector<std::string>& results,
           int first_rank = 0) {
  int failed = 0;
  int skipped = 0;
  for (std::size_t r = 0; r < results.size(); ++r) {
    if (results[r].empty()) continue;
    if (results[r].rfind(kSkip, 0) == 0) {
      ++skipped;
      std::printf("%s, %d processes, rank %zu: %s\n", o.backend.c_str(), world_size, r + first_rank,
                  results[r].c_str());
    } else {
      ++failed;
      std::printf("FAIL %s, %d processes, rank %zu: %s\n", o.backend.c_str(), world_size,
                  r + first_rank, results[r].c_str());
    }
  }
  std::fflush(stdout);
  if (failed != 0) return 1;
  if (skipped == static_cast<int>(results.size())) return arbiter::test::kSkipExitCode;
  if (skipped != 0) {
    std::printf("FAIL %s: some ranks skipped and others ran\n", o.backend.c_str());
    return 1;
  }
  std::printf("%s, %d processes: passed\n", o.backend.c_str(), world_size);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--backend" && i + 1 < argc) {
      o.backend = argv[++i];
    } else if (arg == "--ranks" && i + 1 < argc) {
      o.ranks = std::atoi(argv[++i]);
    } else if (arg == "--lonely") {
      o.lonely = true;
    } else {
      std::fprintf(stderr, "usage: %s --backend trtllm|mnnvl|nccl [--ranks N | --lonely]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.lonely) o.ranks = 2;
  if (o.backend.empty() || o.ranks < 2 || o.ranks > 16) {
    std::fprintf(stderr, "%s: --backend is required and --ranks must be in 2..16\n", argv[0]);
    return 2;
  }
  if (std::getenv("RANK") != nullptr && std::getenv("WORLD_SIZE") != nullptr) {
#ifdef ARBITER_TEST_HAVE_BOOTSTRAP
    try {
      arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment();
      if (o.lonely && boot.world_size() != 2) {
        std::printf("FAIL %s: --lonely needs 2 ranks\n", o.backend.c_str());
        return 1;
      }
      const std::string result =
          o.lonely ? lonely_body(o, boot.rank(), boot.local_rank(), *boot.oob())
                   : rank_body(o, boot.rank(), boot.world_size(), boot.local_rank(), *boot.oob());
      std::vector<std::string> one{result};
      return report(o, boot.world_size(), one, boot.rank());
    } catch (const std::exception& e) {
      std::printf("FAIL %s: %s\n", o.backend.c_str(), e.what());
      return 1;
    }
#else
    std::fprintf(stderr, "%s: built without the runtime: no UCX bootstrap under a launcher\n",
                 argv[0]);
    return 2;
#endif
  }
  // The parent touches no CUDA before fork: each rank initialises its own.
  const std::vector<std::string> results = arbiter::test::run_ranks(
      o.ranks, std::chrono::seconds(600), [&](int rank, const arbiter_oob& oob) {
        return o.lonely ? lonely_body(o, rank, rank, oob) : rank_body(o, rank, o.ranks, rank, oob);
      });
  return report(o, o.ranks, results);
}
