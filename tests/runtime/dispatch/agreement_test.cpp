// What every rank of a communicator must agree on beyond its options, and
// the runtime's own fault handling, with recording modules standing in for
// the GPU backends (threads as ranks, an in-process oob): ranks that loaded
// different modules, or different builds of one, are refused at creation,
// naming the module, the rank and both values; abort() reaches every
// workspace and fails every later call at once; the check mode (which must
// be the same on every rank) refuses a call that differs across ranks on
// every rank, before any backend runs it, and the next matching call runs.
#define BOOST_TEST_MODULE runtime_agreement
#include <dlfcn.h>
#include <stdlib.h>

#include <boost/test/unit_test.hpp>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/communicator.h"
#include "thread_oob.h"

namespace {

std::string module_path(const char* dir, const std::string& name) {
  return std::string(dir) + "/libarbiter-" + name + ".so";
}

// A registry of exactly these module files.
arbiter::Registry registry_of(const std::vector<std::string>& files) {
  arbiter::DiscoverOptions o;
  o.search_path = files;
  o.default_folder = false;
  o.probe = {ARBITER_DEVICE_GPU, 0};
  return arbiter::Registry::discover(o);
}

const std::vector<std::string>& all_modules() {
  static const std::vector<std::string> files = {module_path(ARBITER_RECORDING_DIR, "mnnvl"),
                                                 module_path(ARBITER_RECORDING_DIR, "trtllm"),
                                                 module_path(ARBITER_RECORDING_DIR, "nccl")};
  return files;
}

arbiter::CommunicatorOptions gpu_options(int rank) {
  arbiter::CommunicatorOptions o;
  o.capability = arbiter::Capability::sm(103);
  o.device = rank;
  o.max_tokens = 64;
  o.hidden = 1024;
  o.dtype = arbiter::Dtype::kBf16;
  o.timeout = std::chrono::seconds(20);
  return o;
}

long recording_counter(const std::string& path, const char* name) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  BOOST_REQUIRE_MESSAGE(h != nullptr, path << " is not loaded");
  auto counter = reinterpret_cast<long (*)()>(dlsym(h, name));
  BOOST_REQUIRE(counter != nullptr);
  const long value = counter();
  dlclose(h);
  return value;
}

// Runs body(rank, oob) on `ranks` threads; returns what each threw or "".
std::vector<std::string> on_ranks(int ranks,
                                  const std::function<void(int, const arbiter_oob&)>& body) {
  arbiter::test::ThreadGroup group(ranks);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        const arbiter_oob oob = group.oob(r);
        body(r, oob);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Calls the recording module at `path` ran, every algorithm together.
long recording_runs(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  BOOST_REQUIRE_MESSAGE(h != nullptr, path << " is not loaded");
  auto runs = reinterpret_cast<long (*)(int)>(dlsym(h, "recording_runs"));
  BOOST_REQUIRE(runs != nullptr);
  const long total = runs(0) + runs(1) + runs(2);
  dlclose(h);
  return total;
}

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

arbiter_allreduce_args norm_call(std::vector<std::uint16_t>& dummy, std::uint32_t tokens) {
  arbiter_allreduce_args a{};
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  a.dtype = ARBITER_DTYPE_BF16;
  a.tokens = tokens;
  a.hidden = 1024;
  a.input = dummy.data();  // the recording modules read nothing
  a.residual_in = dummy.data();
  a.gamma = dummy.data();
  a.norm_out = dummy.data();
  a.eps = 1e-6f;
  return a;
}

}  // namespace

BOOST_AUTO_TEST_CASE(ranks_that_loaded_different_modules_are_refused_naming_the_module) {
  const arbiter::Registry full = registry_of(all_modules());
  const arbiter::Registry lacking = registry_of(
      {module_path(ARBITER_RECORDING_DIR, "mnnvl"), module_path(ARBITER_RECORDING_DIR, "nccl")});
  const auto errors = on_ranks(2, [&](int r, const arbiter_oob& oob) {
    arbiter::Communicator comm(oob, arbiter::Policy::load_or_throw({}), r == 1 ? lacking : full,
                               gpu_options(r));
  });
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(contains(errors[r],
                        "ranks differ in the backends they loaded: rank 1 has module "
                        "trtllm unavailable, rank 0 has it available"),
               errors[r]);
    BOOST_TEST(contains(errors[r], "arbiter plugins"), errors[r]);
  }
  // The rank that lacks it says why, from its own registry.
  BOOST_TEST(contains(errors[1], "here, trtllm is no module found"), errors[1]);
}

