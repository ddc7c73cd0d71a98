// Test-only fault injection: ARBITER_TEST_FAULT makes one rank die or stop
// at a named step of creation or of a call, so that arbiter's fault tests
// can put a fault exactly where they mean to (tests/runtime/faults,
// tests/backends/shm_faults_test.cpp, python/tests/test_faults.py).
//
//   ARBITER_TEST_FAULT=RANK:STEP[@CALL]:ACTION
//     RANK    the rank that faults (its rank in the group being created)
//     STEP    one of kFaultSteps below
//     CALL    call steps only: the call's number on that communicator or
//             workspace, from 0 (calls refused before they start count
//             too); without it, the first time the step is reached
//     ACTION  kill  the process sends itself SIGKILL
//             exit  the process ends with _exit(kFaultExitCode)
//             stop  the process sends itself SIGSTOP: alive, never progresses
//             hang  the thread sleeps forever: alive, responds to signals
//             skip  GPU call steps only: run() returns ARBITER_OK without
//                   enqueuing anything (a rank that never launched)
//
// For arbiter's own tests, like ARBITER_TEST_SHARED_GPU: it only makes a
// process do to itself what `kill` could, so it is left in release builds,
// where tests run. A value that does not parse fails creation (a typo must
// not silently disarm a test); an armed rank says so on stderr when the
// fault fires. Each module reads the variable once (its own copy of this
// header's state). Host only.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

#include "arbiter/common/status.h"

namespace arbiter::common {

inline constexpr const char* kFaultVariable = "ARBITER_TEST_FAULT";
inline constexpr int kFaultExitCode = 97;

// Where a fault can be injected. "create.*", "call.start" and "destroy" are
// the runtime's (Communicator); "shm.*" the shm module's; "gpu.*" the GPU
// modules' (trtllm, mnnvl).
inline constexpr std::string_view kFaultSteps[] = {
    "create.facts",        // before the runtime's first exchange (what must agree)
    "create.workspaces",   // after it, before any workspace is created
    "create.checked",      // every workspace created, before the last exchange
    "call.start",          // allreduce_fusion(), before anything is decided
    "destroy",             // the communicator's destructor, before any teardown
    "shm.create.hello",    // shm workspace_create, before its first exchange
    "shm.create.mapped",   // shm: the object mapped, before the last exchange
    "shm.call.start",      // shm run(), before this rank publishes anything
    "shm.call.published",  // shm: this rank's first flag published, before it waits
    "shm.call.met",        // shm: every rank met (signatures equal), before the sums
    "shm.call.barrier2",   // shm two-shot and unfused: before the second barrier
    "gpu.call.start",      // trtllm/mnnvl run(), trtllm run_registered(): before the launch
};

enum class FaultAction { kNone, kKill, kExit, kStop, kHang, kSkip };

class FaultInjection {
 public:
  // The process's setting (this module's copy), parsed once.
  static const FaultInjection& get() {
    static const FaultInjection parsed(std::getenv(kFaultVariable));
    return parsed;
  }

  explicit FaultInjection(const char* value) {
    if (value == nullptr || *value == '\0') return;
    text_ = value;
    if (!parse(text_)) {
      error_ = Status(ARBITER_INVALID_ARGUMENT,
                      std::string(kFaultVariable) + " is \"" + text_ +
                          "\"; arbiter's fault tests set it as RANK:STEP[@CALL]:ACTION (ACTION "
                          "kill, exit, stop, hang or skip; STEP as listed in "
                          "arbiter/common/fault_injection.h); unset it otherwise");
      action_ = FaultAction::kNone;
    }
  }

  // Why the setting was refused (creation fails with it); OK when unset or valid.
  const Status& error() const { return error_; }
  bool armed() const { return action_ != FaultAction::kNone; }

  // Whether the fault is for (step, rank, call).
  bool matches(std::string_view step, int rank, std::uint64_t call) const {
    return armed() && rank == rank_ && step == step_ && (!has_call_ || call == call_);
  }

  // Faults when armed for (step, rank, call); returns otherwise, and for
  // `skip`, which its caller carries out (returns true then).
  bool at(std::string_view step, int rank, std::uint64_t call) const {
    if (!matches(step, rank, call)) return false;
    std::fprintf(stderr, "arbiter: %s=%s: rank %d faults at %.*s (call %llu)\n", kFaultVariable,
                 text_.c_str(), rank, static_cast<int>(step.size()), step.data(),
                 static_cast<unsigned long long>(call));
    std::fflush(stderr);
    switch (action_) {
      case FaultAction::kKill:
        ::kill(::getpid(), SIGKILL);
        break;
      case FaultAction::kExit:
        ::_exit(kFaultExitCode);
      case FaultAction::kStop:
        ::kill(::getpid(), SIGSTOP);
        break;
      case FaultAction::kHang:
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      case FaultAction::kSkip:
        return true;
      case FaultAction::kNone:
        break;
    }
    return false;
  }

 private:
  bool parse(const std::string& text) {
    const auto first = text.find(':');
    const auto last = text.rfind(':');
    if (first == std::string::npos || first == last) return false;
    const std::string rank = text.substr(0, first);
    std::string step = text.substr(first + 1, last - first - 1);
    const std::string action = text.substr(last + 1);
    if (rank.empty() || rank.find_first_not_of("0123456789") != std::string::npos ||
        rank.size() > 4) {
      return false;
    }
    rank_ = std::stoi(rank);
    if (const auto at = step.find('@'); at != std::string::npos) {
      const std::string call = step.substr(at + 1);
      if (call.empty() || call.find_first_not_of("0123456789") != std::string::npos ||
          call.size() > 18) {
        return false;
      }
      call_ = std::stoull(call);
      has_call_ = true;
      step.resize(at);
    }
    bool known = false;
    for (std::string_view s : kFaultSteps) known = known || s == step;
    if (!known) return false;
    step_ = step;
    if (action == "kill") {
      action_ = FaultAction::kKill;
    } else if (action == "exit") {
      action_ = FaultAction::kExit;
    } else if (action == "stop") {
      action_ = FaultAction::kStop;
    } else if (action == "hang") {
      action_ = FaultAction::kHang;
    } else if (action == "skip" && step_ == "gpu.call.start") {
      action_ = FaultAction::kSkip;
    } else {
      return false;
    }
    return true;
  }

  std::string text_;
  Status error_;
  FaultAction action_ = FaultAction::kNone;
  int rank_ = -1;
  std::string step_;
  bool has_call_ = false;
  std::uint64_t call_ = 0;
};

}  // namespace arbiter::common
