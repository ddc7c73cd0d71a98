// The shm module's per-token arithmetic has AVX-512 BF16, AVX-512, AVX2 and
// scalar versions (token_kernels.h); ARBITER_SHM_ISA picks one. Each version this CPU
// runs must give the bits of the same arithmetic compiled here for baseline
// x86-64, on every dtype and pattern and on the values vector code gets wrong
// most easily: NaN (quiet and signalling), infinities, subnormals, -0.0,
// sums that overflow, a hidden size that is not a multiple of the vector
// width, and tokens whose 16-bit outputs show the order of the sum of
// squares.
#define BOOST_TEST_MODULE backends_shm_bits
#include <boost/test/unit_test.hpp>

#include <chrono>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include "arbiter/common/numeric.h"
#include "arbiter/common/rmsnorm.h"
#include "arbiter_backend.h"
#include "shm_harness.h"

using namespace arbiter::common;
using namespace arbiter::test::shm_harness;

namespace {

// 63 blocks of 16 and a tail of 8: the AVX-512 kernels take bf16 32 at a
// step (token_lanes_avx512.h), then one block of 16, then scalars.
constexpr std::uint32_t kHidden = 1016;
constexpr float kEps = 1e-5f;
constexpr float kWeightBias = 0.5f;

float gamma_at(std::uint32_t i) { return 0.5f + static_cast<float>(i % 13) / 8.0f; }

// Orders of the sum of squares a vector kernel could take by mistake
// instead of the reference's (rmsnorm.h: element i into lane i % 16, then
// the 16 lanes in order). A 16-bit output hides most last-bit changes of
// 1 / rms, so the tokens that test the order are searched for (probe_token).
struct SquaresOrder {
  const char* name;
  std::uint32_t lanes;  // element i goes to lane i % lanes
  enum { kInOrder, kReversed, kEvenFirst, kPairwise } combine;
};
constexpr std::array<SquaresOrder, 6> kWrongOrders = {{
    {"one running sum", 1, SquaresOrder::kInOrder},
    {"8 lanes", 8, SquaresOrder::kInOrder},
    {"32 lanes", 32, SquaresOrder::kInOrder},
    {"16 lanes added pairwise", 16, SquaresOrder::kPairwise},
    // AVX2 holds a bf16 block's even elements in one register, odd in the
    // other (token_kernels_avx2.cpp): lanes 0, 2, ..., 14, then 1, 3, ...
    {"16 lanes, even ones first", 16, SquaresOrder::kEvenFirst},
    {"16 lanes in reverse", 16, SquaresOrder::kReversed},
}};
constexpr SquaresOrder kReferenceOrder = {"reference", 16, SquaresOrder::kInOrder};

float sum_of_squares(const std::vector<float>& x, const SquaresOrder& order) {
  std::vector<float> lane(order.lanes, 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i) lane[i % order.lanes] += x[i] * x[i];
  std::vector<float> sequence;
  switch (order.combine) {
    case SquaresOrder::kInOrder:
      sequence = lane;
      break;
    case SquaresOrder::kReversed:
      sequence.assign(lane.rbegin(), lane.rend());
      break;
    case SquaresOrder::kEvenFirst:
      for (std::size_t k = 0; k < lane.size(); k += 2) sequence.push_back(lane[k]);
      for (std::size_t k = 1; k < lane.size(); k += 2) sequence.push_back(lane[k]);
      break;
    case SquaresOrder::kPairwise:
      for (std::size_t width = lane.size(); width > 1; width /= 2) {
        for (std::size_t k = 0; k < width / 2; ++k) lane[k] = lane[2 * k] + lane[2 * k + 1];
      }
      return lane[0];
  }
  float sum = 0.0f;
  for (float value : sequence) sum += value;
  return sum;
}

// The storage bits of y = x * 1 / rms * (gamma + weight_bias), with the sum
// of squares taken in `order`.
std::vector<std::uint32_t> norm_bits(const std::vector<float>& x, const SquaresOrder& order,
                                     arbiter_dtype dtype) {
  const float inv_rms =
      inverse_rms(sum_of_squares(x, order), static_cast<std::uint32_t>(x.size()), kEps);
  std::vector<std::uint32_t> bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto element = static_cast<std::uint32_t>(i);
    bits[i] =
        float_to_dtype_bits(rmsnorm_element(x[i], inv_rms, round_to_dtype(gamma_at(element), dtype),
                                            kWeightBias, dtype),
                            dtype);
  }
  return bits;
}

// The first token of a fixed pseudo-random sequence of `dtype` values whose
// norm output has other bits when its sum of squares is taken in `wrong`
// order. Empty if none is found (the test then fails).
std::vector<float> probe_token(arbiter_dtype dtype, const SquaresOrder& wrong) {
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int candidate = 0; candidate < 20000; ++candidate) {
    std::vector<float> x(kHidden);
    for (float& value : x) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const auto step = static_cast<std::int32_t>((state >> 33) % 2048u) - 1024;
      value = round_to_dtype(static_cast<float>(step) / 256.0f, dtype);
    }
    if (norm_bits(x, wrong, dtype) != norm_bits(x, kReferenceOrder, dtype)) return x;
  }
  return {};
}

