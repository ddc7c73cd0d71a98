// The shm module when something goes wrong, as forked rank processes see
// it: a peer that dies (SIGKILL, _exit) at a named step of a call is noticed
// within a second and named; a peer that stops is named when the deadline
// passes; abort() from another thread returns the waiting call within
// 100 ms and its peers within a second; calls that differ across ranks
// (tokens, eps, pattern, flags, buffers given, algorithm, ...) are refused on
// every rank without writing any output, and the workspace stays usable.
// After each fault the survivors destroy their workspace at once, nothing
// is left in /dev/shm, and they create a new one over their own group that
// runs exactly. Faults are placed with the test-only ARBITER_TEST_FAULT.
#define BOOST_TEST_MODULE backends_shm_faults
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "arbiter_backend.h"
#include "fork_ranks.h"
#include "shm_harness.h"

using arbiter::test::RankBody;
using arbiter::test::run_ranks;
using arbiter::test::SharedOob;
using arbiter::test::SharedOobArea;
using namespace arbiter::test::shm_harness;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint32_t kHidden = 256;
constexpr std::uint32_t kMaxTokens = 40;
// "At once": far below every deadline these tests set, so a call that
// waited on a peer still fails the check, and above the stalls a busy
// 2-core host gives a process (a 50 ms bound flaked there).
constexpr double kAtOnce = 0.5;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string seconds_text(double s) { return std::to_string(s) + " s"; }

// Runs `ranks` forked ranks; `victim` must end one of `victim_ends` ways,
// every other rank must return "", and /dev/shm must be as before.
void run_with_victim(int ranks, int victim, const std::vector<std::string>& victim_ends,
                     const RankBody& body) {
  shm();
  shm_faults();
  const std::set<std::string> before = shm_entries();
  const std::vector<std::string> results = run_ranks(ranks, std::chrono::seconds(60), body);
  for (int rank = 0; rank < ranks; ++rank) {
    if (rank == victim) {
      const bool expected =
          std::find(victim_ends.begin(), victim_ends.end(), results[rank]) != victim_ends.end();
      BOOST_TEST(expected, "victim rank " << rank << " ended as: " << results[rank]);
    } else {
      BOOST_TEST(results[rank] == "", "rank " << rank << " of " << ranks << ": " << results[rank]);
    }
  }
  for (const std::string& name : shm_entries()) {
    BOOST_TEST(before.count(name) == 1u, "left behind: /dev/shm/" << name);
  }
}

arbiter_workspace* create(const arbiter_oob& oob, std::int64_t timeout_ms, std::string& problem,
                          std::uint64_t tokens = kMaxTokens) {
  const arbiter_workspace_spec spec =
      make_spec(oob, ARBITER_DTYPE_FP32, tokens * kHidden * sizeof(float), timeout_ms);
  arbiter_workspace* workspace = nullptr;
  if (shm().workspace_create(&oob, &spec, &workspace) != ARBITER_OK) {
    problem = std::string("workspace_create: ") + shm().last_error();
    return nullptr;
  }
  return workspace;
}

// One all-reduce of exact small integers: rank r contributes r + 1 + call.
struct Exact {
  std::vector<float> input, output;
  Exact() : input(kMaxTokens * kHidden), output(kMaxTokens * kHidden) {}

  std::int32_t run(int rank, int ranks, arbiter_workspace* workspace, arbiter_algorithm algorithm,
                   std::uint32_t tokens, int call, std::string& problem) {
    std::fill(input.begin(), input.end(), static_cast<float>(rank + 1 + call));
    std::fill(output.begin(), output.end(), -1.0f);
    const arbiter_allreduce_args args =
        allreduce_args(ARBITER_DTYPE_FP32, algorithm, tokens, kHidden, input.data(), output.data());
    const std::int32_t status = shm().run(workspace, &args, nullptr);
    if (status != ARBITER_OK) return status;
    const float expected = static_cast<float>(ranks * (ranks + 1) / 2 + ranks * call);
    for (std::size_t i = 0; i < std::size_t{tokens} * kHidden; ++i) {
      if (output[i] != expected) {
        problem = std::string(algorithm_name(algorithm)) + " call " + std::to_string(call) +
                  ": element " + std::to_string(i) + " is " + std::to_string(output[i]) +
                  ", expected " + std::to_string(expected);
        break;
      }
    }
    return status;
  }
};

