// The nccl module on a GPU, through its ABI as the host drives it, against
// the common CPU reference (arbiter/common/reference.h). Every case skips
// with the reason where the GPUs it needs are missing.
//
// NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU
// detected"), so sums over several ranks need as many GPUs; on one GPU the
// epilogue is checked through a one-rank communicator, and the two-rank
// paths are checked for failing together. NVFP4 runs from capability 100
// on; below it, the cases that run it skip and one checks it is refused.
#define BOOST_TEST_MODULE backends_nccl_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/common/reference.h"
#include "arbiter/nccl/call_rules.h"
#include "arbiter_backend.h"
#include "in_place_layouts.h"
#include "module.h"
#include "thread_oob.h"

namespace {

namespace utf = boost::unit_test;
namespace common = arbiter::common;
using Bytes = std::vector<std::uint8_t>;

// ------------------------------------------------------------ preconditions

struct NeedsGpus {
  int count;
  boost::test_tools::assertion_result operator()(utf::test_unit_id) const {
    int n = 0;  // a failing cudaGetDeviceCount leaves it unchanged
    const cudaError_t e = cudaGetDeviceCount(&n);
    boost::test_tools::assertion_result ok(e == cudaSuccess && n >= count);
    if (e != cudaSuccess) {
      ok.message() << "no CUDA device: " << cudaGetErrorString(e);
    } else if (n < count) {
      ok.message() << "needs " << count << " GPU(s), " << n << " visible";
    }
    return ok;
  }
};

// Capability of device 0 (major * 10 + minor); 0 when it cannot be read.
std::uint32_t device_capability() {
  int major = 0;
  int minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    return 0;
  }
  return static_cast<std::uint32_t>(major * 10 + minor);
}

constexpr std::uint32_t kMinNvfp4Capability = 100;

// One GPU, and device 0 on the side of capability 100 the case is about:
// NVFP4 runs from 100 on (nvfp4 = true), and is refused below it.
struct NeedsNvfp4Device {
  bool nvfp4;
  boost::test_tools::assertion_result operator()(utf::test_unit_id id) const {
    boost::test_tools::assertion_result gpu = NeedsGpus{1}(id);
    if (!gpu) return gpu;
    const std::uint32_t capability = device_capability();
    boost::test_tools::assertion_result ok((capability >= kMinNvfp4Capability) == nvfp4);
    if (nvfp4) {
      ok.message() << "NVFP4 needs capability >= " << kMinNvfp4Capability << "; device 0 is "
                   << capability;
    } else {
      ok.message() << "checks the refusal below capability " << kMinNvfp4Capability
                   << "; device 0 is " << capability;
    }
    return ok;
  }
};

// Loaded once for the whole process, as the host keeps it.
const arbiter::test::NcclModule& module() {
  static const arbiter::test::NcclModule loaded;
  return loaded;
}

// Boost.Test assertions are not thread-safe: the main thread checks the
// module once per case with require_module(); rank threads only call api().
void require_module() { BOOST_REQUIRE_MESSAGE(module().api() != nullptr, module().error()); }

const arbiter_backend_v1_t& api() { return *module().api(); }

