// The shm backend module as the runtime sees it: dlopen'ed from the plugin
// folder, driven by N forked rank processes over a test-only oob.
#define BOOST_TEST_MODULE backends_shm
#include <boost/test/unit_test.hpp>

#include <fstream>

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/common/fp8.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/reference.h"
#include "arbiter/common/sentinel.h"
#include "arbiter_backend.h"
#include "fork_ranks.h"
#include "in_place_layouts.h"
#include "shm_harness.h"
#include "workspace.h"  // backends/shm: the one-shot call counter (sequence_numbers_never_wrap)

using namespace arbiter::common;
using arbiter::test::Place;
using arbiter::test::run_ranks;
using namespace arbiter::test::shm_harness;

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1), reproducible from (seed, index) on any rank.
float uniform(std::uint64_t seed, std::uint64_t index) {
  return static_cast<float>(mix(seed * 0x100000001B3ull + index) >> 40) / 8388608.0f - 1.0f;
}

std::uint64_t fnv1a(std::uint64_t hash, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001B3ull;
  return hash;
}

// The buffers of one call, filled reproducibly so any rank can rebuild any
// other rank's input for the reference.
struct Buffers {
  arbiter_dtype dtype;
  std::uint32_t tokens, hidden;
  std::vector<std::byte> input, residual, gamma, allreduce_out, residual_out, norm_out;
  std::vector<std::uint8_t> quant;
  float scale = 0.01f;

  Buffers(arbiter_dtype d, std::uint32_t t, std::uint32_t h) : dtype(d), tokens(t), hidden(h) {
    const std::size_t bytes = std::size_t{t} * h * dtype_size(d);
    input.resize(bytes);
    residual.resize(bytes);
    gamma.resize(std::size_t{h} * dtype_size(d));
    allreduce_out.resize(bytes);
    residual_out.resize(bytes);
    norm_out.resize(bytes);
    quant.resize(std::size_t{t} * h);
  }

  std::size_t count() const { return std::size_t{tokens} * hidden; }

  static void fill(std::vector<std::byte>& buffer, arbiter_dtype d, std::size_t n,
                   std::uint64_t seed, float offset) {
    for (std::size_t i = 0; i < n; ++i)
      store_element(buffer.data(), i, d, offset + uniform(seed, i));
  }

  void poison() {
    for (auto* buffer : {&allreduce_out, &residual_out, &norm_out}) {
      std::memset(buffer->data(), 0xCD, buffer->size());
    }
    std::memset(quant.data(), 0xCD, quant.size());
  }

  // "" when every output the call was not given still holds the poison.
  std::string unrequested_untouched(const arbiter_allreduce_args& args) const {
    auto poisoned = [](const auto& buffer) {
      for (auto byte : buffer) {
        if (static_cast<unsigned char>(byte) != 0xCD) return false;
      }
      return true;
    };
    if (!args.allreduce_out && !poisoned(allreduce_out)) return "allreduce_out written";
    if (!args.residual_out && !poisoned(residual_out)) return "residual_out written";
    if (!args.norm_out && !poisoned(norm_out)) return "norm_out written";
    if (!args.quant_out && !poisoned(quant)) return "quant_out written";
    return "";
  }

  std::uint64_t hash(const arbiter_allreduce_args& args) const {
    std::uint64_t h = 0xCBF29CE484222325ull;
    const std::size_t bytes = allreduce_out.size();
    if (args.allreduce_out) h = fnv1a(h, allreduce_out.data(), bytes);
    if (args.residual_out) h = fnv1a(h, residual_out.data(), bytes);
    if (args.norm_out) h = fnv1a(h, norm_out.data(), bytes);
    if (args.quant_out) h = fnv1a(h, quant.data(), quant.size());
    return h;
  }
};

// What a test case asks for: a pattern and which optional outputs exist.
struct Variant {
  arbiter_pattern pattern;
  bool allreduce_out;
  bool norm_out;
  float weight_bias;
};

constexpr Variant kVariants[] = {
    {ARBITER_PATTERN_ALLREDUCE, true, false, 0.0f},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM, false, true, 0.0f},
    // Gemma, with the sum too (norm_out is required: arbiter_backend.h).
    {ARBITER_PATTERN_RESIDUAL_RMSNORM, true, true, 1.0f},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, true, true, 0.0f},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, false, false, 1.0f},
};

arbiter_allreduce_args make_args(Buffers& b, const Variant& v, arbiter_algorithm algorithm) {
  arbiter_allreduce_args args{};
  args.pattern = v.pattern;
  args.dtype = b.dtype;
  args.algorithm = algorithm;
  args.tokens = b.tokens;
  args.hidden = b.hidden;
  args.input = b.input.data();
  args.allreduce_out = v.allreduce_out ? b.allreduce_out.data() : nullptr;
  if (v.pattern != ARBITER_PATTERN_ALLREDUCE) {
    args.residual_in = b.residual.data();
    args.residual_out = b.residual_out.data();
    args.gamma = b.gamma.data();
    args.eps = 1e-5f;
    args.weight_bias = v.weight_bias;
    args.norm_out = v.norm_out ? b.norm_out.data() : nullptr;
  }
  if (v.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) {
    args.quant_out = b.quant.data();
    args.scale = &b.scale;
  }
  return args;
}