constexpr arbiter_algorithm kAlgorithms[] = {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT,
                                             ARBITER_ALGORITHM_NATIVE};

// The survivors' own group (ranks renumbered): a new workspace that runs
// 12 calls in every algorithm exactly, streamed ones included.
std::string survivors_run_exactly(SharedOobArea& area, int new_rank) {
  SharedOob oob(area, new_rank);
  std::string problem;
  arbiter_workspace* workspace = create(oob.oob(), 5000, problem, 16);
  if (workspace == nullptr) return "survivors' new workspace: " + problem;
  Exact exact;
  for (int call = 0; call < 12 && problem.empty(); ++call) {
    const std::int32_t status = exact.run(new_rank, area.ranks(), workspace, kAlgorithms[call % 3],
                                          1 + (call * 7) % kMaxTokens, call, problem);
    if (status != ARBITER_OK) problem = std::string("survivors' call: ") + shm().last_error();
  }
  shm().workspace_destroy(workspace);
  return problem.empty() ? "" : "survivors' group: " + problem;
}

// Every rank's pid, so that survivors can end a stopped victim.
std::vector<std::int32_t> all_pids(const arbiter_oob& oob) {
  std::vector<std::int32_t> pids(oob.size);
  const std::int32_t mine = getpid();
  if (oob.allgather(oob.ctx, &mine, pids.data(), sizeof mine, kTimeoutMs) != ARBITER_OK) {
    throw std::runtime_error("allgather of pids failed");
  }
  return pids;
}

void arm(int rank, const std::string& step, int call, const std::string& action) {
  const std::string value =
      std::to_string(rank) + ":" + step + "@" + std::to_string(call) + ":" + action;
  setenv("ARBITER_TEST_FAULT", value.c_str(), 1);
}

}  // namespace

