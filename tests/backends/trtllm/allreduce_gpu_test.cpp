// The trtllm module on one GPU in loopback mode (N virtual ranks, one stream
// each), through its ABI as the host drives it, against the common CPU
// reference (arbiter/common/reference.h). Exits 77 (ctest: skipped) with the
// reason where there is no CUDA device.
//
// For every world size (2, 4, 8, 16) and dtype, one workspace group runs
// every pattern (NVFP4 with linear and swizzled scales; quantising patterns
// with and without norm_out) over a grid of hidden sizes and token counts,
// one-shot and two-shot, and checks that
//  - outputs match the reference (FP8 and NVFP4 dequantised);
//  - every virtual rank gets the same bits, and one-shot the same bits as
//    two-shot (sums in fp32 in rank order on both; only where every rank
//    sends -0.0 may the two differ, in the sign of a zero);
//  - what the module cannot run is refused before launch with the reason
//    (NVFP4 below capability 100, two-shot with fewer tokens than ranks,
//    messages above the workspace's capacity), and nothing hangs after it;
//  - inputs that look like the Lamport sentinel (-0.0) or that flush-to-zero
//    would turn into it (negative subnormals) finish and sum correctly;
//  - 10,000 back-to-back calls and CUDA-graph replays (inputs changed
//    between replays) keep producing the right bits.
// Every wait has a deadline: a hung kernel cannot be recovered, so the test
// names the case and exits.
//
// No Boost: this builds and runs where only CUDA is installed.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"
#include "arbiter/common/reference.h"
#include "arbiter/common/sentinel.h"
#include "arbiter_backend.h"
#include "gpu_check.h"
#include "loopback_group.h"
#include "module.h"

namespace {

namespace common = arbiter::common;
using arbiter::test::LoopbackGroup;
using arbiter::test::Watchdog;
using Bytes = std::vector<std::uint8_t>;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kTestName = "backends_trtllm_gpu_test";

// The workspace of every group: the largest shape of the sweep.
constexpr std::uint32_t kMaxTokens = 1000;
constexpr std::uint32_t kMaxHidden = 8192;
constexpr int kMaxRanks = 16;
constexpr std::uint32_t kMinNvfp4Capability = 100;
constexpr float kEps = 1e-6f;
constexpr float kFp8Scale = 0.008f;  // dequant scale: the largest norms saturate
constexpr float kNvfp4GlobalScale = 512.0f;
// Side buffers (graph and salted cases) hold this many tokens of kMaxHidden.
constexpr std::uint32_t kSideTokens = 32;
constexpr milliseconds kCallLimit{20000};
constexpr int kBackToBackCalls = 10000;
constexpr int kGraphReplays = 100;
constexpr int kGraphInputSets = 4;  // the inputs change every kGraphReplays / kGraphInputSets

const int kWorldSizes[] = {2, 4, 8, 16};
const arbiter_dtype kDtypes[] = {ARBITER_DTYPE_FP16, ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP32};
// 2880: CTAs whose thread count is not a multiple of 32.
const std::uint32_t kHiddens[] = {1024, 2880, 4096, 7168, 8192};
// 1 and 7: fewer tokens than ranks (two-shot refused at larger world sizes).
const std::uint32_t kTokenCounts[] = {1, 7, 128, 1000};

const char* dtype_name(arbiter_dtype dtype) {
  switch (dtype) {
    case ARBITER_DTYPE_FP16:
      return "fp16";
    case ARBITER_DTYPE_BF16:
      return "bf16";
    case ARBITER_DTYPE_FP32:
      return "fp32";
  }
  return "dtype?";
}

const char* pattern_name(arbiter_pattern pattern) {
  switch (pattern) {
    case ARBITER_PATTERN_ALLREDUCE:
      return "allreduce";
    case ARBITER_PATTERN_RESIDUAL_RMSNORM:
      return "residual_rmsnorm";
    case ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8:
      return "residual_rmsnorm_fp8";
    case ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4:
      return "residual_rmsnorm_fp4";
  }
  return "pattern?";
}

const char* algorithm_name(arbiter_algorithm algorithm) {
  switch (algorithm) {
    case ARBITER_ALGORITHM_ONESHOT:
      return "one-shot";
    case ARBITER_ALGORITHM_TWOSHOT:
      return "two-shot";
    case ARBITER_ALGORITHM_NATIVE:
      return "native";
  }
  return "algorithm?";
}

// Runs body(0 .. count-1) on up to one thread per core.
template <class Body>
void parallel_for(std::size_t count, const Body& body) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t workers = std::min<std::size_t>(cores, count);
  if (workers <= 1) {
    for (std::size_t i = 0; i < count; ++i) body(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      for (std::size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) body(i);
    });
  }
  for (std::thread& t : threads) t.join();
}

// ------------------------------------------------------------ inputs

// A subnormal of `dtype`: 16-bit types 0x0001-0x007F (0x8001-0x807F when
// negative), fp32 any non-zero mantissa.
std::uint32_t subnormal_bits(arbiter_dtype dtype, bool negative, std::uint32_t random) {
  if (dtype == ARBITER_DTYPE_FP32) {
    return (negative ? 0x80000000u : 0u) | (1u + random % 0x007FFFFFu);
  }
  return (negative ? 0x8000u : 0u) | (1u + random % 0x7Fu);
}

// `count` uniform values in [lo, hi). With salt_rank >= 0 some are replaced
// by -0.0 and by negative and positive subnormals, at positions that depend
// on the rank: no element is -0.0 on two ranks (3 x rank differs mod 61 for
// ranks < 16), so every sum has a term that is not -0.0 and one-shot (which
// sends +0.0 for -0.0) and two-shot must agree bit for bit.
Bytes random_elements(std::size_t count, arbiter_dtype dtype, float lo, float hi,
                      std::uint32_t seed, int salt_rank) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Bytes out(count * common::dtype_size(dtype));
  const std::size_t r = salt_rank < 0 ? 0 : static_cast<std::size_t>(salt_rank);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t bits = common::float_to_dtype_bits(dist(rng), dtype);
    if (salt_rank >= 0) {
      if ((i + 3 * r) % 61 == 0) {
        bits = common::negative_zero_bits(dtype);
      } else if ((i + 5 * r) % 97 == 1) {
        bits = subnormal_bits(dtype, true, rng());
      } else if ((i + 7 * r) % 89 == 2) {
        bits = subnormal_bits(dtype, false, rng());
      }
    }
    common::store_bits(out.data(), i, dtype, bits);
  }
  return out;
}