std::string describe(int ws, arbiter_dtype dtype, std::uint32_t tokens, std::uint32_t hidden,
                     int variant) {
  return "ws " + std::to_string(ws) + " " + dtype_name(dtype) + " tokens " +
         std::to_string(tokens) + " hidden " + std::to_string(hidden) + " variant " +
         std::to_string(variant);
}

// Checks rank 0's outputs of `args` against the fp64 reference over every
// rank's input (rebuilt from the seeds).
std::string check_against_reference(const Buffers& b, const arbiter_allreduce_args& args, int ws,
                                    std::uint64_t seed) {
  std::vector<std::vector<std::byte>> inputs(ws, std::vector<std::byte>(b.input.size()));
  ReferenceCase c;
  c.pattern = args.pattern;
  c.dtype = b.dtype;
  c.tokens = b.tokens;
  c.hidden = b.hidden;
  for (int r = 0; r < ws; ++r) {
    Buffers::fill(inputs[r], b.dtype, b.count(), seed + 1 + r, 0.0f);
    c.inputs.push_back(inputs[r].data());
  }
  c.residual_in = b.residual.data();
  c.gamma = b.gamma.data();
  c.eps = args.eps;
  c.weight_bias = args.weight_bias;
  c.scale = b.scale;
  const ReferenceOutputs ref = compute_reference(c);
  std::string problem;
  if (args.allreduce_out) {
    problem = check_output(args.allreduce_out, b.dtype, ref.sum, ref.sum_bound, b.hidden,
                           "allreduce_out");
  }
  if (problem.empty() && args.residual_out) {
    problem = check_output(args.residual_out, b.dtype, ref.residual, ref.residual_bound, b.hidden,
                           "residual_out");
  }
  if (problem.empty() && args.norm_out) {
    problem = check_output(args.norm_out, b.dtype, ref.norm, ref.norm_bound, b.hidden, "norm_out");
  }
  if (problem.empty() && args.quant_out) {
    problem = check_fp8(b.quant.data(), ref, b.scale, b.hidden);
  }
  return problem;
}

// The ways a call can run: each algorithm, and two-shot again with the
// residual declared replicated (every rank's residual_in is the same here).
struct Method {
  arbiter_algorithm algorithm;
  std::uint32_t flags;
};
constexpr Method kMethods[] = {{ARBITER_ALGORITHM_ONESHOT, 0},
                               {ARBITER_ALGORITHM_TWOSHOT, 0},
                               {ARBITER_ALGORITHM_TWOSHOT, ARBITER_RUN_RESIDUAL_REPLICATED},
                               {ARBITER_ALGORITHM_NATIVE, 0}};

std::string method_name(const Method& m) {
  return std::string(algorithm_name(m.algorithm)) +
         ((m.flags & ARBITER_RUN_RESIDUAL_REPLICATED) != 0 ? " (residual replicated)" : "");
}

// One (dtype, tokens, hidden, variant) in every method: outputs within the
// reference's bounds, nothing written that was not asked for, and the same
// bits from every method and on every rank.
std::string check_case(int rank, const arbiter_oob& oob, arbiter_workspace* workspace,
                       arbiter_dtype dtype, std::uint32_t tokens, std::uint32_t hidden, int variant,
                       std::uint64_t seed) {
  const auto& module = shm();
  const int ws = oob.size;
  Buffers b(dtype, tokens, hidden);
  Buffers::fill(b.input, dtype, b.count(), seed + 1 + rank, 0.0f);
  Buffers::fill(b.residual, dtype, b.count(), seed, 0.0f);
  Buffers::fill(b.gamma, dtype, hidden, seed + 99,
                kVariants[variant].weight_bias == 0.0f ? 1.0f : 0.0f);
  std::array<std::uint64_t, std::size(kMethods)> hashes{};
  for (std::size_t m = 0; m < std::size(kMethods); ++m) {
    const arbiter_algorithm algorithm = kMethods[m].algorithm;
    const std::string where =
        describe(ws, dtype, tokens, hidden, variant) + " " + method_name(kMethods[m]);
    b.poison();
    arbiter_allreduce_args args = make_args(b, kVariants[variant], algorithm);
    args.flags = kMethods[m].flags;
    if (module.run(workspace, &args, nullptr) != ARBITER_OK) {
      return where + ": run: " + module.last_error();
    }
    if (const std::string stray = b.unrequested_untouched(args); !stray.empty()) {
      return where + ": " + stray + " although the call did not pass it";
    }
    hashes[m] = b.hash(args);
    if (rank == 0 && m == 0) {
      const std::string problem = check_against_reference(b, args, ws, seed);
      if (!problem.empty()) return where + ": " + problem;
    }
  }
  const std::string where = describe(ws, dtype, tokens, hidden, variant) + " " +
                            algorithm_name(ARBITER_ALGORITHM_ONESHOT);
  for (std::size_t m = 1; m < std::size(kMethods); ++m) {
    if (hashes[m] != hashes[0]) {
      return where + ": " + method_name(kMethods[m]) + " and one-shot outputs differ in some bit";
    }
  }
  std::vector<std::uint64_t> all(ws);
  if (oob.allgather(oob.ctx, &hashes[0], all.data(), sizeof(std::uint64_t), kTimeoutMs) !=
      ARBITER_OK) {
    return std::string("oob allgather: ") + oob.last_error(oob.ctx);
  }
  for (int r = 1; r < ws; ++r) {
    if (all[r] != all[0]) {
      return where + ": rank " + std::to_string(r) + "'s outputs differ from rank 0's";
    }
  }
  return "";
}