// 2 and 3 ranks; the last one dies at call 5 at each step of each
// algorithm, by SIGKILL or _exit. The survivors' failing call returns within
// a second naming the dead rank (a one-shot call whose victim died after
// publishing its data completes; the next one fails); every later call
// fails at once; teardown is immediate; the survivors' new group is exact.
BOOST_AUTO_TEST_CASE(a_peer_that_dies_mid_call_is_named_within_a_second_and_survivors_go_on) {
  struct Case {
    const char* step;
    arbiter_algorithm algorithm;
    const char* action;
  };
  const Case cases[] = {
      {"shm.call.start", ARBITER_ALGORITHM_ONESHOT, "kill"},
      {"shm.call.published", ARBITER_ALGORITHM_ONESHOT, "exit"},
      {"shm.call.start", ARBITER_ALGORITHM_TWOSHOT, "exit"},
      {"shm.call.met", ARBITER_ALGORITHM_TWOSHOT, "kill"},
      {"shm.call.published", ARBITER_ALGORITHM_NATIVE, "kill"},
      {"shm.call.barrier2", ARBITER_ALGORITHM_NATIVE, "exit"},
  };
  constexpr int kDeathCall = 5;
  for (int ranks : {2, 3}) {
    for (const Case& c : cases) {
      BOOST_TEST_CONTEXT(ranks << " ranks, " << c.step << " " << algorithm_name(c.algorithm) << " "
                               << c.action) {
        const int victim = ranks - 1;
        SharedOobArea survivors(ranks - 1);
        run_with_victim(
            ranks, victim, {"died with signal 9", "exit status 97"},
            [&](int rank, const arbiter_oob& oob) -> std::string {
              arm(victim, c.step, kDeathCall, c.action);
              std::string problem;
              // A long deadline: the death must be noticed long before it.
              arbiter_workspace* workspace = create(oob, 20000, problem);
              if (workspace == nullptr) return problem;
              Exact exact;
              for (int call = 0;; ++call) {
                const auto started = Clock::now();
                const std::int32_t status =
                    exact.run(rank, ranks, workspace, c.algorithm, 7, call, problem);
                if (!problem.empty()) return problem;
                if (status == ARBITER_OK) {
                  if (call > kDeathCall + 1) return "calls still succeed after the death";
                  continue;
                }
                const double waited = since(started);
                const std::string message = shm().last_error();
                if (rank == victim) return "the victim's own call failed: " + message;
                if (call < kDeathCall) return "failed before the death: " + message;
                if (status != ARBITER_PEER_FAILED ||
                    !contains(message, "rank " + std::to_string(victim) + " died")) {
                  return "call " + std::to_string(call) + ": status " + std::to_string(status) +
                         ": " + message;
                }
                if (waited > 1.0) return "noticed after " + seconds_text(waited) + ": " + message;
                const auto again = Clock::now();
                if (exact.run(rank, ranks, workspace, c.algorithm, 7, call + 1, problem) !=
                        ARBITER_PEER_FAILED ||
                    since(again) > kAtOnce ||
                    !contains(shm().last_error(), "rank " + std::to_string(victim) + " died")) {
                  return std::string("the next call did not fail at once: ") + shm().last_error();
                }
                break;
              }
              const auto teardown = Clock::now();
              shm().workspace_destroy(workspace);
              if (since(teardown) > kAtOnce)
                return "teardown took " + seconds_text(since(teardown));
              return survivors_run_exactly(survivors, rank);
            });
      }
    }
  }
}

// Ranks may be given different timeouts. A peer that gave up at its own
// was reported with this rank's ("rank 0 gave up after 30000 ms" where rank
// 0 waited 300 ms): a peer's timeout is not named.
BOOST_AUTO_TEST_CASE(a_peer_that_gave_up_is_not_given_this_ranks_timeout) {
  run_group(2, [&](int rank, const arbiter_oob& oob) -> std::string {
    std::string problem;
    arbiter_workspace* workspace = create(oob, rank == 0 ? 300 : 30000, problem);
    if (workspace == nullptr) return problem;
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    Exact exact;
    const std::int32_t status =
        exact.run(rank, 2, workspace, ARBITER_ALGORITHM_ONESHOT, 4, 0, problem);
    const std::string message = shm().last_error();
    shm().workspace_destroy(workspace);
    if (rank == 0 && (status != ARBITER_TIMEOUT || !contains(message, "timed out after 300 ms"))) {
      return "status " + std::to_string(status) + ": " + message;
    }
    if (rank == 1 && (status != ARBITER_PEER_FAILED ||
                      !contains(message, "rank 0 gave up (at its timeout) waiting for rank 1") ||
                      contains(message, "30000"))) {
      return "status " + std::to_string(status) + ": " + message;
    }
    return "";
  });
}

// abort() while this rank's allocation waits for its peers: they refuse
// theirs at once (the communicator is aborted), so the exchange ends at the
// deadline; that is this rank's own abort, said as ARBITER_ABORTED, not a
// TIMEOUT blaming the peer that refused.
BOOST_AUTO_TEST_CASE(an_allocation_aborted_while_it_waits_says_so) {
  run_group(2, [&](int rank, const arbiter_oob& oob) -> std::string {
    std::string problem;
    arbiter_workspace* workspace = create(oob, 1500, problem);
    if (workspace == nullptr) return problem;
    void* area = nullptr;
    std::int32_t status = ARBITER_OK;
    std::string message;
    if (rank == 0) {
      std::thread aborter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        shm_faults().abort(workspace);
      });
      status = shm_memory().alloc(workspace, 4096, &area);
      message = shm().last_error();
      aborter.join();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(700));
      status = shm_memory().alloc(workspace, 4096, &area);
      message = shm().last_error();
    }
    shm().workspace_destroy(workspace);
    if (rank == 0 &&
        (status != ARBITER_ABORTED ||
         !contains(message, "abort() was called on this rank while this allocation"))) {
      return "status " + std::to_string(status) + ": " + message;
    }
    if (rank == 1 && (status != ARBITER_PEER_FAILED || !contains(message, "rank 0 aborted"))) {
      return "status " + std::to_string(status) + ": " + message;
    }
    return "";
  });
}

