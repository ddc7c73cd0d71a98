// Faults through the whole runtime: 2 and 3 CPU rank processes started by
// hand with torchrun's variables (no launcher, which would stop the
// survivors), meeting over the UCX bootstrap, the shm backend under the
// communicator. One rank is made to die or stop at a named step of
// creation or of a call (the test-only ARBITER_TEST_FAULT). Each test
// asserts every survivor's error, how long it took and what it says, that
// every later call fails at once, that teardown waits on nobody, that
// nothing is left in /dev/shm, and that the survivors' new communicator over
// their own group runs exactly. Then abort() from another thread, and the
// matrix of calls that differ across ranks (with and without the check
// mode), each refused on every rank.
#define BOOST_TEST_MODULE runtime_faults
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "arbiter/bootstrap.h"
#include "run_command.h"

using namespace arbiter::test;

namespace {

// "At once": far below the deadlines these runs set (2 s and more), so a
// call that waited on a peer still fails the check, and above the stalls a
// busy 2-core host gives a process.
constexpr double kAtOnce = 0.5;

int shm_objects() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    n += e.path().filename().string().rfind("arbiter-shm-", 0) == 0;
  }
  return n;
}

struct Run {
  std::vector<std::string> outputs;  // per rank
  std::string all;                   // every rank's, for messages
};

// Starts `ranks` processes of the rank program in `mode` and waits for all
// (each is killed after 90 s). `fault` is ARBITER_TEST_FAULT; `victim` the
// rank it names (-1: none); `extra` more VAR=value words.
Run start(int ranks, const std::string& mode, const std::string& fault, int victim,
          const std::string& extra = "") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("arbiter-faults-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device()()));
  std::filesystem::create_directories(dir);
  const std::string token = "faults-" + std::to_string(std::random_device()());
  std::ostringstream script;
  script << "cd " << shell_quote(dir.string()) << " && (";
  for (int r = 0; r < ranks; ++r) {
    script << "env -u ARBITER_BACKENDS -u ARBITER_CHECK_CALLS ARBITER_CONFIG="
           << shell_quote(std::string(ARBITER_TEST_DATA) + "/good/cpu_cap_4mib.yaml")
           << " RANK=" << r << " WORLD_SIZE=" << ranks << " LOCAL_RANK=" << r
           << " MASTER_ADDR=127.0.0.1 MASTER_PORT=0"
           << " ARBITER_JOB_TOKEN=" << token << " UCX_TLS=tcp,self UCX_NET_DEVICES=lo"
           << " ARBITER_TEST_FAULT=" << shell_quote(fault) << " FAULTS_VICTIM=" << victim
           << " FAULTS_DIR=" << shell_quote(dir.string()) << " " << extra << " timeout -s KILL 90 "
           << FAULTS_RANK_BIN << " " << mode << " > out." << r << " 2>&1 & ";
  }
  script << "wait)";
  // Every rank needs the same MASTER_PORT: substitute one port for all.
  std::string command = script.str();
  const int port = arbiter::free_bootstrap_port();
  int survivor_port = arbiter::free_bootstrap_port();
  while (survivor_port == port) survivor_port = arbiter::free_bootstrap_port();
  command = std::regex_replace(command, std::regex("MASTER_PORT=[0-9]+"),
                               "MASTER_PORT=" + std::to_string(port) +
                                   " FAULTS_SURVIVOR_PORT=" + std::to_string(survivor_port));
  run_command(command);
  Run run;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(dir / ("out." + std::to_string(r)));
    std::stringstream text;
    text << in.rdbuf();
    run.outputs.push_back(text.str());
    run.all += "--- rank " + std::to_string(r) + "\n" + text.str();
  }
  std::filesystem::remove_all(dir);
  BOOST_TEST_MESSAGE(run.all);  // --log_level=message shows what every rank said
  return run;
}

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

// The seconds in "<prefix> after S s" on `output`, or -1.
double seconds_after(const std::string& output, const std::string& prefix) {
  const std::regex pattern(prefix + "[^\n]*? after ([0-9.]+) s");
  std::smatch m;
  return std::regex_search(output, m, pattern) ? std::stod(m[1]) : -1.0;
}

// The first line of `output` that contains `part`.
std::string line_with(const std::string& output, const std::string& part) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (contains(line, part)) return line;
  }
  return "";
}

