// One rank of the bootstrap tests, started by `arbiter launch` (or by hand as
// a stranger). Joins from the environment, then checks allgather, broadcast
// from rank 0 and from the last rank, barrier and the C view, and prints
// "rank K OK". Faults are injected per rank:
//   --delay R:MS        rank R waits MS before joining
//   --exit-before R:C   rank R exits with code C before joining
//   --sleep-instead R   rank R sleeps instead of joining
//   --die-during R:MS   rank R vanishes (exit 0) MS after it began joining
//   --die-after R       rank R vanishes (exit 0) right after joining
//   --late-barrier R:MS rank R waits MS before its first barrier
//   --stop-after R      rank R stops itself (SIGSTOP) right after joining:
//                       alive, never answering
//   --fork-child R      rank R forks right after joining; the child tries a
//                       barrier on its copy of the group, prints "rank R
//                       child: " and what it got, destroys the copy, and
//                       exits; the parent waits for it, then goes on
//   --leave-on-failure  a failed collective destroys the bootstrap (as a
//                       program that unwinds would) before the rank reports
//                       it, and says "rank K left" once that is done
//   --op-timeout MS     timeout of each collective (default 20000)
//   --linger MS         after a failure, wait MS before exiting, so that the
//                       launcher does not stop the others before they report
//   --iterations N      rounds of checks (default 5)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/bootstrap.h"

namespace {

struct Fault {
  int rank = -1;
  long value = 0;
};

Fault parse_fault(const char* text) {
  Fault f;
  f.rank = std::atoi(text);
  if (const char* colon = std::strchr(text, ':')) f.value = std::atol(colon + 1);
  return f;
}

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : -1;
}

std::uint8_t pattern(int rank, std::size_t i, int round) {
  return static_cast<std::uint8_t>(rank * 131 + i * 7 + round * 13 + (i >> 8));
}

long g_linger_ms = 0;
bool g_leave_on_failure = false;

// A failure that unwinds past the Bootstrap (--leave-on-failure).
struct Failure {
  std::string message;
};

[[noreturn]] void fail(int rank, const std::string& message) {
  std::fprintf(stderr, "rank %d FAILED: %s\n", rank, message.c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(g_linger_ms));
  std::exit(1);
}

void check(int rank, const arbiter::BootstrapStatus& status, const char* what) {
  if (status.ok()) return;
  if (g_leave_on_failure) throw Failure{std::string(what) + ": " + status.message};
  fail(rank, std::string(what) + ": " + status.message);
}

}  // namespace