// Host copies of the sweep's inputs for one dtype, kMaxTokens x kMaxHidden
// elements each: a tokens x hidden case reads the first tokens x hidden
// elements (the same prefix on the device), so one upload serves every shape.
struct HostInputs {
  std::vector<Bytes> ranks;  // kMaxRanks of them; a group of ws ranks uses the first ws
  Bytes residual;            // the same on every rank, as in a model
  Bytes gamma;               // kMaxHidden elements
};

HostInputs make_inputs(arbiter_dtype dtype) {
  const std::size_t count = std::size_t{kMaxTokens} * kMaxHidden;
  const std::uint32_t seed = 1000u * (static_cast<std::uint32_t>(dtype) + 1);
  HostInputs in;
  in.ranks.resize(kMaxRanks);
  parallel_for(kMaxRanks + 1, [&](std::size_t k) {
    if (k < kMaxRanks) {
      in.ranks[k] = random_elements(count, dtype, -1.0f, 1.0f, seed + static_cast<std::uint32_t>(k),
                                    static_cast<int>(k));
    } else {
      in.residual = random_elements(count, dtype, -1.0f, 1.0f, seed + 100, -1);
    }
  });
  // Around 0 and around 1: fits weight_bias 0 and Gemma's 1 alike.
  in.gamma = random_elements(kMaxHidden, dtype, -0.5f, 1.5f, seed + 200, -1);
  return in;
}

// Host pointers to what one call reads (row-major tokens x hidden).
struct HostView {
  std::vector<const std::uint8_t*> inputs;  // one per rank
  const std::uint8_t* residual = nullptr;
  const std::uint8_t* gamma = nullptr;
};

// ------------------------------------------------------------ device memory

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&pointer_, bytes) != cudaSuccess) pointer_ = nullptr;
  }
  ~DeviceBuffer() {
    if (pointer_ != nullptr) cudaFree(pointer_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : pointer_(std::exchange(other.pointer_, nullptr)), bytes_(other.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(pointer_, other.pointer_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return pointer_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
};

struct RankBuffers {
  DeviceBuffer input;  // kMaxTokens x kMaxHidden: the sweep's inputs
  DeviceBuffer allreduce_out, residual_out, norm_out, quant_out, scale_out;
  DeviceBuffer side_input;  // kSideTokens x kMaxHidden: graph and salted cases
};

struct SharedBuffers {  // read by every rank
  DeviceBuffer residual, gamma, fp8_scale, nvfp4_scale, side_residual;
};

// Device pointers to what one call reads.
struct DeviceInputs {
  std::vector<const void*> inputs;  // one per rank
  const void* residual = nullptr;
};

// ------------------------------------------------------------ calls

struct Variant {
  arbiter_pattern pattern;
  bool norm_out;       // quantising patterns: also write the un-quantised norm
  bool linear_scales;  // NVFP4: linear scale factors, else 128x4 swizzled
};

const Variant kVariants[] = {
    {ARBITER_PATTERN_ALLREDUCE, false, false},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM, true, false},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, true, false},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, false, false},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, true, true},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, true, false},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, false, true},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4, false, false},
};

// One run() on every rank of a group.
struct Call {
  int world_size = 2;
  arbiter_dtype dtype = ARBITER_DTYPE_BF16;
  std::uint32_t tokens = 1;
  std::uint32_t hidden = 1024;
  Variant variant = kVariants[0];
  arbiter_algorithm algorithm = ARBITER_ALGORITHM_ONESHOT;
  float weight_bias = 0.0f;
  bool allreduce_out = false;  // norm patterns: also write the sum
  bool residual_out = true;    // norm patterns
  bool pdl = false;
  const char* inputs = "sweep";  // names the inputs in messages

  arbiter_pattern pattern() const { return variant.pattern; }
  bool norm() const { return common::pattern_has_norm(pattern()); }
  bool fp8() const { return pattern() == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8; }
  bool fp4() const { return pattern() == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4; }
  bool writes_allreduce_out() const { return !norm() || allreduce_out; }
  bool writes_residual_out() const { return norm() && residual_out; }
  bool writes_norm_out() const {
    return pattern() == ARBITER_PATTERN_RESIDUAL_RMSNORM || ((fp8() || fp4()) && variant.norm_out);
  }
  std::size_t elements() const { return std::size_t{tokens} * hidden; }
  std::size_t element_size() const { return common::dtype_size(dtype); }
  std::size_t bytes() const { return elements() * element_size(); }
  std::size_t quant_bytes() const { return fp8() ? elements() : fp4() ? elements() / 2 : 0; }
  std::uint32_t scale_blocks() const { return common::nvfp4_blocks_per_row(hidden); }
  std::size_t scale_bytes() const {
    if (!fp4()) return 0;
    return variant.linear_scales ? common::linear_scale_bytes(tokens, scale_blocks())
                                 : common::swizzled_128x4_bytes(tokens, scale_blocks());
  }

  std::string name() const {
    std::ostringstream s;
    s << "ws " << world_size << " " << dtype_name(dtype) << " " << pattern_name(pattern()) << " "
      << algorithm_name(algorithm) << " tokens " << tokens << " hidden " << hidden;
    if (fp8() || fp4()) s << (variant.norm_out ? " +norm_out" : " no-norm_out");
    if (fp4()) s << (variant.linear_scales ? " linear-scales" : " swizzled-scales");
    if (norm()) {
      if (weight_bias != 0.0f) s << " weight_bias " << weight_bias;
      if (allreduce_out) s << " +allreduce_out";
      if (!residual_out) s << " no-residual_out";
    }
    if (pdl) s << " pdl";
    s << " [" << inputs << " inputs]";
    return s.str();
  }
};

