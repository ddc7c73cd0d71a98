// Which patterns each backend is asked for, what happens to a pattern no
// backend runs, and the shared-GPU test mode: on a CPU machine, with the
// recording modules standing in for trtllm, mnnvl and nccl on capability 103
// (RECORDING_<NAME>_PATTERNS takes a pattern away from one). 8 ranks on one
// node (threads, in-process oob): the default tables fuse on trtllm up to
// 2 MiB and send larger calls to the nccl fallback.
#define BOOST_TEST_MODULE runtime_patterns
#include <boost/test/unit_test.hpp>

#include <dlfcn.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/arbiter.h"
#include "arbiter/communicator.h"
#include "thread_oob.h"

namespace {

using arbiter::Backend;
using arbiter::Pattern;

constexpr std::uint32_t kNoFp4 = 0x7;
constexpr std::uint32_t kAll = 0xF;

template <typename T>
T module_function(const std::string& name, const char* symbol) {
  const std::string path = std::string(ARBITER_RECORDING_DIR) + "/libarbiter-" + name + ".so";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  BOOST_REQUIRE_MESSAGE(h != nullptr, "module " << path << " is not loaded");
  auto f = reinterpret_cast<T>(dlsym(h, symbol));
  dlclose(h);  // still loaded by the registry
  return f;
}

unsigned asked_patterns(const std::string& name) {
  return module_function<unsigned (*)()>(name, "recording_asked_patterns")();
}
long fp4_runs(const std::string& name) {
  return module_function<long (*)()>(name, "recording_fp4_runs")();
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Probes the modules now, so that RECORDING_*_PATTERNS set by the caller count.
arbiter::Registry discover() {
  arbiter::DiscoverOptions o;
  o.search_path = {ARBITER_RECORDING_DIR};
  o.default_folder = false;
  o.probe = {ARBITER_DEVICE_GPU, 0};
  return arbiter::Registry::discover(o);
}

struct Outcome {
  std::string creation_error;  // from any rank; every rank must agree
  std::vector<std::string> dropped;
  std::uint32_t usable = 0;
  std::uint32_t patterns = 0;
  std::vector<arbiter::Communicator::Result> results;  // rank 0's
  std::vector<bool> same_on_every_rank;                // status and error, per call
};

struct Call {
  Pattern pattern;
  std::uint32_t tokens;
  bool residual = true;  // false: residual_in NULL (a first block)
};

Outcome run(const arbiter::Registry& registry, std::uint32_t pattern_mask,
            const std::vector<Call>& calls, int ranks = 8) {
  arbiter::test::ThreadGroup group(ranks);
  std::vector<Outcome> per_rank(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      Outcome& mine = per_rank[r];
      try {
        arbiter::CommunicatorOptions o;
        o.capability = arbiter::Capability::sm(103);
        o.device = r;
        o.max_tokens = 16384;
        o.hidden = 7168;
        o.dtype = arbiter::Dtype::kBf16;
        o.pattern_mask = pattern_mask;
        o.timeout = std::chrono::seconds(30);
        const arbiter_oob oob = group.oob(r);
        arbiter::Communicator comm(oob, arbiter::Policy::load_or_throw({}), registry, o);
        mine.dropped = comm.dropped();
        mine.usable = comm.usable_mask();
        mine.patterns = comm.pattern_mask();
        std::vector<std::uint16_t> dummy(1);
        float scale = 1.0f;
        for (const Call& c : calls) {
          arbiter_allreduce_args a{};
          a.pattern = static_cast<arbiter_pattern>(c.pattern);
          a.dtype = ARBITER_DTYPE_BF16;
          a.tokens = c.tokens;
          a.hidden = 7168;
          a.input = dummy.data();  // the recording modules read nothing
          if (c.pattern == Pattern::kAllreduce) {
            a.allreduce_out = dummy.data();
          } else {
            a.residual_in = c.residual ? dummy.data() : nullptr;
            a.gamma = dummy.data();
            a.residual_out = dummy.data();
            a.norm_out = dummy.data();
            a.quant_out = dummy.data();
            a.scale_out = dummy.data();
            a.scale = &scale;
          }
          mine.results.push_back(comm.allreduce_fusion(a, nullptr));
        }
      } catch (const std::exception& e) {
        mine.creation_error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  Outcome out = per_rank[0];
  for (int r = 1; r < ranks; ++r) {
    BOOST_TEST(per_rank[r].creation_error == out.creation_error, "rank " << r);
  }
  for (std::size_t i = 0; i < out.results.size(); ++i) {
    bool same = true;
    for (int r = 1; r < ranks; ++r) {
      same = same && per_rank[r].results.size() == out.results.size() &&
             per_rank[r].results[i].status == out.results[i].status &&
             per_rank[r].results[i].error == out.results[i].error;
    }
    out.same_on_every_rank.push_back(same);
  }
  return out;
}

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

// 1 token of 7168 bf16 (14 KiB): fused on trtllm. 4096 tokens (56 MiB):
// above the 2 MiB cap of (103, ws 8), the fallback.
constexpr std::uint32_t kSmall = 1;
constexpr std::uint32_t kLarge = 4096;

}  // namespace

BOOST_AUTO_TEST_CASE(a_backend_without_a_pattern_is_still_created_with_the_defaults) {
  const ScopedEnv nccl("RECORDING_NCCL_PATTERNS", "7");  // an nccl without NVFP4
  const arbiter::Registry registry = discover();
  const Outcome o = run(registry, arbiter::CommunicatorOptions{}.pattern_mask,
                        {{Pattern::kResidualRmsnormFp4, kSmall},
                         {Pattern::kResidualRmsnormFp4, kLarge},
                         {Pattern::kResidualRmsnorm, kLarge}});
  BOOST_REQUIRE_MESSAGE(o.creation_error.empty(), o.creation_error);
  // Each module was asked only for what it runs.
  BOOST_TEST(asked_patterns("nccl") == kNoFp4);
  BOOST_TEST(asked_patterns("trtllm") == kAll);
  BOOST_TEST(o.patterns == kAll);
  BOOST_REQUIRE_EQUAL(o.results.size(), 3u);
  // Small NVFP4: fused on trtllm, which runs it.
  BOOST_TEST(o.results[0].status == ARBITER_OK, o.results[0].error);
  BOOST_TEST((o.results[0].decision.backend == Backend::kTrtllm));
  // Large NVFP4: the fallback lacks it, so it is refused, alike on every
  // rank, naming the pattern, the capability and each backend's reason.
  const auto& refused = o.results[1];
  BOOST_TEST(refused.status == ARBITER_UNSUPPORTED);
  BOOST_TEST(contains(refused.error, "no backend can run this residual_rmsnorm_fp4 (NVFP4) call"),
             refused.error);
  BOOST_TEST(contains(refused.error, "on capability 103 with 8 rank(s)"), refused.error);
  BOOST_TEST(contains(refused.error,
                      "the tables send it to the fallback nccl (above the fused "
                      "cap of 2097152 bytes)"),
             refused.error);
  BOOST_TEST(
      contains(refused.error, "nccl: does not run residual_rmsnorm_fp4 (NVFP4) on this device"),
      refused.error);
  BOOST_TEST(o.same_on_every_rank[1]);
  // The same size of another pattern runs on the fallback.
  BOOST_TEST(o.results[2].status == ARBITER_OK, o.results[2].error);
  BOOST_TEST((o.results[2].decision.backend == Backend::kNccl));
}

BOOST_AUTO_TEST_CASE(a_pattern_the_fused_backend_lacks_goes_to_the_fallback) {
  const ScopedEnv trtllm("RECORDING_TRTLLM_PATTERNS", "7");
  const arbiter::Registry registry = discover();
  const long before = fp4_runs("nccl");
  const Outcome o = run(
      registry, 0, {{Pattern::kResidualRmsnormFp4, kSmall}, {Pattern::kResidualRmsnorm, kSmall}});
  BOOST_REQUIRE_MESSAGE(o.creation_error.empty(), o.creation_error);
  BOOST_TEST(asked_patterns("trtllm") == kNoFp4);
  BOOST_REQUIRE_EQUAL(o.results.size(), 2u);
  BOOST_TEST(o.results[0].status == ARBITER_OK, o.results[0].error);
  BOOST_TEST((o.results[0].decision.backend == Backend::kNccl && !o.results[0].decision.fused));
  BOOST_TEST(fp4_runs("nccl") - before == 8);  // every rank
  // Other patterns keep the fused path.
  BOOST_TEST((o.results[1].decision.backend == Backend::kTrtllm && o.results[1].decision.fused));
}

// Flags of a recording module: 8 is ARBITER_CAPS_SHARES_GPU alone (a v1
// module from before residual-free norm), 24 adds ARBITER_CAPS_RESIDUAL_OPTIONAL.
static_assert(ARBITER_CAPS_SHARES_GPU == 8 && ARBITER_CAPS_RESIDUAL_OPTIONAL == 16);

BOOST_AUTO_TEST_CASE(a_call_without_residual_skips_the_modules_that_need_one) {
  const ScopedEnv trtllm("RECORDING_TRTLLM_FLAGS", "8");
  const ScopedEnv mnnvl("RECORDING_MNNVL_FLAGS", "8");
  const ScopedEnv nccl("RECORDING_NCCL_FLAGS", "16");
  const arbiter::Registry registry = discover();
  const Outcome o = run(registry, 0,
                        {{Pattern::kResidualRmsnorm, kSmall, false},
                         {Pattern::kResidualRmsnorm, kSmall, true},
                         {Pattern::kAllreduce, kSmall, false}});
  BOOST_REQUIRE_MESSAGE(o.creation_error.empty(), o.creation_error);
  BOOST_REQUIRE_EQUAL(o.results.size(), 3u);
  // No residual: trtllm (the tables' choice) never sees it; the fallback,
  // which accepts it, runs the call on every rank.
  BOOST_TEST(o.results[0].status == ARBITER_OK, o.results[0].error);
  BOOST_TEST((o.results[0].decision.backend == Backend::kNccl));
  BOOST_TEST(o.same_on_every_rank[0]);
  // With a residual the same call is fused on trtllm as before.
  BOOST_TEST(o.results[1].status == ARBITER_OK, o.results[1].error);
  BOOST_TEST((o.results[1].decision.backend == Backend::kTrtllm));
  // Plain all-reduce has no residual to miss.
  BOOST_TEST((o.results[2].decision.backend == Backend::kTrtllm));
}

BOOST_AUTO_TEST_CASE(a_call_without_residual_no_module_accepts_is_refused_naming_each) {
  const ScopedEnv trtllm("RECORDING_TRTLLM_FLAGS", "8");
  const ScopedEnv mnnvl("RECORDING_MNNVL_FLAGS", "8");
  const ScopedEnv nccl("RECORDING_NCCL_FLAGS", "0");
  const arbiter::Registry registry = discover();
  const Outcome o = run(
      registry, 0,
      {{Pattern::kResidualRmsnorm, kSmall, false}, {Pattern::kResidualRmsnormFp8, kLarge, false}});
  BOOST_REQUIRE_MESSAGE(o.creation_error.empty(), o.creation_error);
  BOOST_REQUIRE_EQUAL(o.results.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const std::string& e = o.results[i].error;
    BOOST_TEST(o.results[i].status == ARBITER_UNSUPPORTED);
    const std::string pattern = i == 0 ? "residual_rmsnorm" : "residual_rmsnorm_fp8";
    BOOST_TEST(contains(e, "trtllm: needs residual_in for " + pattern +
                               " (its module does not set ARBITER_CAPS_RESIDUAL_OPTIONAL): pass "
                               "a residual tensor"),
               e);
    BOOST_TEST(contains(e, "nccl: needs residual_in"), e);
    BOOST_TEST(o.same_on_every_rank[i]);
  }
}

BOOST_AUTO_TEST_CASE(a_pattern_no_backend_runs_is_refused_and_creation_still_succeeds) {
  const ScopedEnv trtllm("RECORDING_TRTLLM_PATTERNS", "7");
  const ScopedEnv mnnvl("RECORDING_MNNVL_PATTERNS", "7");
  const ScopedEnv nccl("RECORDING_NCCL_PATTERNS", "7");
  const arbiter::Registry registry = discover();
  const Outcome o = run(registry, 0, {{Pattern::kResidualRmsnormFp4, kSmall}});
  BOOST_REQUIRE_MESSAGE(o.creation_error.empty(), o.creation_error);
  BOOST_TEST(o.patterns == kNoFp4);
  BOOST_REQUIRE_EQUAL(o.results.size(), 1u);
  const std::string& e = o.results[0].error;
  BOOST_TEST(o.results[0].status == ARBITER_UNSUPPORTED);
  BOOST_TEST(contains(e, "the tables choose trtllm oneshot"), e);
  BOOST_TEST(contains(e,
                      "trtllm: does not run residual_rmsnorm_fp4 (NVFP4) on this device (it "
                      "runs allreduce, residual_rmsnorm, residual_rmsnorm_fp8)"),
             e);
  BOOST_TEST(contains(e, "nccl: does not run residual_rmsnorm_fp4 (NVFP4)"), e);
  BOOST_TEST(o.same_on_every_rank[0]);
}

BOOST_AUTO_TEST_CASE(patterns_not_asked_for_are_refused_and_not_asked_of_modules) {
  const arbiter::Registry registry = discover();
  const std::uint32_t norm_only = 1u << static_cast<int>(Pattern::kResidualRmsnorm);
  const Outcome o = run(registry, norm_only,
                        {{Pattern::kResidualRmsnorm, kSmall}, {Pattern::kAllreduce, kSmall}});
  BOOST_REQUIRE_MESSAGE(o.creation_error.empty(), o.creation_error);
  BOOST_TEST(asked_patterns("trtllm") == norm_only);
  BOOST_TEST(asked_patterns("nccl") == norm_only);
  BOOST_TEST(o.results[0].status == ARBITER_OK, o.results[0].error);
  BOOST_TEST(o.results[1].status == ARBITER_UNSUPPORTED);
  BOOST_TEST(contains(o.results[1].error, "created for residual_rmsnorm only"), o.results[1].error);
  // A mask with a bit that names no pattern is refused at creation.
  const Outcome bad = run(registry, 1u << 4, {});
  BOOST_TEST(contains(bad.creation_error, "pattern_mask 16 has bits that name no pattern"),
             bad.creation_error);
}

BOOST_AUTO_TEST_CASE(the_shared_gpu_test_mode_drops_nccl_and_refuses_calls_above_the_cap) {
  const ScopedEnv mode("ARBITER_TEST_SHARED_GPU", "1");
  const arbiter::Registry registry = discover();
  const Outcome o =
      run(registry, 0, {{Pattern::kResidualRmsnorm, kSmall}, {Pattern::kResidualRmsnorm, kLarge}});
  BOOST_REQUIRE_MESSAGE(o.creation_error.empty(), o.creation_error);
  BOOST_TEST((o.usable & (1u << static_cast<int>(Backend::kNccl))) == 0u);
  BOOST_TEST((o.usable & (1u << static_cast<int>(Backend::kTrtllm))) != 0u);
  BOOST_REQUIRE_EQUAL(o.dropped.size(), 1u);
  BOOST_TEST(contains(o.dropped[0], "nccl: dropped by the shared-GPU test mode"), o.dropped[0]);
  BOOST_TEST(o.results[0].status == ARBITER_OK, o.results[0].error);
  BOOST_TEST((o.results[0].decision.backend == Backend::kTrtllm));
  const std::string& e = o.results[1].error;
  BOOST_TEST(o.results[1].status == ARBITER_UNSUPPORTED);
  BOOST_TEST(contains(e, "above the fused cap of 2097152 bytes"), e);
  BOOST_TEST(contains(e, "nccl: dropped by the shared-GPU test mode (ARBITER_TEST_SHARED_GPU=1)"),
             e);
  BOOST_TEST(o.same_on_every_rank[1]);
}

BOOST_AUTO_TEST_CASE(outside_the_mode_a_missing_fallback_still_fails_creation) {
  const ScopedEnv nccl("RECORDING_NCCL_PATTERNS", "0");  // runs nothing asked for
  const arbiter::Registry registry = discover();
  const Outcome o = run(registry, 0, {});
  BOOST_TEST(contains(o.creation_error, "the fallback backend nccl is not usable on every rank"),
             o.creation_error);
  BOOST_TEST(contains(o.creation_error, "runs none of the patterns asked for"), o.creation_error);
}

// A C caller that zeroes every option but the device and shape gets what
// C++ and Python callers get by default: one node means NVLink, so the small
// call is fused (nvlink_domain 0 is ARBITER_NVLINK_AUTO, not "no NVLink").
BOOST_AUTO_TEST_CASE(c_api_default_options_fuse_on_one_node) {
  const ScopedEnv plugins("ARBITER_PLUGIN_PATH", ARBITER_RECORDING_DIR);
  constexpr int kRanks = 8;
  arbiter::test::ThreadGroup group(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<arbiter_decision> used(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      arbiter_policy* policy = nullptr;
      arbiter_policy_load(nullptr, 0, nullptr, &policy);
      arbiter_comm_options o{};
      o.capability = 103;
      o.device = r;
      o.hidden = 7168;
      o.dtype = ARBITER_DTYPE_BF16;
      const arbiter_oob oob = group.oob(r);
      arbiter_comm* comm = nullptr;
      if (arbiter_comm_create(&oob, policy, &o, &comm) != ARBITER_OK) {
        errors[r] = arbiter_last_error();
      } else {
        std::vector<std::uint16_t> dummy(1);
        arbiter_allreduce_args a{};
        a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
        a.dtype = ARBITER_DTYPE_BF16;
        a.tokens = 1;
        a.hidden = 7168;
        a.input = a.residual_in = a.gamma = dummy.data();
        a.residual_out = a.norm_out = dummy.data();
        if (arbiter_comm_allreduce_fusion(comm, &a, nullptr, &used[r]) != ARBITER_OK) {
          errors[r] = arbiter_last_error();
        }
        arbiter_comm_destroy(comm);
      }
      arbiter_policy_free(policy);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    BOOST_TEST(errors[r].empty(), "rank " << r << ": " << errors[r]);
    BOOST_TEST(std::string(arbiter_backend_name(used[r].backend)) == "trtllm");
    BOOST_TEST(used[r].fused == 1u);
  }
  // Values that name no setting are refused.
  arbiter_policy* policy = nullptr;
  arbiter_policy_load(nullptr, 0, nullptr, &policy);
  arbiter_comm_options o{};
  o.capability = 103;
  o.hidden = 64;
  o.nvlink_domain = 3;
  const arbiter_oob oob = group.oob(0);
  arbiter_comm* comm = nullptr;
  BOOST_TEST(arbiter_comm_create(&oob, policy, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("nvlink_domain 3") != std::string::npos);
  arbiter_policy_free(policy);
}