// One probe token per wrong order, found once per dtype.
const std::vector<std::vector<float>>& probe_tokens(arbiter_dtype dtype) {
  static std::map<arbiter_dtype, std::vector<std::vector<float>>> found;
  auto [at, inserted] = found.try_emplace(dtype);
  if (inserted) {
    for (const SquaresOrder& wrong : kWrongOrders) at->second.push_back(probe_token(dtype, wrong));
  }
  return at->second;
}

// Tokens 0-2 hold special values (input_of), then one probe per wrong order.
constexpr std::uint32_t kProbeToken = 3;
constexpr std::uint32_t kTokens = kProbeToken + kWrongOrders.size();

// Bit patterns of `dtype` worth testing, in storage bits.
std::vector<std::uint32_t> special_bits(arbiter_dtype dtype) {
  if (dtype == ARBITER_DTYPE_FP32) {
    return {0x7FC00000u, 0x7F800001u, 0xFFC12345u, 0x7F800000u, 0xFF800000u, 0x00000001u,
            0x807FFFFFu, 0x80000000u, 0x00000000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x3F800000u};
  }
  if (dtype == ARBITER_DTYPE_BF16) {
    return {0x7FC0u, 0x7F81u, 0xFFC1u, 0x7F80u, 0xFF80u, 0x0001u,
            0x807Fu, 0x8000u, 0x0000u, 0x7F7Fu, 0xFF7Fu, 0x3F80u};
  }
  return {0x7E00u, 0x7C01u, 0xFE01u, 0x7C00u, 0xFC00u, 0x0001u,
          0x83FFu, 0x8000u, 0x0000u, 0x7BFFu, 0xFBFFu, 0x3C00u};
}

// Rank `rank`'s input: token 0 mixes every special pattern into ordinary
// values (its 1 / rms is NaN), token 1 is ordinary values with a subnormal
// every 89 elements, in either half of a step of 32 (a finite 1 / rms, so
// some outputs are subnormal and their neighbours are not), token 2 is the
// largest finite values, of alternating sign from rank to rank. The residual
// (input_of(dtype, 6)) has token 2's signs as rank 0: with 3 ranks, sum +
// residual overflows, 1 / rms is 0 and y = inf * 0 is NaN although no input
// is; with 2 ranks, only the sum of squares overflows.
// The probe tokens are rank 0's; every other rank and the residual hold
// +0.0 there, so x is the probe itself. They hold +0.0 in fp32 too, whose
// outputs show any change of 1 / rms without a search.
std::vector<std::byte> input_of(arbiter_dtype dtype, int rank) {
  const std::vector<std::uint32_t> specials = special_bits(dtype);
  std::vector<std::byte> input(std::size_t{kTokens} * kHidden * dtype_size(dtype));
  for (std::uint32_t i = 0; i < kHidden; ++i) {
    const float ordinary = static_cast<float>((i * 37 + rank * 11) % 97) / 32.0f - 1.5f;
    std::uint32_t bits = float_to_dtype_bits(ordinary, dtype);
    if (i % 5 == static_cast<std::uint32_t>(rank)) bits = specials[(i / 5) % specials.size()];
    store_bits(input.data(), i, dtype, bits);
    store_element(input.data(), kHidden + i, dtype, ordinary * (rank + 1));
    if (i % 89 == 3) store_bits(input.data(), kHidden + i, dtype, 3u + i % 2);
    store_bits(input.data(), 2 * kHidden + i, dtype, specials[9 + (i + rank) % 2]);
  }
  if (rank == 0 && dtype != ARBITER_DTYPE_FP32) {
    const auto& probes = probe_tokens(dtype);
    for (std::size_t p = 0; p < probes.size(); ++p) {
      for (std::uint32_t i = 0; i < probes[p].size(); ++i) {
        store_element(input.data(), (kProbeToken + p) * kHidden + i, dtype, probes[p][i]);
      }
    }
  }
  return input;
}

struct Outputs {
  std::vector<std::byte> allreduce_out, residual_out, norm_out;
  std::vector<std::uint8_t> quant;
  explicit Outputs(arbiter_dtype dtype)
      : allreduce_out(std::size_t{kTokens} * kHidden * dtype_size(dtype)),
        residual_out(allreduce_out.size()),
        norm_out(allreduce_out.size()),
        quant(std::size_t{kTokens} * kHidden) {}
};

arbiter_allreduce_args args_for(arbiter_dtype dtype, arbiter_pattern pattern,
                                arbiter_algorithm algorithm, const void* input,
                                const std::vector<std::byte>& residual,
                                const std::vector<std::byte>& gamma, const float& scale,
                                Outputs& out) {
  arbiter_allreduce_args a =
      allreduce_args(dtype, algorithm, kTokens, kHidden, input, out.allreduce_out.data());
  a.pattern = pattern;
  a.residual_in = residual.data();
  a.residual_out = out.residual_out.data();
  a.gamma = gamma.data();
  a.eps = kEps;
  a.weight_bias = kWeightBias;
  a.norm_out = out.norm_out.data();
  if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) {
    a.quant_out = out.quant.data();
    a.scale = &scale;
  }
  return a;
}