// The fragment of the message run() must refuse `c` with ("" when only the
// status is known), or nothing when it must run. In the order guards.h
// checks them.
std::optional<std::string> expected_refusal(const Call& c, std::uint32_t capability,
                                            std::uint64_t capacity) {
  if (c.fp4() && capability < kMinNvfp4Capability) {
    return std::string("NVFP4 needs capability >= 100");
  }
  if (c.fp4() && c.dtype == ARBITER_DTYPE_FP32) return std::string("NVFP4");
  if (c.bytes() > capacity) return std::string();
  if (c.algorithm == ARBITER_ALGORITHM_TWOSHOT &&
      c.tokens < static_cast<std::uint32_t>(c.world_size)) {
    return std::string("two-shot needs tokens >= world size");
  }
  return std::nullopt;
}

// One rank's outputs, downloaded; empty where the call does not write.
struct HostOutputs {
  Bytes allreduce_out, residual_out, norm_out, quant_out, scale_out;
};

// Bytes of one output on the host.
struct Span {
  const std::uint8_t* data;
  std::size_t size;
};

Span span(const Bytes& bytes) { return Span{bytes.data(), bytes.size()}; }

enum class Field { kValues, kFp8, kNvfp4, kScales };

bool is_zero_code(std::uint32_t code, Field field, arbiter_dtype dtype) {
  switch (field) {
    case Field::kValues:
      return (code & (dtype == ARBITER_DTYPE_FP32 ? 0x7FFFFFFFu : 0x7FFFu)) == 0;
    case Field::kFp8:
      return (code & 0x7Fu) == 0;
    case Field::kNvfp4:
      return (code & 0x7u) == 0;
    case Field::kScales:
      return false;
  }
  return false;
}

// "" when `got` and `want` hold the same bits (with zero_sign_free, +0.0 and
// -0.0 count as the same); otherwise where they first differ.
std::string first_difference(Span got, Span want, Field field, const Call& c, bool zero_sign_free) {
  if (got.size != want.size) {
    return "sizes differ (" + std::to_string(got.size) + " vs " + std::to_string(want.size) +
           " bytes)";
  }
  if (got.size == 0 || std::memcmp(got.data, want.data, got.size) == 0) return "";
  const std::size_t codes = field == Field::kValues  ? got.size / c.element_size()
                            : field == Field::kNvfp4 ? got.size * 2
                                                     : got.size;
  for (std::size_t i = 0; i < codes; ++i) {
    std::uint32_t a = 0;
    std::uint32_t b = 0;
    if (field == Field::kValues) {
      a = common::load_bits(got.data, i, c.dtype);
      b = common::load_bits(want.data, i, c.dtype);
    } else if (field == Field::kNvfp4) {
      a = (got.data[i / 2] >> ((i % 2) * 4)) & 0xFu;
      b = (want.data[i / 2] >> ((i % 2) * 4)) & 0xFu;
    } else {
      a = got.data[i];
      b = want.data[i];
    }
    if (a == b) continue;
    if (zero_sign_free && is_zero_code(a, field, c.dtype) && is_zero_code(b, field, c.dtype)) {
      continue;
    }
    std::ostringstream text;
    text << (field == Field::kScales ? "byte " : "element ") << i;
    if (field != Field::kScales) text << " (token " << i / c.hidden << ", " << i % c.hidden << ")";
    text << ": 0x" << std::hex << a << " vs 0x" << b;
    return text.str();
  }
  return "";
}

// The scale factors in linear layout, whatever layout `c` wrote.
// REQUIRES: `written` holds c.scale_bytes() bytes.
Bytes linear_scales(const Call& c, const std::uint8_t* written) {
  if (c.variant.linear_scales) return Bytes(written, written + c.scale_bytes());
  const std::uint32_t blocks = c.scale_blocks();
  Bytes out(common::linear_scale_bytes(c.tokens, blocks));
  for (std::uint32_t t = 0; t < c.tokens; ++t) {
    for (std::uint32_t b = 0; b < blocks; ++b) {
      out[common::linear_scale_offset(t, b, blocks)] =
          written[common::swizzled_128x4_offset(t, b, blocks)];
    }
  }
  return out;
}

// Checks that output `name` of `got` has the bits of `want`. Swizzled scale
// factors are compared in linear layout: the swizzled padding holds no values.
void compare_field(const char* name, Span got, Span want, Field field, const Call& c,
                   bool zero_sign_free, const std::string& context) {
  std::string e = first_difference(got, want, field, c, zero_sign_free);
  if (!e.empty() && field == Field::kScales && !c.variant.linear_scales &&
      got.size == c.scale_bytes() && want.size == c.scale_bytes()) {
    e = first_difference(span(linear_scales(c, got.data)), span(linear_scales(c, want.data)), field,
                         c, false);
    if (!e.empty()) e += " (in linear layout)";
  }
  ARBITER_CHECK(e.empty(), context, name << " differs at " << e);
}

Field quant_field(const Call& c) { return c.fp4() ? Field::kNvfp4 : Field::kFp8; }

// Checks that `got` has the bits of `want`, output by output.
void compare_outputs(const HostOutputs& got, const HostOutputs& want, const Call& c,
                     bool zero_sign_free, const std::string& context) {
  const struct {
    const char* name;
    const Bytes& got;
    const Bytes& want;
    Field field;
  } fields[] = {{"allreduce_out", got.allreduce_out, want.allreduce_out, Field::kValues},
                {"residual_out", got.residual_out, want.residual_out, Field::kValues},
                {"norm_out", got.norm_out, want.norm_out, Field::kValues},
                {"quant_out", got.quant_out, want.quant_out, quant_field(c)},
                {"scale_out", got.scale_out, want.scale_out, Field::kScales}};
  for (const auto& f : fields) {
    compare_field(f.name, span(f.got), span(f.want), f.field, c, zero_sign_free, context);
  }
}