// What every survivor of a call fault must show: its failing call names
// `named` within `bound` seconds with `status`, the next call fails at
// once, teardown is immediate, and the survivors' group runs exactly.
void check_call_fault(const Run& run, int victim, int status, const std::string& named,
                      double bound) {
  for (std::size_t r = 0; r < run.outputs.size(); ++r) {
    if (static_cast<int>(r) == victim) continue;
    const std::string& out = run.outputs[r];
    BOOST_TEST_CONTEXT("rank " << r) {
      const std::string failed = line_with(out, "failed call");
      BOOST_TEST(!failed.empty(), run.all);
      BOOST_TEST(contains(failed, "status " + std::to_string(status) + ":"), failed);
      BOOST_TEST(contains(failed, named), failed);
      const double waited = seconds_after(out, "failed call");
      BOOST_TEST((waited >= 0 && waited <= bound), "waited " << waited << " s: " << failed);
      const double next = seconds_after(out, "next call status");
      BOOST_TEST((next >= 0 && next < kAtOnce), line_with(out, "next call"));
      BOOST_TEST(!contains(line_with(out, "next call"), "status 0 "), run.all);
      const std::regex teardown("teardown ([0-9.]+) s");
      std::smatch m;
      BOOST_TEST_REQUIRE(std::regex_search(out, m, teardown), run.all);
      BOOST_TEST(std::stod(m[1]) < 0.5, "teardown took " << m[1] << " s");
      BOOST_TEST(contains(out, "survivors ok"), run.all);
      BOOST_TEST(contains(out, "done"), run.all);
    }
  }
}

// What every rank of an abort run must show: rank 0 (which aborted) returns
// ARBITER_ABORTED at once after its abort() (100 ms by design), the others
// ARBITER_PEER_FAILED naming rank 0 within a second (all but the last rank
// when `last_is_late`: it joins after the abort and fails at once), every
// later call fails at once, and the group makes a new communicator.
void check_abort(const Run& run, int ranks, bool last_is_late) {
  const std::regex abort_at("abort at ([0-9]+)");
  std::smatch m;
  BOOST_TEST_REQUIRE(std::regex_search(run.outputs[0], m, abort_at), run.all);
  const double aborted = std::stod(m[1]) * 1e-9;
  for (int r = 0; r < ranks; ++r) {
    const std::string& out = run.outputs[r];
    const std::regex returned("returned at ([0-9]+): status ([0-9]+): ([^\n]*)");
    BOOST_TEST_REQUIRE(std::regex_search(out, m, returned), run.all);
    const double after = std::stod(m[1]) * 1e-9 - aborted;
    const int status = std::stoi(m[2]);
    const std::string message = m[3];
    if (r == 0) {
      BOOST_TEST(status == 7, message);  // ARBITER_ABORTED
      BOOST_TEST(after <= kAtOnce, "returned " << after << " s after the abort");
    } else {
      BOOST_TEST(status == 5, message);  // ARBITER_PEER_FAILED
      BOOST_TEST(contains(message, "rank 0 aborted the communicator"), message);
      if (!last_is_late || r != ranks - 1) {
        BOOST_TEST(after <= 1.0, "returned " << after << " s after the abort");
      }
    }
    BOOST_TEST(seconds_after(out, "next call status") < kAtOnce, out);
    BOOST_TEST(contains(out, "survivors ok"), run.all);
  }
}

}  // namespace

// The case: the last of 3 ranks is SIGKILLed between calls (at the
// start of call 100, before it publishes anything); 2 ranks too, by _exit
// in the middle of a call. Today's bound was the whole timeout (20 s).
BOOST_AUTO_TEST_CASE(a_rank_killed_between_calls_is_named_within_a_second) {
  const int before = shm_objects();
  for (int ranks : {3, 2}) {
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      const int victim = ranks - 1;
      const std::string fault = ranks == 3 ? std::to_string(victim) + ":call.start@100:kill"
                                           : std::to_string(victim) + ":shm.call.met@100:exit";
      const Run run = start(ranks, "calls", fault, victim);
      check_call_fault(run, victim, 5, "rank " + std::to_string(victim) + " died", 1.0);
    }
  }
  BOOST_TEST(shm_objects() == before);
}

