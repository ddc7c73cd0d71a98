// One rank of the runtime fault tests (faults_test.cpp), started by hand
// with torchrun's variables, as a user without a launcher would (`arbiter
// launch` would stop the survivors). CPU ranks, shm, hidden 1024, fp32,
// max_tokens 64, as in issue 32's reproduction. Modes:
//   calls     exact calls until one fails (a peer faults through
//             ARBITER_TEST_FAULT), then: the next call, the teardown, and a
//             new communicator over the survivors' own group
//   create    creation (a peer faults during it), then the survivors' group
//   abort     rank 0 aborts from another thread while its call waits on the
//             last rank, which calls 1.5 s late; then a new communicator
//             over the same group
//   mismatch  the matrix of calls that differ across ranks (the last rank
//             differs), each followed by a matching call
//   gpu-calls GPU ranks (capability 10.3) on the recording modules in
//             FAULTS_GPU_MODULES, whose RECORDING_BLOCK_AT call waits as a
//             kernel waits on a peer, until the runtime's peer watch aborts
//             it; calls until one fails, then as `calls`
//   alloc-fault rank 0 allocates registered memory while rank 1 calls;
//             both time out, and the next call or allocation fails at once
//   gpu-abort GPU ranks as in gpu-calls, all waiting in call 5; rank 0
//             aborts 300 ms into it; then a new GPU communicator
// Prints one line per finding ("failed call N after S s: status X: ...",
// "teardown S s", "survivors ok", ...) and "rank R: done" at the end.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/bootstrap.h"
#include "arbiter/communicator.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kHidden = 1024;
constexpr std::uint32_t kMaxTokens = 64;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

void say(int rank, const std::string& line) {
  std::printf("rank %d: %s\n", rank, line.c_str());
  std::fflush(stdout);
}

arbiter::CommunicatorOptions options() {
  arbiter::CommunicatorOptions o;
  o.capability = arbiter::Capability::cpu();
  o.hidden = kHidden;
  o.dtype = arbiter::Dtype::kFp32;
  o.max_tokens = kMaxTokens;
  o.timeout = std::chrono::milliseconds(env_int("FAULTS_TIMEOUT_MS", 20000));
  return o;
}

// Loaded once; every communicator refers to it (it must outlive them).
const arbiter::Registry& cpu_registry() {
  static const arbiter::Registry registry = [] {
    arbiter::DiscoverOptions d = arbiter::DiscoverOptions::from_environment();
    d.probe = {ARBITER_DEVICE_CPU, -1};
    return arbiter::Registry::discover(d);
  }();
  return registry;
}

// The buffers of one call, exact small integers: rank r adds r + 1 + call.
struct Buffers {
  std::vector<float> input, output, residual, residual_out, norm_out, gamma;
  Buffers()
      : input(kMaxTokens * kHidden),
        output(kMaxTokens * kHidden),
        residual(kMaxTokens * kHidden, 0.5f),
        residual_out(kMaxTokens * kHidden),
        norm_out(kMaxTokens * kHidden),
        gamma(kHidden, 1.0f) {}

  arbiter_allreduce_args allreduce(int rank, int call, std::uint32_t tokens) {
    std::fill(input.begin(), input.end(), static_cast<float>(rank + 1 + call));
    std::fill(output.begin(), output.end(), -1.0f);
    arbiter_allreduce_args a{};
    a.pattern = ARBITER_PATTERN_ALLREDUCE;
    a.dtype = ARBITER_DTYPE_FP32;
    a.tokens = tokens;
    a.hidden = kHidden;
    a.input = input.data();
    a.allreduce_out = output.data();
    return a;
  }

  arbiter_allreduce_args norm(int rank, std::uint32_t tokens) {
    arbiter_allreduce_args a = allreduce(rank, 0, tokens);
    a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
    a.allreduce_out = nullptr;
    a.residual_in = residual.data();
    a.residual_out = residual_out.data();
    a.gamma = gamma.data();
    a.eps = 1e-6f;
    a.norm_out = norm_out.data();
    return a;
  }

  // "" when the sums of `tokens` are right for `ranks` ranks.
  std::string check(int ranks, int call, std::uint32_t tokens) const {
    const float expected = static_cast<float>(ranks * (ranks + 1) / 2 + ranks * call);
    for (std::size_t i = 0; i < std::size_t{tokens} * kHidden; ++i) {
      if (output[i] != expected) {
        return "element " + std::to_string(i) + " is " + std::to_string(output[i]) + ", expected " +
               std::to_string(expected);
      }
    }
    return "";
  }
};