// A timeout meant as "never" (1e10 s) waits: now() + 1e13 ms overflowed
// the clock's nanoseconds, and the first call that waited at all timed out
// at once, leaving the workspace unusable.
BOOST_AUTO_TEST_CASE(a_timeout_meant_as_never_waits_for_a_late_peer) {
  run_group(2, [&](int rank, const arbiter_oob& oob) -> std::string {
    std::string problem;
    arbiter_workspace* workspace = create(oob, std::int64_t{10'000'000'000'000}, problem);
    if (workspace == nullptr) return problem;
    Exact exact;
    for (int call = 0; call < 3 && problem.empty(); ++call) {
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (exact.run(rank, 2, workspace, kAlgorithms[call], 6, call, problem) != ARBITER_OK &&
          problem.empty()) {
        problem = "call " + std::to_string(call) + ": " + shm().last_error();
      }
    }
    shm().workspace_destroy(workspace);
    return problem;
  });
}

// The last rank stops (SIGSTOP) at call 3: alive, so only the deadline
// (1 s) ends the survivors' wait, and the error names the rank they waited
// for (before, a peer was named after whichever rank gave up first).
BOOST_AUTO_TEST_CASE(a_peer_that_stops_is_named_when_the_deadline_passes) {
  for (int ranks : {2, 3}) {
    for (arbiter_algorithm algorithm : {ARBITER_ALGORITHM_ONESHOT, ARBITER_ALGORITHM_TWOSHOT}) {
      BOOST_TEST_CONTEXT(ranks << " ranks, " << algorithm_name(algorithm)) {
        const int victim = ranks - 1;
        SharedOobArea survivors(ranks - 1);
        run_with_victim(
            ranks, victim, {"died with signal 9"},
            [&](int rank, const arbiter_oob& oob) -> std::string {
              arm(victim, "shm.call.start", 3, "stop");
              const std::vector<std::int32_t> pids = all_pids(oob);
              std::string problem;
              arbiter_workspace* workspace = create(oob, 1000, problem);
              if (workspace == nullptr) return problem;
              Exact exact;
              std::string result;
              for (int call = 0; call < 5 && result.empty(); ++call) {
                const auto started = Clock::now();
                const std::int32_t status =
                    exact.run(rank, ranks, workspace, algorithm, 9, call, problem);
                if (!problem.empty()) return problem;
                if (status == ARBITER_OK) continue;
                const double waited = since(started);
                const std::string message = shm().last_error();
                const std::string named = "waiting for rank " + std::to_string(victim);
                if (call != 3) {
                  result = "call " + std::to_string(call) + " failed: " + message;
                } else if ((status != ARBITER_TIMEOUT && status != ARBITER_PEER_FAILED) ||
                           !contains(message, named)) {
                  result = "status " + std::to_string(status) + ": " + message;
                } else if (waited < 0.5 || waited > 3.0) {
                  result = "ended after " + seconds_text(waited) + " (deadline 1 s): " + message;
                } else {
                  break;
                }
              }
              shm().workspace_destroy(workspace);
              if (!result.empty()) return result;
              kill(pids[victim], SIGKILL);  // every survivor may; the first one does
              return survivors_run_exactly(survivors, rank);
            });
      }
    }
  }
}