[[noreturn]] void fail_and_exit(const std::string& context, const std::string& message) {
  arbiter::test::check(false, context, message);
  arbiter::test::finish(kTestName);
  std::_Exit(1);
}

// Page-locked host memory: device-to-host copies into it run at full speed.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) {
    if (cudaMallocHost(&pointer_, bytes) != cudaSuccess) pointer_ = nullptr;
  }
  ~PinnedBuffer() {
    if (pointer_ != nullptr) cudaFreeHost(pointer_);
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept : pointer_(std::exchange(other.pointer_, nullptr)) {}
  PinnedBuffer& operator=(PinnedBuffer&&) = delete;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  std::uint8_t* get() const { return static_cast<std::uint8_t*>(pointer_); }

 private:
  void* pointer_ = nullptr;
};

// The device buffers of one rank's call that hold outputs, as HostOutputs
// names them.
struct OutputField {
  const char* name;
  const void* device;
  std::size_t bytes;
  Bytes HostOutputs::*host;
  Field field;
};

std::vector<OutputField> output_fields(const arbiter_allreduce_args& a, const Call& c) {
  return {
      {"allreduce_out", a.allreduce_out, c.bytes(), &HostOutputs::allreduce_out, Field::kValues},
      {"residual_out", a.residual_out, c.bytes(), &HostOutputs::residual_out, Field::kValues},
      {"norm_out", a.norm_out, c.bytes(), &HostOutputs::norm_out, Field::kValues},
      {"quant_out", a.quant_out, c.quant_bytes(), &HostOutputs::quant_out, quant_field(c)},
      {"scale_out", a.scale_out, c.scale_bytes(), &HostOutputs::scale_out, Field::kScales}};
}

// Copies `bytes` of device memory to `staging`; a failure (the CUDA context
// is then unusable) ends the test.
void copy_to_host(std::uint8_t* staging, const void* device, std::size_t bytes,
                  const std::string& context) {
  const cudaError_t e = cudaMemcpy(staging, device, bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    fail_and_exit(context, std::string("download: ") + cudaGetErrorString(e) +
                               " (the CUDA context is unusable)");
  }
}

// The outputs `a` names, through `staging` (at least c.bytes() bytes).
HostOutputs download(const arbiter_allreduce_args& a, const Call& c, std::uint8_t* staging,
                     const std::string& context) {
  HostOutputs out;
  for (const OutputField& f : output_fields(a, c)) {
    if (f.device == nullptr || f.bytes == 0) continue;
    copy_to_host(staging, f.device, f.bytes, context);
    (out.*f.host).assign(staging, staging + f.bytes);
  }
  return out;
}

// Checks that the outputs `a` names have the bits of `want`, copying them
// through `staging` (at least c.bytes() bytes).
void compare_device_outputs(const arbiter_allreduce_args& a, const Call& c, const HostOutputs& want,
                            std::uint8_t* staging, const std::string& context) {
  for (const OutputField& f : output_fields(a, c)) {
    if (f.device == nullptr || f.bytes == 0) continue;
    copy_to_host(staging, f.device, f.bytes, context);
    compare_field(f.name, Span{staging, f.bytes}, span(want.*f.host), f.field, c, false, context);
  }
}

// A call that ran, with the bits every rank and algorithm agreed on.
struct Result {
  Call call;
  HostOutputs out;
  Bytes scales;  // NVFP4: scale_out in linear layout
};

// Checks tokens [t0, t0 + ref tokens) of `r` against the reference.
void check_chunk(const Result& r, const common::ReferenceCase& rc,
                 const common::ReferenceOutputs& ref, std::uint32_t t0) {
  const Call& c = r.call;
  std::ostringstream context_text;
  context_text << c.name();
  if (t0 != 0 || rc.tokens != c.tokens) {
    context_text << " (tokens " << t0 << "-" << t0 + rc.tokens - 1
                 << "; token numbers below count from " << t0 << ")";
  }
  const std::string context = context_text.str();
  const std::size_t first = std::size_t{t0} * c.hidden;
  const std::size_t offset = first * c.element_size();
  if (c.writes_allreduce_out()) {
    const std::string e = common::check_output(r.out.allreduce_out.data() + offset, c.dtype,
                                               ref.sum, ref.sum_bound, c.hidden, "allreduce_out");
    ARBITER_CHECK(e.empty(), context, e);
  }
  if (!c.norm()) return;
  if (c.writes_residual_out()) {
    const std::string e =
        common::check_output(r.out.residual_out.data() + offset, c.dtype, ref.residual,
                             ref.residual_bound, c.hidden, "residual_out");
    ARBITER_CHECK(e.empty(), context, e);
  }
  if (c.writes_norm_out()) {
    const std::string e = common::check_output(r.out.norm_out.data() + offset, c.dtype, ref.norm,
                                               ref.norm_bound, c.hidden, "norm_out");
    ARBITER_CHECK(e.empty(), context, e);
  }
  if (c.fp8()) {
    const std::string e =
        common::check_fp8(r.out.quant_out.data() + first, ref, kFp8Scale, c.hidden);
    ARBITER_CHECK(e.empty(), context, e);
  }
  if (c.fp4()) {
    common::ReferenceCase nvfp4 = rc;
    nvfp4.scale = kNvfp4GlobalScale;
    nvfp4.linear_scales = true;  // r.scales is linear
    const std::string e = common::check_nvfp4(
        r.out.quant_out.data() + first / 2,
        r.scales.data() + common::linear_scale_offset(t0, 0, c.scale_blocks()), nvfp4, ref);
    ARBITER_CHECK(e.empty(), context, e);
  }
}