// Calls of 1..64 tokens (one-shot and two-shot at 2 ranks, unfused at 3).
std::uint32_t tokens_of(int call) { return 1 + static_cast<std::uint32_t>(call * 13) % kMaxTokens; }

// `calls` exact calls; "" when all ran right.
std::string run_exactly(arbiter::Communicator& comm, int calls) {
  Buffers b;
  for (int call = 0; call < calls; ++call) {
    const std::uint32_t tokens = tokens_of(call);
    const arbiter_allreduce_args a = b.allreduce(comm.rank(), call, tokens);
    const auto r = comm.allreduce_fusion(a, nullptr);
    if (r.status != ARBITER_OK) return "call " + std::to_string(call) + ": " + r.error;
    if (std::string p = b.check(comm.world_size(), call, tokens); !p.empty()) {
      return "call " + std::to_string(call) + ": " + p;
    }
  }
  return "";
}

// The recording modules of FAULTS_GPU_MODULES (trtllm, mnnvl, nccl).
const arbiter::Registry& gpu_registry() {
  static const arbiter::Registry registry = [] {
    arbiter::DiscoverOptions d;
    const std::string dir =
        std::getenv("FAULTS_GPU_MODULES") ? std::getenv("FAULTS_GPU_MODULES") : "";
    for (const char* name : {"trtllm", "mnnvl", "nccl"}) {
      d.search_path.push_back(dir + "/libarbiter-" + name + ".so");
    }
    d.default_folder = false;
    d.probe = {ARBITER_DEVICE_GPU, 0};
    return arbiter::Registry::discover(d);
  }();
  return registry;
}

// The survivors' own group: every rank but `victim`, renumbered, on
// FAULTS_SURVIVOR_PORT; a new communicator over it runs 20 calls exactly.
void survivors(int rank, int world_size, int victim, const std::string& token) {
  arbiter::BootstrapOptions o;
  o.rank = rank < victim ? rank : rank - 1;
  o.world_size = world_size - 1;
  o.local_rank = o.rank;
  o.master_port = static_cast<std::uint16_t>(env_int("FAULTS_SURVIVOR_PORT", 0));
  o.job_token = "survivors-" + token;
  o.timeout = std::chrono::seconds(20);
  try {
    arbiter::Bootstrap group = arbiter::Bootstrap::connect(o);
    arbiter::Communicator comm(*group.oob(), arbiter::Policy::from_environment(), cpu_registry(),
                               options());
    const std::string problem = run_exactly(comm, 20);
    say(rank, problem.empty() ? "survivors ok" : "survivors failed: " + problem);
  } catch (const std::exception& e) {
    say(rank, std::string("survivors failed: ") + e.what());
  }
}

using CommunicatorPtr = std::unique_ptr<arbiter::Communicator>;

CommunicatorPtr make_communicator(const arbiter_oob& oob) {
  return std::make_unique<arbiter::Communicator>(oob, arbiter::Policy::from_environment(),
                                                 cpu_registry(), options());
}

// Destroys `comm`, saying how long it took (it must not wait on the dead).
void teardown(int rank, CommunicatorPtr& comm) {
  const auto started = Clock::now();
  comm.reset();
  say(rank, "teardown " + std::to_string(since(started)) + " s");
}

void mode_calls(int rank, arbiter::Bootstrap& boot) {
  CommunicatorPtr comm = make_communicator(*boot.oob());
  Buffers b;
  int call = 0;
  for (; call < 400; ++call) {
    const std::uint32_t tokens = tokens_of(call);
    const auto started = Clock::now();
    const auto r = comm->allreduce_fusion(b.allreduce(rank, call, tokens), nullptr);
    if (r.status != ARBITER_OK) {
      say(rank, "failed call " + std::to_string(call) + " after " + std::to_string(since(started)) +
                    " s: status " + std::to_string(r.status) + ": " + r.error);
      break;
    }
    if (std::string p = b.check(boot.world_size(), call, tokens); !p.empty()) {
      say(rank, "wrong result in call " + std::to_string(call) + ": " + p);
      return;
    }
  }
  if (call == 400) {
    say(rank, "no call failed");
    return;
  }
  const auto again = Clock::now();
  const auto r = comm->allreduce_fusion(b.allreduce(rank, call + 1, 4), nullptr);
  say(rank, "next call status " + std::to_string(r.status) + " after " +
                std::to_string(since(again)) + " s");
  teardown(rank, comm);
}

