// The communicator across real processes through `arbiter launch`: the
// policy's decisions run on the shm backend, results are right and equal on
// every rank, too-large messages still run, calls forced onto a backend
// (run_on) run or are refused alike on every rank, mismatched tables are
// refused, and nothing is left in /dev/shm.
#define BOOST_TEST_MODULE runtime_communicator
#include <boost/test/unit_test.hpp>

#include <filesystem>

#include "run_command.h"

using namespace arbiter::test;

namespace {

// Every rank reads the defaults with cpu rows capped at 4 MiB (see the file),
// so that the fallback is reachable with messages of a few MiB. The check
// mode is on, as in every test suite: each call's signature is all-gathered.
CommandResult launch(int ranks, const std::string& mode) {
  return run_command(std::string("env -u ARBITER_BACKENDS ARBITER_CHECK_CALLS=1 ARBITER_CONFIG=") +
                     ARBITER_TEST_DATA + "/good/cpu_cap_4mib.yaml " + ARBITER_BIN +
                     " launch --nproc " + std::to_string(ranks) + " --timeout 240 -- " +
                     COMMUNICATOR_RANK_BIN + " " + mode);
}

int arbiter_shm_files() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    n += e.path().filename().string().rfind("arbiter-shm-", 0) == 0;
  }
  return n;
}

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(fused_and_fallback_calls_are_right_on_2_4_and_8_ranks) {
  const int before = arbiter_shm_files();
  for (int ranks : {2, 4, 8}) {
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      const CommandResult r = launch(ranks, "sizes");
      BOOST_TEST(r.exit_code == 0, r.output);
      for (int k = 0; k < ranks; ++k) {
        BOOST_TEST(contains(r.output, "rank " + std::to_string(k) + ": OK"), r.output);
      }
      // The decisions the default cpu row implies.
      BOOST_TEST(contains(r.output, "bf16 tokens 1 hidden 2880: shm oneshot fused: ok"), r.output);
      BOOST_TEST(contains(r.output, "bf16 tokens 36 hidden 7168: shm twoshot fused: ok"), r.output);
      BOOST_TEST(contains(r.output, "bf16 tokens 1000 hidden 7168: shm native unfused: ok"),
                 r.output);
    }
  }
  BOOST_TEST(arbiter_shm_files() == before);
}

BOOST_AUTO_TEST_CASE(a_message_larger_than_the_workspace_still_runs_right) {
  const CommandResult r = launch(4, "slices");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "shm native unfused: ok"), r.output);
}

BOOST_AUTO_TEST_CASE(run_on_forces_a_backend_and_refuses_alike_on_every_rank) {
  const int before = arbiter_shm_files();
  const CommandResult r = launch(4, "run_on");
  BOOST_TEST(r.exit_code == 0, r.output);
  for (int k = 0; k < 4; ++k) {
    const std::string rank = "[rank " + std::to_string(k) + "] ";
    BOOST_TEST(contains(r.output, "rank " + std::to_string(k) + ": OK"), r.output);
    // Refused before anything ran, on every rank, with the reason.
    BOOST_TEST(contains(r.output, rank + "a GPU backend on CPU ranks: refused"), r.output);
    BOOST_TEST(contains(r.output, rank + "a pattern the module refuses: refused"), r.output);
  }
  BOOST_TEST(contains(r.output, "one-shot where the policy takes two-shot: shm oneshot fused: ok"),
             r.output);
  BOOST_TEST(contains(r.output, "fused above the cap: shm twoshot fused: ok"), r.output);
  // shm streams a call larger than its workspace instead of refusing it.
  BOOST_TEST(
      contains(r.output, "fused above a default workspace (streamed): shm oneshot fused: ok"),
      r.output);
  BOOST_TEST(
      contains(r.output, "unfused above a default workspace (slices): shm native unfused: ok"),
      r.output);
  BOOST_TEST(arbiter_shm_files() == before);
}

BOOST_AUTO_TEST_CASE(ranks_with_different_tables_are_refused) {
  const CommandResult r = launch(3, "fingerprint");
  BOOST_TEST(r.exit_code == 0, r.output);
  for (int k = 0; k < 3; ++k) {
    BOOST_TEST(contains(r.output, "rank " + std::to_string(k) + ": refused: tuning tables differ"),
               r.output);
  }
  BOOST_TEST(contains(r.output, "ARBITER_CONFIG and ARBITER_BACKENDS"), r.output);
}

// Options at their defaults (every pattern asked for): creation succeeds at
// 1, 2 and 3 ranks (fused at 2; 1 and 3 have no cpu cell) and everything a
// CPU runs is right; NVFP4, which no CPU backend runs, is refused on every
// rank with the reason.
BOOST_AUTO_TEST_CASE(default_options_work_at_every_world_size_including_1) {
  const int before = arbiter_shm_files();
  for (int ranks : {1, 2, 3}) {
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      const CommandResult r = launch(ranks, "defaults");
      BOOST_TEST(r.exit_code == 0, r.output);
      for (int k = 0; k < ranks; ++k) {
        BOOST_TEST(contains(r.output, "rank " + std::to_string(k) + ": OK"), r.output);
        BOOST_TEST(contains(r.output, "[rank " + std::to_string(k) + "] nvfp4: refused"), r.output);
      }
      if (ranks != 2) {
        // No cpu cell for 1 (nothing to fuse) or 3 ranks: the fallback runs.
        BOOST_TEST(contains(r.output, "bf16 residual_rmsnorm tokens 40: shm native unfused: ok"),
                   r.output);
        BOOST_TEST(!contains(r.output, " fused: ok"), r.output);
      } else {
        BOOST_TEST(contains(r.output, "bf16 residual_rmsnorm tokens 1: shm oneshot fused: ok"),
                   r.output);
      }
    }
  }
  BOOST_TEST(arbiter_shm_files() == before);
}