struct Shape {
  std::uint32_t hidden;
  std::vector<std::uint32_t> tokens;
};

// Every dtype x shape x variant, one workspace per dtype sized for the
// largest shape, or for `workspace_tokens` tokens of the widest shape when
// that is not 0 (larger calls then stream through it in slices).
std::string sweep(int rank, const arbiter_oob& oob, const std::vector<Shape>& shapes,
                  std::uint32_t workspace_tokens = 0) {
  const auto& module = shm();
  for (arbiter_dtype dtype : {ARBITER_DTYPE_FP32, ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP16}) {
    std::uint64_t largest = 0;
    for (const Shape& shape : shapes) {
      for (std::uint32_t tokens : shape.tokens) {
        largest = std::max<std::uint64_t>(
            largest,
            std::uint64_t{workspace_tokens != 0 ? workspace_tokens : tokens} * shape.hidden);
      }
    }
    const arbiter_workspace_spec spec = make_spec(oob, dtype, largest * dtype_size(dtype));
    arbiter_workspace* workspace = nullptr;
    if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + module.last_error();
    }
    std::uint64_t seed = 1000 * dtype;
    for (const Shape& shape : shapes) {
      for (std::uint32_t tokens : shape.tokens) {
        for (int variant = 0; variant < 5; ++variant) {
          seed += 100;
          const std::string problem =
              check_case(rank, oob, workspace, dtype, tokens, shape.hidden, variant, seed);
          if (!problem.empty()) return problem;
        }
      }
    }
    module.workspace_destroy(workspace);
  }
  return "";
}

// Model-like hidden sizes (2880 is not a multiple of 32 threads), token
// counts not divisible by the world size, and fewer tokens than ranks.
std::string model_shapes(int rank, const arbiter_oob& oob) {
  return sweep(rank, oob, {{1024, {3, 7, 13}}, {2880, {7, 13}}, {7168, {7, 13}}});
}

// 1000 calls alternating one-shot and two-shot (and native) on bf16 exact
// small integers, different in every call and of changing sizes: a stale
// element from an earlier call or a missed clear shows up as a wrong sum.
// One-shot calls also run back to back: a two-shot call in between is a full
// barrier and would hide races between consecutive Lamport stages. One
// two-shot call in eight declares the residual replicated (a zero residual
// on every rank), so its sums come from their owners' staged outputs: a
// fast rank's next call overwriting them early shows up as a wrong sum.
std::string back_to_back(int rank, const arbiter_oob& oob) {
  constexpr arbiter_algorithm kSchedule[8] = {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_ONESHOT,
                                              ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT,
                                              ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT,
                                              ARBITER_ALGORITHM_TWOSHOT, ARBITER_ALGORITHM_NATIVE};
  const auto& module = shm();
  constexpr std::uint32_t kHidden = 256;
  const arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_BF16, 9ull * kHidden * 2);
  arbiter_workspace* workspace = nullptr;
  if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
    return std::string("workspace_create: ") + module.last_error();
  }
  std::vector<std::uint16_t> input(9 * kHidden), output(9 * kHidden), norm(9 * kHidden);
  const std::vector<std::uint16_t> zeros(9 * kHidden, 0), ones(kHidden, 0x3F80);
  for (int call = 0; call < 1000; ++call) {
    const std::uint32_t tokens = 1 + (call * 5) % 9;
    const std::size_t count = std::size_t{tokens} * kHidden;
    auto value = [&](int r, std::size_t i) {
      return static_cast<float>(static_cast<int>((call * 7 + r * 3 + i) % 17) - 8);
    };
    for (std::size_t i = 0; i < count; ++i) input[i] = float_to_bf16_bits(value(rank, i));
    arbiter_allreduce_args args{};
    args.pattern = ARBITER_PATTERN_ALLREDUCE;
    args.dtype = ARBITER_DTYPE_BF16;
    args.algorithm = kSchedule[call % 8];
    args.tokens = tokens;
    args.hidden = kHidden;
    args.input = input.data();
    args.allreduce_out = output.data();
    if (call % 8 == 6) {
      args.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
      args.flags = ARBITER_RUN_RESIDUAL_REPLICATED;
      args.residual_in = zeros.data();
      args.gamma = ones.data();
      args.eps = 1e-5f;
      args.norm_out = norm.data();
    }
    if (module.run(workspace, &args, nullptr) != ARBITER_OK) {
      return "call " + std::to_string(call) + ": " + module.last_error();
    }
    for (std::size_t i = 0; i < count; ++i) {
      float expected = 0.0f;
      for (int r = 0; r < oob.size; ++r) expected += value(r, i);
      if (bf16_bits_to_float(output[i]) != expected) {
        return "call " + std::to_string(call) + " (" + algorithm_name(args.algorithm) +
               ") element " + std::to_string(i) + ": got " +
               std::to_string(bf16_bits_to_float(output[i])) + ", expected " +
               std::to_string(expected);
      }
    }
  }
  module.workspace_destroy(workspace);
  return "";
}

}  // namespace

