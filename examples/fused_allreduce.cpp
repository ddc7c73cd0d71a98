// arbiter-example-fused: what a framework does with arbiter, on CPU ranks.
//
//   arbiter launch --nproc 4 -- arbiter-example-fused
//
// Each rank joins the group (UCX bootstrap from the launcher's environment),
// loads the policy (embedded defaults + ARBITER_CONFIG + ARBITER_BACKENDS),
// creates a communicator (the shm backend on CPU ranks), runs fused
// all-reduce + residual + RMSNorm on several sizes, checks every output
// against the fp64 reference and that every rank got the same bits, and
// rank 0 prints each decision. Exits non-zero on any mismatch.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

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

}  // namespace

int main() try {
  arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment();
  const arbiter::Policy policy = arbiter::Policy::from_environment();
  arbiter::DiscoverOptions discover = arbiter::DiscoverOptions::from_environment();
  discover.probe = {ARBITER_DEVICE_CPU, -1};
  const arbiter::Registry registry = arbiter::Registry::discover(discover);

  arbiter::CommunicatorOptions options;
  options.capability = arbiter::Capability::cpu();
  options.device = -1;
  options.max_tokens = kMaxTokens;
  options.hidden = kHidden;
  options.dtype = arbiter::Dtype::kBf16;
  arbiter::Communicator comm(*boot.oob(), policy, registry, options);
  const bool lead = boot.rank() == 0;
  if (lead) {
    std::printf("%d ranks, tables %s; backends with a workspace:", boot.world_size(),
                policy.fingerprint_hex().c_str());
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
    std::vector<std::vector<std::uint16_t>> inputs;
    for (int r = 0; r < boot.world_size(); ++r) inputs.push_back(make_input(r, tokens));
    const std::vector<std::uint16_t> residual = make_input(1000, tokens);
    std::vector<std::uint16_t> residual_out(count), norm_out(count);

    arbiter_allreduce_args a{};
    a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
    a.dtype = ARBITER_DTYPE_BF16;
    a.tokens = tokens;
    a.hidden = kHidden;
    a.input = inputs[static_cast<std::size_t>(boot.rank())].data();
    a.residual_in = residual.data();
    a.residual_out = residual_out.data();
    a.gamma = gamma.data();
    a.eps = 1e-6f;
    a.norm_out = norm_out.data();
    const arbiter::Communicator::Result result = comm.allreduce_fusion(a, nullptr);

    std::string problem = result.status == ARBITER_OK ? "" : result.error;
    if (problem.empty()) {
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
    // Every rank must hold the same bits.
    const std::uint64_t mine =
        hash(norm_out.data(), count * 2) ^ hash(residual_out.data(), count * 2);
    std::vector<std::uint64_t> all(static_cast<std::size_t>(boot.world_size()));
    if (!boot.allgather(&mine, all.data(), sizeof mine, std::chrono::seconds(60)).ok()) {
      throw std::runtime_error("allgather of result hashes failed");
    }
    for (std::uint64_t h : all) {
      if (h != all[0] && problem.empty()) problem = "ranks hold different bits";
    }
    if (!problem.empty()) ++failures;
    const arbiter::Decision& d = result.decision;
    if (lead || !problem.empty()) {
      std::printf("tokens %4u x hidden %u = %9s: %s %s %s -> %s\n", tokens, kHidden,
                  arbiter::format_size(std::uint64_t{tokens} * kHidden * 2).c_str(),
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