std::string compare(const char* name, const std::vector<std::byte>& got,
                    const std::vector<std::byte>& want) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      const std::size_t token = i / (got.size() / kTokens);
      const std::string probe = token >= kProbeToken && token < kTokens
                                    ? std::string(", the probe for a sum of squares in ") +
                                          kWrongOrders[token - kProbeToken].name
                                    : "";
      return std::string(name) + " differs at byte " + std::to_string(i) + " (token " +
             std::to_string(token) + probe + ")";
    }
  }
  return "";
}

std::string check_rank(int rank, const arbiter_oob& oob) {
  const auto& module = shm();
  for (arbiter_dtype dtype : {ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP16, ARBITER_DTYPE_FP32}) {
    const std::size_t element = dtype_size(dtype);
    const arbiter_workspace_spec spec =
        make_spec(oob, dtype, std::uint64_t{kTokens} * kHidden * element);
    arbiter_workspace* workspace = nullptr;
    if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + module.last_error();
    }
    std::vector<std::vector<std::byte>> inputs;
    for (int r = 0; r < oob.size; ++r) inputs.push_back(input_of(dtype, r));
    std::vector<std::byte> residual = input_of(dtype, 6);
    std::vector<std::byte> gamma(std::size_t{kHidden} * element);
    for (std::uint32_t i = 0; i < kHidden; ++i) {
      store_element(gamma.data(), i, dtype, gamma_at(i));
    }
    const float scale = 0.02f;
    for (arbiter_pattern pattern : {ARBITER_PATTERN_ALLREDUCE, ARBITER_PATTERN_RESIDUAL_RMSNORM,
                                    ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8}) {
      // The expected bits, with this binary's baseline code: the sum over
      // ranks in rank order from +0.0, then the epilogue.
      Outputs want(dtype);
      const arbiter_allreduce_args w = args_for(dtype, pattern, ARBITER_ALGORITHM_ONESHOT,
                                                inputs[rank].data(), residual, gamma, scale, want);
      std::vector<float> row(kHidden);
      for (std::uint32_t t = 0; t < kTokens; ++t) {
        for (std::uint32_t i = 0; i < kHidden; ++i) {
          float sum = 0.0f;
          for (const auto& in : inputs) sum += load_element(in.data(), t * kHidden + i, dtype);
          row[i] = sum;
        }
        apply_epilogue_token(w, t, row.data());
      }
      for (arbiter_algorithm algorithm :
           {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT, ARBITER_ALGORITHM_NATIVE}) {
        Outputs got(dtype);
        const arbiter_allreduce_args a =
            args_for(dtype, pattern, algorithm, inputs[rank].data(), residual, gamma, scale, got);
        const std::string where = std::string(dtype_name(dtype)) + " pattern " +
                                  std::to_string(pattern) + " " + algorithm_name(algorithm) + ": ";
        if (module.run(workspace, &a, nullptr) != ARBITER_OK) {
          return where + "run: " + module.last_error();
        }
        for (const std::string& problem :
             {compare("allreduce_out", got.allreduce_out, want.allreduce_out),
              compare("residual_out", got.residual_out, want.residual_out),
              compare("norm_out", got.norm_out, want.norm_out)}) {
          if (!problem.empty()) return where + problem;
        }
        if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8 && got.quant != want.quant) {
          return where + "quant_out differs";
        }
      }
      // The registered path (ABI v2): the input in memory every rank maps,
      // read in place, at an offset inside the allocation; with and
      // without the replicated-residual split, and in place (norm_out over
      // the input: one-shot copies in). Variants 3 and 4 put every output in
      // registered memory too (replicated: two-shot copies the other slices
      // from their owners' outputs), 4 with norm_out over the input. The
      // same bits.
      const std::size_t bytes = inputs[rank].size();
      const std::size_t quant_bytes = std::size_t{kTokens} * kHidden;
      void* area = nullptr;
      if (shm_memory().alloc(workspace, 4096 + 4 * bytes + quant_bytes, &area) != ARBITER_OK) {
        return std::string("alloc: ") + module.last_error();
      }
      std::byte* const registered = static_cast<std::byte*>(area) + 4096;
      std::byte* const registered_outputs[3] = {registered + bytes, registered + 2 * bytes,
                                                registered + 3 * bytes};
      auto* const registered_quant = reinterpret_cast<std::uint8_t*>(registered + 4 * bytes);
      for (arbiter_algorithm algorithm :
           {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT, ARBITER_ALGORITHM_NATIVE}) {
        for (int variant = 0; variant < 5; ++variant) {
          if (variant > 0 && pattern == ARBITER_PATTERN_ALLREDUCE) continue;
          std::memcpy(registered, inputs[rank].data(), bytes);
          Outputs got(dtype);
          arbiter_allreduce_args a =
              args_for(dtype, pattern, algorithm, registered, residual, gamma, scale, got);
          if (variant == 1 || variant >= 3) a.flags |= ARBITER_RUN_RESIDUAL_REPLICATED;
          if (variant >= 3) {
            std::memset(registered + bytes, 0xA5, 3 * bytes + quant_bytes);
            a.allreduce_out = registered_outputs[0];
            a.residual_out = registered_outputs[1];
            a.norm_out = registered_outputs[2];
            if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) a.quant_out = registered_quant;
          }
          if (variant == 2 || variant == 4) a.norm_out = registered;
          const std::string where = std::string(dtype_name(dtype)) + " pattern " +
                                    std::to_string(pattern) + " " + algorithm_name(algorithm) +
                                    " registered variant " + std::to_string(variant) + ": ";
          if (shm_memory().run_registered(workspace, &a, nullptr) != ARBITER_OK) {
            return where + "run_registered: " + module.last_error();
          }
          if (variant >= 3) {
            got.allreduce_out.assign(registered_outputs[0], registered_outputs[0] + bytes);
            got.residual_out.assign(registered_outputs[1], registered_outputs[1] + bytes);
            got.norm_out.assign(registered_outputs[2], registered_outputs[2] + bytes);
            got.quant.assign(registered_quant, registered_quant + quant_bytes);
          }
          if (variant == 2 || variant == 4) got.norm_out.assign(registered, registered + bytes);
          for (const std::string& problem :
               {compare("allreduce_out", got.allreduce_out, want.allreduce_out),
                compare("residual_out", got.residual_out, want.residual_out),
                compare("norm_out", got.norm_out, want.norm_out)}) {
            if (!problem.empty()) return where + problem;
          }
          if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8 && got.quant != want.quant) {
            return where + "quant_out differs";
          }
        }
      }
      if (shm_memory().free(workspace, area) != ARBITER_OK) {
        return std::string("free: ") + module.last_error();
      }
    }
    module.workspace_destroy(workspace);
  }
  return "";
}