BOOST_AUTO_TEST_CASE(probe_admits_cpu_ranks_with_world_sizes_1_to_63_and_no_fp4) {
  arbiter_probe_args args{ARBITER_DEVICE_CPU, -1};
  arbiter_backend_caps caps{};
  BOOST_TEST(shm().abi_version == 1u);
  BOOST_TEST(std::string(shm().name) == "shm");
  BOOST_TEST_REQUIRE(shm().probe(&args, &caps) == ARBITER_OK);
  BOOST_TEST(caps.device_kind == ARBITER_DEVICE_CPU);
  BOOST_TEST(caps.world_size_mask == (~std::uint64_t{0} & ~std::uint64_t{1}));
  BOOST_TEST(caps.dtype_mask == 0x7u);
  BOOST_TEST(caps.pattern_mask == 0x7u);  // allreduce, rmsnorm, rmsnorm+fp8
  BOOST_TEST(caps.algorithm_mask == 0x7u);
  BOOST_TEST(caps.flags == (ARBITER_CAPS_SINGLE_NODE_ONLY | ARBITER_CAPS_RESIDUAL_OPTIONAL |
                            ARBITER_CAPS_JOINS_REFUSALS));
  arbiter_probe_args gpu{ARBITER_DEVICE_GPU, 0};
  BOOST_TEST(shm().probe(&gpu, &caps) == ARBITER_UNAVAILABLE);
  BOOST_TEST(std::string(shm().last_error()).find("CPU") != std::string::npos);
}

// A TP=1 job: every algorithm is the epilogue alone (the sum of one rank is
// its input, with -0.0 read as +0.0 as in every sum), streamed through a
// workspace of 3 tokens too, and no shared memory is ever created.
BOOST_AUTO_TEST_CASE(one_rank_matches_the_reference_in_every_algorithm_without_shared_memory) {
  run_group(1, [](int rank, const arbiter_oob& oob) {
    std::string problem = model_shapes(rank, oob);
    if (problem.empty()) problem = sweep(rank, oob, {{1024, {4, 7, 40}}, {3, {2}}}, 3);
    if (!problem.empty()) return problem;
    // The name is unlinked at once even for a group, so look at the mappings.
    const arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_BF16, 1 << 20);
    arbiter_workspace* workspace = nullptr;
    if (shm().workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + shm().last_error();
    }
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
      if (line.find("arbiter-shm-") != std::string::npos) problem = "mapped: " + line;
    }
    shm().workspace_destroy(workspace);
    return problem;
  });
}

BOOST_AUTO_TEST_CASE(two_ranks_match_the_reference_bit_identically_in_every_algorithm) {
  run_group(2, model_shapes);
}

BOOST_AUTO_TEST_CASE(four_ranks_match_the_reference_bit_identically_in_every_algorithm) {
  run_group(4, model_shapes);
}

BOOST_AUTO_TEST_CASE(eight_ranks_match_the_reference_bit_identically_in_every_algorithm) {
  run_group(8, model_shapes);
}

// A workspace of 3 tokens: every call of 4 to 40 tokens streams through it
// in slices, in every algorithm, dtype and pattern, in place too, with the
// bits of an unsliced call (the reference bounds and the equality across
// algorithms, whose slices differ from each other's chunks, say so).
BOOST_AUTO_TEST_CASE(calls_larger_than_the_workspace_stream_through_it_exactly) {
  run_group(2, [](int rank, const arbiter_oob& oob) {
    return sweep(rank, oob, {{1024, {4, 7, 40}}, {2880, {5}}}, 3);
  });
  run_group(3, [](int rank, const arbiter_oob& oob) {
    return sweep(rank, oob, {{512, {4, 10}}}, 3);
  });
}

BOOST_AUTO_TEST_CASE(odd_world_sizes_and_messages_that_do_not_fill_whole_words_work) {
  // Messages whose bytes are not a multiple of 8 take the per-element tail
  // path; 3 and 16 ranks are not the usual 2, 4, 8.
  for (int ranks : {3, 16}) {
    run_group(ranks, [](int rank, const arbiter_oob& oob) {
      return sweep(rank, oob, {{1, {1, 5}}, {3, {2}}, {1001, {3}}});
    });
  }
}

BOOST_AUTO_TEST_CASE(a_thousand_back_to_back_calls_alternating_algorithms_stay_exact) {
  run_group(8, back_to_back);
}

BOOST_AUTO_TEST_CASE(back_to_back_calls_stay_exact_when_ranks_are_preempted_at_random) {
  // A rank frozen anywhere, mid-poll included, must neither hang the others
  // nor let them see stale or half-cleared data.
  run_group(8, back_to_back, 120, /*preempt=*/true);
}