// GPU ranks: their calls return once enqueued and their kernels wait on
// peers, so the runtime watches the peers' processes from a thread. The last
// rank is SIGKILLed at the start of call 5 while the survivors' call 5 waits
// in its module as a kernel would (the recording modules, RECORDING_BLOCK_AT):
// the watch aborts the workspaces, and the call returns ARBITER_PEER_FAILED
// naming the dead rank within a second, though the deadline is 20 s.
BOOST_AUTO_TEST_CASE(a_dead_peer_of_a_gpu_communicator_is_named_within_a_second) {
  for (int ranks : {2, 3}) {
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      const int victim = ranks - 1;
      const Run run =
          start(ranks, "gpu-calls", std::to_string(victim) + ":call.start@5:kill", victim,
                std::string("FAULTS_GPU_MODULES=") + FAULTS_GPU_MODULES +
                    " RECORDING_BLOCK_AT=5 ARBITER_CONFIG=");
      check_call_fault(run, victim, 5, "rank " + std::to_string(victim) + " died", 1.0);
      for (int r = 0; r < victim; ++r) {
        const std::string failed = line_with(run.outputs[r], "failed call");
        BOOST_TEST(contains(failed, "failed call 5 "), failed);
        BOOST_TEST(contains(failed, "pid "), failed);
        BOOST_TEST(contains(line_with(run.outputs[r], "next call"), "died"), run.all);
        BOOST_TEST(contains(run.outputs[r], "faulted yes"), run.all);
      }
    }
  }
}

// A GPU rank that faults while alive: its peers' kernels would wait on it
// until their deadline (10 minutes by default; the recording module's 10 s
// here), since nothing on their host side waits. The rank posts the fault
// on the host's fault board, and the peers' watch aborts their workspaces:
// - the last rank's call 5 fails (a launch that fails: ARBITER_INTERNAL)
//   while its peers' call 5 waits on it; they return ARBITER_PEER_FAILED
//   naming that rank and call within a second;
// - rank 0 calls abort() from another thread 300 ms into call 5, which
//   every rank waits in: rank 0 returns ARBITER_ABORTED within 100 ms, the
//   others ARBITER_PEER_FAILED ("rank 0 aborted") within a second of it,
//   and the same group then makes a new communicator.
// The board leaves nothing in /dev/shm.
BOOST_AUTO_TEST_CASE(a_gpu_ranks_failed_call_or_abort_reaches_its_peers_within_a_second) {
  const int before = shm_objects();
  const std::string gpu = std::string("FAULTS_GPU_MODULES=") + FAULTS_GPU_MODULES +
                          " RECORDING_BLOCK_AT=5 ARBITER_CONFIG=";
  for (int ranks : {2, 3}) {
    BOOST_TEST_CONTEXT(ranks << " ranks, a failed call") {
      const int victim = ranks - 1;
      const Run run = start(ranks, "gpu-calls", "", victim,
                            gpu + " RECORDING_FAIL_RANK=" + std::to_string(victim));
      const std::string failed = line_with(run.outputs[victim], "failed call");
      BOOST_TEST(contains(failed, "failed call 5 "), run.all);
      BOOST_TEST(contains(failed, "status 6:"), failed);  // ARBITER_INTERNAL
      check_call_fault(run, victim, 5,
                       "rank " + std::to_string(victim) + "'s call 5 failed (ARBITER_INTERNAL",
                       1.0);
    }
    BOOST_TEST_CONTEXT(ranks << " ranks, abort()") {
      const Run run = start(ranks, "gpu-abort", "", -1, gpu);
      check_abort(run, ranks, /*last_is_late=*/false);
    }
  }
  BOOST_TEST(shm_objects() == before);
}

// An allocation of registered memory is a collective like a call: one
// that times out (rank 0 allocates while rank 1 calls) leaves the ranks out
// of step, so, as after a failed call, the next call or allocation on every
// rank fails at once instead of pairing with another rank's collective.
BOOST_AUTO_TEST_CASE(an_allocation_that_times_out_leaves_the_communicator_unusable) {
  const int before = shm_objects();
  const Run run = start(2, "alloc-fault", "", -1, "FAULTS_TIMEOUT_MS=2000");
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST_CONTEXT("rank " << r) {
      const std::string& out = run.outputs[r];
      const std::string first = line_with(out, "first status");
      BOOST_TEST((contains(first, "status 4 ") || contains(first, "status 5 ")), run.all);
      const double waited = seconds_after(out, "first status");
      BOOST_TEST((waited >= 1.5 && waited <= 4.0), first);
      const std::string next = line_with(out, "next status");
      BOOST_TEST(!contains(next, "status 0 "), run.all);
      BOOST_TEST(contains(next, "left this communicator unusable"), next);
      BOOST_TEST(seconds_after(out, "next status") < kAtOnce, next);
      BOOST_TEST(contains(out, "faulted yes"), run.all);
      BOOST_TEST(contains(out, "done"), run.all);
    }
  }
  BOOST_TEST(shm_objects() == before);
}