// Residual-free norm (residual_in NULL, ARBITER_CAPS_RESIDUAL_OPTIONAL):
// the bits of the baseline epilogue given a residual of -0.0, which adds
// nothing to any value (-0.0 + -0.0 is -0.0, so signed zeros survive too), on
// every algorithm, plain and registered, with residual_out separate, NULL
// (left untouched) or over the input (in place).
std::string check_rank_residual_free(int rank, const arbiter_oob& oob) {
  const auto& module = shm();
  for (arbiter_dtype dtype : {ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP16, ARBITER_DTYPE_FP32}) {
    const std::size_t element = dtype_size(dtype);
    const arbiter_workspace_spec spec =
        make_spec(oob, dtype, std::uint64_t{kTokens} * kHidden * element);
    arbiter_workspace* workspace = nullptr;
    if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + module.last_error();
    }
    std::vector<std::vector<std::byte>> inputs;
    for (int r = 0; r < oob.size; ++r) inputs.push_back(input_of(dtype, r));
    std::vector<std::byte> negative_zeros(inputs[rank].size());
    for (std::size_t i = 0; i < std::size_t{kTokens} * kHidden; ++i) {
      store_element(negative_zeros.data(), i, dtype, -0.0f);
    }
    std::vector<std::byte> gamma(std::size_t{kHidden} * element);
    for (std::uint32_t i = 0; i < kHidden; ++i) store_element(gamma.data(), i, dtype, gamma_at(i));
    const float scale = 0.02f;
    const std::size_t bytes = inputs[rank].size();
    void* area = nullptr;
    if (shm_memory().alloc(workspace, bytes + 4096, &area) != ARBITER_OK) {
      return std::string("alloc: ") + module.last_error();
    }
    std::byte* const registered = static_cast<std::byte*>(area) + 4096;
    for (arbiter_pattern pattern :
         {ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8}) {
      Outputs want(dtype);
      const arbiter_allreduce_args w =
          args_for(dtype, pattern, ARBITER_ALGORITHM_ONESHOT, inputs[rank].data(), negative_zeros,
                   gamma, scale, want);
      std::vector<float> row(kHidden);
      for (std::uint32_t t = 0; t < kTokens; ++t) {
        for (std::uint32_t i = 0; i < kHidden; ++i) {
          float sum = 0.0f;
          for (const auto& in : inputs) sum += load_element(in.data(), t * kHidden + i, dtype);
          row[i] = sum;
        }
        apply_epilogue_token(w, t, row.data());
      }
      for (arbiter_algorithm algorithm :
           {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT, ARBITER_ALGORITHM_NATIVE}) {
        for (const bool use_registered : {false, true}) {
          for (const char* residual_out : {"separate", "NULL", "over the input"}) {
            std::vector<std::byte> input = inputs[rank];
            std::byte* const in = use_registered ? registered : input.data();
            std::memcpy(in, inputs[rank].data(), bytes);
            Outputs got(dtype);
            arbiter_allreduce_args a =
                args_for(dtype, pattern, algorithm, in, negative_zeros, gamma, scale, got);
            a.residual_in = nullptr;
            if (residual_out == std::string("NULL")) a.residual_out = nullptr;
            if (residual_out == std::string("over the input")) a.residual_out = in;
            const std::string where = std::string(dtype_name(dtype)) + " pattern " +
                                      std::to_string(pattern) + " " + algorithm_name(algorithm) +
                                      (use_registered ? " registered" : "") +
                                      ", no residual, residual_out " + residual_out + ": ";
            const std::int32_t code = use_registered
                                          ? shm_memory().run_registered(workspace, &a, nullptr)
                                          : module.run(workspace, &a, nullptr);
            if (code != ARBITER_OK) return where + "run: " + module.last_error();
            std::vector<std::byte> residual_bits = got.residual_out;
            if (a.residual_out == in) residual_bits.assign(in, in + bytes);
            const std::vector<std::byte> untouched(bytes);
            for (const std::string& problem :
                 {compare("allreduce_out", got.allreduce_out, want.allreduce_out),
                  compare("residual_out", residual_bits,
                          a.residual_out == nullptr ? untouched : want.residual_out),
                  compare("norm_out", got.norm_out, want.norm_out)}) {
              if (!problem.empty()) return where + problem;
            }
            if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8 && got.quant != want.quant) {
              return where + "quant_out differs";
            }
          }
        }
      }
    }
    if (shm_memory().free(workspace, area) != ARBITER_OK) {
      return std::string("free: ") + module.last_error();
    }
    module.workspace_destroy(workspace);
  }
  return "";
}

}  // namespace