#define CUDA_REQUIRE(call)                                                             \
  do {                                                                                 \
    const cudaError_t e_ = (call);                                                     \
    BOOST_REQUIRE_MESSAGE(e_ == cudaSuccess, #call << ": " << cudaGetErrorString(e_)); \
  } while (0)

// ------------------------------------------------------------ cases and data

struct Case {
  arbiter_pattern pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  arbiter_dtype dtype = ARBITER_DTYPE_BF16;
  std::uint32_t tokens = 1;
  std::uint32_t hidden = 2880;
  float weight_bias = 0.0f;
  float scale = 0.008f;            // FP8: dequant scale (some values saturate); NVFP4: global
  bool linear_scales = false;      // NVFP4: linear scale factors, else 128x4 swizzled
  bool allreduce_out = false;      // norm patterns: also ask for the sum
  bool in_place_residual = false;  // residual_out == residual_in
  bool no_residual = false;        // residual_in NULL: a first block, x = the sum
  bool no_residual_out = false;    // residual_out NULL: x is not wanted
  bool norm_out = true;            // FP8 pattern: also ask for the norm
  bool pdl = false;
  bool misaligned = false;  // every buffer one element off 16 bytes
  bool capture = false;     // inside CUDA-graph capture, replayed twice (so never in-place)
  // Outputs over input and residual_in as this layout says (overrides
  // allreduce_out, in_place_residual and norm_out; never with capture).
  const arbiter::test::InPlaceLayout* layout = nullptr;

  std::string name() const {
    std::ostringstream s;
    s << "pattern " << pattern << " dtype " << dtype << " tokens " << tokens << " hidden " << hidden
      << (weight_bias != 0.0f ? " gemma" : "") << (allreduce_out ? " +allreduce_out" : "")
      << (in_place_residual ? " in-place" : "") << (no_residual ? " no-residual_in" : "")
      << (no_residual_out ? " no-residual_out" : "") << (norm_out ? "" : " no-norm_out")
      << (pdl ? " pdl" : "") << (misaligned ? " misaligned" : "") << (capture ? " graph" : "");
    if (fp4()) s << (linear_scales ? " linear-scales" : " swizzled-scales");
    if (layout != nullptr) {
      s << " in-place layout " << (layout - arbiter::test::kInPlaceLayouts);
    }
    return s.str();
  }
  bool fp4() const { return pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4; }
  std::size_t elements() const { return std::size_t{tokens} * hidden; }
  std::size_t bytes() const { return elements() * common::dtype_size(dtype); }
  // quant_out: FP8 a byte per element, NVFP4 two elements a byte.
  std::size_t quant_bytes() const { return fp4() ? elements() / 2 : elements(); }
  // scale_out as allocated: the swizzled size, which covers the linear one;
  // all of it is read back, so a write past the layout's end shows.
  std::size_t scale_bytes() const {
    return common::swizzled_128x4_bytes(tokens, common::nvfp4_blocks_per_row(hidden));
  }
};

// The global scale of the NVFP4 cases: scale factors of blocks with amax
// near 3 land mid-range in e4m3 (512 * 3 / 6 = 256).
constexpr float kNvfp4GlobalScale = 512.0f;

struct HostData {
  std::vector<Bytes> inputs;  // one per rank
  Bytes residual;             // the same on every rank, as in a model
  Bytes gamma;
};

Bytes random_values(std::size_t n, arbiter_dtype dtype, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Bytes out(n * common::dtype_size(dtype));
  for (std::size_t i = 0; i < n; ++i) common::store_element(out.data(), i, dtype, dist(rng));
  return out;
}

HostData make_data(const Case& c, int ranks, unsigned seed) {
  std::mt19937 rng(seed);
  HostData d;
  for (int r = 0; r < ranks; ++r)
    d.inputs.push_back(random_values(c.elements(), c.dtype, -1, 1, rng));
  d.residual = random_values(c.elements(), c.dtype, -1, 1, rng);
  d.gamma = random_values(c.hidden, c.dtype, 0.5f, 1.5f, rng);
  return d;
}

struct Outputs {
  Bytes allreduce_out, residual_out, norm_out, quant_out, scale_out;
  bool operator==(const Outputs& o) const {
    return allreduce_out == o.allreduce_out && residual_out == o.residual_out &&
           norm_out == o.norm_out && quant_out == o.quant_out && scale_out == o.scale_out;
  }
};

// "" when `out` matches the reference over every rank's input.
std::string check(const Case& c, const HostData& d, const Outputs& out) {
  common::ReferenceCase rc;
  rc.pattern = c.pattern;
  rc.dtype = c.dtype;
  rc.tokens = c.tokens;
  rc.hidden = c.hidden;
  for (const Bytes& in : d.inputs) rc.inputs.push_back(in.data());
  rc.residual_in = c.no_residual ? nullptr : d.residual.data();
  rc.gamma = d.gamma.data();
  rc.eps = 1e-6f;
  rc.weight_bias = c.weight_bias;
  rc.scale = c.scale;
  rc.linear_scales = c.linear_scales;
  const common::ReferenceOutputs ref = common::compute_reference(rc);
  std::string e;
  if (c.pattern == ARBITER_PATTERN_ALLREDUCE || c.allreduce_out) {
    e = common::check_output(out.allreduce_out.data(), c.dtype, ref.sum, ref.sum_bound, c.hidden,
                             "allreduce_out");
    if (!e.empty() || c.pattern == ARBITER_PATTERN_ALLREDUCE) return e;
  }
  if (!c.no_residual_out) {
    e = common::check_output(out.residual_out.data(), c.dtype, ref.residual, ref.residual_bound,
                             c.hidden, "residual_out");
  }
  if (e.empty() && !out.norm_out.empty()) {
    e = common::check_output(out.norm_out.data(), c.dtype, ref.norm, ref.norm_bound, c.hidden,
                             "norm_out");
  }
  if (e.empty() && c.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) {
    e = common::check_fp8(out.quant_out.data(), ref, c.scale, c.hidden);
  }
  if (e.empty() && c.fp4()) {
    e = common::check_nvfp4(out.quant_out.data(), out.scale_out.data(), rc, ref);
  }
  // Only the layout's own bytes are written: the swizzled padding and what
  // lies past the linear layout keep the 0xFF they were filled with.
  if (e.empty() && c.fp4()) {
    const std::uint32_t blocks = common::nvfp4_blocks_per_row(c.hidden);
    std::vector<bool> used(out.scale_out.size(), false);
    for (std::uint32_t t = 0; t < c.tokens; ++t) {
      for (std::uint32_t b = 0; b < blocks; ++b) {
        used[common::scale_offset(c.linear_scales, t, b, blocks)] = true;
      }
    }
    for (std::size_t i = 0; i < used.size() && e.empty(); ++i) {
      if (!used[i] && out.scale_out[i] != 0xFF) {
        e = "scale_out byte " + std::to_string(i) + " lies outside the layout but was written";
      }
    }
  }
  return e;
}

// ------------------------------------------------------------ one rank

struct DeviceBuffer {
  void* base = nullptr;
  std::size_t offset = 0;
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t bytes, std::size_t offset_bytes) : offset(offset_bytes) {
    if (cudaMalloc(&base, bytes + offset_bytes + 16) != cudaSuccess) {
      base = nullptr;
      return;
    }
    // Unwritten outputs show up as 0xFF bytes (NaN for every dtype).
    cudaMemset(base, 0xFF, bytes + offset_bytes + 16);
  }
  ~DeviceBuffer() {
    if (base != nullptr) cudaFree(base);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return base == nullptr ? nullptr : static_cast<char*>(base) + offset; }
};