// Rank 0 aborts from another thread while its call waits on the last rank,
// which never calls: the call returns ARBITER_ABORTED at once (100 ms by design), the
// other waiting rank (3 ranks) returns ARBITER_PEER_FAILED naming rank 0
// within a second, every later call fails at once, and teardown is
// immediate; a new workspace over the same group then runs exactly.
BOOST_AUTO_TEST_CASE(abort_from_another_thread_ends_the_wait_here_and_on_the_peers) {
  for (int ranks : {2, 3}) {
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      run_group(ranks, [&](int rank, const arbiter_oob& oob) -> std::string {
        const int late = ranks - 1;
        std::string problem;
        arbiter_workspace* workspace = create(oob, 20000, problem);
        if (workspace == nullptr) return problem;
        Exact exact;
        std::int64_t times[2] = {0, 0};  // [0] abort (rank 0), [1] the call's return
        std::string result;
        if (rank != late) {
          std::thread aborter;
          if (rank == 0) {
            aborter = std::thread([&] {
              std::this_thread::sleep_for(std::chrono::milliseconds(200));
              times[0] = now_ns();
              shm_faults().abort(workspace);
            });
          }
          const std::int32_t status =
              exact.run(rank, ranks, workspace, ARBITER_ALGORITHM_ONESHOT, 4, 0, problem);
          times[1] = now_ns();
          const std::string message = shm().last_error();
          if (aborter.joinable()) aborter.join();
          if (rank == 0 && (status != ARBITER_ABORTED || !contains(message, "aborted"))) {
            result = "the aborted call: status " + std::to_string(status) + ": " + message;
          } else if (rank != 0 &&
                     (status != ARBITER_PEER_FAILED || !contains(message, "rank 0 aborted"))) {
            result = "the peer's call: status " + std::to_string(status) + ": " + message;
          }
        }
        std::vector<std::int64_t> all(2 * static_cast<std::size_t>(ranks));
        if (oob.allgather(oob.ctx, times, all.data(), sizeof times, kTimeoutMs) != ARBITER_OK) {
          return "allgather failed";
        }
        const double aborted_at = static_cast<double>(all[0]) * 1e-9;
        for (int r = 0; r < ranks && result.empty() && rank == 0; ++r) {
          if (r == late) continue;
          const double after = static_cast<double>(all[2 * r + 1]) * 1e-9 - aborted_at;
          if (after > (r == 0 ? kAtOnce : 1.0)) {
            result = "rank " + std::to_string(r) + " returned " + seconds_text(after) +
                     " after the abort";
          }
        }
        // Every later call fails at once, on the late rank too.
        const auto again = Clock::now();
        const std::int32_t status =
            exact.run(rank, ranks, workspace, ARBITER_ALGORITHM_TWOSHOT, 4, 1, problem);
        if (result.empty() && (status != (rank == 0 ? ARBITER_ABORTED : ARBITER_PEER_FAILED) ||
                               since(again) > kAtOnce)) {
          result = "a later call: status " + std::to_string(status) + ": " + shm().last_error();
        }
        const auto teardown = Clock::now();
        shm().workspace_destroy(workspace);
        if (result.empty() && since(teardown) > kAtOnce) result = "teardown was not immediate";
        if (!result.empty()) return result;
        // The same group, a new workspace.
        workspace = create(oob, 5000, problem);
        if (workspace == nullptr) return "after the abort: " + problem;
        for (int call = 0; call < 6 && problem.empty(); ++call) {
          if (exact.run(rank, ranks, workspace, kAlgorithms[call % 3], 5, call, problem) !=
              ARBITER_OK) {
            problem = std::string("after the abort: ") + shm().last_error();
          }
        }
        shm().workspace_destroy(workspace);
        return problem;
      });
    }
  }
}