BOOST_AUTO_TEST_CASE(a_pattern_not_asked_for_is_refused_on_every_rank) {
  const CommandResult r = launch(2, "patterns");
  BOOST_TEST(r.exit_code == 0, r.output);
  for (int k = 0; k < 2; ++k) {
    BOOST_TEST(contains(r.output, "[rank " + std::to_string(k) + "] not asked for: refused"),
               r.output);
  }
}

BOOST_AUTO_TEST_CASE(ranks_with_different_options_are_refused_naming_the_field) {
  const CommandResult r = launch(3, "agreement");
  BOOST_TEST(r.exit_code == 0, r.output);
  for (int k = 0; k < 3; ++k) {
    BOOST_TEST(contains(r.output, "rank " + std::to_string(k) +
                                      ": refused: ranks differ in hidden: rank 1 has 2048"),
               r.output);
  }
}

// The shared-GPU test mode concerns GPU modules only: CPU ranks run as
// always. A value other than 1 is refused on every rank.
BOOST_AUTO_TEST_CASE(the_shared_gpu_test_mode_leaves_cpu_ranks_alone_and_takes_only_1) {
  const CommandResult on =
      run_command(std::string("env -u ARBITER_BACKENDS ARBITER_TEST_SHARED_GPU=1 ARBITER_CONFIG=") +
                  ARBITER_TEST_DATA + "/good/cpu_cap_4mib.yaml " + ARBITER_BIN +
                  " launch --nproc 2 --timeout 120 -- " + COMMUNICATOR_RANK_BIN + " sizes");
  BOOST_TEST(on.exit_code == 0, on.output);
  BOOST_TEST(contains(on.output, "rank 1: OK"), on.output);
  const CommandResult bad = run_command(
      std::string("env -u ARBITER_CONFIG -u ARBITER_BACKENDS ARBITER_TEST_SHARED_GPU=yes ") +
      ARBITER_BIN + " launch --nproc 2 --timeout 120 -- " + COMMUNICATOR_RANK_BIN + " sizes");
  BOOST_TEST(bad.exit_code != 0, bad.output);
  BOOST_TEST(contains(bad.output, "ARBITER_TEST_SHARED_GPU is \"yes\""), bad.output);
  BOOST_TEST(contains(bad.output, "switched on by exactly 1"), bad.output);
  BOOST_TEST(!contains(bad.output, ": OK"), bad.output);
}

#ifdef EXAMPLE_FUSED_BIN
// The example's GPU mode where there is no GPU (or no CUDA in its build):
// one clear line, no crash. On a GPU machine it must simply pass.
BOOST_AUTO_TEST_CASE(the_example_on_cuda_says_clearly_what_is_missing) {
  const CommandResult r =
      run_command(std::string(ARBITER_BIN) + " launch --nproc 1 --timeout 120 -- " +
                  EXAMPLE_FUSED_BIN + " --device cuda");
  if (r.exit_code == 0) {
    BOOST_TEST(contains(r.output, "GPU ranks"), r.output);
    return;
  }
  BOOST_TEST((contains(r.output, "--device cuda: no CUDA device") ||
              contains(r.output, "--device cuda: this build of the example has no CUDA")),
             r.output);
  BOOST_TEST(!contains(r.output, "terminate called"), r.output);
}
#endif

BOOST_AUTO_TEST_CASE(registered_memory_gives_the_same_bits_and_refuses_misuse) {
  const int before = arbiter_shm_files();
  for (int ranks : {2, 3}) {
    const CommandResult r = launch(ranks, "registered");
    BOOST_TEST(r.exit_code == 0, r.output);
    for (int k = 0; k < ranks; ++k) {
      BOOST_TEST(contains(r.output, "rank " + std::to_string(k) + ": OK"), r.output);
    }
  }
  BOOST_TEST(arbiter_shm_files() == before);
}

// What an operator budgets for is what a rank maps: the communicator's
// figure for shm equals the bytes of the /dev/shm object each rank mapped.
BOOST_AUTO_TEST_CASE(the_footprint_is_the_shared_memory_each_rank_maps) {
  for (int ranks : {2, 3}) {
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      const CommandResult r = launch(ranks, "footprint");
      BOOST_TEST(r.exit_code == 0, r.output);
      for (int k = 0; k < ranks; ++k) {
        BOOST_TEST(contains(r.output, "[rank " + std::to_string(k) + "] footprint: shared "),
                   r.output);
      }
    }
  }
}
