// The shm module's per-token arithmetic has AVX-512 BF16, AVX-512, AVX2 and
// scalar versions (token_kernels.h); ARBITER_SHM_ISA picks one. Each version this CPU
// runs must give the bits of the same arithmetic compiled here for baseline
// x86-64, on every dtype and pattern and on the values vector code gets wrong
// most easily: NaN (quiet and signalling), infinities, subnormals, -0.0,
// sums that overflow, and a hidden size that is not a multiple of the
// vector width.
#define BOOST_TEST_MODULE backends_shm_bits
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
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

constexpr std::uint32_t kTokens = 3;
// 63 blocks of 16 and a tail of 8: the AVX-512 kernels take bf16 32 at a
// step (token_lanes_avx512.h), then one block of 16, then scalars.
constexpr std::uint32_t kHidden = 1016;

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
  arbiter_allreduce_args a{};
  a.pattern = pattern;
  a.dtype = dtype;
  a.algorithm = algorithm;
  a.tokens = kTokens;
  a.hidden = kHidden;
  a.input = input;
  a.allreduce_out = out.allreduce_out.data();
  a.residual_in = residual.data();
  a.residual_out = out.residual_out.data();
  a.gamma = gamma.data();
  a.eps = 1e-5f;
  a.weight_bias = 0.5f;
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
      return std::string(name) + " differs at byte " + std::to_string(i) + " (token " +
             std::to_string(i / (got.size() / kTokens)) + ")";
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
      store_element(gamma.data(), i, dtype, 0.5f + static_cast<float>(i % 13) / 8.0f);
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
    }
  }
  unsetenv("ARBITER_SHM_ISA");
}

BOOST_AUTO_TEST_CASE(an_unknown_level_is_refused_on_every_rank) {
  setenv("ARBITER_SHM_ISA", "avx1024", 1);
  expect_refusal(ARBITER_INVALID_ARGUMENT, "ARBITER_SHM_ISA='avx1024' is not a level");
  unsetenv("ARBITER_SHM_ISA");
}