// abort() before any call, and on a workspace of one rank: later calls fail
// at once with ARBITER_ABORTED; aborting twice is harmless.
BOOST_AUTO_TEST_CASE(abort_before_a_call_and_on_one_rank_fails_every_later_call) {
  for (int ranks : {1, 2}) {
    run_group(ranks, [&](int rank, const arbiter_oob& oob) -> std::string {
      std::string problem;
      arbiter_workspace* workspace = create(oob, 20000, problem);
      if (workspace == nullptr) return problem;
      Exact exact;
      if (exact.run(rank, ranks, workspace, ARBITER_ALGORITHM_ONESHOT, 3, 0, problem) !=
          ARBITER_OK) {
        return std::string("first call: ") + shm().last_error();
      }
      if (oob.barrier(oob.ctx, kTimeoutMs) != ARBITER_OK) return "barrier failed";
      shm_faults().abort(workspace);
      shm_faults().abort(workspace);
      std::string result;
      for (arbiter_algorithm algorithm : kAlgorithms) {
        const auto started = Clock::now();
        const std::int32_t status = exact.run(rank, ranks, workspace, algorithm, 3, 1, problem);
        if (status != ARBITER_ABORTED || since(started) > kAtOnce) {
          result = std::string("after abort: status ") + std::to_string(status) + ": " +
                   shm().last_error();
        }
      }
      shm().workspace_destroy(workspace);
      return result;
    });
  }
}

namespace {

// Buffers of one call of up to kMaxTokens tokens, outputs poisoned.
struct Call {
  std::vector<float> input, residual, gamma, allreduce_out, residual_out, norm_out;
  std::vector<std::uint8_t> quant;
  float scale = 0.5f;
  Call()
      : input(kMaxTokens * kHidden, 1.0f),
        residual(kMaxTokens * kHidden, 0.25f),
        gamma(kHidden, 1.0f),
        allreduce_out(kMaxTokens * kHidden),
        residual_out(kMaxTokens * kHidden),
        norm_out(kMaxTokens * kHidden),
        quant(kMaxTokens * kHidden) {
    poison();
  }
  void poison() {
    for (auto* v : {&allreduce_out, &residual_out, &norm_out}) {
      std::memset(v->data(), 0xCD, v->size() * sizeof(float));
    }
    std::memset(quant.data(), 0xCD, quant.size());
  }
  bool untouched() const {
    for (const auto* v : {&allreduce_out, &residual_out, &norm_out}) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(v->data());
      for (std::size_t i = 0; i < v->size() * sizeof(float); ++i) {
        if (bytes[i] != 0xCD) return false;
      }
    }
    return std::all_of(quant.begin(), quant.end(), [](std::uint8_t b) { return b == 0xCD; });
  }
  arbiter_allreduce_args args(arbiter_pattern pattern, arbiter_algorithm algorithm,
                              std::uint32_t tokens) {
    arbiter_allreduce_args a{};
    a.pattern = pattern;
    a.dtype = ARBITER_DTYPE_FP32;
    a.algorithm = algorithm;
    a.tokens = tokens;
    a.hidden = kHidden;
    a.input = input.data();
    if (pattern == ARBITER_PATTERN_ALLREDUCE) {
      a.allreduce_out = allreduce_out.data();
      return a;
    }
    a.residual_in = residual.data();
    a.residual_out = residual_out.data();
    a.gamma = gamma.data();
    a.eps = 1e-6f;
    a.norm_out = norm_out.data();
    if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) {
      a.quant_out = quant.data();
      a.scale = &scale;
    }
    return a;
  }
};

struct Mismatch {
  const char* name;
  arbiter_pattern pattern;
  arbiter_algorithm algorithm;
  std::uint32_t tokens;
  void (*odd)(arbiter_allreduce_args&, Call&);  // what the last rank does differently
  const char* field;                            // as the error names it
};

