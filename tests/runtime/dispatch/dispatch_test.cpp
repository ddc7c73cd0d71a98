// The communicator's dispatch for GPU topologies, on a CPU machine: 16 ranks
// (threads, in-process oob) of capability 103 on 4 nodes of one NVLink
// domain, with recording modules standing in for mnnvl, trtllm and nccl.
// With multicast, fused calls go to mnnvl (one-shot while bytes x ranks fit
// the threshold, two-shot above, up to the 64 MiB cap) and larger ones to
// the nccl fallback; without multicast everything goes to nccl; a
// single-node job of 8 ranks goes to trtllm; a registered call larger than
// trtllm's workspace runs there too when a registered cell says so.
#define BOOST_TEST_MODULE runtime_dispatch
#include <boost/test/unit_test.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/communicator.h"
#include "thread_oob.h"

namespace {

using arbiter::Backend;

struct Counts {
  long oneshot = 0;
  long twoshot = 0;
  long native = 0;
};

const arbiter::Registry& registry() {
  static const arbiter::Registry r = [] {
    arbiter::DiscoverOptions o;
    o.search_path = {ARBITER_RECORDING_DIR};
    o.default_folder = false;
    o.probe = {ARBITER_DEVICE_GPU, 0};
    return arbiter::Registry::discover(o);
  }();
  return r;
}

Counts counts_of(const std::string& name) {
  registry();  // loads the modules
  const std::string path = std::string(ARBITER_RECORDING_DIR) + "/libarbiter-" + name + ".so";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  BOOST_REQUIRE_MESSAGE(h != nullptr, "module " << path << " is not loaded");
  auto runs = reinterpret_cast<long (*)(int)>(dlsym(h, "recording_runs"));
  Counts c{runs(ARBITER_ALGORITHM_ONESHOT), runs(ARBITER_ALGORITHM_TWOSHOT),
           runs(ARBITER_ALGORITHM_NATIVE)};
  dlclose(h);
  return c;
}

struct Call {
  std::uint32_t tokens;
  std::uint32_t hidden;
};

// Runs `calls` on `ranks` communicators of capability 103 over `modules`:
// rank 0's results, and each rank's first error (creation or a call), ""
// for none.
struct Ran {
  std::vector<arbiter::Communicator::Result> rank0;
  std::vector<std::string> errors;
};
Ran run_on_ranks(const arbiter::Registry& modules, int ranks, std::uint32_t nodes, bool multicast,
                 const std::vector<Call>& calls) {
  arbiter::test::ThreadGroup group(ranks);
  Ran ran;
  ran.errors.resize(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      std::string& error = ran.errors[r];
      try {
        arbiter::CommunicatorOptions o;
        o.capability = arbiter::Capability::sm(103);
        o.nodes = nodes;
        o.nvlink_domain = true;
        o.multicast = multicast;
        o.device = r % 4;
        o.max_tokens = 16384;
        o.hidden = 7168;
        o.dtype = arbiter::Dtype::kBf16;
        o.timeout = std::chrono::seconds(30);
        const arbiter_oob oob = group.oob(r);
        arbiter::Communicator comm(oob, arbiter::Policy::load_or_throw({}), modules, o);
        std::vector<std::uint16_t> dummy(1);
        for (const Call& c : calls) {
          arbiter_allreduce_args a{};
          a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
          a.dtype = ARBITER_DTYPE_BF16;
          a.tokens = c.tokens;
          a.hidden = c.hidden;
          a.input = dummy.data();  // the recording modules read nothing
          a.residual_in = dummy.data();
          a.gamma = dummy.data();
          a.norm_out = dummy.data();
          a.residual_out = dummy.data();
          auto result = comm.allreduce_fusion(a, nullptr);
          if (result.status != ARBITER_OK && error.empty()) error = result.error;
          if (r == 0) ran.rank0.push_back(std::move(result));
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return ran;
}

// Runs `calls` on `ranks` communicators, every one of which must succeed;
// returns rank 0's decisions.
std::vector<arbiter::Decision> run(int ranks, std::uint32_t nodes, bool multicast,
                                   const std::vector<Call>& calls) {
  const Ran ran = run_on_ranks(registry(), ranks, nodes, multicast, calls);
  for (int r = 0; r < ranks; ++r) {
    BOOST_TEST(ran.errors[r].empty(), "rank " << r << ": " << ran.errors[r]);
  }
  std::vector<arbiter::Decision> decisions;
  for (const auto& result : ran.rank0) decisions.push_back(result.decision);
  return decisions;
}

}  // namespace

BOOST_AUTO_TEST_CASE(ws16_on_four_nodes_with_multicast_runs_fused_on_mnnvl) {
  const Counts before = counts_of("mnnvl");
  const Counts nccl_before = counts_of("nccl");
  // 1 token of 7168 (14 KiB, x16 = 224 KiB <= 1 MiB: one-shot); 64 tokens
  // (896 KiB: two-shot); 4681 tokens (63.998 MiB: two-shot, at the cap);
  // 4682 tokens (above the 64 MiB cap: the nccl fallback).
  const auto d = run(16, 4, true, {{1, 7168}, {64, 7168}, {4681, 7168}, {4682, 7168}});
  BOOST_REQUIRE_EQUAL(d.size(), 4u);
  BOOST_TEST((d[0].backend == Backend::kMnnvl && d[0].fused));
  BOOST_TEST((d[0].algorithm == arbiter::Algorithm::kOneshot));
  BOOST_TEST((d[1].backend == Backend::kMnnvl && d[1].algorithm == arbiter::Algorithm::kTwoshot));
  BOOST_TEST((d[2].backend == Backend::kMnnvl && d[2].fused));
  BOOST_TEST((d[3].backend == Backend::kNccl && !d[3].fused));
  const Counts after = counts_of("mnnvl");
  const Counts nccl_after = counts_of("nccl");
  BOOST_TEST(after.oneshot - before.oneshot == 16);  // every rank ran it
  BOOST_TEST(after.twoshot - before.twoshot == 32);
  BOOST_TEST(nccl_after.native - nccl_before.native >= 16);
}

BOOST_AUTO_TEST_CASE(without_multicast_the_same_job_runs_on_nccl) {
  const Counts before = counts_of("mnnvl");
  const auto d = run(16, 4, false, {{1, 7168}, {64, 7168}});
  for (const auto& x : d) BOOST_TEST((x.backend == Backend::kNccl && !x.fused));
  const Counts after = counts_of("mnnvl");
  BOOST_TEST(after.oneshot + after.twoshot == before.oneshot + before.twoshot);
}

BOOST_AUTO_TEST_CASE(a_single_node_job_runs_fused_on_trtllm) {
  const Counts before = counts_of("trtllm");
  const auto d = run(8, 1, false, {{1, 7168}});
  BOOST_REQUIRE_EQUAL(d.size(), 1u);
  BOOST_TEST((d[0].backend == Backend::kTrtllm && d[0].fused));
  BOOST_TEST(counts_of("trtllm").oneshot - before.oneshot == 8);
}

BOOST_AUTO_TEST_CASE(a_module_status_outside_the_abi_or_a_null_error_is_an_internal_fault) {
  // A module that breaks the ABI (status 4242, last_error() NULL) gets a
  // message, not a crash, and leaves the communicator unusable.
  ::setenv("RECORDING_TRTLLM_STATUS", "4242", 1);
  ::setenv("RECORDING_NULL_ERROR", "1", 1);
  const auto results = run_on_ranks(registry(), 8, 1, false, {{16, 7168}, {16, 7168}}).rank0;
  ::unsetenv("RECORDING_TRTLLM_STATUS");
  ::unsetenv("RECORDING_NULL_ERROR");
  BOOST_TEST_REQUIRE(results.size() == 2u);
  BOOST_TEST(results[0].status == ARBITER_INTERNAL);
  BOOST_TEST(results[0].error.find("trtllm returned status 4242, which arbiter_backend.h does "
                                   "not define") != std::string::npos,
             results[0].error);
  BOOST_TEST(
      results[0].error.find("gave no reason (its last_error() returned NULL)") != std::string::npos,
      results[0].error);
  BOOST_TEST(results[1].status == ARBITER_INTERNAL);
  BOOST_TEST(results[1].error.find("left this communicator unusable") != std::string::npos,
             results[1].error);
}

BOOST_AUTO_TEST_CASE(a_module_that_does_not_run_the_world_size_gets_no_workspace) {
  // trtllm's caps admit world sizes 2 and 4 only: at 8 ranks the fused
  // calls go to the nccl fallback, and trtllm is dropped saying why.
  ::setenv("RECORDING_TRTLLM_WORLD_SIZES", std::to_string((1u << 2) | (1u << 4)).c_str(), 1);
  arbiter::DiscoverOptions o;
  o.search_path = {ARBITER_RECORDING_DIR};
  o.default_folder = false;
  o.probe = {ARBITER_DEVICE_GPU, 0};
  const arbiter::Registry narrowed = arbiter::Registry::discover(o);
  ::unsetenv("RECORDING_TRTLLM_WORLD_SIZES");
  const auto results = run_on_ranks(narrowed, 8, 1, false, {{16, 7168}}).rank0;
  BOOST_TEST_REQUIRE(results.size() == 1u);
  BOOST_TEST(results[0].status == ARBITER_OK, results[0].error);
  BOOST_TEST(arbiter::backend_name(results[0].decision.backend) == "nccl");
}

BOOST_AUTO_TEST_CASE(a_cpu_communicator_over_modules_probed_for_a_gpu_says_how_to_discover) {
  // DiscoverOptions' default probe is the GPU of LOCAL_RANK: a CPU rank
  // that keeps it would find every module "unavailable" for reasons about
  // a GPU. The error says what to change.
  arbiter::test::ThreadGroup group(1);
  arbiter::CommunicatorOptions o;  // CPU ranks by default
  o.hidden = 64;
  const arbiter_oob oob = group.oob(0);
  try {
    arbiter::Communicator comm(oob, arbiter::Policy::load_or_throw({}), registry(), o);
    BOOST_FAIL("created a CPU communicator over GPU-probed modules");
  } catch (const arbiter::CommunicatorError& e) {
    BOOST_TEST(std::string(e.what()).find("probed for a GPU rank") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find("{ARBITER_DEVICE_CPU, -1}") != std::string::npos,
               e.what());
  }
}

// A registered call larger than the fused workspace: the workspace holds
// the copied cap (2 MiB at 8 ranks of capability 103), but a site cell
// keyed `buffers: registered` fuses up to 16 MiB, and trtllm streams a
// registered input of any size itself (run_registered). Before, every such
// call went to nccl: the capacity check dropped trtllm first.
BOOST_AUTO_TEST_CASE(a_registered_call_above_the_workspace_capacity_runs_where_its_cell_says) {
  const std::string site = (std::filesystem::temp_directory_path() /
                            ("arbiter-registered-site-" + std::to_string(::getpid()) + ".yaml"))
                               .string();
  {
    std::ofstream f(site);
    f << "format: 1\nfusion:\n"
         "  - {capability: 103, world_size: 8, buffers: registered, max: 16}\n";
  }
  arbiter::LoadOptions load;
  load.site_files = {site};
  const arbiter::Policy policy = arbiter::Policy::load_or_throw(load);
  std::filesystem::remove(site);
  arbiter::DiscoverOptions o;
  o.search_path = {std::string(ARBITER_RECORDING_MEMORY_DIR) + "/libarbiter-trtllm.so",
                   std::string(ARBITER_RECORDING_DIR) + "/libarbiter-nccl.so"};
  o.default_folder = false;
  o.probe = {ARBITER_DEVICE_GPU, 0};
  const arbiter::Registry modules = arbiter::Registry::discover(o);
  const std::string trtllm = std::string(ARBITER_RECORDING_MEMORY_DIR) + "/libarbiter-trtllm.so";
  void* h = dlopen(trtllm.c_str(), RTLD_NOW | RTLD_NOLOAD);
  BOOST_REQUIRE_MESSAGE(h != nullptr, trtllm << " is not loaded");
  auto registered_runs = reinterpret_cast<long (*)()>(dlsym(h, "recording_registered_runs"));
  BOOST_REQUIRE(registered_runs != nullptr);
  const long before = registered_runs();

  constexpr int kRanks = 8;
  constexpr std::uint32_t kHidden = 7168, kTokens = 512;  // 7 MiB of bf16
  arbiter::test::ThreadGroup group(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<arbiter::Decision> registered(kRanks), copied(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        arbiter::CommunicatorOptions c;
        c.capability = arbiter::Capability::sm(103);
        c.device = r;
        c.max_tokens = 1024;
        c.hidden = kHidden;
        c.timeout = std::chrono::seconds(30);
        const arbiter_oob oob = group.oob(r);  // outlives the communicator
        arbiter::Communicator comm(oob, policy, modules, c);
        void* input = nullptr;
        const std::uint64_t bytes = std::uint64_t{kTokens} * kHidden * 2;
        auto made = comm.alloc_registered(bytes, &input);
        if (made.status != ARBITER_OK) throw std::runtime_error(made.error);
        // Never touched (the recording modules read and write nothing).
        const auto buffer = [&] {
          return std::make_unique_for_overwrite<std::uint16_t[]>(bytes / 2);
        };
        const auto ordinary = buffer(), residual = buffer(), residual_out = buffer(),
                   norm_out = buffer();
        std::vector<std::uint16_t> gamma(kHidden);
        arbiter_allreduce_args a{};
        a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
        a.dtype = ARBITER_DTYPE_BF16;
        a.tokens = kTokens;
        a.hidden = kHidden;
        a.input = input;
        a.residual_in = residual.get();
        a.residual_out = residual_out.get();
        a.gamma = gamma.data();
        a.norm_out = norm_out.get();
        auto result = comm.allreduce_fusion(a, nullptr);
        if (result.status != ARBITER_OK) throw std::runtime_error(result.error);
        registered[r] = result.decision;
        // run_on() takes it there too, above the workspace's capacity.
        result = comm.run_on(Backend::kTrtllm, arbiter::Algorithm::kTwoshot, a, nullptr);
        if (result.status != ARBITER_OK) throw std::runtime_error("run_on: " + result.error);
        a.input = ordinary.get();  // the same call, copied
        result = comm.allreduce_fusion(a, nullptr);
        if (result.status != ARBITER_OK) throw std::runtime_error(result.error);
        copied[r] = result.decision;
        comm.free_registered(input);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    BOOST_TEST_REQUIRE(errors[r].empty(), "rank " << r << ": " << errors[r]);
    BOOST_TEST((registered[r].backend == Backend::kTrtllm && registered[r].fused), "rank " << r);
    BOOST_TEST((copied[r].backend == Backend::kNccl && !copied[r].fused), "rank " << r);
  }
  BOOST_TEST(registered_runs() - before == 2 * kRanks);
  dlclose(h);
}