// Checks every result (all of one shape, dtype, weight_bias and inputs)
// against one reference, computed and compared in token chunks in parallel.
void check_results(const std::vector<Result>& results, const HostView& view) {
  if (results.empty()) return;
  const Call& c0 = results.front().call;
  bool any_norm = false;
  for (const Result& r : results) any_norm = any_norm || r.call.norm();
  const std::uint32_t chunk = std::max<std::uint32_t>(1, (c0.tokens + 63) / 64);
  const std::size_t chunks = (c0.tokens + chunk - 1) / chunk;
  parallel_for(chunks, [&](std::size_t k) {
    const std::uint32_t t0 = static_cast<std::uint32_t>(k) * chunk;
    const std::uint32_t t1 = std::min(c0.tokens, t0 + chunk);
    const std::size_t offset = std::size_t{t0} * c0.hidden * c0.element_size();
    common::ReferenceCase rc;
    rc.pattern = any_norm ? ARBITER_PATTERN_RESIDUAL_RMSNORM : ARBITER_PATTERN_ALLREDUCE;
    rc.dtype = c0.dtype;
    rc.tokens = t1 - t0;
    rc.hidden = c0.hidden;
    for (int r = 0; r < c0.world_size; ++r) rc.inputs.push_back(view.inputs[r] + offset);
    rc.residual_in = view.residual + offset;
    rc.gamma = view.gamma;
    rc.eps = kEps;
    rc.weight_bias = c0.weight_bias;
    const common::ReferenceOutputs ref = common::compute_reference(rc);
    for (const Result& r : results) check_chunk(r, rc, ref, t0);
  });
}