Bytes download(const void* p, std::size_t bytes) {
  Bytes out(bytes);
  if (cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) out.clear();
  return out;
}

// Runs case `c` on this rank's workspace; returns the status and fills `out`.
// Called on the rank's thread, with its device current.
int32_t run_case(arbiter_workspace* ws, const Case& c, const HostData& d, int rank, Outputs* out,
                 std::string* error) {
  const std::size_t bytes = c.bytes();
  const std::size_t off = c.misaligned ? common::dtype_size(c.dtype) : 0;
  const bool norm = c.pattern != ARBITER_PATTERN_ALLREDUCE;
  const bool fp8 = c.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  const bool quantised = fp8 || c.fp4();
  DeviceBuffer input(bytes, off), residual(bytes, off), residual_out(bytes, off),
      gamma(c.hidden * common::dtype_size(c.dtype), off), sum(bytes, off), norm_out(bytes, off),
      quant(c.quant_bytes(), off), scale(sizeof(float), 0), scale_out(c.scale_bytes(), 0);
  for (const DeviceBuffer* b :
       {&input, &residual, &residual_out, &gamma, &sum, &norm_out, &quant, &scale, &scale_out}) {
    if (b->base == nullptr) {
      *error = "cudaMalloc failed";
      return -1;
    }
  }
  cudaMemcpy(input.get(), d.inputs[rank].data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(residual.get(), d.residual.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(gamma.get(), d.gamma.data(), d.gamma.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(scale.get(), &c.scale, sizeof(float), cudaMemcpyHostToDevice);

  arbiter_allreduce_args a{};
  a.pattern = c.pattern;
  a.dtype = c.dtype;
  a.algorithm = ARBITER_ALGORITHM_NATIVE;
  a.tokens = c.tokens;
  a.hidden = c.hidden;
  a.flags = (c.pdl ? ARBITER_RUN_PDL : 0u) |
            (c.fp4() && c.linear_scales ? ARBITER_RUN_NVFP4_LINEAR_SCALES : 0u);
  a.input = input.get();
  a.allreduce_out = (!norm || c.allreduce_out) ? sum.get() : nullptr;
  if (norm) {
    a.residual_in = c.no_residual ? nullptr : residual.get();
    a.residual_out = c.no_residual_out     ? nullptr
                     : c.in_place_residual ? residual.get()
                                           : residual_out.get();
    a.gamma = gamma.get();
    a.eps = 1e-6f;
    a.weight_bias = c.weight_bias;
    a.norm_out = (!quantised || c.norm_out) ? norm_out.get() : nullptr;
    if (quantised) {
      a.quant_out = quant.get();
      a.scale = static_cast<const float*>(scale.get());
    }
    if (c.fp4()) a.scale_out = scale_out.get();
  }
  if (c.layout != nullptr) {
    using arbiter::test::place_output;
    const arbiter::test::InPlaceLayout& l = *c.layout;
    a.allreduce_out = place_output(l.allreduce_out, sum.get(), input.get(), residual.get());
    if (norm) {
      a.residual_out =
          place_output(l.residual_out, residual_out.get(), input.get(), residual.get());
      a.norm_out = place_output(l.norm_out, norm_out.get(), input.get(), residual.get());
    }
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    *error = "cudaStreamCreate failed";
    return -1;
  }
  int32_t status = ARBITER_OK;
  cudaError_t ce = cudaSuccess;
  if (c.capture) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ce = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (ce == cudaSuccess) {
      status = api().run(ws, &a, stream);
      ce = cudaStreamEndCapture(stream, &graph);
    }
    if (ce == cudaSuccess && status == ARBITER_OK) ce = cudaGraphInstantiate(&exec, graph, 0);
    if (ce == cudaSuccess && status == ARBITER_OK) {
      // Twice: a replay must not depend on state the first one changed.
      ce = cudaGraphLaunch(exec, stream);
      if (ce == cudaSuccess) ce = cudaGraphLaunch(exec, stream);
    }
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  } else {
    status = api().run(ws, &a, stream);
  }
  if (status != ARBITER_OK) *error = api().last_error();
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (ce != cudaSuccess) {
    *error = std::string("CUDA: ") + cudaGetErrorString(ce);
    return -1;
  }
  if (status != ARBITER_OK) return status;
  if (a.allreduce_out != nullptr) out->allreduce_out = download(a.allreduce_out, bytes);
  if (a.residual_out != nullptr) out->residual_out = download(a.residual_out, bytes);
  if (a.norm_out != nullptr) out->norm_out = download(a.norm_out, bytes);
  if (quantised) out->quant_out = download(a.quant_out, c.quant_bytes());
  if (c.fp4()) out->scale_out = download(a.scale_out, c.scale_bytes());
  return ARBITER_OK;
}

// ------------------------------------------------------------ ranks

constexpr std::uint32_t kNoFp4 = 0x7u;
constexpr std::uint32_t kAllPatterns = 0xFu;

// What the runtime asks for: the patterns wanted that the caps offer.
arbiter_workspace_spec spec_for(int rank, int world_size, int device,
                                std::uint32_t pattern_mask = kNoFp4) {
  arbiter_workspace_spec spec{};
  spec.world_size = world_size;
  spec.rank = rank;
  spec.device = device;
  spec.nodes = 1;
  spec.max_tokens = 0;  // unknown: the scratch is sized from max_message_bytes
  spec.hidden = 0;
  spec.dtype = ARBITER_DTYPE_BF16;
  spec.pattern_mask = pattern_mask;
  spec.max_message_bytes = 1 << 20;
  spec.timeout_ms = 60000;
  return spec;
}

struct RankResult {
  int32_t create_status = -1;
  std::string create_error;
  std::vector<int32_t> run_status;
  std::vector<std::string> run_error;
  std::vector<Outputs> outputs;
};

// Every rank on its own thread: create, run every case, destroy.
std::vector<RankResult> run_ranks(const std::vector<int>& devices,
                                  const std::vector<arbiter_workspace_spec>& specs,
                                  const std::vector<Case>& cases,
                                  const std::vector<HostData>& data) {
  require_module();
  const int n = static_cast<int>(devices.size());
  arbiter::test::ThreadGroup group(n);
  std::vector<RankResult> results(n);
  auto job = [&](int r) {
    RankResult& mine = results[r];
    if (cudaSetDevice(devices[r]) != cudaSuccess) {
      mine.create_error = "test: cudaSetDevice failed";
    }
    const arbiter_oob oob = group.oob(r);
    arbiter_workspace* ws = nullptr;
    mine.create_status = api().workspace_create(&oob, &specs[r], &ws);
    if (mine.create_status != ARBITER_OK) {
      mine.create_error = api().last_error();
      return;
    }
    for (std::size_t i = 0; i < cases.size(); ++i) {
      Outputs out;
      std::string error;
      mine.run_status.push_back(run_case(ws, cases[i], data[i], r, &out, &error));
      mine.run_error.push_back(error);
      mine.outputs.push_back(std::move(out));
    }
    api().workspace_destroy(ws);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(job, r);
  for (auto& t : threads) t.join();
  return results;
}

void check_ranks(const std::vector<RankResult>& results, const std::vector<Case>& cases,
                 const std::vector<HostData>& data) {
  for (std::size_t r = 0; r < results.size(); ++r) {
    BOOST_REQUIRE_MESSAGE(results[r].create_status == ARBITER_OK,
                          "rank " << r << " workspace_create: " << results[r].create_status << " "
                                  << results[r].create_error);
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    BOOST_TEST_CONTEXT("case " << i << ": " << cases[i].name()) {
      for (std::size_t r = 0; r < results.size(); ++r) {
        BOOST_TEST_INFO("rank " << r);
        BOOST_CHECK_MESSAGE(results[r].run_status[i] == ARBITER_OK, results[r].run_error[i]);
        if (results[r].run_status[i] != ARBITER_OK) continue;
        const std::string e = check(cases[i], data[i], results[r].outputs[i]);
        BOOST_CHECK_MESSAGE(e.empty(), e);
        // Every rank ends with the same bits.
        if (r > 0 && results[0].run_status[i] == ARBITER_OK) {
          const Outputs& a = results[0].outputs[i];
          const Outputs& b = results[r].outputs[i];
          BOOST_TEST((a == b));
        }
      }
    }
  }
}

std::vector<HostData> data_for(const std::vector<Case>& cases, int ranks) {
  std::vector<HostData> data;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    data.push_back(make_data(cases[i], ranks, 1234u + static_cast<unsigned>(i)));
  }
  return data;
}

// Every dtype x pattern x hidden size, with the variants rotated through so
// each appears with each dtype. Hidden sizes: 7 and 4099 (no 16-byte packs),
// 1000 (packs, a partial warp for 16-bit types), 2880 (360 or 720 threads:
// partial warps), 16384 (more packs than threads).
std::vector<Case> sweep() {
  std::vector<Case> cases;
  const arbiter_dtype dtypes[] = {ARBITER_DTYPE_FP16, ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP32};
  const arbiter_pattern patterns[] = {ARBITER_PATTERN_ALLREDUCE, ARBITER_PATTERN_RESIDUAL_RMSNORM,
                                      ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8};
  const std::uint32_t hiddens[] = {7, 1000, 2880, 4099, 16384};
  const std::uint32_t tokens[] = {1, 33};
  unsigned k = 0;
  for (arbiter_dtype dtype : dtypes) {
    for (arbiter_pattern pattern : patterns) {
      for (std::uint32_t hidden : hiddens) {
        for (std::uint32_t t : tokens) {
          Case c;
          c.dtype = dtype;
          c.pattern = pattern;
          c.hidden = hidden;
          c.tokens = t;
          c.weight_bias = k % 3 == 1 ? 1.0f : 0.0f;
          c.allreduce_out = k % 4 == 1;
          c.in_place_residual = k % 4 == 2;
          c.no_residual = k % 6 == 5;  // odd k: never in place over residual_in
          // With and without allreduce_out (k % 4 == 1); never in place.
          c.no_residual_out = k % 8 == 1 || k % 8 == 3;
          c.norm_out = k % 5 != 3;
          c.pdl = k % 2 == 1;
          c.misaligned = k % 7 == 4;
          cases.push_back(c);
          ++k;
        }
      }
    }
  }
  return cases;
}

// NVFP4 over both dtypes and hidden sizes 16 (one block), 1008 (63 blocks:
// the swizzled layout pads columns to 4), 2880, 7168 and 16400 (1025
// blocks: more than one block per thread), 1, 33 and 300 tokens (three
// 128-row tiles, the last partial), both scale layouts, the variants
// rotated through.
std::vector<Case> nvfp4_sweep() {
  std::vector<Case> cases;
  unsigned k = 0;
  for (arbiter_dtype dtype : {ARBITER_DTYPE_FP16, ARBITER_DTYPE_BF16}) {
    for (std::uint32_t hidden : {16u, 1008u, 2880u, 7168u, 16400u}) {
      for (std::uint32_t tokens : {1u, 33u, 300u}) {
        for (bool linear : {false, true}) {
          Case c;
          c.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
          c.dtype = dtype;
          c.hidden = hidden;
          c.tokens = tokens;
          c.scale = kNvfp4GlobalScale;
          c.linear_scales = linear;
          c.weight_bias = k % 3 == 1 ? 1.0f : 0.0f;
          c.allreduce_out = k % 4 == 1;
          c.in_place_residual = k % 4 == 2;
          c.no_residual_out = k % 8 == 1 || k % 8 == 3;
          c.norm_out = k % 5 != 3;
          c.pdl = k % 2 == 1;
          cases.push_back(c);
          ++k;
        }
      }
    }
  }
  return cases;
}

}  // namespace

BOOST_AUTO_TEST_CASE(probe_reports_the_device, *utf::precondition(NeedsGpus{1})) {
  require_module();
  arbiter_probe_args args{ARBITER_DEVICE_GPU, 0};
  arbiter_backend_caps caps{};
  BOOST_REQUIRE_MESSAGE(api().probe(&args, &caps) == ARBITER_OK, api().last_error());
  int major = 0;
  int minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  BOOST_TEST(caps.capability == static_cast<std::uint32_t>(major * 10 + minor));
  // A build for the device (the suite is built with the module): the norm
  // patterns, NVFP4 from capability 100 on; and every world size from 1.
  BOOST_TEST(caps.pattern_mask == (caps.capability >= kMinNvfp4Capability ? kAllPatterns : kNoFp4));
  BOOST_TEST(caps.world_size_mask == arbiter::nccl::kWorldSizeMask);
  BOOST_TEST(((caps.world_size_mask >> 1) & 1u) == 1u);
  BOOST_TEST((caps.flags & ARBITER_CAPS_RESIDUAL_OPTIONAL) != 0u);  // first blocks, no zeros
}

BOOST_AUTO_TEST_CASE(one_rank_matches_the_reference, *utf::precondition(NeedsGpus{1})) {
  const std::vector<Case> cases = sweep();
  const std::vector<HostData> data = data_for(cases, 1);
  check_ranks(run_ranks({0}, {spec_for(0, 1, 0)}, cases, data), cases, data);
}

// Larger than the 16 MiB scratch: with residual_out == residual_in the sum
// has nowhere else to go, so the message runs in chunks of whole tokens.
BOOST_AUTO_TEST_CASE(messages_beyond_the_scratch_run_in_chunks, *utf::precondition(NeedsGpus{1})) {
  std::vector<Case> cases(3);
  for (Case& c : cases) {
    c.dtype = ARBITER_DTYPE_FP32;
    c.hidden = 4096;
    c.tokens = 2100;  // 34.4 MB
  }
  cases[0].in_place_residual = true;
  cases[1].pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  cases[1].in_place_residual = true;
  cases[2].allreduce_out = true;
  const std::vector<HostData> data = data_for(cases, 1);
  check_ranks(run_ranks({0}, {spec_for(0, 1, 0)}, cases, data), cases, data);
}

// The aliasing contract (arbiter_backend.h): outputs over input or
// residual_in give the reference's results, in every dtype, also when the
// message runs in chunks (34 MB fp32, above the 16 MiB scratch).
BOOST_AUTO_TEST_CASE(in_place_calls_match_the_reference, *utf::precondition(NeedsGpus{1})) {
  std::vector<Case> cases;
  for (const arbiter::test::InPlaceLayout& layout : arbiter::test::kInPlaceLayouts) {
    for (arbiter_dtype dtype : {ARBITER_DTYPE_FP16, ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP32}) {
      for (std::uint32_t tokens : {33u, 2100u}) {
        if (tokens == 2100 && dtype != ARBITER_DTYPE_FP32) continue;
        Case c;
        c.layout = &layout;
        c.pattern = layout.pattern;
        c.dtype = dtype;
        c.tokens = tokens;
        c.hidden = tokens == 2100 ? 4096 : 2880;
        c.allreduce_out = layout.allreduce_out != arbiter::test::Place::kNone;
        c.norm_out = layout.norm_out != arbiter::test::Place::kNone;
        cases.push_back(c);
      }
    }
  }
  const std::vector<HostData> data = data_for(cases, 1);
  check_ranks(run_ranks({0}, {spec_for(0, 1, 0)}, cases, data), cases, data);
}

BOOST_AUTO_TEST_CASE(runs_inside_cuda_graph_capture, *utf::precondition(NeedsGpus{1})) {
  std::vector<Case> cases(4);
  cases[0].pattern = ARBITER_PATTERN_ALLREDUCE;  // warms NCCL up outside capture
  cases[1].capture = true;
  cases[1].tokens = 17;
  cases[2].capture = true;
  cases[2].pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8;
  cases[2].dtype = ARBITER_DTYPE_FP16;
  cases[2].tokens = 8;
  cases[2].pdl = true;
  cases[3].capture = true;
  cases[3].pattern = ARBITER_PATTERN_ALLREDUCE;
  cases[3].tokens = 5;
  const std::vector<HostData> data = data_for(cases, 1);
  check_ranks(run_ranks({0}, {spec_for(0, 1, 0)}, cases, data), cases, data);
}

BOOST_AUTO_TEST_CASE(run_refuses_what_it_cannot_do, *utf::precondition(NeedsGpus{1})) {
  require_module();
  CUDA_REQUIRE(cudaSetDevice(0));
  arbiter::test::ThreadGroup group(1);
  const arbiter_oob oob = group.oob(0);
  arbiter_workspace_spec spec = spec_for(0, 1, 0);
  spec.pattern_mask = (1u << ARBITER_PATTERN_ALLREDUCE) | (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM);
  arbiter_workspace* ws = nullptr;
  BOOST_REQUIRE_MESSAGE(api().workspace_create(&oob, &spec, &ws) == ARBITER_OK, api().last_error());
  void* buffer = nullptr;
  CUDA_REQUIRE(cudaMalloc(&buffer, 1 << 16));
  arbiter_allreduce_args good{};
  good.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  good.dtype = ARBITER_DTYPE_BF16;
  good.algorithm = ARBITER_ALGORITHM_NATIVE;
  good.tokens = 1;
  good.hidden = 64;
  good.input = good.residual_in = good.gamma = buffer;
  good.residual_out = good.norm_out = static_cast<char*>(buffer) + 4096;
  good.eps = 1e-6f;
  struct Bad {
    const char* what;
    std::function<void(arbiter_allreduce_args&)> edit;
    int32_t status;
  };
  const Bad bad[] = {
      {"fp4 not in pattern_mask", [](auto& a) { a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4; },
       ARBITER_UNSUPPORTED},
      {"fp8 not in pattern_mask", [](auto& a) { a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8; },
       ARBITER_UNSUPPORTED},
      {"unknown pattern", [](auto& a) { a.pattern = static_cast<arbiter_pattern>(9); },
       ARBITER_UNSUPPORTED},
      {"oneshot", [](auto& a) { a.algorithm = ARBITER_ALGORITHM_ONESHOT; }, ARBITER_UNSUPPORTED},
      {"unknown dtype", [](auto& a) { a.dtype = static_cast<arbiter_dtype>(7); },
       ARBITER_UNSUPPORTED},
      {"hidden 0", [](auto& a) { a.hidden = 0; }, ARBITER_INVALID_ARGUMENT},
      {"no input", [](auto& a) { a.input = nullptr; }, ARBITER_INVALID_ARGUMENT},
      {"no gamma", [](auto& a) { a.gamma = nullptr; }, ARBITER_INVALID_ARGUMENT},
      {"no residual_out", [](auto& a) { a.residual_out = nullptr; }, ARBITER_INVALID_ARGUMENT},
      {"no norm_out", [](auto& a) { a.norm_out = nullptr; }, ARBITER_INVALID_ARGUMENT},
      {"allreduce without allreduce_out", [](auto& a) { a.pattern = ARBITER_PATTERN_ALLREDUCE; },
       ARBITER_INVALID_ARGUMENT},
      {"allreduce_out over residual_in",
       [](auto& a) { a.allreduce_out = const_cast<void*>(a.residual_in); },
       ARBITER_INVALID_ARGUMENT},
      {"misaligned gamma", [](auto& a) { a.gamma = static_cast<const char*>(a.gamma) + 1; },
       ARBITER_INVALID_ARGUMENT},
      {"negative eps", [](auto& a) { a.eps = -1.0f; }, ARBITER_INVALID_ARGUMENT},
  };
  for (const Bad& b : bad) {
    arbiter_allreduce_args a = good;
    b.edit(a);
    BOOST_TEST_INFO(b.what);
    BOOST_TEST(api().run(ws, &a, nullptr) == b.status);
    BOOST_TEST(std::strlen(api().last_error()) > 0u);
  }
  arbiter_allreduce_args empty = good;
  empty.tokens = 0;
  BOOST_TEST(api().run(ws, &empty, nullptr) == ARBITER_OK);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  cudaFree(buffer);
  api().workspace_destroy(ws);
}

BOOST_AUTO_TEST_CASE(ranks_that_disagree_on_the_spec_fail_together,
                     *utf::precondition(NeedsGpus{1})) {
  std::vector<arbiter_workspace_spec> specs = {spec_for(0, 2, 0), spec_for(1, 2, 0)};
  specs[1].max_message_bytes *= 2;
  const auto results = run_ranks({0, 0}, specs, {}, {});
  for (const RankResult& r : results) {
    BOOST_TEST(r.create_status == ARBITER_INVALID_ARGUMENT);
    BOOST_CHECK_MESSAGE(r.create_error.find("disagree") != std::string::npos, r.create_error);
  }
}

// NCCL rejects two ranks on one GPU; both ranks must say so, not hang. (Should
// a later NCCL accept it, the ranks must then agree with the reference.)
BOOST_AUTO_TEST_CASE(two_ranks_on_one_gpu_fail_together_or_work, *utf::precondition(NeedsGpus{1})) {
  std::vector<Case> cases(1);
  cases[0].tokens = 4;
  const std::vector<HostData> data = data_for(cases, 2);
  const auto results = run_ranks({0, 0}, {spec_for(0, 2, 0), spec_for(1, 2, 0)}, cases, data);
  BOOST_TEST_MESSAGE("rank 0: " << results[0].create_status << " " << results[0].create_error);
  BOOST_TEST_MESSAGE("rank 1: " << results[1].create_status << " " << results[1].create_error);
  if (results[0].create_status == ARBITER_OK && results[1].create_status == ARBITER_OK) {
    check_ranks(results, cases, data);
    return;
  }
  for (const RankResult& r : results) {
    BOOST_TEST(r.create_status != ARBITER_OK);
    BOOST_TEST(!r.create_error.empty());
  }
}

BOOST_AUTO_TEST_CASE(two_ranks_match_the_reference_on_every_rank,
                     *utf::precondition(NeedsGpus{2})) {
  std::vector<Case> cases = sweep();
  std::uint32_t patterns = kNoFp4;
  if (device_capability() >= kMinNvfp4Capability) {
    const std::vector<Case> nvfp4 = nvfp4_sweep();
    cases.insert(cases.end(), nvfp4.begin(), nvfp4.end());
    patterns = kAllPatterns;
  }
  const std::vector<HostData> data = data_for(cases, 2);
  check_ranks(
      run_ranks({0, 1}, {spec_for(0, 2, 0, patterns), spec_for(1, 2, 1, patterns)}, cases, data),
      cases, data);
}

// ------------------------------------------------------------ NVFP4

BOOST_AUTO_TEST_CASE(nvfp4_matches_the_reference, *utf::precondition(NeedsNvfp4Device{true})) {
  std::vector<Case> cases = nvfp4_sweep();
  // Inside CUDA-graph capture, replayed twice.
  Case graph;
  graph.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  graph.scale = kNvfp4GlobalScale;
  graph.tokens = 130;
  graph.capture = true;
  graph.pdl = true;
  cases.push_back(graph);
  // Outputs over input and residual_in (the FP8 layouts: the quantising ones).
  for (const arbiter::test::InPlaceLayout& layout : arbiter::test::kInPlaceLayouts) {
    if (layout.pattern != ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) continue;
    for (bool linear : {false, true}) {
      Case c;
      c.layout = &layout;
      c.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
      c.scale = kNvfp4GlobalScale;
      c.linear_scales = linear;
      c.tokens = 150;
      c.allreduce_out = layout.allreduce_out != arbiter::test::Place::kNone;
      c.norm_out = layout.norm_out != arbiter::test::Place::kNone;
      cases.push_back(c);
    }
  }
  const std::vector<HostData> data = data_for(cases, 1);
  check_ranks(run_ranks({0}, {spec_for(0, 1, 0, kAllPatterns)}, cases, data), cases, data);
}

// A message beyond the 16 MiB scratch runs in chunks of 1170 tokens (16 MiB
// / 14336-byte rows), which start inside 128-row swizzle tiles: the chunked
// call must write the bits one call over a larger scratch writes, padding
// and all, and match the reference.
BOOST_AUTO_TEST_CASE(nvfp4_chunks_write_what_one_call_writes,
                     *utf::precondition(NeedsNvfp4Device{true})) {
  std::vector<Case> cases;
  for (bool linear : {false, true}) {
    for (bool in_place : {true, false}) {
      Case c;
      c.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
      c.dtype = ARBITER_DTYPE_BF16;
      c.hidden = 7168;
      c.tokens = 2500;  // 35.8 MB: chunks of 1170, 1170 and 160 tokens
      c.scale = kNvfp4GlobalScale;
      c.linear_scales = linear;
      c.in_place_residual = in_place;  // the sum goes to the scratch
      c.allreduce_out = !in_place;
      cases.push_back(c);
    }
  }
  const std::vector<HostData> data = data_for(cases, 1);
  arbiter_workspace_spec chunked = spec_for(0, 1, 0, kAllPatterns);
  BOOST_REQUIRE(arbiter::nccl::scratch_bytes_for(chunked) < cases[0].bytes());
  arbiter_workspace_spec whole = chunked;
  whole.max_message_bytes = std::uint64_t{64} << 20;
  BOOST_REQUIRE(arbiter::nccl::scratch_bytes_for(whole) >= cases[0].bytes());
  const std::vector<RankResult> in_chunks = run_ranks({0}, {chunked}, cases, data);
  const std::vector<RankResult> at_once = run_ranks({0}, {whole}, cases, data);
  check_ranks(in_chunks, cases, data);
  check_ranks(at_once, cases, data);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    BOOST_TEST_CONTEXT("case " << i << ": " << cases[i].name()) {
      BOOST_TEST((in_chunks[0].outputs[i] == at_once[0].outputs[i]));
      BOOST_TEST(!in_chunks[0].outputs[i].scale_out.empty());
    }
  }
}