// Whether this CPU runs `level`, by the test the module makes.
bool cpu_runs(const std::string& level) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (level == "avx512bf16") return cpu_runs("avx512") && __builtin_cpu_supports("avx512bf16");
  if (level == "avx512") {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  if (level == "avx2") {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && f16c;
  }
#endif
  return level == "scalar" || level == "auto";
}

// Every rank's workspace_create fails with `code` and a message holding `words`.
void expect_refusal(std::int32_t code, const std::string& words) {
  run_group(2, [&](int, const arbiter_oob& oob) -> std::string {
    const arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_BF16, 4096);
    arbiter_workspace* workspace = nullptr;
    const std::int32_t got = shm().workspace_create(&oob, &spec, &workspace);
    if (got == ARBITER_OK) {
      shm().workspace_destroy(workspace);
      return "workspace_create succeeded";
    }
    const std::string error = shm().last_error();
    if (got != code || error.find(words) == std::string::npos) {
      return "code " + std::to_string(got) + ": " + error;
    }
    return workspace == nullptr ? "" : "a refused workspace was returned";
  });
}

BOOST_AUTO_TEST_CASE(every_level_and_algorithm_gives_the_baseline_bits_on_special_values) {
  // Registered outputs of replicated two-shot calls: the owners' path at
  // every size on every level, then staged (the default threshold, 64 KiB,
  // is above these calls: checked below).
  static_assert(std::size_t{kTokens} * kHidden * 4 < 64 * 1024);
  setenv("ARBITER_SHM_OWNERS_FROM", "0", 1);
  for (const std::string level : {"scalar", "avx2", "avx512", "avx512bf16", "auto"}) {
    BOOST_TEST_CONTEXT("ARBITER_SHM_ISA=" << level) {
      setenv("ARBITER_SHM_ISA", level.c_str(), 1);
      if (!cpu_runs(level)) {
        BOOST_TEST_MESSAGE("this CPU lacks " << level << ": its refusal is checked instead");
        expect_refusal(ARBITER_UNSUPPORTED, "ARBITER_SHM_ISA=" + level + ": this CPU");
        continue;
      }
      run_group(2, check_rank);
      run_group(3, check_rank);
      run_group(4, check_rank);
    }
  }
  unsetenv("ARBITER_SHM_ISA");
  unsetenv("ARBITER_SHM_OWNERS_FROM");
  BOOST_TEST_CONTEXT("ARBITER_SHM_OWNERS_FROM unset") {
    run_group(2, check_rank);
    run_group(3, check_rank);
  }
}

BOOST_AUTO_TEST_CASE(no_residual_gives_the_bits_of_a_negative_zero_residual_on_every_level) {
  for (const std::string level : {"scalar", "avx2", "avx512", "avx512bf16", "auto"}) {
    BOOST_TEST_CONTEXT("ARBITER_SHM_ISA=" << level) {
      if (!cpu_runs(level)) continue;  // its refusal is the test above's
      setenv("ARBITER_SHM_ISA", level.c_str(), 1);
      run_group(2, check_rank_residual_free);
      run_group(3, check_rank_residual_free);
    }
  }
  unsetenv("ARBITER_SHM_ISA");
}