// ------------------------------------------------------------ one group

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
  GroupRunner(const arbiter_backend_v1_t& api, arbiter_dtype dtype, int world_size,
              std::uint32_t capability, const HostInputs& inputs,
              const std::vector<PinnedBuffer>& staging, Watchdog& watchdog)
      : api_(api),
        dtype_(dtype),
        world_size_(world_size),
        capability_(capability),
        inputs_(inputs),
        staging_(staging),
        watchdog_(watchdog),
        capacity_(std::uint64_t{kMaxTokens} * kMaxHidden * common::dtype_size(dtype)),
        group_(create_group()) {
    watchdog_.disarm();  // armed by create_group()
  }

  void run_all(std::size_t group_index) {
    const auto start = std::chrono::steady_clock::now();
    const long failures_before = arbiter::test::failure_count();
    const std::string name = "ws " + std::to_string(world_size_) + " " + dtype_name(dtype_);
    if (!ARBITER_CHECK(group_.ok(), name,
                       "workspace_create: status " << group_.status() << ": " << group_.error())) {
      return;
    }
    if (!allocate(name)) return;
    check_capacity(name);
    std::size_t shape = 0;
    for (std::uint32_t hidden : kHiddens) {
      for (std::uint32_t tokens : kTokenCounts) sweep_shape(hidden, tokens, group_index + shape++);
    }
    back_to_back();
    graph_replays();
    salted();
    oversized();
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "%s: %ld calls (%ld ran and checked, %ld refused as expected), %ld back-to-back calls, "
        "%ld graph replays, %ld failures, %.1f s\n",
        name.c_str(), stats_.calls, stats_.ran, stats_.refused, stats_.back_to_back,
        stats_.graph_replays, arbiter::test::failure_count() - failures_before, elapsed);
    std::fflush(stdout);
  }

 private:
  LoopbackGroup create_group() {
    arbiter_workspace_spec spec{};
    spec.world_size = world_size_;
    spec.rank = 0;
    spec.device = 0;
    spec.nodes = 1;
    spec.max_tokens = kMaxTokens;
    spec.hidden = kMaxHidden;
    spec.dtype = dtype_;
    spec.pattern_mask = 0xFu;
    spec.max_message_bytes = capacity_;
    spec.timeout_ms = 60000;
    watchdog_.arm("workspace_create, ws " + std::to_string(world_size_) + " " + dtype_name(dtype_),
                  seconds(180));
    return LoopbackGroup(api_, spec);
  }

  bool allocate(const std::string& name) {
    const std::size_t elements = std::size_t{kMaxTokens} * kMaxHidden;
    const std::size_t bytes = elements * common::dtype_size(dtype_);
    const std::size_t side = std::size_t{kSideTokens} * kMaxHidden * common::dtype_size(dtype_);
    const std::size_t scales =
        common::swizzled_128x4_bytes(kMaxTokens, common::nvfp4_blocks_per_row(kMaxHidden));
    bool ok = true;
    for (int r = 0; r < world_size_; ++r) {
      RankBuffers b;
      b.input = DeviceBuffer(bytes);
      b.allreduce_out = DeviceBuffer(bytes);
      b.residual_out = DeviceBuffer(bytes);
      b.norm_out = DeviceBuffer(bytes);
      b.quant_out = DeviceBuffer(elements);
      b.scale_out = DeviceBuffer(scales);
      b.side_input = DeviceBuffer(side);
      for (const DeviceBuffer* d : {&b.input, &b.allreduce_out, &b.residual_out, &b.norm_out,
                                    &b.quant_out, &b.scale_out, &b.side_input}) {
        ok = ok && d->get() != nullptr;
      }
      ranks_.push_back(std::move(b));
    }
    shared_.residual = DeviceBuffer(bytes);
    shared_.gamma = DeviceBuffer(kMaxHidden * common::dtype_size(dtype_));
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
    for (int r = 0; r < world_size_; ++r) {
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

  HostView sweep_view() const {
    HostView view;
    for (int r = 0; r < world_size_; ++r) view.inputs.push_back(inputs_.ranks[r].data());
    view.residual = inputs_.residual.data();
    view.gamma = inputs_.gamma.data();
    return view;
  }

  Call base_call() const {
    Call c;
    c.world_size = world_size_;
    c.dtype = dtype_;
    return c;
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
      a.residual_in = in.residual;
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

  // Fills every output of `a` with 0xFF bytes (NaN in every dtype and in
  // e4m3) on `stream`, so an element the call does not write shows.
  static cudaError_t clear_outputs(const arbiter_allreduce_args& a, const Call& c,
                                   cudaStream_t stream) {
    const std::pair<void*, std::size_t> outputs[] = {{a.allreduce_out, c.bytes()},
                                                     {a.residual_out, c.bytes()},
                                                     {a.norm_out, c.bytes()},
                                                     {a.quant_out, c.quant_bytes()},
                                                     {a.scale_out, c.scale_bytes()}};
    cudaError_t e = cudaSuccess;
    for (const auto& [pointer, bytes] : outputs) {
      if (pointer != nullptr && bytes != 0 && e == cudaSuccess) {
        e = cudaMemsetAsync(pointer, 0xFF, bytes, stream);
      }
    }
    return e;
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

  // Runs `c` on every rank and waits. Returns rank 0's outputs after checking
  // that every other rank has the same bits; nothing when the call was
  // refused (expected or not).
  std::optional<HostOutputs> execute(const Call& c, const DeviceInputs& in) {
    const std::string name = c.name();
    const std::optional<std::string> refusal = expected_refusal(c, capability_, capacity_);
    std::vector<arbiter_allreduce_args> args;
    cudaError_t e = cudaSuccess;
    for (int r = 0; r < world_size_; ++r) {
      args.push_back(args_for(c, r, in));
      // Not for refused calls: an oversized one does not fit the buffers.
      if (!refusal && e == cudaSuccess) e = clear_outputs(args[r], c, group_.stream(r));
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

  std::uint8_t* staging(int rank) const { return staging_[rank].get(); }

  // Checks that every rank but 0 has the bits of `want` (rank 0's), ranks in
  // parallel.
  void compare_ranks(const std::vector<arbiter_allreduce_args>& args, const Call& c,
                     const HostOutputs& want, const std::string& context) {
    parallel_for(static_cast<std::size_t>(world_size_ - 1), [&](std::size_t k) {
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
    for (const Variant& v : kVariants) {
      const std::size_t k = rotation++;
      c.variant = v;
      if (c.norm()) {
        c.allreduce_out = k % 3 == 1;
        c.residual_out = k % 4 != 2;
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

  // The workspace says what one call may take, and refuses more.
  void check_capacity(const std::string& name) {
    if (!ARBITER_CHECK(api_.max_message_bytes != nullptr, name, "max_message_bytes is NULL")) {
      return;
    }
    for (int r = 0; r < world_size_; ++r) {
      const arbiter_workspace* ws = group_.workspace(r);
      const std::uint64_t one = api_.max_message_bytes(ws, ARBITER_ALGORITHM_ONESHOT);
      const std::uint64_t two = api_.max_message_bytes(ws, ARBITER_ALGORITHM_TWOSHOT);
      const std::uint64_t native = api_.max_message_bytes(ws, ARBITER_ALGORITHM_NATIVE);
      ARBITER_CHECK(one == capacity_ && two == capacity_ && native == 0, name << " rank " << r,
                    "max_message_bytes: one-shot " << one << ", two-shot " << two << ", native "
                                                   << native << "; expected " << capacity_ << ", "
                                                   << capacity_ << ", 0");
    }
  }

  void oversized() {
    Call c = base_call();
    c.variant = kVariants[1];  // residual_rmsnorm
    c.inputs = "oversized";
    for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
      c.algorithm = algorithm;
      c.hidden = kMaxHidden;
      c.tokens = kMaxTokens + 1;
      execute(c, sweep_inputs());
      c.hidden = 1024;
      c.tokens = static_cast<std::uint32_t>(capacity_ / (1024 * c.element_size())) + 1;
      execute(c, sweep_inputs());
    }
  }

  // 10,000 calls without a wait in between, one-shot and two-shot
  // alternating (and with and without PDL); the last must still give the
  // bits of a lone call.
  void back_to_back() {
    Call c = base_call();
    c.variant = kVariants[1];  // residual_rmsnorm: every element output
    c.tokens = 32;
    c.hidden = 4096;
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
      for (int r = 0; r < world_size_; ++r) args[k].push_back(args_for(ck, r, sweep_inputs()));
    }
    const std::string name =
        std::to_string(kBackToBackCalls) + " back-to-back calls of " + c.name();
    cudaError_t e = cudaSuccess;
    for (int r = 0; r < world_size_ && e == cudaSuccess; ++r) {
      e = clear_outputs(args[0][r], c, group_.stream(r));
    }
    if (!ARBITER_CHECK(e == cudaSuccess, name, "cudaMemsetAsync: " << cudaGetErrorString(e))) {
      return;
    }
    watchdog_.arm(name, seconds(300));
    for (int i = 0; i < kBackToBackCalls; ++i) {
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
    const int last = ((kBackToBackCalls - 1) % 2) + 2 * (((kBackToBackCalls - 1) / 2) % 2);
    parallel_for(static_cast<std::size_t>(world_size_), [&](std::size_t r) {
      compare_device_outputs(args[last][r], c, *golden, staging(static_cast<int>(r)),
                             name + ", rank " + std::to_string(r) + " vs a lone call");
    });
  }

  // Each rank's call captured into its own graph, replayed kGraphReplays
  // times; the inputs change between replays (same device buffers).
  void graph_replays() {
    Call c = base_call();
    c.variant = kVariants[2];  // residual_rmsnorm_fp8 with norm_out
    c.tokens = 16;
    c.hidden = 2880;
    c.allreduce_out = true;
    c.residual_out = true;
    c.weight_bias = 1.0f;
    c.inputs = "graph";
    // Input sets: [set][rank], salted like the sweep's.
    std::vector<std::vector<Bytes>> sets(kGraphInputSets);
    for (int s = 0; s < kGraphInputSets; ++s) {
      for (int r = 0; r < world_size_; ++r) {
        sets[s].push_back(random_elements(
            c.elements(), dtype_, -1.0f, 1.0f,
            777u + 100u * static_cast<std::uint32_t>(s) + static_cast<std::uint32_t>(r), r));
      }
    }
    DeviceInputs in;
    for (const RankBuffers& b : ranks_) in.inputs.push_back(b.side_input.get());
    in.residual = shared_.residual.get();

    for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
      c.algorithm = algorithm;
      const std::string name = "CUDA graph of " + c.name();
      std::vector<arbiter_allreduce_args> args;
      for (int r = 0; r < world_size_; ++r) args.push_back(args_for(c, r, in));
      watchdog_.arm(name, seconds(300));

      std::vector<cudaGraph_t> graphs(world_size_, nullptr);
      std::vector<cudaGraphExec_t> execs(world_size_, nullptr);
      cudaError_t e = cudaSuccess;
      int capturing = 0;
      for (; capturing < world_size_ && e == cudaSuccess; ++capturing) {
        e = cudaStreamBeginCapture(group_.stream(capturing), cudaStreamCaptureModeRelaxed);
        if (e != cudaSuccess) break;
      }
      std::string error;
      std::int32_t status = ARBITER_INTERNAL;
      if (e == cudaSuccess) {
        status = group_.run(args, &error);
      }
      for (int r = 0; r < capturing; ++r) {
        const cudaError_t end = cudaStreamEndCapture(group_.stream(r), &graphs[r]);
        if (e == cudaSuccess) e = end;
      }
      exit_if_hung(name, error);
      bool ok = ARBITER_CHECK(e == cudaSuccess, name, "capture: " << cudaGetErrorString(e)) &&
                ARBITER_CHECK(status == ARBITER_OK, name,
                              "run during capture: status " << status << ": " << error);
      for (int r = 0; r < world_size_ && ok; ++r) {
        e = cudaGraphInstantiate(&execs[r], graphs[r], 0);
        ok = ARBITER_CHECK(e == cudaSuccess, name,
                           "cudaGraphInstantiate, rank " << r << ": " << cudaGetErrorString(e));
      }
      for (int i = 0; i < kGraphReplays && ok; ++i) {
        const int per_set = kGraphReplays / kGraphInputSets;
        const int set = std::min(i / per_set, kGraphInputSets - 1);
        if (i % per_set == 0 && i / per_set < kGraphInputSets) {
          // New inputs in the same buffers, and outputs reset to 0xFF.
          for (int r = 0; r < world_size_ && e == cudaSuccess; ++r) {
            e = cudaMemcpyAsync(ranks_[r].side_input.get(), sets[set][r].data(), c.bytes(),
                                cudaMemcpyHostToDevice, group_.stream(r));
            if (e == cudaSuccess) e = clear_outputs(args[r], c, group_.stream(r));
          }
        }
        for (int r = 0; r < world_size_ && e == cudaSuccess; ++r) {
          e = cudaGraphLaunch(execs[r], group_.stream(r));
        }
        ok = ARBITER_CHECK(e == cudaSuccess, name, "replay " << i << ": " << cudaGetErrorString(e));
        if (ok) ++stats_.graph_replays;
        const bool last_of_set = (i + 1) % per_set == 0 || i + 1 == kGraphReplays;
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
        for (int r = 0; r < world_size_; ++r) view.inputs.push_back(sets[set][r].data());
        view.residual = inputs_.residual.data();
        view.gamma = inputs_.gamma.data();
        check_results({Result{checked, first, {}}}, view);
      }
      wait_or_exit(name, kCallLimit);
      watchdog_.disarm();
      for (cudaGraphExec_t x : execs) {
        if (x != nullptr) cudaGraphExecDestroy(x);
      }
      for (cudaGraph_t g : graphs) {
        if (g != nullptr) cudaGraphDestroy(g);
      }
    }
  }

  // Payloads that look like the Lamport sentinel, or that flush-to-zero would
  // turn into it, on every rank at once. Per token (mod 5):
  //  0: -0.0 everywhere (token 0 with a -0.0 residual too);
  //  1: negative subnormals;  2: positive subnormals;
  //  3: -0.0, negative and positive subnormals and normal values interleaved
  //     differently on each rank;
  //  4: negative subnormals with a +0.0 residual (a subnormal norm input).
  // Every element of tokens 0 is -0.0 on every rank, so its sum is a zero of
  // either sign (one-shot sends +0.0 for -0.0): one-shot and two-shot are
  // compared with the sign of zero ignored.
  void salted() {
    Call c = base_call();
    c.tokens = 20;  // >= every world size: two-shot runs too
    c.hidden = 4096;
    c.inputs = "salted (-0.0, subnormals)";
    const arbiter_dtype d = dtype_;
    std::mt19937 rng(4242u + static_cast<std::uint32_t>(world_size_));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<Bytes> inputs(world_size_, Bytes(c.bytes()));
    Bytes residual(c.bytes());
    const std::uint32_t minus_zero = common::negative_zero_bits(d);
    for (std::uint32_t t = 0; t < c.tokens; ++t) {
      for (std::uint32_t i = 0; i < c.hidden; ++i) {
        const std::size_t at = std::size_t{t} * c.hidden + i;
        for (int r = 0; r < world_size_; ++r) {
          std::uint32_t bits = 0;
          switch (t % 5) {
            case 0:
              bits = minus_zero;
              break;
            case 1:
            case 4:
              bits = subnormal_bits(d, true, rng());
              break;
            case 2:
              bits = subnormal_bits(d, false, rng());
              break;
            default:
              switch ((i + static_cast<std::uint32_t>(r)) % 4) {
                case 0:
                  bits = minus_zero;
                  break;
                case 1:
                  bits = subnormal_bits(d, true, rng());
                  break;
                case 2:
                  bits = subnormal_bits(d, false, rng());
                  break;
                default:
                  bits = common::float_to_dtype_bits(dist(rng), d);
              }
          }
          common::store_bits(inputs[r].data(), at, d, bits);
        }
        const std::uint32_t res = t == 0       ? minus_zero
                                  : t % 5 == 4 ? 0u
                                               : common::float_to_dtype_bits(dist(rng), d);
        common::store_bits(residual.data(), at, d, res);
      }
    }
    cudaError_t e = cudaMemcpyAsync(shared_.side_residual.get(), residual.data(), c.bytes(),
                                    cudaMemcpyHostToDevice, group_.stream(0));
    for (int r = 0; r < world_size_ && e == cudaSuccess; ++r) {
      e = cudaMemcpyAsync(ranks_[r].side_input.get(), inputs[r].data(), c.bytes(),
                          cudaMemcpyHostToDevice, group_.stream(r));
    }
    if (!ARBITER_CHECK(e == cudaSuccess, c.name(), "upload: " << cudaGetErrorString(e))) return;
    wait_or_exit(c.name() + " (upload)", kCallLimit);

    DeviceInputs in;
    for (const RankBuffers& b : ranks_) in.inputs.push_back(b.side_input.get());
    in.residual = shared_.side_residual.get();
    HostView view;
    for (const Bytes& b : inputs) view.inputs.push_back(b.data());
    view.residual = residual.data();
    view.gamma = inputs_.gamma.data();
    for (float weight_bias : {0.0f, 1.0f}) {
      c.weight_bias = weight_bias;
      check_results(run_variants(c, in, true, weight_bias == 0.0f ? 0 : 1), view);
    }
  }

  const arbiter_backend_v1_t& api_;
  const arbiter_dtype dtype_;
  const int world_size_;
  const std::uint32_t capability_;
  const HostInputs& inputs_;
  const std::vector<PinnedBuffer>& staging_;  // one per rank, kMaxTokens x kMaxHidden x 4 bytes
  Watchdog& watchdog_;
  const std::uint64_t capacity_;  // bytes per call: max_message_bytes of the spec
  LoopbackGroup group_;
  std::vector<RankBuffers> ranks_;  // after group_: freed before the workspaces
  SharedBuffers shared_;
  GroupStats stats_;
};

// probe() on device 0: what the module claims, against the device.
// Returns false when the module cannot run here at all.
bool check_probe(const arbiter_backend_v1_t& api, std::uint32_t capability) {
  arbiter_probe_args args{ARBITER_DEVICE_GPU, 0};
  arbiter_backend_caps caps{};
  const std::int32_t status = api.probe(&args, &caps);
  if (status != ARBITER_OK) {
    if (capability < 90) {
      std::printf("SKIP: trtllm does not run on capability %u: %s\n", capability, api.last_error());
      std::fflush(stdout);
      std::exit(arbiter::test::kSkipExitCode);
    }
    arbiter::test::check(false, "probe(device 0)",
                         "status " + std::to_string(status) + ": " + api.last_error());
    return false;
  }
  const std::uint64_t world_sizes = (std::uint64_t{1} << 2) | (std::uint64_t{1} << 4) |
                                    (std::uint64_t{1} << 8) | (std::uint64_t{1} << 16);
  const std::uint32_t patterns = capability >= kMinNvfp4Capability ? 0xFu : 0x7u;
  ARBITER_CHECK(caps.device_kind == ARBITER_DEVICE_GPU, "probe",
                "device_kind " << caps.device_kind);
  ARBITER_CHECK(caps.capability == capability, "probe",
                "capability " << caps.capability << ", the device says " << capability);
  ARBITER_CHECK(caps.world_size_mask == world_sizes, "probe",
                "world_size_mask 0x" << std::hex << caps.world_size_mask);
  ARBITER_CHECK(caps.dtype_mask == 0x7u, "probe", "dtype_mask 0x" << std::hex << caps.dtype_mask);
  ARBITER_CHECK(caps.pattern_mask == patterns, "probe",
                "pattern_mask 0x" << std::hex << caps.pattern_mask << ", expected 0x" << patterns);
  ARBITER_CHECK(
      caps.algorithm_mask == 0x3u, "probe",
      "algorithm_mask 0x" << std::hex << caps.algorithm_mask << ", expected one-shot and two-shot");
  ARBITER_CHECK((caps.flags & ARBITER_CAPS_SINGLE_NODE_ONLY) != 0, "probe",
                "flags 0x" << std::hex << caps.flags << " lack ARBITER_CAPS_SINGLE_NODE_ONLY");
  return true;
}

}  // namespace

int main() {
  arbiter::test::prepare_loopback_environment();
  arbiter::test::require_device_or_skip();
  arbiter::test::BackendModule module("trtllm");
  if (!arbiter::test::check(module.api() != nullptr, "dlopen " + module.path(), module.error())) {
    return arbiter::test::finish(kTestName);
  }
  const arbiter_backend_v1_t& api = *module.api();
  int major = 0;
  int minor = 0;
  cudaSetDevice(0);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  const auto capability = static_cast<std::uint32_t>(major * 10 + minor);
  std::printf("device 0: capability %u; NVFP4 cases %s\n", capability,
              capability >= kMinNvfp4Capability ? "run" : "must be refused");
  std::fflush(stdout);
  if (!check_probe(api, capability)) return arbiter::test::finish(kTestName);

  // Host staging for downloads, one per rank, large enough for any output.
  std::vector<PinnedBuffer> staging;
  staging.reserve(kMaxRanks);
  for (int r = 0; r < kMaxRanks; ++r) {
    staging.emplace_back(std::size_t{kMaxTokens} * kMaxHidden * sizeof(float));
    if (staging.back().get() == nullptr) fail_and_exit("cudaMallocHost", "no pinned host memory");
  }
  Watchdog watchdog;
  std::size_t group_index = 0;
  for (arbiter_dtype dtype : kDtypes) {
    const HostInputs inputs = make_inputs(dtype);
    for (int world_size : kWorldSizes) {
      GroupRunner runner(api, dtype, world_size, capability, inputs, staging, watchdog);
      runner.run_all(group_index++);
    }
  }
  return arbiter::test::finish(kTestName);
}