// A rank that stops (SIGSTOP) mid-call is alive: the deadline (2 s here)
// ends the wait, and every survivor names the rank that did not arrive.
BOOST_AUTO_TEST_CASE(a_rank_that_stops_is_named_at_the_deadline) {
  const int before = shm_objects();
  const Run run = start(3, "calls", "2:shm.call.published@60:stop", 2,
                        "FAULTS_TIMEOUT_MS=2000 FAULTS_KILL_VICTIM=1");
  for (int r = 0; r < 2; ++r) {
    const std::string failed = line_with(run.outputs[r], "failed call");
    BOOST_TEST((contains(failed, "status 4:") || contains(failed, "status 5:")), run.all);
    BOOST_TEST(contains(failed, "waiting for rank 2"), failed);
    const double waited = seconds_after(run.outputs[r], "failed call");
    BOOST_TEST((waited >= 1.5 && waited <= 4.0), "waited " << waited << " s: " << failed);
    BOOST_TEST(contains(run.outputs[r], "survivors ok"), run.all);
  }
  BOOST_TEST(shm_objects() == before);
}

// A rank that dies at a step of creation: the survivors' creation fails
// promptly (the bootstrap sees the connection drop; a dead peer in the shm
// module's exchange likewise) naming it, and their new group works.
BOOST_AUTO_TEST_CASE(a_rank_that_dies_during_creation_fails_it_promptly_and_by_name) {
  const int before = shm_objects();
  for (const char* step :
       {"create.facts", "shm.create.hello", "shm.create.mapped", "create.checked"}) {
    BOOST_TEST_CONTEXT(step) {
      const Run run = start(3, "create", std::string("2:") + step + ":kill", 2);
      for (int r = 0; r < 2; ++r) {
        const std::string failed = line_with(run.outputs[r], "creation failed");
        BOOST_TEST(!failed.empty(), run.all);
        BOOST_TEST(contains(failed, "rank 2"), failed);
        const double waited = seconds_after(run.outputs[r], "creation failed");
        BOOST_TEST((waited >= 0 && waited <= 3.0), "waited " << waited << " s: " << failed);
        BOOST_TEST(contains(run.outputs[r], "survivors ok"), run.all);
      }
    }
  }
  BOOST_TEST(shm_objects() == before);
}

// Rank 0 creates the shared memory and removes its name once every rank has
// mapped it: when rank 0 dies after the others mapped it, the survivors'
// failed creation removes the name instead (it was left in /dev/shm).
BOOST_AUTO_TEST_CASE(a_creator_that_dies_after_its_peers_mapped_the_memory_leaves_nothing) {
  const int before = shm_objects();
  // (The survivors' own group dies the same way: its rank 0 is armed too.)
  const Run run = start(3, "create", "0:shm.create.mapped:kill", 0);
  for (int r = 1; r < 3; ++r) {
    const std::string failed = line_with(run.outputs[r], "creation failed");
    BOOST_TEST(contains(failed, "rank 0"), run.all);  // disconnected, or reset the connection
    const double waited = seconds_after(run.outputs[r], "creation failed");
    BOOST_TEST((waited >= 0 && waited <= 3.0), "waited " << waited << " s: " << failed);
  }
  BOOST_TEST(shm_objects() == before, run.all);
}

// abort() from another thread on rank 0 while its call waits on the last
// rank: rank 0's call returns ARBITER_ABORTED within 100 ms, rank 1's (3
// ranks) ARBITER_PEER_FAILED naming rank 0 within a second, the late rank's
// at once; every later call fails at once, teardown is immediate, and a new
// communicator over the same group runs exactly.
BOOST_AUTO_TEST_CASE(abort_returns_the_waiting_call_and_its_peers) {
  const int before = shm_objects();
  for (int ranks : {2, 3}) {
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      const Run run = start(ranks, "abort", "", -1);
      check_abort(run, ranks, /*last_is_late=*/true);
    }
  }
  BOOST_TEST(shm_objects() == before);
}