// A GPU communicator (capability 10.3) on the recording modules.
CommunicatorPtr make_gpu_communicator(int rank, const arbiter_oob& oob) {
  arbiter::CommunicatorOptions o = options();
  o.capability = arbiter::Capability::sm(103);
  o.device = rank;
  return std::make_unique<arbiter::Communicator>(oob, arbiter::Policy::from_environment(),
                                                 gpu_registry(), o);
}

// Makes call `call` (its arguments from `args`) while rank 0 aborts 300 ms
// into it from another thread, saying when it returned and with what; then
// the next call, and the teardown.
void call_while_rank_0_aborts(int rank, CommunicatorPtr& comm,
                              const std::function<arbiter_allreduce_args(int call)>& args,
                              int call) {
  std::thread aborter;
  if (rank == 0) {
    aborter = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      say(rank, "abort at " + std::to_string(now_ns()));
      comm->abort();
    });
  }
  const auto r = comm->allreduce_fusion(args(call), nullptr);
  say(rank, "returned at " + std::to_string(now_ns()) + ": status " + std::to_string(r.status) +
                ": " + r.error);
  if (aborter.joinable()) aborter.join();
  const auto again = Clock::now();
  const auto next = comm->allreduce_fusion(args(call + 1), nullptr);
  say(rank, "next call status " + std::to_string(next.status) + " after " +
                std::to_string(since(again)) + " s");
  teardown(rank, comm);
}

// One-token calls (one backend throughout) until one fails; the recording
// modules compute nothing, so results are not checked.
void mode_gpu_calls(int rank, arbiter::Bootstrap& boot) {
  CommunicatorPtr comm = make_gpu_communicator(rank, *boot.oob());
  Buffers b;
  int call = 0;
  for (; call < 20; ++call) {
    const auto started = Clock::now();
    const auto r = comm->allreduce_fusion(b.allreduce(rank, call, 1), nullptr);
    if (r.status != ARBITER_OK) {
      say(rank, "failed call " + std::to_string(call) + " after " + std::to_string(since(started)) +
                    " s: status " + std::to_string(r.status) + ": " + r.error);
      break;
    }
  }
  if (call == 20) {
    say(rank, "no call failed");
    return;
  }
  const auto again = Clock::now();
  const auto r = comm->allreduce_fusion(b.allreduce(rank, call + 1, 1), nullptr);
  say(rank, "next call status " + std::to_string(r.status) + " after " +
                std::to_string(since(again)) + " s: " + r.error);
  say(rank, std::string("faulted ") + (comm->faulted() ? "yes" : "no"));
  teardown(rank, comm);
}

// GPU ranks whose call 5 waits on its peers on every rank, as kernels
// would (RECORDING_BLOCK_AT=5); rank 0 aborts 300 ms into it from another
// thread. Then a new GPU communicator over the same group.
void mode_gpu_abort(int rank, arbiter::Bootstrap& boot) {
  CommunicatorPtr comm = make_gpu_communicator(rank, *boot.oob());
  Buffers b;
  for (int call = 0; call < 5; ++call) {
    if (const auto r = comm->allreduce_fusion(b.allreduce(rank, call, 1), nullptr);
        r.status != ARBITER_OK) {
      say(rank, "before the abort: call " + std::to_string(call) + ": " + r.error);
      return;
    }
  }
  call_while_rank_0_aborts(
      rank, comm, [&](int call) { return b.allreduce(rank, call, 1); }, 5);
  try {
    comm = make_gpu_communicator(rank, *boot.oob());
    for (int call = 0; call < 3; ++call) {
      if (const auto n = comm->allreduce_fusion(b.allreduce(rank, call, 1), nullptr);
          n.status != ARBITER_OK) {
        say(rank, "survivors failed: " + n.error);
        return;
      }
    }
    say(rank, "survivors ok");
  } catch (const std::exception& e) {
    say(rank, std::string("survivors failed: ") + e.what());
  }
}

// Rank 0 allocates registered memory while rank 1 makes a call: each
// collective waits for the other until the deadline (FAULTS_TIMEOUT_MS).
// Both leave the ranks out of step, so each rank's next call or
// allocation must fail at once.
void mode_alloc_fault(int rank, arbiter::Bootstrap& boot) {
  CommunicatorPtr comm = make_communicator(*boot.oob());
  Buffers b;
  const auto started = Clock::now();
  arbiter::Communicator::Result r;
  void* area = nullptr;
  if (rank == 0) {
    r = comm->alloc_registered(4096, &area);
  } else {
    r = comm->allreduce_fusion(b.allreduce(rank, 0, 8), nullptr);
  }
  say(rank, "first status " + std::to_string(r.status) + " after " +
                std::to_string(since(started)) + " s: " + r.error);
  const auto again = Clock::now();
  if (rank == 0) {
    r = comm->allreduce_fusion(b.allreduce(rank, 0, 8), nullptr);
  } else {
    r = comm->alloc_registered(4096, &area);
  }
  say(rank, "next status " + std::to_string(r.status) + " after " + std::to_string(since(again)) +
                " s: " + r.error);
  say(rank, std::string("faulted ") + (comm->faulted() ? "yes" : "no"));
  teardown(rank, comm);
}