int main(int argc, char** argv) {
  Fault delay, exit_before, sleep_instead, die_during, die_after, late_barrier, stop_after,
      fork_child;
  long op_timeout_ms = 20000;
  int iterations = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--delay") {
      delay = parse_fault(value);
    } else if (flag == "--exit-before") {
      exit_before = parse_fault(value);
    } else if (flag == "--sleep-instead") {
      sleep_instead = parse_fault(value);
    } else if (flag == "--die-during") {
      die_during = parse_fault(value);
    } else if (flag == "--die-after") {
      die_after = parse_fault(value);
    } else if (flag == "--late-barrier") {
      late_barrier = parse_fault(value);
    } else if (flag == "--stop-after") {
      stop_after = parse_fault(value);
    } else if (flag == "--fork-child") {
      fork_child = parse_fault(value);
    } else if (flag == "--leave-on-failure") {
      g_leave_on_failure = std::string(value) == "1";
    } else if (flag == "--op-timeout") {
      op_timeout_ms = std::atol(value);
    } else if (flag == "--iterations") {
      iterations = std::atoi(value);
    } else if (flag == "--linger") {
      g_linger_ms = std::atol(value);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const int me = env_int("RANK");
  const std::chrono::milliseconds op_timeout(op_timeout_ms);

  if (me == exit_before.rank) return static_cast<int>(exit_before.value);
  if (me == sleep_instead.rank) {
    std::this_thread::sleep_for(std::chrono::seconds(300));
    return 0;
  }
  if (me == delay.rank) std::this_thread::sleep_for(std::chrono::milliseconds(delay.value));
  if (me == die_during.rank) {
    std::thread([ms = die_during.value] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      std::_Exit(0);  // as a crash would: no teardown, no goodbye
    }).detach();
  }

  try {
    arbiter::Bootstrap bs = arbiter::Bootstrap::from_environment();
    const int rank = bs.rank();
    const int world = bs.world_size();
    if (me == die_after.rank) std::_Exit(0);
    if (me == stop_after.rank) raise(SIGSTOP);
    if (me == fork_child.rank) {
      std::fflush(stdout);
      const pid_t child = fork();
      if (child == 0) {
        {
          arbiter::Bootstrap copy = std::move(bs);
          const arbiter::BootstrapStatus s = copy.barrier(op_timeout);
          std::printf("rank %d child: %s\n", rank, s.ok() ? "the barrier ran" : s.message.c_str());
        }  // the copy's teardown must leave the parent's connections alone
        std::fflush(stdout);
        std::_Exit(0);
      }
      if (child < 0 || waitpid(child, nullptr, 0) != child) fail(rank, "fork/waitpid failed");
    }
    if (bs.local_rank() != env_int("LOCAL_RANK")) fail(rank, "local_rank differs from LOCAL_RANK");

    for (int round = 0; round < iterations; ++round) {
      // Allgather: distinct bytes from every rank; an odd size, larger on
      // the first round (several transport fragments).
      const std::size_t bytes = round == 0 ? 200 * 1024 + 3 : 1000 + round;
      std::vector<std::uint8_t> mine(bytes), all(bytes * world);
      for (std::size_t i = 0; i < bytes; ++i) mine[i] = pattern(rank, i, round);
      check(rank, bs.allgather(mine.data(), all.data(), bytes, op_timeout), "allgather");
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < bytes; ++i) {
          if (all[r * bytes + i] != pattern(r, i, round)) {
            fail(rank, "allgather: byte " + std::to_string(i) + " of rank " + std::to_string(r) +
                           " is wrong in round " + std::to_string(round));
          }
        }
      }
      // Broadcast from the last rank (not rank 0), then from rank 0.
      for (int root : {world - 1, 0}) {
        std::vector<std::uint8_t> buf(777, 0);
        if (rank == root) {
          for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(root + 50, i, round);
        }
        check(rank, bs.broadcast(buf.data(), buf.size(), root, op_timeout), "broadcast");
        for (std::size_t i = 0; i < buf.size(); ++i) {
          if (buf[i] != pattern(root + 50, i, round)) {
            fail(rank, "broadcast from rank " + std::to_string(root) + ": byte " +
                           std::to_string(i) + " is wrong");
          }
        }
      }
      if (round == 0 && rank == late_barrier.rank) {
        std::this_thread::sleep_for(std::chrono::milliseconds(late_barrier.value));
      }
      check(rank, bs.barrier(op_timeout), "barrier");
    }

    // The C view a backend sees.
    const arbiter_oob* oob = bs.oob();
    if (oob->rank != rank || oob->size != world) fail(rank, "oob rank/size differ");
    std::vector<std::int32_t> ranks(world, -1);
    const std::int32_t mine = rank * 10;
    if (oob->allgather(oob->ctx, &mine, ranks.data(), sizeof(mine), op_timeout.count()) !=
        ARBITER_OK) {
      fail(rank, std::string("oob allgather: ") + oob->last_error(oob->ctx));
    }
    for (int r = 0; r < world; ++r) {
      if (ranks[r] != r * 10) fail(rank, "oob allgather: wrong value of rank " + std::to_string(r));
    }
    if (oob->barrier(oob->ctx, op_timeout.count()) != ARBITER_OK) {
      fail(rank, std::string("oob barrier: ") + oob->last_error(oob->ctx));
    }
    std::printf("rank %d OK\n", rank);
    std::fflush(stdout);
  } catch (const arbiter::BootstrapError& e) {
    fail(me, e.what());
  } catch (const Failure& f) {
    // The Bootstrap is gone: its teardown with a peer that never answers
    // must neither hang nor abort the process.
    std::printf("rank %d left\n", me);
    std::fflush(stdout);
    fail(me, f.message);
  }
  return 0;
}