// Each call of the matrix differs on the last rank: every rank returns
// ARBITER_MISMATCH (8) naming the field and both ranks, within a second;
// the next matching call is exact. At 2 ranks the differing calls take
// different algorithms (64 tokens two-shot, 1 token one-shot); at 3 ranks
// everything is unfused. The check mode refuses the same calls through the
// oob, a per-call dtype included, and an input in registered memory on some
// ranks and not on the last (or at another offset): the check mode compares
// where each input lies too, and shm refuses it without the check mode. A
// replicated two-shot call's outputs registered on some ranks and ordinary
// on the last have the same signature and input, so shm refuses it in
// either mode (2 ranks: at 3 the default table runs the call unfused, which
// never reads a peer's outputs). A call refused on the last rank alone (a
// NULL input; a binding's own refusal, join_refused_call(); without the
// check mode, a dtype the workspace was not made for) is joined by it: the
// others return MISMATCH naming it at once, instead of pairing their call
// with its next one, and the next call is exact on every rank.
BOOST_AUTO_TEST_CASE(calls_that_differ_across_ranks_are_refused_on_every_rank) {
  const int before = shm_objects();
  struct Expect {
    const char* name;
    const char* field;
    bool by_module = false;  // refused by shm even in the check mode (same signature)
    bool two_ranks_only = false;
    // Refused by the last rank alone (its own error), which joined the call
    // only to say so; `field` is then what the other ranks' error says.
    // dtype: so without the check mode, whose exchange compares it first.
    bool refused_by_odd = false;
    bool refused_without_check_mode = false;
  };
  const Expect cases[] = {
      {"tokens 8 vs 4", "tokens: "},
      {"tokens 64 vs 1", "tokens: "},
      {"eps 1e-6 vs 1e-2", "eps: "},
      {"pattern (residual given on one rank only)", "pattern: "},
      {"residual_out given on one rank only", "the buffers given: "},
      {"residual_in given on one rank only", "the buffers given: "},
      {"hidden 1024 vs 512", "hidden: "},
      {"dtype fp32 vs bf16", "dtype: "},
      {"input registered vs ordinary memory", "the input's memory: "},
      {"input at another offset of the registered memory", "the input's memory: "},
      {"outputs registered vs ordinary memory", "the outputs' memory: ", true, true},
      // The signatures agree (they hold no pointers): the module refuses it,
      // in either mode.
      {"input NULL on one rank (refused by the module)", "refused its call", true, false, true},
      {"refused before arbiter on one rank (join_refused_call)", "refused its call", false, false,
       true},
      // The host's own flag: refused (it would run nothing), and joined.
      {"ARBITER_RUN_REFUSED passed by the caller on one rank", "refused its call", false, false,
       true},
  };
  for (int ranks : {2, 3}) {
    for (bool check_mode : {false, true}) {
      if (ranks == 3 && check_mode) continue;
      BOOST_TEST_CONTEXT(ranks << " ranks, check mode " << check_mode) {
        // ARBITER_SHM_OWNERS_FROM=0: the owners' path (the outputs case)
        // at this call's size.
        const Run run =
            start(ranks, "mismatch", "", -1,
                  std::string(check_mode ? "ARBITER_CHECK_CALLS=1" : "ARBITER_CHECK_CALLS=0") +
                      " ARBITER_SHM_OWNERS_FROM=0");
        const std::string odd = "rank " + std::to_string(ranks - 1);
        for (const Expect& c : cases) {
          if (c.two_ranks_only && ranks != 2) continue;
          const bool dtype = std::string(c.name).rfind("dtype", 0) == 0;
          const bool refused = c.refused_by_odd || (dtype && !check_mode);
          for (int r = 0; r < ranks; ++r) {
            const std::string line = line_with(run.outputs[r], std::string("mismatch ") + c.name);
            if (refused && r == ranks - 1) {
              // Its own refusal (join_refused_call() itself succeeds).
              const bool joined_only = std::string(c.name).rfind("refused before", 0) == 0;
              BOOST_TEST(contains(line, joined_only ? "status 0 " : "status "), line);
              BOOST_TEST(!contains(line, "status 8 "), line);
              BOOST_TEST(seconds_after(run.outputs[r], std::string("mismatch ") + c.name) < 1.0,
                         line);
              BOOST_TEST(contains(run.outputs[r], std::string("after ") + c.name + ": exact"),
                         run.all);
              continue;
            }
            BOOST_TEST(contains(line, "status 8 "), c.name << ": " << line << "\n" << run.all);
            BOOST_TEST(contains(line, refused ? "whether it was refused: " : c.field), line);
            // Both ranks of the pair compared (shm: this rank and the one
            // that differs from it; the check mode: rank 0 and that one).
            BOOST_TEST(contains(line, odd), line);
            BOOST_TEST((contains(line, "rank 0") || contains(line, "rank " + std::to_string(r))),
                       line);
            if (check_mode && !c.by_module) BOOST_TEST(contains(line, "check mode"), line);
            BOOST_TEST(seconds_after(run.outputs[r], std::string("mismatch ") + c.name) < 1.0,
                       line);
            BOOST_TEST(contains(run.outputs[r], std::string("after ") + c.name + ": exact"),
                       run.all);
          }
        }
        for (int r = 0; r < ranks; ++r) BOOST_TEST(contains(run.outputs[r], "done"), run.all);
      }
    }
  }
  BOOST_TEST(shm_objects() == before);
}