const Mismatch kMismatches[] = {
    {"tokens 8 vs 4, one-shot", ARBITER_PATTERN_ALLREDUCE, ARBITER_ALGORITHM_ONESHOT, 8,
     [](arbiter_allreduce_args& a, Call&) { a.tokens = 4; }, "in tokens: "},
    {"tokens 8 one-shot vs 4 two-shot", ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_ALGORITHM_ONESHOT,
     8,
     [](arbiter_allreduce_args& a, Call&) {
       a.tokens = 4;
       a.algorithm = ARBITER_ALGORITHM_TWOSHOT;
     },
     "in tokens: "},
    {"tokens 8 two-shot vs 4 unfused", ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_ALGORITHM_TWOSHOT,
     8,
     [](arbiter_allreduce_args& a, Call&) {
       a.tokens = 4;
       a.algorithm = ARBITER_ALGORITHM_NATIVE;
     },
     "in tokens: "},
    {"tokens 40 vs 33, streamed through 16-token slots in different slices",
     ARBITER_PATTERN_ALLREDUCE, ARBITER_ALGORITHM_ONESHOT, 40,
     [](arbiter_allreduce_args& a, Call&) { a.tokens = 33; }, "in tokens: "},
    {"tokens 4 vs 0", ARBITER_PATTERN_ALLREDUCE, ARBITER_ALGORITHM_TWOSHOT, 4,
     [](arbiter_allreduce_args& a, Call&) { a.tokens = 0; }, "in tokens: "},
    {"eps 1e-6 vs 1e-2", ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_ALGORITHM_ONESHOT, 4,
     [](arbiter_allreduce_args& a, Call&) { a.eps = 1e-2f; }, "in eps: "},
    {"pattern residual_rmsnorm vs allreduce (no residual)", ARBITER_PATTERN_RESIDUAL_RMSNORM,
     ARBITER_ALGORITHM_ONESHOT, 4,
     [](arbiter_allreduce_args& a, Call& c) {
       a = c.args(ARBITER_PATTERN_ALLREDUCE, a.algorithm, 4);
     },
     "in pattern: "},
    {"weight_bias 0 vs 1 (Gemma)", ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_ALGORITHM_TWOSHOT, 4,
     [](arbiter_allreduce_args& a, Call&) { a.weight_bias = 1.0f; }, "in weight_bias: "},
    // (Not norm_out: residual_rmsnorm requires it, and a rank without it
    // refuses its call alone, as the GPU modules do.)
    {"residual_out given vs not", ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_ALGORITHM_TWOSHOT, 4,
     [](arbiter_allreduce_args& a, Call&) { a.residual_out = nullptr; }, "in the buffers given: "},
    {"allreduce_out given vs not", ARBITER_PATTERN_RESIDUAL_RMSNORM, ARBITER_ALGORITHM_ONESHOT, 4,
     [](arbiter_allreduce_args& a, Call& c) { a.allreduce_out = c.allreduce_out.data(); },
     "in the buffers given: "},
    {"FP8 scale 0.5 vs 0.25", ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, ARBITER_ALGORITHM_ONESHOT, 4,
     [](arbiter_allreduce_args& a, Call&) {
       static const float quarter = 0.25f;
       a.scale = &quarter;
     },
     "in the quantisation scale: "},
    {"residual declared replicated on one rank", ARBITER_PATTERN_RESIDUAL_RMSNORM,
     ARBITER_ALGORITHM_TWOSHOT, 6,
     [](arbiter_allreduce_args& a, Call&) { a.flags = ARBITER_RUN_RESIDUAL_REPLICATED; },
     "in flags: "},
    {"the same call forced onto one-shot and unfused", ARBITER_PATTERN_ALLREDUCE,
     ARBITER_ALGORITHM_ONESHOT, 4,
     [](arbiter_allreduce_args& a, Call&) { a.algorithm = ARBITER_ALGORITHM_NATIVE; },
     "in algorithm"},
};

}  // namespace