BOOST_AUTO_TEST_CASE(nvfp4_calls_the_module_cannot_run_are_refused,
                     *utf::precondition(NeedsNvfp4Device{true})) {
  std::vector<Case> cases(3);
  for (Case& c : cases) {
    c.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
    c.scale = kNvfp4GlobalScale;
    c.tokens = 4;
  }
  cases[0].dtype = ARBITER_DTYPE_FP32;
  cases[1].hidden = 2888;  // a multiple of 8, not of 16
  cases[2].misaligned = true;
  const std::vector<HostData> data = data_for(cases, 1);
  const auto results = run_ranks({0}, {spec_for(0, 1, 0, kAllPatterns)}, cases, data);
  BOOST_REQUIRE_MESSAGE(results[0].create_status == ARBITER_OK, results[0].create_error);
  const struct {
    int32_t status;
    const char* words;
  } expected[] = {{ARBITER_UNSUPPORTED, "NVFP4 needs fp16 or bf16 input"},
                  {ARBITER_UNSUPPORTED, "NVFP4 needs hidden % 16 == 0"},
                  {ARBITER_INVALID_ARGUMENT, "is not 16-byte aligned"}};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    BOOST_TEST_INFO(cases[i].name());
    BOOST_TEST(results[0].run_status[i] == expected[i].status);
    BOOST_CHECK_MESSAGE(results[0].run_error[i].find(expected[i].words) != std::string::npos,
                        results[0].run_error[i]);
  }
}