// One-shot sequence numbers after 2^32 calls (a server makes that many in
// hours): a peer's chunk counts as published only once this call published
// it, never because a line still holds a number from long ago. The call
// counter is set as 2^32 earlier calls would leave it (white box: the
// module's Workspace behind the handle), and rank 1 comes 300 ms late, so a
// rank that did not wait sums a slot rank 1 has not written yet.
//   - counter 2^32 - 1: the number published matched, in 32 bits, the zero
//     of lines no call has reached (this call has 8 chunks, none before it);
//   - counter 2^32 + 1, after two calls: it matched the lines call 1 left.
std::string sequence_numbers_never_wrap(int rank, const arbiter_oob& oob) {
  const auto& module = shm();
  constexpr std::uint32_t kHidden = 1024, kTokens = 64;  // 4 KiB rows: 8 chunks
  const arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_FP32, 256 * 1024);
  for (const bool after_two_calls : {false, true}) {
    arbiter_workspace* workspace = nullptr;
    if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + module.last_error();
    }
    std::vector<float> input(std::size_t{kTokens} * kHidden), output(input.size());
    const arbiter_allreduce_args args =
        allreduce_args(ARBITER_DTYPE_FP32, ARBITER_ALGORITHM_ONESHOT, kTokens, kHidden,
                       input.data(), output.data());
    std::uint64_t counter = (std::uint64_t{1} << 32) - 1;
    if (after_two_calls) {
      std::fill(input.begin(), input.end(), 10.0f * static_cast<float>(rank + 1));
      for (int call = 0; call < 2; ++call) {
        if (module.run(workspace, &args, nullptr) != ARBITER_OK) return module.last_error();
      }
      counter = (std::uint64_t{1} << 32) + 1;
    }
    // Every rank sets it before anyone calls again (it must agree across ranks).
    if (oob.barrier(oob.ctx, kTimeoutMs) != ARBITER_OK) return "barrier failed";
    reinterpret_cast<arbiter::shm::Workspace*>(workspace)->sequence = counter;
    if (oob.barrier(oob.ctx, kTimeoutMs) != ARBITER_OK) return "barrier failed";
    std::fill(input.begin(), input.end(), static_cast<float>(rank + 1));
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (module.run(workspace, &args, nullptr) != ARBITER_OK) return module.last_error();
    std::string result;
    const float expected = static_cast<float>(oob.size * (oob.size + 1) / 2);
    for (std::size_t i = 0; i < output.size() && result.empty(); ++i) {
      if (output[i] != expected) {
        result = "call number " + std::to_string(counter) + ": element " + std::to_string(i) +
                 " is " + std::to_string(output[i]) + ", expected " + std::to_string(expected);
      }
    }
    if (oob.barrier(oob.ctx, kTimeoutMs) != ARBITER_OK) return "barrier failed";
    module.workspace_destroy(workspace);
    if (!result.empty()) return result;
  }
  return "";
}

BOOST_AUTO_TEST_CASE(one_shot_sequence_numbers_do_not_wrap_after_two_to_the_32_calls) {
  run_group(2, sequence_numbers_never_wrap);
}

// 2 ranks take the kernels' two-rank sums (token_kernels_vector.h), 4 the
// general ones.
std::string negative_zero_and_subnormals(int rank, const arbiter_oob& oob) {
  const auto& module = shm();
  // 1000: the last 8 elements of each row take the kernels' scalar tail.
  constexpr std::uint32_t kTokens = 5, kHidden = 1000;
  for (arbiter_dtype dtype : {ARBITER_DTYPE_FP16, ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP32}) {
    const std::size_t element = dtype_size(dtype);
    // A short timeout: a hang here shows up as ARBITER_TIMEOUT, not a stuck test.
    const arbiter_workspace_spec spec =
        make_spec(oob, dtype, std::uint64_t{kTokens} * kHidden * element, 5000);
    arbiter_workspace* workspace = nullptr;
    if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + module.last_error();
    }
    const std::size_t count = std::size_t{kTokens} * kHidden;
    std::vector<std::byte> input(count * element), output(count * element);
    std::vector<const void*> inputs;
    for (int fill = 0; fill < 2; ++fill) {
      // fill 0: every element -0.0 on every rank. fill 1: negative and
      // positive subnormals, the patterns flush-to-zero turns into -0.0.
      for (std::size_t i = 0; i < count; ++i) {
        std::uint32_t bits = negative_zero_bits(dtype);
        if (fill == 1) {
          const std::uint32_t tiny = 1 + (i * 7 + rank) % (element == 4 ? 0x7FFFFF : 0x7F);
          bits = (i + rank) % 3 ? (negative_zero_bits(dtype) | tiny) : tiny;
        }
        store_bits(input.data(), i, dtype, bits);
      }
      for (arbiter_algorithm algorithm :
           {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT, ARBITER_ALGORITHM_NATIVE}) {
        const arbiter_allreduce_args args =
            allreduce_args(dtype, algorithm, kTokens, kHidden, input.data(), output.data());
        const std::string where = std::string(dtype_name(dtype)) + " fill " + std::to_string(fill) +
                                  " " + algorithm_name(algorithm);
        if (module.run(workspace, &args, nullptr) != ARBITER_OK) {
          return where + ": " + module.last_error();
        }
        for (std::size_t i = 0; i < count; ++i) {
          if (fill == 0 && load_bits(output.data(), i, dtype) != 0) {
            return where + ": -0.0 inputs must sum to +0.0 on every rank";
          }
        }
        if (fill == 1) {
          // Subnormals survive: the sum of the sanitised bit patterns.
          std::vector<std::vector<std::byte>> all(oob.size, input);
          ReferenceCase c;
          c.dtype = dtype;
          c.tokens = kTokens;
          c.hidden = kHidden;
          for (int r = 0; r < oob.size; ++r) {
            for (std::size_t i = 0; i < count; ++i) {
              const std::uint32_t tiny = 1 + (i * 7 + r) % (element == 4 ? 0x7FFFFF : 0x7F);
              store_bits(all[r].data(), i, dtype,
                         (i + r) % 3 ? (negative_zero_bits(dtype) | tiny) : tiny);
            }
            c.inputs.push_back(all[r].data());
          }
          const ReferenceOutputs ref = compute_reference(c);
          const std::string problem =
              check_output(output.data(), dtype, ref.sum, ref.sum_bound, kHidden, "allreduce_out");
          if (!problem.empty()) return where + ": " + problem;
        }
      }
    }
    module.workspace_destroy(workspace);
  }
  return "";
}