// The probes are only worth their place if each one's expected output
// differs from what its wrong order gives, and the expected output is the
// reference epilogue's.
// Registered outputs are the caller's once a call returns: here every rank
// overwrites its outputs at once (as a model reusing the buffer would)
// while ranks are preempted at random. A peer still copying this rank's
// slice would take the overwritten rows; the end barrier of the owners'
// path prevents it.
BOOST_AUTO_TEST_CASE(registered_outputs_can_be_overwritten_as_soon_as_a_call_returns) {
  setenv("ARBITER_SHM_OWNERS_FROM", "0", 1);  // the owners' path at this size
  auto body = [](int rank, const arbiter_oob& oob) -> std::string {
    const arbiter_dtype dtype = ARBITER_DTYPE_BF16;
    const std::size_t bytes = std::size_t{kTokens} * kHidden * dtype_size(dtype);
    const arbiter_workspace_spec spec = make_spec(oob, dtype, bytes);
    arbiter_workspace* workspace = nullptr;
    if (shm().workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + shm().last_error();
    }
    const std::vector<std::byte> input = input_of(dtype, rank);
    const std::vector<std::byte> residual = input_of(dtype, 6);
    std::vector<std::byte> gamma(std::size_t{kHidden} * dtype_size(dtype));
    for (std::uint32_t i = 0; i < kHidden; ++i) store_element(gamma.data(), i, dtype, gamma_at(i));
    const float scale = 0.02f;
    Outputs want(dtype);
    arbiter_allreduce_args w =
        args_for(dtype, ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_ALGORITHM_TWOSHOT, input.data(),
                 residual, gamma, scale, want);
    if (shm().run(workspace, &w, nullptr) != ARBITER_OK) {
      return std::string("run: ") + shm().last_error();
    }
    void* area = nullptr;
    if (shm_memory().alloc(workspace, 3 * bytes, &area) != ARBITER_OK) {
      return std::string("alloc: ") + shm().last_error();
    }
    auto* const registered = static_cast<std::byte*>(area);
    std::memcpy(registered, input.data(), bytes);
    Outputs unused(dtype);
    arbiter_allreduce_args a =
        args_for(dtype, ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_ALGORITHM_TWOSHOT, registered,
                 residual, gamma, scale, unused);
    a.flags |= ARBITER_RUN_RESIDUAL_REPLICATED;
    a.allreduce_out = nullptr;
    a.residual_out = registered + bytes;
    a.norm_out = registered + 2 * bytes;
    std::string problem;
    for (int call = 0; call < 300 && problem.empty(); ++call) {
      if (shm_memory().run_registered(workspace, &a, nullptr) != ARBITER_OK) {
        problem = "call " + std::to_string(call) + ": " + shm().last_error();
        break;
      }
      const std::vector<std::byte> residual_out(registered + bytes, registered + 2 * bytes);
      const std::vector<std::byte> norm_out(registered + 2 * bytes, registered + 3 * bytes);
      problem = compare("residual_out", residual_out, want.residual_out);
      if (problem.empty()) problem = compare("norm_out", norm_out, want.norm_out);
      if (!problem.empty()) problem = "call " + std::to_string(call) + ": " + problem;
      std::memset(registered + bytes, 0xFF, 2 * bytes);
    }
    shm_memory().free(workspace, area);
    shm().workspace_destroy(workspace);
    return problem;
  };
  run_group(2, body, 120, /*preempt=*/true);
  run_group(3, body, 120, /*preempt=*/true);
  unsetenv("ARBITER_SHM_OWNERS_FROM");
}

// Every rank must allocate the same bytes. Sizes that round up to the same
// pages mapped alike, and both ranks were given their allocation: a view as
// large as one rank's then crossed the end of the other's.
BOOST_AUTO_TEST_CASE(registered_allocations_of_different_sizes_are_refused_on_every_rank) {
  // (make_spec's timeout is 20 s: a peer left waiting would show.)
  auto body = [](int rank, const arbiter_oob& oob) -> std::string {
    const arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_BF16, 4096);
    arbiter_workspace* workspace = nullptr;
    if (shm().workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + shm().last_error();
    }
    std::string problem;
    void* area = nullptr;
    const std::int32_t refused = shm_memory().alloc(workspace, rank == 1 ? 5000 : 4100, &area);
    const std::string message = shm().last_error();
    if (refused != ARBITER_MISMATCH || area != nullptr) {
      problem = "different sizes: status " + std::to_string(refused) + ": " + message;
    } else if (message.find("rank 1 asked for 5000 bytes, rank 0 for 4100 (every rank must "
                            "allocate the same size)") == std::string::npos) {
      problem = "different sizes: " + message;
    }
    // A size no rank can take, on one rank only: refused on every rank at
    // once (its peers waited out their deadline), naming that rank.
    for (int odd = 0; odd < 2 && problem.empty(); ++odd) {
      const auto started = std::chrono::steady_clock::now();
      const std::int32_t status = shm_memory().alloc(workspace, rank == odd ? 0 : 4096, &area);
      const std::string why = shm().last_error();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (status != ARBITER_INVALID_ARGUMENT || area != nullptr ||
          why.find("rank " + std::to_string(odd) + " asked for 0 bytes per rank") ==
              std::string::npos) {
        problem = "0 bytes on rank " + std::to_string(odd) + ": status " + std::to_string(status) +
                  ": " + why;
      } else if (seconds > 5) {
        problem = "0 bytes on rank " + std::to_string(odd) + " took " + std::to_string(seconds) +
                  " s: a peer waited";
      }
    }
    // Nothing is held: the same size on every rank then works.
    if (problem.empty() && shm_memory().alloc(workspace, 4100, &area) != ARBITER_OK) {
      problem = std::string("the same size: ") + shm().last_error();
    }
    if (area != nullptr) shm_memory().free(workspace, area);
    shm().workspace_destroy(workspace);
    return problem;
  };
  run_group(2, body);
  run_group(3, body);
}