// DESIGN.md section 6: FP4 on SM90 is refused, never run as a no-op. The
// workspace may list NVFP4 (a caller that did not read the caps); the call
// is refused on the host, with the reason, before anything is enqueued.
BOOST_AUTO_TEST_CASE(nvfp4_is_refused_below_capability_100,
                     *utf::precondition(NeedsNvfp4Device{false})) {
  require_module();
  arbiter_probe_args args{ARBITER_DEVICE_GPU, 0};
  arbiter_backend_caps caps{};
  BOOST_REQUIRE_MESSAGE(api().probe(&args, &caps) == ARBITER_OK, api().last_error());
  BOOST_TEST(((caps.pattern_mask >> ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) & 1u) == 0u);

  std::vector<Case> cases(2);
  for (Case& c : cases) {
    c.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
    c.scale = kNvfp4GlobalScale;
    c.tokens = 33;
  }
  cases[1].linear_scales = true;
  const std::vector<HostData> data = data_for(cases, 1);
  const auto results = run_ranks({0}, {spec_for(0, 1, 0, kAllPatterns)}, cases, data);
  BOOST_REQUIRE_MESSAGE(results[0].create_status == ARBITER_OK, results[0].create_error);
  const std::string words =
      "NVFP4 needs capability >= 100 (this device is " + std::to_string(device_capability()) + ")";
  for (std::size_t i = 0; i < cases.size(); ++i) {
    BOOST_TEST_INFO(cases[i].name());
    BOOST_TEST(results[0].run_status[i] == ARBITER_UNSUPPORTED);
    BOOST_CHECK_MESSAGE(results[0].run_error[i].find(words) != std::string::npos,
                        results[0].run_error[i]);
  }
}