BOOST_AUTO_TEST_CASE(inputs_full_of_negative_zero_and_subnormals_do_not_hang) {
  run_group(2, negative_zero_and_subnormals);
  run_group(4, negative_zero_and_subnormals);
}

// Each layout in each algorithm gives the bits of the same call with
// separate buffers; a call that breaks the contract is refused on every
// rank and writes nothing.
std::string in_place_calls(int rank, const arbiter_oob& oob) {
  const auto& module = shm();
  constexpr std::uint32_t kTokens = 7;
  // 1000: the scalar tail after the vector blocks (it wrote allreduce_out
  // before reading residual_in, which may be the same buffer).
  for (const std::uint32_t hidden : {1024u, 1000u})
    for (arbiter_dtype dtype : {ARBITER_DTYPE_FP32, ARBITER_DTYPE_BF16, ARBITER_DTYPE_FP16}) {
      const arbiter_workspace_spec spec =
          make_spec(oob, dtype, std::uint64_t{kTokens} * hidden * dtype_size(dtype));
      arbiter_workspace* workspace = nullptr;
      if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
        return std::string("workspace_create: ") + module.last_error();
      }
      Buffers b(dtype, kTokens, hidden);
      Buffers::fill(b.input, dtype, b.count(), 7 + rank, 0.0f);
      Buffers::fill(b.residual, dtype, b.count(), 5, 0.0f);
      Buffers::fill(b.gamma, dtype, hidden, 3, 1.0f);
      for (const Method& method : kMethods) {
        const arbiter_algorithm algorithm = method.algorithm;
        for (std::size_t l = 0; l < std::size(arbiter::test::kInPlaceLayouts); ++l) {
          const arbiter::test::InPlaceLayout& layout = arbiter::test::kInPlaceLayouts[l];
          const std::string where = std::string(dtype_name(dtype)) + " hidden " +
                                    std::to_string(hidden) + " " + method_name(method) +
                                    " layout " + std::to_string(l);
          const Variant separate{layout.pattern, layout.allreduce_out != Place::kNone,
                                 layout.norm_out != Place::kNone, 0.0f};
          b.poison();
          arbiter_allreduce_args args = make_args(b, separate, algorithm);
          args.flags = method.flags;
          if (layout.residual_out == Place::kNone) args.residual_out = nullptr;
          if (module.run(workspace, &args, nullptr) != ARBITER_OK) {
            return where + " (separate buffers): " + module.last_error();
          }
          std::vector<std::byte> input = b.input;
          std::vector<std::byte> residual = b.residual;
          auto place = [&](Place p, std::vector<std::byte>& own) {
            return arbiter::test::place_output(p, own.data(), input.data(), residual.data());
          };
          Buffers in_place = b;
          in_place.poison();
          arbiter_allreduce_args a = args;
          a.input = input.data();
          if (a.residual_in) a.residual_in = residual.data();
          a.allreduce_out = place(layout.allreduce_out, in_place.allreduce_out);
          a.residual_out = place(layout.residual_out, in_place.residual_out);
          a.norm_out = place(layout.norm_out, in_place.norm_out);
          if (a.quant_out) a.quant_out = in_place.quant.data();
          if (module.run(workspace, &a, nullptr) != ARBITER_OK) {
            return where + ": " + module.last_error();
          }
          const struct {
            const char* name;
            const void* got;
            const std::vector<std::byte>& want;
          } outputs[] = {{"allreduce_out", a.allreduce_out, b.allreduce_out},
                         {"residual_out", a.residual_out, b.residual_out},
                         {"norm_out", a.norm_out, b.norm_out}};
          for (const auto& o : outputs) {
            if (o.got != nullptr && std::memcmp(o.got, o.want.data(), o.want.size()) != 0) {
              return where + ": in place, " + o.name + " differs from the separate-buffer result";
            }
          }
          if (a.quant_out && in_place.quant != b.quant) return where + ": quant_out differs";
        }
        // A partial overlap: refused before anything is written.
        b.poison();
        arbiter_allreduce_args bad = make_args(b, kVariants[1], algorithm);
        bad.norm_out = b.input.data() + 16;
        const std::vector<std::byte> input_before = b.input;
        const std::int32_t status = module.run(workspace, &bad, nullptr);
        const std::string message = module.last_error();
        if (status != ARBITER_INVALID_ARGUMENT ||
            message.find("shm run: norm_out overlaps input") == std::string::npos) {
          return std::string(dtype_name(dtype)) + " partial overlap: status " +
                 std::to_string(status) + ": " + message;
        }
        if (b.input != input_before || !b.unrequested_untouched(arbiter_allreduce_args{}).empty()) {
          return std::string(dtype_name(dtype)) + " partial overlap: a refused call wrote memory";
        }
      }
      module.workspace_destroy(workspace);
    }
  return "";
}

