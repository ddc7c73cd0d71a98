// `arbiter launch` as a process launcher (no UCX involved): the environment
// each rank gets, prefixed output, stopping everything when one rank fails
// or the time is up, no processes left behind, and usage errors (exit 2).
#define BOOST_TEST_MODULE tools_launch
#include <boost/test/unit_test.hpp>

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "run_command.h"

using namespace arbiter::test;

namespace {

struct Run {
  CommandResult result;
  double seconds = 0;
};

Run launch(const std::string& args, const std::string& env = "") {
  const auto start = std::chrono::steady_clock::now();
  Run run;
  run.result = run_command("env -u UCX_TLS -u UCX_NET_DEVICES " + env + " " + ARBITER_BIN +
                           " launch " + args);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

// `arbiter launch ARGS -- sh -c SCRIPT`
Run launch_sh(const std::string& args, const std::string& script, const std::string& env = "") {
  return launch(args + " -- sh -c " + shell_quote(script), env);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<std::string> lines_starting(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line);
  }
  return lines;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(environment_and_output)

BOOST_AUTO_TEST_CASE(each_rank_gets_torchrun_variables_and_one_job_token) {
  const Run run = launch_sh(
      "--nproc 3 --port 29999",
      "echo vars $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
      "$UCX_TLS $UCX_NET_DEVICES; echo token $ARBITER_JOB_TOKEN");
  BOOST_TEST(run.result.exit_code == 0, run.result.output);
  for (int r = 0; r < 3; ++r) {
    const std::string k = std::to_string(r);
    const std::string line =
        "[rank " + k + "] vars " + k + " 3 " + k + " 3 127.0.0.1 29999 tcp,self lo\n";
    BOOST_TEST(contains(run.result.output, line), run.result.output);
  }
  std::set<std::string> tokens;
  for (int r = 0; r < 3; ++r) {
    for (const std::string& line :
         lines_starting(run.result.output, "[rank " + std::to_string(r) + "] token ")) {
      tokens.insert(line.substr(line.find("token ") + 6));
    }
  }
  BOOST_TEST(tokens.size() == 1u);
  BOOST_TEST(tokens.begin()->size() == 32u);  // 128 random bits in hex
}

BOOST_AUTO_TEST_CASE(arbiter_listens_on_a_port_of_its_own_beside_master_port) {
  // A torch.distributed store on MASTER_PORT may listen while arbiter's rank
  // 0 joins its group (torch first, or both at once): two ports.
  const std::string script = "echo ports $MASTER_PORT $ARBITER_BOOTSTRAP_PORT";
  Run run = launch_sh("--nproc 2", script, "-u ARBITER_BOOTSTRAP_PORT");
  BOOST_TEST(run.result.exit_code == 0, run.result.output);
  const std::vector<std::string> lines = lines_starting(run.result.output, "[rank 1] ports ");
  BOOST_REQUIRE_EQUAL(lines.size(), 1u);
  std::istringstream ports(lines[0].substr(std::string("[rank 1] ports ").size()));
  int master = 0, bootstrap = 0;
  ports >> master >> bootstrap;
  BOOST_TEST(master > 0);
  BOOST_TEST(bootstrap > 0);
  BOOST_TEST(master != bootstrap, run.result.output);

  run = launch_sh("--nproc 2 --port 29999 --bootstrap-port 29998", script);
  BOOST_TEST(contains(run.result.output, "[rank 0] ports 29999 29998\n"), run.result.output);
  // Set by the caller (as for torchrun): kept; the flag still wins.
  run = launch_sh("--nproc 2 --port 29999", script, "ARBITER_BOOTSTRAP_PORT=29601");
  BOOST_TEST(contains(run.result.output, "[rank 1] ports 29999 29601\n"), run.result.output);
  run = launch_sh("--nproc 2 --port 29999 --bootstrap-port 29602", script,
                  "ARBITER_BOOTSTRAP_PORT=29601");
  BOOST_TEST(contains(run.result.output, "[rank 1] ports 29999 29602\n"), run.result.output);
}

BOOST_AUTO_TEST_CASE(each_launch_draws_a_fresh_token_and_a_free_port) {
  const std::string script = "echo $ARBITER_JOB_TOKEN $MASTER_PORT";
  const Run a = launch_sh("--nproc 1", script);
  const Run b = launch_sh("--nproc 1", script);
  BOOST_TEST(a.result.exit_code == 0, a.result.output);
  BOOST_TEST(a.result.output != b.result.output);
}

BOOST_AUTO_TEST_CASE(ucx_settings_of_the_caller_are_kept) {
  const Run run =
      launch_sh("--nproc 1", "echo $UCX_TLS $UCX_NET_DEVICES", "UCX_TLS=tcp UCX_NET_DEVICES=eth0");
  BOOST_TEST(contains(run.result.output, "[rank 0] tcp eth0\n"), run.result.output);
}

BOOST_AUTO_TEST_CASE(stdout_and_stderr_lines_are_prefixed_with_the_rank) {
  const Run run =
      launch_sh("--nproc 2", "echo out $RANK; echo err $RANK >&2; printf 'no newline %s' $RANK");
  BOOST_TEST(run.result.exit_code == 0, run.result.output);
  for (const std::string k : {"0", "1"}) {
    BOOST_TEST(contains(run.result.output, "[rank " + k + "] out " + k + "\n"), run.result.output);
    BOOST_TEST(contains(run.result.output, "[rank " + k + "] err " + k + "\n"), run.result.output);
    BOOST_TEST(contains(run.result.output, "[rank " + k + "] no newline " + k + "\n"),
               run.result.output);
  }
  // stdout stays stdout: nothing of the error stream reaches it.
  const CommandResult only_out = run_command(
      "sh -c " + shell_quote(std::string(ARBITER_BIN) +
                             " launch --nproc 1 -- sh -c 'echo a; echo b >&2' 2>/dev/null"));
  BOOST_TEST(only_out.output == "[rank 0] a\n");
}

BOOST_AUTO_TEST_CASE(ranks_read_stdin_from_dev_null) {
  const CommandResult r = run_command("echo typed | " + std::string(ARBITER_BIN) +
                                      " launch --nproc 2 -- sh -c 'cat; echo done'");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(!contains(r.output, "typed"), r.output);
  BOOST_TEST(contains(r.output, "[rank 1] done"), r.output);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(failures)

BOOST_AUTO_TEST_CASE(a_failing_rank_stops_the_others_and_is_named) {
  const Run run = launch_sh("--nproc 4", "if [ $RANK = 2 ]; then exit 3; fi; exec sleep 30");
  BOOST_TEST(run.result.exit_code == 1, run.result.output);
  BOOST_TEST(contains(run.result.output,
                      "arbiter launch: rank 2 exited with code 3; stopped ranks 0, 1, 3\n"),
             run.result.output);
  BOOST_TEST(run.seconds < 5, "took " << run.seconds << " s");
}

BOOST_AUTO_TEST_CASE(a_killed_rank_is_named_with_its_signal) {
  const Run run = launch_sh("--nproc 2", "if [ $RANK = 1 ]; then kill -SEGV $$; fi; exec sleep 30");
  BOOST_TEST(run.result.exit_code == 1, run.result.output);
  BOOST_TEST(contains(run.result.output,
                      "arbiter launch: rank 1 was killed by SIGSEGV (Segmentation fault); "
                      "stopped rank 0"),
             run.result.output);
}

BOOST_AUTO_TEST_CASE(ranks_that_all_exit_0_make_launch_exit_0_even_at_different_times) {
  const Run run = launch_sh("--nproc 3", "sleep 0.$RANK; echo bye");
  BOOST_TEST(run.result.exit_code == 0, run.result.output);
  BOOST_TEST(lines_starting(run.result.output, "[rank ").size() == 3u, run.result.output);
  BOOST_TEST(!contains(run.result.output, "arbiter launch:"), run.result.output);
}

BOOST_AUTO_TEST_CASE(the_timeout_stops_hung_ranks) {
  const Run run = launch_sh("--nproc 2 --timeout 1", "exec sleep 30");
  BOOST_TEST(run.result.exit_code == 124, run.result.output);
  BOOST_TEST(contains(run.result.output,
                      "arbiter launch: timed out after 1 s with ranks 0, 1 still running; "
                      "stopped ranks 0, 1\n"),
             run.result.output);
  BOOST_TEST(run.seconds < 4, "took " << run.seconds << " s");
}

BOOST_AUTO_TEST_CASE(ranks_ignoring_sigterm_get_sigkill_after_the_grace_period) {
  const Run run =
      // The timeout leaves the shells time to set their trap on a busy host.
      launch_sh("--nproc 2 --timeout 2 --grace 0.5", "trap '' TERM; sleep 30; sleep 30");
  BOOST_TEST(run.result.exit_code == 124, run.result.output);
  BOOST_TEST(contains(run.result.output, "(ranks 0, 1 needed SIGKILL after 0.5 s)"),
             run.result.output);
  BOOST_TEST(run.seconds < 6, "took " << run.seconds << " s");
}

// A signal that would end the launcher at once (SIGUSR1's, SIGIO's, a
// real-time signal's default) stops the job as SIGTERM does: the ranks are
// stopped, the summary says why, and the exit status is 128 + N. They
// killed the launcher outright (no summary, nothing removed from /dev/shm).
BOOST_AUTO_TEST_CASE(other_terminating_signals_stop_the_job_like_sigterm) {
  for (const std::string signal : {"USR1", "IO", "RTMIN+3"}) {
    // The signal is sent once both ranks said "up": the launcher set its
    // handlers before it started them.
    const std::string out = "launch_signal_" + std::to_string(::getpid()) + ".txt";
    const std::string script =
        "env -u UCX_TLS -u UCX_NET_DEVICES " + std::string(ARBITER_BIN) +
        " launch --nproc 2 -- sh -c 'echo up; exec sleep 30' > " + out + " 2>&1 & pid=$!; " +
        "for i in $(seq 300); do [ $(grep -c up " + out + ") = 2 ] && break; sleep 0.1; done; " +
        "kill -" + signal + " $pid; wait $pid; echo launch-exit=$?; cat " + out + "; rm -f " + out;
    const auto start = std::chrono::steady_clock::now();
    const CommandResult r = run_command("bash -c " + shell_quote(script));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    BOOST_TEST_CONTEXT("SIG" << signal) {
      BOOST_TEST(!contains(r.output, "launch-exit=0"), r.output);
      BOOST_TEST(contains(r.output, "interrupted by "), r.output);
      BOOST_TEST(contains(r.output, "stopped ranks 0, 1"), r.output);
      BOOST_TEST(seconds < 40, "took " << seconds << " s");
    }
  }
}

BOOST_AUTO_TEST_CASE(nothing_a_rank_started_outlives_the_launch) {
  // Each rank leaves a background child; rank 1 fails. Afterwards no
  // process with the marker may remain.
  const std::string marker = std::to_string(1000 + ::getpid() % 8000) + ".25";
  const Run run = launch_sh("--nproc 3", "sleep " + marker +
                                             " & if [ $RANK = 1 ]; then "
                                             "sleep 0.3; exit 1; fi; wait");
  BOOST_TEST(run.result.exit_code == 1, run.result.output);
  const CommandResult left = run_command("pgrep -f '[s]leep " + marker + "'");
  BOOST_TEST(left.output.empty(), "left behind: " << left.output);
  if (!left.output.empty()) {
    std::istringstream pids(left.output);
    for (int pid; pids >> pid;) ::kill(pid, SIGKILL);  // only our own leftovers
  }
  // Also when every rank succeeds while its child lives on.
  const Run ok = launch_sh("--nproc 2", "sleep " + marker + " & echo started");
  BOOST_TEST(ok.result.exit_code == 0, ok.result.output);
  BOOST_TEST(ok.seconds < 5, "took " << ok.seconds << " s");
  BOOST_TEST(run_command("pgrep -f '[s]leep " + marker + "'").output.empty());
}

BOOST_AUTO_TEST_CASE(what_the_ranks_left_in_dev_shm_is_removed_and_nothing_else) {
  // As a rank killed while its peers open the workspace it created leaves
  // it: named for the creator's process group (arbiter/common/shm_object.h),
  // which each rank leads. Another group's object stays.
  const std::string tag = "arbiter-shm-launchtest" + std::to_string(::getpid()) + "-";
  const std::string other = "/dev/shm/" + tag + "000000010badf00d";
  BOOST_TEST_REQUIRE(run_command("touch " + other).exit_code == 0);
  // Rank 1 fails once both ranks' objects (and `other`) are there.
  const Run run =
      launch_sh("--nproc 2", "name=" + tag + "$(printf %08x $$)0badf00d; : > /dev/shm/$name; " +
                                 "if [ $RANK = 1 ]; then until [ $(ls /dev/shm | grep -c '^" + tag +
                                 "') -ge 3 ]; do sleep 0.01; done; exit 3; fi; exec sleep 30");
  BOOST_TEST(run.result.exit_code == 1, run.result.output);
  BOOST_TEST(
      lines_starting(run.result.output, "arbiter launch: removed /dev/shm/" + tag).size() == 2u,
      run.result.output);
  BOOST_TEST(contains(run.result.output, "left by rank 1's processes"), run.result.output);
  const CommandResult left = run_command("ls /dev/shm | grep -c '^" + tag + "'");
  BOOST_TEST(left.output == "1\n", "left: " << left.output);
  BOOST_TEST(::unlink(other.c_str()) == 0);
}

BOOST_AUTO_TEST_CASE(a_program_that_cannot_start_is_named) {
  const Run run = launch("--nproc 2 -- /no/such/program");
  BOOST_TEST(run.result.exit_code == 1, run.result.output);
  BOOST_TEST(contains(run.result.output,
                      "arbiter launch: rank 0 could not start '/no/such/program': No such file"),
             run.result.output);
  // It never ran: not named among the ranks stopped.
  BOOST_TEST(!contains(run.result.output, "stopped rank 0"), run.result.output);
}

// Pinning: each rank runs on the CPU it was given, from the flag or the
// variable (the flag wins); without either, ranks may run anywhere.
BOOST_AUTO_TEST_CASE(cpu_affinity_pins_each_rank_to_one_cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  BOOST_REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  std::vector<int> allowed;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) allowed.push_back(cpu);
  }
  const std::string script = "grep Cpus_allowed_list /proc/self/status";
  const Run spread = launch_sh("--nproc 3 --cpu-affinity spread", script);
  BOOST_TEST(spread.result.exit_code == 0, spread.result.output);
  for (int r = 0; r < 3; ++r) {
    const std::string cpu = std::to_string(allowed[static_cast<std::size_t>(r) % allowed.size()]);
    BOOST_TEST(contains(spread.result.output,
                        "[rank " + std::to_string(r) + "] Cpus_allowed_list:\t" + cpu + "\n"),
               spread.result.output);
  }
  const std::string last = std::to_string(allowed.back());
  const Run from_env = launch_sh("--nproc 2", script, "ARBITER_CPU_AFFINITY=" + last);
  BOOST_TEST(from_env.result.exit_code == 0, from_env.result.output);
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(contains(from_env.result.output,
                        "[rank " + std::to_string(r) + "] Cpus_allowed_list:\t" + last + "\n"),
               from_env.result.output);
  }
  if (allowed.size() > 1) {  // the flag wins, and `none` pins nothing
    const Run none =
        launch_sh("--nproc 1 --cpu-affinity none", script, "ARBITER_CPU_AFFINITY=" + last);
    BOOST_TEST(!contains(none.result.output, "Cpus_allowed_list:\t" + last + "\n"),
               none.result.output);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(usage)

BOOST_AUTO_TEST_CASE(bad_command_lines_exit_2_with_the_reason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"-- true", "--nproc N is required"},
      {"--nproc 0 -- true", "--nproc '0' is not a number of ranks in 1..1024"},
      {"--nproc two -- true", "--nproc 'two' is not a number of ranks"},
      {"--nproc 5000 -- true", "--nproc '5000' is not a number of ranks"},
      {"--nproc 2", "give the program to run"},
      {"--nproc 2 --", "give the program to run"},
      {"--nproc 2 --port 0 -- true", "--port '0' is not a port number in 1..65535"},
      {"--nproc 2 --port 70000 -- true", "--port '70000' is not a port number"},
      {"--nproc 2 --bootstrap-port x -- true",
       "--bootstrap-port 'x' is not a port number in 1..65535"},
      {"--nproc 2 --port 29999 --bootstrap-port 29999 -- true",
       "arbiter's bootstrap port (--bootstrap-port) and MASTER_PORT (--port) are both 29999"},
      {"--nproc 2 --timeout -1 -- true", "--timeout '-1' is not a number of seconds > 0"},
      {"--nproc 2 --timeout soon -- true", "--timeout 'soon' is not a number of seconds"},
      {"--nproc 2 --grace x -- true", "--grace 'x' is not a number of seconds >= 0"},
      {"--nproc 2 --bogus -- true", "unrecognised option '--bogus'"},
      {"--nproc 2 true --flag", "put the program and its arguments after `--`"},
      {"--nproc 2 --cpu-affinity 1-0 -- true",
       "--cpu-affinity '1-0': '1-0' is not a CPU or a range of CPUs"},
      {"--nproc 2 --cpu-affinity 0,,1 -- true", "'' is not a CPU or a range of CPUs"},
      {"--nproc 2 --cpu-affinity 1000 -- true",
       "--cpu-affinity '1000': CPU 1000 is not one this process may run on (allowed: "},
  };
  for (const auto& [args, message] : cases) {
    const Run run = launch(args);
    BOOST_TEST(run.result.exit_code == 2, args << ":\n" << run.result.output);
    BOOST_TEST(contains(run.result.output, message), args << ":\n" << run.result.output);
    BOOST_TEST(contains(run.result.output, "Run `arbiter launch --help`"), run.result.output);
  }
}

BOOST_AUTO_TEST_CASE(the_program_may_follow_without_dashes_and_help_exits_0) {
  const Run run = launch("--nproc 1 echo hi");
  BOOST_TEST(run.result.exit_code == 0, run.result.output);
  BOOST_TEST(run.result.output == "[rank 0] hi\n");
  const Run help = launch("--help");
  BOOST_TEST(help.result.exit_code == 0);
  BOOST_TEST(contains(help.result.output, "usage: arbiter launch --nproc N"));
}

BOOST_AUTO_TEST_SUITE_END()
