// Runs one function as N ranks in N forked child processes and collects what
// each reports, for multi-process backend tests on a single machine.
//
// The body runs in the child and returns "" on success or a message. A child
// that crashes, exits oddly or outlives the time limit is reported as a
// failure of its rank (stragglers are killed). Children leave with _exit, so
// no test-framework state of the parent runs twice.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "shared_oob.h"

namespace arbiter::test {

using RankBody = std::function<std::string(int rank, const arbiter_oob& oob)>;

// With `preempt`, the parent keeps stopping a random rank for a moment
// (SIGSTOP, about a millisecond, SIGCONT), so every interleaving a busy
// machine could produce, a rank frozen mid-read included, shows up often.
// Returns one message per rank: "" when that rank succeeded.
inline std::vector<std::string> run_ranks(int ranks, std::chrono::seconds limit,
                                          const RankBody& body, bool preempt = false) {
  constexpr std::size_t kMessageBytes = 4096;
  const std::size_t bytes = kMessageBytes * static_cast<std::size_t>(ranks);
  void* shared = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) throw std::runtime_error("mmap of the result area failed");
  auto* messages = static_cast<char*>(shared);
  SharedOobArea area(ranks);

  std::cout.flush();
  std::fflush(nullptr);  // or the children print the parent's buffered output again
  std::vector<pid_t> children;
  for (int rank = 0; rank < ranks; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      // Crash for real: the test framework's handlers would resume the
      // parent's test run inside this child.
      for (int signal_number : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
        ::signal(signal_number, SIG_DFL);
      }
      std::string message;
      try {
        SharedOob oob(area, rank);
        message = body(rank, oob.oob());
      } catch (const std::exception& error) {
        message = std::string("exception: ") + error.what();
      } catch (...) {
        message = "unknown exception";
      }
      char* mine = messages + kMessageBytes * rank;
      std::strncpy(mine, message.c_str(), kMessageBytes - 1);
      _exit(message.empty() ? 0 : 1);
    }
    children.push_back(pid);
  }

  std::vector<std::string> results(ranks);
  std::vector<bool> done(ranks, false);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int remaining = ranks;
  while (remaining > 0) {
    for (int rank = 0; rank < ranks; ++rank) {
      if (done[rank]) continue;
      int status = 0;
      if (waitpid(children[rank], &status, WNOHANG) != children[rank]) continue;
      done[rank] = true;
      --remaining;
      const std::string said(messages + kMessageBytes * rank);
      if (WIFSIGNALED(status)) {
        results[rank] = "died with signal " + std::to_string(WTERMSIG(status));
      } else if (WEXITSTATUS(status) != 0) {
        results[rank] = said.empty() ? "exit status " + std::to_string(WEXITSTATUS(status)) : said;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      for (int rank = 0; rank < ranks; ++rank) {
        if (done[rank]) continue;
        kill(children[rank], SIGKILL);
        waitpid(children[rank], nullptr, 0);
        results[rank] = "still running after " + std::to_string(limit.count()) + " s; killed";
      }
      break;
    }
    if (preempt) {
      const int victim = static_cast<int>(random() % ranks);
      if (!done[victim]) {
        kill(children[victim], SIGSTOP);
        const timespec frozen{0, static_cast<long>(200 + random() % 1800) * 1000};
        nanosleep(&frozen, nullptr);
        kill(children[victim], SIGCONT);
      }
      const timespec pause{0, static_cast<long>(random() % 500) * 1000};
      nanosleep(&pause, nullptr);
    } else {
      const timespec pause{0, 2 * 1000 * 1000};
      nanosleep(&pause, nullptr);
    }
  }
  munmap(shared, bytes);
  return results;
}

}  // namespace arbiter::test