BOOST_AUTO_TEST_CASE(in_place_calls_give_the_separate_buffer_bits_and_overlaps_are_refused) {
  run_group(2, in_place_calls);
  run_group(4, in_place_calls);
}

BOOST_AUTO_TEST_CASE(calls_the_workspace_cannot_take_are_unsupported_and_change_nothing) {
  run_group(2, [](int rank, const arbiter_oob& oob) -> std::string {
    const auto& module = shm();
    constexpr std::uint32_t kHidden = 512;
    const arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_BF16, 4ull * kHidden * 2);
    arbiter_workspace* workspace = nullptr;
    if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + module.last_error();
    }
    // Any number of tokens streams through the slots; one token must fit.
    for (arbiter_algorithm algorithm :
         {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT, ARBITER_ALGORITHM_NATIVE}) {
      if (module.max_message_bytes(workspace, algorithm) != UINT64_MAX) {
        return "max_message_bytes is not 'any size'";
      }
    }
    Buffers b(ARBITER_DTYPE_BF16, 1, 5 * kHidden);  // one token wider than the slot
    Buffers::fill(b.input, b.dtype, b.count(), 7 + rank, 0.0f);
    Buffers::fill(b.residual, b.dtype, b.count(), 7, 0.0f);
    Buffers::fill(b.gamma, b.dtype, kHidden, 8, 1.0f);
    b.poison();
    const std::vector<std::byte> untouched = b.allreduce_out;
    for (arbiter_algorithm algorithm :
         {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT, ARBITER_ALGORITHM_NATIVE}) {
      arbiter_allreduce_args args = make_args(b, kVariants[0], algorithm);
      if (module.run(workspace, &args, nullptr) != ARBITER_UNSUPPORTED) {
        return std::string("a token wider than the slot was not refused: ") +
               algorithm_name(algorithm);
      }
      if (std::string(module.last_error()).find("one token of hidden 2560 is 5120 bytes") ==
          std::string::npos) {
        return std::string("oversize reason: ") + module.last_error();
      }
      // NVFP4 is refused with a reason, whatever the size.
      args = make_args(b, kVariants[3], algorithm);
      args.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
      args.tokens = 1;
      if (module.run(workspace, &args, nullptr) != ARBITER_UNSUPPORTED ||
          std::string(module.last_error()).find("NVFP4") == std::string::npos) {
        return std::string("fp4: ") + module.last_error();
      }
      // So is a dtype the workspace was not made for.
      args = make_args(b, kVariants[0], algorithm);
      args.dtype = ARBITER_DTYPE_FP16;
      args.tokens = 1;
      if (module.run(workspace, &args, nullptr) != ARBITER_UNSUPPORTED) {
        return std::string("dtype mismatch: ") + module.last_error();
      }
    }
    if (b.allreduce_out != untouched) return "a refused call wrote its output";
    // The workspace still works, at exactly its capacity.
    Buffers fits(ARBITER_DTYPE_BF16, 4, kHidden);
    Buffers::fill(fits.input, fits.dtype, fits.count(), 9 + rank, 0.0f);
    for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
      const arbiter_allreduce_args args = make_args(fits, kVariants[0], algorithm);
      if (module.run(workspace, &args, nullptr) != ARBITER_OK) {
        return std::string("after refusals: ") + module.last_error();
      }
    }
    module.workspace_destroy(workspace);
    return "";
  });
}

BOOST_AUTO_TEST_CASE(creation_fails_on_every_rank_when_one_rank_fails) {
  // Rank 2 asks for a different capacity; rank 1 of the second group for a
  // world size it is not in. Every rank must fail and name the culprit.
  run_group(4, [](int rank, const arbiter_oob& oob) -> std::string {
    const auto& module = shm();
    arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_FP32, rank == 2 ? 8192 : 4096);
    arbiter_workspace* workspace = nullptr;
    if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_INVALID_ARGUMENT ||
        workspace != nullptr) {
      return "disagreeing capacities were accepted";
    }
    if (std::string(module.last_error()).find("rank 2") == std::string::npos) {
      return std::string("reason does not name rank 2: ") + module.last_error();
    }
    spec = make_spec(oob, ARBITER_DTYPE_FP32, 4096);
    if (rank == 1) spec.world_size = 5;
    if (module.workspace_create(&oob, &spec, &workspace) == ARBITER_OK) {
      return "a rank with the wrong world size was accepted";
    }
    if (std::string(module.last_error()).find("rank 1") == std::string::npos) {
      return std::string("reason does not name rank 1: ") + module.last_error();
    }
    // And a clean attempt afterwards works.
    spec = make_spec(oob, ARBITER_DTYPE_FP32, 4096);
    if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("clean attempt: ") + module.last_error();
    }
    module.workspace_destroy(workspace);
    return "";
  });
}