// A search path entry that cannot be searched was skipped: the modules it was
// meant to supply were missing, or the default folder's ran in their place,
// silently. Creation is refused on every rank; the rank that has the entry
// names it.
BOOST_AUTO_TEST_CASE(a_search_path_entry_that_cannot_be_searched_refuses_creation_on_every_rank) {
  const arbiter::Registry full = registry_of(all_modules());
  std::vector<std::string> with_typo = all_modules();
  with_typo.insert(with_typo.begin(), std::string(ARBITER_RECORDING_DIR) + "/no-such-folder");
  const arbiter::Registry typo = registry_of(with_typo);
  BOOST_TEST(typo.available_mask() == full.available_mask());  // it would have run
  const auto errors = on_ranks(2, [&](int r, const arbiter_oob& oob) {
    arbiter::Communicator comm(oob, arbiter::Policy::load_or_throw({}), r == 1 ? typo : full,
                               gpu_options(r));
  });
  BOOST_TEST(contains(errors[0], "rank 1 cannot search its plugin search path"), errors[0]);
  BOOST_TEST(contains(errors[1],
                      "DiscoverOptions::search_path entry '" + std::string(ARBITER_RECORDING_DIR) +
                          "/no-such-folder': No such file or directory (fix the entry or remove "
                          "it"),
             errors[1]);
}

BOOST_AUTO_TEST_CASE(ranks_that_loaded_different_builds_of_a_module_are_refused_naming_both) {
  const arbiter::Registry one = registry_of(all_modules());
  const arbiter::Registry other = registry_of({module_path(ARBITER_RECORDING_DIR, "mnnvl"),
                                               module_path(ARBITER_RECORDING_DIR, "trtllm"),
                                               module_path(ARBITER_RECORDING_OTHER_DIR, "nccl")});
  BOOST_TEST(other.info(arbiter::Backend::kNccl)->build == "recording 2");
  const auto errors = on_ranks(3, [&](int r, const arbiter_oob& oob) {
    arbiter::Communicator comm(oob, arbiter::Policy::load_or_throw({}), r == 2 ? other : one,
                               gpu_options(r));
  });
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST(contains(errors[r],
                        "ranks differ in the build of module nccl: rank 2 has build "
                        "recording 2, rank 0 has build recording 1"),
               errors[r]);
  }
}

BOOST_AUTO_TEST_CASE(ranks_in_and_out_of_the_check_mode_are_refused) {
  const arbiter::Registry registry = registry_of(all_modules());
  const auto errors = on_ranks(2, [&](int r, const arbiter_oob& oob) {
    arbiter::CommunicatorOptions o = gpu_options(r);
    o.check_calls = r == 0;
    arbiter::Communicator comm(oob, arbiter::Policy::load_or_throw({}), registry, o);
  });
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(contains(errors[r],
                        "ranks differ in the check mode: rank 1 has it off, rank 0 "
                        "has it on"),
               errors[r]);
  }
}

// Without a hidden size the fused modules could size no workspace (trtllm
// refuses one; the runtime would drop it and run every call unfused):
// creation fails on every rank, saying what to pass.
BOOST_AUTO_TEST_CASE(a_communicator_without_a_hidden_size_is_refused_on_every_rank) {
  const arbiter::Registry registry = registry_of(all_modules());
  const auto errors = on_ranks(2, [&](int r, const arbiter_oob& oob) {
    arbiter::CommunicatorOptions o = gpu_options(r);
    o.hidden = 0;
    arbiter::Communicator comm(oob, arbiter::Policy::load_or_throw({}), registry, o);
  });
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(contains(errors[r], "hidden is 0: pass the model's hidden size"), errors[r]);
  }
}