// Each mismatch of the matrix, the last rank differing, at 2 and 3 ranks:
// every rank gets ARBITER_MISMATCH naming the field and the ranks, no output
// is written on any rank, and the workspace still runs matching calls
// exactly afterwards. Once more at 3 ranks with ranks stopped at random for
// a moment: a refusal must not let a fast rank run two calls ahead of a
// frozen one (it once did, and overwrote a line the frozen rank had yet to
// read).
BOOST_AUTO_TEST_CASE(calls_that_differ_across_ranks_are_refused_on_every_rank) {
  for (const std::pair<int, bool>& group : {std::pair{2, false}, {3, false}, {3, true}}) {
    const int ranks = group.first;  // not a structured binding: lambdas capture it
    const bool preempt = group.second;
    BOOST_TEST_CONTEXT(ranks << " ranks" << (preempt ? ", preempted" : "")) {
      run_group(
          ranks,
          [&](int rank, const arbiter_oob& oob) -> std::string {
            std::string problem;
            arbiter_workspace* workspace = create(oob, 20000, problem, 16);
            if (workspace == nullptr) return problem;
            const bool odd = rank == ranks - 1;
            Call call;
            Exact exact;
            int calls = 0;
            for (const Mismatch& m : kMismatches) {
              call.poison();
              arbiter_allreduce_args a = call.args(m.pattern, m.algorithm, m.tokens);
              if (odd) m.odd(a, call);
              const auto started = Clock::now();
              const std::int32_t status = shm().run(workspace, &a, nullptr);
              const std::string message = shm().last_error();
              const std::string where = std::string(m.name) + ": ";
              const std::string other = "rank " + std::to_string(odd ? 0 : ranks - 1);
              if (status != ARBITER_MISMATCH) {
                problem = where + "status " + std::to_string(status) + ": " + message;
              } else if (!contains(message, m.field) || !contains(message, other)) {
                problem = where + "the error does not name the field and the ranks: " + message;
              } else if (!call.untouched()) {
                problem = where + "a refused call wrote an output";
              } else if (since(started) > 1.0) {
                problem = where + "refused only after " + seconds_text(since(started));
              }
              if (!problem.empty()) break;
              // Still usable: a matching call right after is exact.
              if (exact.run(rank, ranks, workspace, kAlgorithms[calls % 3], 5, calls, problem) !=
                  ARBITER_OK) {
                problem = where + "the next matching call failed: " + shm().last_error();
              }
              ++calls;
              if (!problem.empty()) break;
            }
            shm().workspace_destroy(workspace);
            return problem;
          },
          120, preempt);
    }
  }
}

// ARBITER_SHM_WAIT picks the wait policy (wait_policy.h); a value that is
// none is refused at creation on every rank, with the variable and the
// choices in the message, and leaves nothing in /dev/shm. (The contracts
// above, deadlines, aborts and dead peers, run under each policy: ctest runs
// this suite again with ARBITER_SHM_WAIT=spin and =yield.)
BOOST_AUTO_TEST_CASE(an_unknown_wait_policy_is_refused_on_every_rank) {
  const char* before = std::getenv("ARBITER_SHM_WAIT");
  const std::string kept = before == nullptr ? "" : before;
  setenv("ARBITER_SHM_WAIT", "busy", 1);
  run_with_victim(2, -1, {}, [](int, const arbiter_oob& oob) -> std::string {
    std::string problem;
    arbiter_workspace* workspace = create(oob, 5000, problem);
    if (workspace != nullptr) {
      shm().workspace_destroy(workspace);
      return "workspace_create accepted ARBITER_SHM_WAIT=busy";
    }
    if (!contains(problem, "ARBITER_SHM_WAIT='busy' is not a wait policy; use auto") ||
        !contains(problem, "or spin")) {
      return "unclear refusal: " + problem;
    }
    return "";
  });
  if (before == nullptr) {
    unsetenv("ARBITER_SHM_WAIT");
  } else {
    setenv("ARBITER_SHM_WAIT", kept.c_str(), 1);
  }
}