// ARBITER_SHM_OWNERS_FROM sets the size from which the owners' path runs,
// the same on every rank. Seen from outside: a replicated two-shot call
// whose outputs are registered on rank 0 only is staged below it (exact on
// every rank) and refused on every rank at or above it (a peer would read
// rank 1's outputs where they are not). A value that is not a size is
// refused at creation.
BOOST_AUTO_TEST_CASE(the_owners_path_starts_at_its_threshold_on_every_rank) {
  const arbiter_dtype dtype = ARBITER_DTYPE_BF16;
  const std::size_t bytes = std::size_t{kTokens} * kHidden * dtype_size(dtype);
  bool owners = false;  // whether the call takes the owners' path
  auto body = [&](int rank, const arbiter_oob& oob) -> std::string {
    const arbiter_workspace_spec spec = make_spec(oob, dtype, bytes);
    arbiter_workspace* workspace = nullptr;
    if (shm().workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + shm().last_error();
    }
    const std::vector<std::byte> input = input_of(dtype, rank);
    const std::vector<std::byte> residual = input_of(dtype, 6);
    std::vector<std::byte> gamma(std::size_t{kHidden} * dtype_size(dtype));
    for (std::uint32_t i = 0; i < kHidden; ++i) store_element(gamma.data(), i, dtype, gamma_at(i));
    Outputs want(dtype);
    arbiter_allreduce_args w =
        args_for(dtype, ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_ALGORITHM_TWOSHOT, input.data(),
                 residual, gamma, 0.02f, want);
    if (shm().run(workspace, &w, nullptr) != ARBITER_OK) {
      return std::string("run: ") + shm().last_error();
    }
    void* area = nullptr;
    if (shm_memory().alloc(workspace, 3 * bytes, &area) != ARBITER_OK) {
      return std::string("alloc: ") + shm().last_error();
    }
    auto* const registered = static_cast<std::byte*>(area);
    std::memcpy(registered, input.data(), bytes);
    Outputs got(dtype);
    arbiter_allreduce_args a =
        args_for(dtype, ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_ALGORITHM_TWOSHOT, registered,
                 residual, gamma, 0.02f, got);
    a.flags |= ARBITER_RUN_RESIDUAL_REPLICATED;
    a.allreduce_out = nullptr;
    if (rank == 0) {
      a.residual_out = registered + bytes;
      a.norm_out = registered + 2 * bytes;
    }
    const std::int32_t status = shm_memory().run_registered(workspace, &a, nullptr);
    const std::string error = status == ARBITER_OK ? "" : shm().last_error();
    if (rank == 0) {
      got.residual_out.assign(registered + bytes, registered + 2 * bytes);
      got.norm_out.assign(registered + 2 * bytes, registered + 3 * bytes);
    }
    shm_memory().free(workspace, area);
    shm().workspace_destroy(workspace);
    if (owners) {
      if (status == ARBITER_OK) return "accepted outputs registered on rank 0 only";
      if (error.find("outputs' memory") == std::string::npos) return "unclear refusal: " + error;
      return "";
    }
    if (status != ARBITER_OK) return "refused below the threshold: " + error;
    std::string problem = compare("residual_out", got.residual_out, want.residual_out);
    if (problem.empty()) problem = compare("norm_out", got.norm_out, want.norm_out);
    return problem;
  };
  BOOST_TEST_REQUIRE(bytes >= 1024u);
  BOOST_TEST_REQUIRE(bytes < 64u * 1024);  // unset: below the default threshold
  // "": unset (the default, 64 KiB, above this call: staged); just above this call; at it
  // (inclusive); with a unit.
  const std::pair<std::string, bool> settings[] = {{"", false},
                                                   {std::to_string(bytes + 2), false},
                                                   {std::to_string(bytes), true},
                                                   {"1KiB", true}};
  for (const auto& [value, takes_owners] : settings) {
    BOOST_TEST_CONTEXT("ARBITER_SHM_OWNERS_FROM=" << value) {
      if (value.empty()) {
        unsetenv("ARBITER_SHM_OWNERS_FROM");
      } else {
        setenv("ARBITER_SHM_OWNERS_FROM", value.c_str(), 1);
      }
      owners = takes_owners;
      run_group(2, body);
    }
  }
  setenv("ARBITER_SHM_OWNERS_FROM", "4 MiB", 1);
  expect_refusal(ARBITER_INVALID_ARGUMENT, "ARBITER_SHM_OWNERS_FROM='4 MiB' is not a size");
  unsetenv("ARBITER_SHM_OWNERS_FROM");
}