// Taken in the parent before forking, read in the children.
std::set<std::string> g_entries_before;

// Two processes that both say they are rank 0 (oob.rank and spec.rank; the
// group itself still orders them 0 and 1) would share rank 0's slots.
BOOST_AUTO_TEST_CASE(creation_refuses_two_processes_that_say_they_are_the_same_rank) {
  run_group(2, [](int, const arbiter_oob& oob) -> std::string {
    arbiter_oob claims_rank_0 = oob;
    claims_rank_0.rank = 0;
    const arbiter_workspace_spec spec = make_spec(claims_rank_0, ARBITER_DTYPE_BF16, 4096);
    arbiter_workspace* workspace = nullptr;
    const std::int32_t code = shm().workspace_create(&claims_rank_0, &spec, &workspace);
    const std::string message = shm().last_error();
    if (code != ARBITER_INVALID_ARGUMENT || workspace != nullptr) {
      if (workspace != nullptr) shm().workspace_destroy(workspace);
      return "expected ARBITER_INVALID_ARGUMENT, got " + std::to_string(code) + ": " + message;
    }
    if (message.find("group's rank 1 says it is rank 0") == std::string::npos) {
      return "the error does not say which rank is claimed twice: " + message;
    }
    return "";
  });
}

BOOST_AUTO_TEST_CASE(no_shared_memory_name_is_left_once_creation_returns) {
  // So a rank that crashes during a run leaks nothing into /dev/shm.
  g_entries_before = shm_entries();
  run_group(4, [](int, const arbiter_oob& oob) -> std::string {
    const auto& module = shm();
    const arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_FP16, 1 << 20);
    arbiter_workspace* workspace = nullptr;
    if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
      return std::string("workspace_create: ") + module.last_error();
    }
    if (oob.barrier(oob.ctx, kTimeoutMs) != ARBITER_OK) return "barrier failed";
    for (const std::string& name : shm_entries()) {
      if (g_entries_before.count(name) == 0) return "still linked: /dev/shm/" + name;
    }
    module.workspace_destroy(workspace);
    return "";
  });
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_arrives_makes_the_others_time_out_naming_it) {
  // Ranks 0 and 1 run; rank 2 creates the workspace and then never calls.
  // Once for the Lamport poll (one-shot), once for the barrier (two-shot).
  run_group(3, [](int rank, const arbiter_oob& oob) -> std::string {
    const auto& module = shm();
    for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
      const arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_FP32, 4096, 300);
      arbiter_workspace* workspace = nullptr;
      if (module.workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
        return std::string("workspace_create: ") + module.last_error();
      }
      std::string result;
      if (rank != 2) {
        std::vector<float> input(256, 1.0f), output(256);
        arbiter_allreduce_args args{};
        args.pattern = ARBITER_PATTERN_ALLREDUCE;
        args.dtype = ARBITER_DTYPE_FP32;
        args.algorithm = algorithm;
        args.tokens = 1;
        args.hidden = 256;
        args.input = input.data();
        args.allreduce_out = output.data();
        const auto started = std::chrono::steady_clock::now();
        const std::int32_t code = module.run(workspace, &args, nullptr);
        const auto waited = std::chrono::steady_clock::now() - started;
        const std::string message = module.last_error();
        const std::string where = std::string(algorithm_name(algorithm)) + ": ";
        // The first to give up times out; a peer may see that first and
        // report the peer failure instead. Both name what they waited for.
        if (code != ARBITER_TIMEOUT && code != ARBITER_PEER_FAILED) {
          result = where + "expected a timeout, got code " + std::to_string(code) + ": " + message;
        } else if (message.find("waiting for rank 2") == std::string::npos &&
                   message.find("rank 2 has not arrived") == std::string::npos &&
                   message.find("rank 2's") == std::string::npos) {
          result = where + "the error does not name rank 2: " + message;
        } else if (waited > std::chrono::seconds(5)) {
          result = where + "the wait did not end near its 300 ms deadline";
        } else if (module.run(workspace, &args, nullptr) != ARBITER_PEER_FAILED) {
          result = where + "a workspace that timed out was used again";
        }
      }
      // Rank 2 keeps its mapping until the others are done.
      if (oob.barrier(oob.ctx, kTimeoutMs) != ARBITER_OK) return "barrier failed";
      module.workspace_destroy(workspace);
      if (!result.empty()) return result;
    }
    return "";
  });
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_joins_makes_creation_time_out_instead_of_hanging) {
  run_group(3, [](int rank, const arbiter_oob& oob) -> std::string {
    if (rank == 2) return "";  // never calls workspace_create
    const auto& module = shm();
    const arbiter_workspace_spec spec = make_spec(oob, ARBITER_DTYPE_BF16, 4096, 300);
    arbiter_workspace* workspace = nullptr;
    const std::int32_t code = module.workspace_create(&oob, &spec, &workspace);
    if (code != ARBITER_TIMEOUT || workspace != nullptr) {
      return "expected ARBITER_TIMEOUT, got " + std::to_string(code) + ": " + module.last_error();
    }
    if (std::string(module.last_error()).find("oob") == std::string::npos) {
      return std::string("reason: ") + module.last_error();
    }
    return "";
  });
}