// abort() on rank 0 reaches every workspace it has (the module's abort),
// every later call there fails at once, and teardown is local.
BOOST_AUTO_TEST_CASE(abort_reaches_every_workspace_and_fails_later_calls) {
  const arbiter::Registry registry = registry_of(all_modules());
  const std::string trtllm = module_path(ARBITER_RECORDING_DIR, "trtllm");
  const std::string nccl = module_path(ARBITER_RECORDING_DIR, "nccl");
  const long trtllm_before = recording_counter(trtllm, "recording_aborts");
  const long nccl_before = recording_counter(nccl, "recording_aborts");
  std::vector<std::uint16_t> dummy(64 * 1024);
  const auto errors = on_ranks(2, [&](int r, const arbiter_oob& oob) {
    arbiter::Communicator comm(oob, arbiter::Policy::load_or_throw({}), registry, gpu_options(r));
    auto first = comm.allreduce_fusion(norm_call(dummy, 4), nullptr);
    if (first.status != ARBITER_OK) throw std::runtime_error("first call: " + first.error);
    if (oob.barrier(oob.ctx, 20000) != ARBITER_OK) throw std::runtime_error("barrier");
    if (r != 0) return;
    BOOST_TEST(!comm.faulted());
    comm.abort();
    comm.abort();
    BOOST_TEST(comm.faulted());
    const auto later = comm.allreduce_fusion(norm_call(dummy, 4), nullptr);
    BOOST_TEST(later.status == ARBITER_ABORTED);
    BOOST_TEST(contains(later.error, "aborted"), later.error);
  });
  for (int r = 0; r < 2; ++r) BOOST_TEST(errors[r].empty(), "rank " << r << ": " << errors[r]);
  // Two abort() calls, then the teardown's, on rank 0's trtllm and nccl.
  BOOST_TEST(recording_counter(trtllm, "recording_aborts") - trtllm_before == 3);
  BOOST_TEST(recording_counter(nccl, "recording_aborts") - nccl_before == 3);
}

// The check mode: rank 1 passes 4 tokens where rank 0 passes 8, so (without
// the check) rank 0 would run trtllm one-shot on a shape its peer never
// sends. Both are refused before any module runs; the next call runs.
BOOST_AUTO_TEST_CASE(the_check_mode_refuses_calls_that_differ_on_every_rank_before_they_run) {
  const arbiter::Registry registry = registry_of(all_modules());
  const std::string trtllm = module_path(ARBITER_RECORDING_DIR, "trtllm");
  const long runs_before = recording_runs(trtllm);
  std::vector<std::uint16_t> dummy(64 * 1024);
  std::vector<std::string> refused(2);
  std::vector<int> next(2, -1);
  setenv("ARBITER_CHECK_CALLS", "1", 1);  // as the test suites set it; read at creation
  const auto errors = on_ranks(2, [&](int r, const arbiter_oob& oob) {
    arbiter::Communicator comm(oob, arbiter::Policy::load_or_throw({}), registry, gpu_options(r));
    if (!comm.check_calls()) throw std::runtime_error("ARBITER_CHECK_CALLS=1 left it off");
    if (oob.barrier(oob.ctx, 20000) != ARBITER_OK) throw std::runtime_error("barrier");
    const auto mismatched = comm.allreduce_fusion(norm_call(dummy, r == 1 ? 4 : 8), nullptr);
    refused[r] = std::to_string(mismatched.status) + ": " + mismatched.error;
    arbiter_allreduce_args eps = norm_call(dummy, 8);
    if (r == 1) eps.eps = 1e-2f;
    const auto eps_refused = comm.allreduce_fusion(eps, nullptr);
    if (eps_refused.status != ARBITER_MISMATCH || !contains(eps_refused.error, "in eps: ")) {
      throw std::runtime_error("eps: " + eps_refused.error);
    }
    next[r] = comm.allreduce_fusion(norm_call(dummy, 8), nullptr).status;
  });
  unsetenv("ARBITER_CHECK_CALLS");
  // Only the matching call ran, once per rank.
  BOOST_TEST(recording_runs(trtllm) - runs_before == 2);
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(errors[r].empty(), "rank " << r << ": " << errors[r]);
    BOOST_TEST(contains(refused[r],
                        "8: check mode: call 0 differs across ranks in tokens: rank 1 "
                        "has 4, rank 0 has 8"),
               refused[r]);
    BOOST_TEST(next[r] == ARBITER_OK);
  }
}