// Unset, the owners' path starts at 64 KiB per rank (owners_threshold.h has
// the measurements), seen as above: with outputs registered on rank 0 only,
// a call one token short of 64 KiB is staged and succeeds on every rank, and
// a call of 64 KiB is refused on every rank.
BOOST_AUTO_TEST_CASE(by_default_the_owners_path_starts_at_64_KiB) {
  constexpr std::uint32_t kRowElements = 1024;  // bf16: 2 KiB a token
  constexpr std::uint32_t kAtThreshold = 32;
  constexpr std::size_t kRowBytes = std::size_t{kRowElements} * 2;
  static_assert(kAtThreshold * kRowBytes == 64 * 1024);
  unsetenv("ARBITER_SHM_OWNERS_FROM");
  for (const std::uint32_t tokens : {kAtThreshold - 1, kAtThreshold}) {
    BOOST_TEST_CONTEXT(tokens << " tokens") {
      run_group(2, [&](int rank, const arbiter_oob& oob) -> std::string {
        const std::size_t bytes = tokens * kRowBytes;
        const arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_BF16, bytes);
        arbiter_workspace* workspace = nullptr;
        if (shm().workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
          return std::string("workspace_create: ") + shm().last_error();
        }
        void* area = nullptr;
        if (shm_memory().alloc(workspace, 3 * bytes, &area) != ARBITER_OK) {
          shm().workspace_destroy(workspace);
          return std::string("alloc: ") + shm().last_error();
        }
        auto* const registered = static_cast<std::byte*>(area);
        const std::uint16_t one = 0x3F80;  // bf16 1.0
        for (std::size_t i = 0; i < bytes / 2; ++i) std::memcpy(registered + 2 * i, &one, 2);
        const std::vector<std::uint16_t> residual(bytes / 2, 0), gamma(kRowElements, one);
        std::vector<std::uint16_t> residual_out(bytes / 2), norm_out(bytes / 2);
        arbiter_allreduce_args a = allreduce_args(ARBITER_DTYPE_BF16, ARBITER_ALGORITHM_TWOSHOT,
                                                  tokens, kRowElements, registered, nullptr);
        a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
        a.flags = ARBITER_RUN_RESIDUAL_REPLICATED;
        a.residual_in = residual.data();
        a.gamma = gamma.data();
        a.eps = 1e-6f;
        a.residual_out = rank == 0 ? static_cast<void*>(registered + bytes) : residual_out.data();
        a.norm_out = rank == 0 ? static_cast<void*>(registered + 2 * bytes) : norm_out.data();
        const std::int32_t status = shm_memory().run_registered(workspace, &a, nullptr);
        const std::string error = status == ARBITER_OK ? "" : shm().last_error();
        shm_memory().free(workspace, area);
        shm().workspace_destroy(workspace);
        if (tokens < kAtThreshold) {
          return status == ARBITER_OK ? "" : "refused below 64 KiB: " + error;
        }
        if (status == ARBITER_OK) return "accepted outputs registered on rank 0 only at 64 KiB";
        return error.find("outputs' memory") == std::string::npos ? "unclear refusal: " + error
                                                                  : "";
      });
    }
  }
}

BOOST_AUTO_TEST_CASE(each_probe_token_tells_its_wrong_order_from_the_reference) {
  for (arbiter_dtype dtype : {ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP16}) {
    const auto& probes = probe_tokens(dtype);
    std::vector<std::byte> gamma(std::size_t{kHidden} * dtype_size(dtype));
    for (std::uint32_t i = 0; i < kHidden; ++i) store_element(gamma.data(), i, dtype, gamma_at(i));
    const std::vector<std::byte> zeros(gamma.size());
    for (std::size_t p = 0; p < probes.size(); ++p) {
      BOOST_TEST_CONTEXT(dtype_name(dtype) << ", " << kWrongOrders[p].name) {
        BOOST_TEST_REQUIRE(probes[p].size() == kHidden);
        std::vector<std::byte> norm_out(gamma.size());
        arbiter_allreduce_args a{};
        a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
        a.dtype = dtype;
        a.tokens = 1;
        a.hidden = kHidden;
        a.residual_in = zeros.data();
        a.gamma = gamma.data();
        a.eps = kEps;
        a.weight_bias = kWeightBias;
        a.norm_out = norm_out.data();
        std::vector<float> row = probes[p];
        apply_epilogue_token(a, 0, row.data());
        std::vector<std::uint32_t> reference(kHidden);
        for (std::uint32_t i = 0; i < kHidden; ++i) {
          reference[i] = load_bits(norm_out.data(), i, dtype);
        }
        BOOST_TEST((reference == norm_bits(probes[p], kReferenceOrder, dtype)));
        BOOST_TEST((reference != norm_bits(probes[p], kWrongOrders[p], dtype)));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(an_unknown_level_is_refused_on_every_rank) {
  setenv("ARBITER_SHM_ISA", "avx1024", 1);
  expect_refusal(ARBITER_INVALID_ARGUMENT, "ARBITER_SHM_ISA='avx1024' is not a level");
  unsetenv("ARBITER_SHM_ISA");
}