void mode_create(int rank, arbiter::Bootstrap& boot) {
  const auto started = Clock::now();
  try {
    CommunicatorPtr comm = make_communicator(*boot.oob());
    say(rank, "created");
    teardown(rank, comm);
  } catch (const arbiter::CommunicatorError& e) {
    say(rank, "creation failed after " + std::to_string(since(started)) + " s: " + e.what());
  }
}

// Rank 0 aborts 300 ms into a call that the last rank joins 1.5 s late.
void mode_abort(int rank, arbiter::Bootstrap& boot) {
  CommunicatorPtr comm = make_communicator(*boot.oob());
  if (std::string p = run_exactly(*comm, 10); !p.empty()) {
    say(rank, "before the abort: " + p);
    return;
  }
  const bool late = rank == boot.world_size() - 1;
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  Buffers b;
  call_while_rank_0_aborts(
      rank, comm, [&](int call) { return b.allreduce(rank, call, 8); }, 10);
  // Nobody died: the same group makes a new communicator.
  try {
    comm = make_communicator(*boot.oob());
    const std::string p = run_exactly(*comm, 20);
    say(rank, p.empty() ? "survivors ok" : "survivors failed: " + p);
  } catch (const std::exception& e) {
    say(rank, std::string("survivors failed: ") + e.what());
  }
}

// The last rank makes a different call; every rank must refuse it, then
// the next matching call must be exact.
void mode_mismatch(int rank, arbiter::Bootstrap& boot) {
  CommunicatorPtr comm = make_communicator(*boot.oob());
  const bool odd = rank == boot.world_size() - 1;
  struct Case {
    const char* name;
    void (*odd)(arbiter_allreduce_args&, Buffers&);
    bool norm;
    std::uint32_t tokens;
    bool registered = false;  // every rank's input in `area` (alloc_registered), odd() aside
    // Replicated residual, residual_out and norm_out in `area` too: run as
    // shm two-shot (pinned: the tables may send such a call to one-shot,
    // whose outputs are each rank's own), which copies the other slices from
    // their owners.
    bool registered_outputs = false;
  };
  const Case cases[] = {
      {"tokens 8 vs 4", [](arbiter_allreduce_args& a, Buffers&) { a.tokens = 4; }, false, 8},
      {"tokens 64 vs 1", [](arbiter_allreduce_args& a, Buffers&) { a.tokens = 1; }, true, 64},
      {"eps 1e-6 vs 1e-2", [](arbiter_allreduce_args& a, Buffers&) { a.eps = 1e-2f; }, true, 4},
      {"pattern (residual given on one rank only)",
       [](arbiter_allreduce_args& a, Buffers& b) {
         a = b.allreduce(0, 0, a.tokens);
         a.input = b.input.data();
       },
       true, 4},
      {"residual_out given on one rank only",
       [](arbiter_allreduce_args& a, Buffers&) { a.residual_out = nullptr; }, true, 4},
      // Legal on every rank alike (a first block), a mismatch on one.
      {"residual_in given on one rank only",
       [](arbiter_allreduce_args& a, Buffers&) { a.residual_in = nullptr; }, true, 4},
      {"hidden 1024 vs 512", [](arbiter_allreduce_args& a, Buffers&) { a.hidden = 512; }, false, 4},
      {"dtype fp32 vs bf16",
       [](arbiter_allreduce_args& a, Buffers&) { a.dtype = ARBITER_DTYPE_BF16; }, false, 4},
      {"input registered vs ordinary memory",
       [](arbiter_allreduce_args& a, Buffers& b) { a.input = b.input.data(); }, false, 4, true},
      {"input at another offset of the registered memory",
       [](arbiter_allreduce_args& a, Buffers&) {
         a.input = static_cast<const float*>(a.input) + kHidden;
       },
       false, 4, true},
      {"outputs registered vs ordinary memory",
       [](arbiter_allreduce_args& a, Buffers& b) { a.norm_out = b.norm_out.data(); }, true, 64,
       true, true},
      // Refused on the last rank only, which joins the call to say so: the
      // others' call is refused rather than paired with its next one.
      {"input NULL on one rank (refused by the module)",
       [](arbiter_allreduce_args& a, Buffers&) { a.input = nullptr; }, true, 4},
      {"refused before arbiter on one rank (join_refused_call)", nullptr, true, 4},
      {"ARBITER_RUN_REFUSED passed by the caller on one rank",
       [](arbiter_allreduce_args& a, Buffers&) { a.flags |= ARBITER_RUN_REFUSED; }, true, 4},
  };
  // Registered memory (Communicator::alloc_registered) for the last cases:
  // the input, residual_out and norm_out, one block each.
  constexpr std::size_t kBlock = std::size_t{kMaxTokens} * kHidden;
  void* area = nullptr;
  if (const auto r = comm->alloc_registered(3 * kBlock * sizeof(float), &area);
      r.status != ARBITER_OK) {
    say(rank, "alloc_registered failed: " + r.error);
  }
  int call = 0;
  for (const Case& c : cases) {
    Buffers b;
    arbiter_allreduce_args a = c.norm ? b.norm(rank, c.tokens) : b.allreduce(rank, 0, c.tokens);
    if (c.registered) {
      std::memcpy(area, b.input.data(), b.input.size() * sizeof(float));
      a.input = area;
    }
    if (c.registered_outputs) {
      a.flags |= ARBITER_RUN_RESIDUAL_REPLICATED;
      a.residual_out = static_cast<float*>(area) + kBlock;
      a.norm_out = static_cast<float*>(area) + 2 * kBlock;
    }
    if (odd && c.odd != nullptr) c.odd(a, b);
    const auto started = Clock::now();
    const auto r = odd && c.odd == nullptr ? comm->join_refused_call()
                   : c.registered_outputs  ? comm->run_on(arbiter::Backend::kShm,
                                                          arbiter::Algorithm::kTwoshot, a, nullptr)
                                           : comm->allreduce_fusion(a, nullptr);
    say(rank, std::string("mismatch ") + c.name + ": status " + std::to_string(r.status) +
                  " after " + std::to_string(since(started)) + " s: " + r.error);
    Buffers exact;
    const auto next = comm->allreduce_fusion(exact.allreduce(rank, call, 8), nullptr);
    const std::string p =
        next.status == ARBITER_OK ? exact.check(boot.world_size(), call, 8) : next.error;
    say(rank, std::string("after ") + c.name + ": " + (p.empty() ? "exact" : p));
    ++call;
  }
  teardown(rank, comm);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "calls";
  const int rank = env_int("RANK", 0);
  const int victim = env_int("FAULTS_VICTIM", -1);
  const std::string token =
      std::getenv("ARBITER_JOB_TOKEN") ? std::getenv("ARBITER_JOB_TOKEN") : "";
  if (const char* dir = std::getenv("FAULTS_DIR")) {
    std::ofstream(std::string(dir) + "/pid." + std::to_string(rank)) << getpid() << "\n";
  }
  try {
    arbiter::Bootstrap boot = arbiter::Bootstrap::from_environment(std::chrono::seconds(20));
    if (mode == "calls") {
      mode_calls(rank, boot);
    } else if (mode == "create") {
      mode_create(rank, boot);
    } else if (mode == "abort") {
      mode_abort(rank, boot);
    } else if (mode == "mismatch") {
      mode_mismatch(rank, boot);
    } else if (mode == "gpu-calls") {
      mode_gpu_calls(rank, boot);
    } else if (mode == "alloc-fault") {
      mode_alloc_fault(rank, boot);
    } else if (mode == "gpu-abort") {
      mode_gpu_abort(rank, boot);
    } else {
      say(rank, "unknown mode " + mode);
      return 2;
    }
    // A stopped victim: the survivors end it, now that they are done with it.
    if (const char* stop = std::getenv("FAULTS_KILL_VICTIM");
        stop && victim >= 0 && rank != victim) {
      std::ifstream in(std::string(std::getenv("FAULTS_DIR")) + "/pid." + std::to_string(victim));
      pid_t pid = 0;
      if (in >> pid && pid > 0) kill(pid, SIGKILL);
    }
    // A victim still alive (a failed call) is not one of them.
    if (victim >= 0 && rank != victim && mode != "abort") {
      survivors(rank, boot.world_size(), victim, token);
    }
  } catch (const std::exception& e) {
    say(rank, std::string("exception: ") + e.what());
    return 1;
  }
  say(rank, "done");
  return 0;
}
