#include "arbiter/communicator.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <string_view>

#include "arbiter/common/call_checks.h"
#include "arbiter/common/call_signature.h"
#include "arbiter/common/fault_injection.h"
#include "arbiter/common/token_slice.h"
#include "arbiter/workspace_plan.h"
#include "fault_board.h"
#include "fork_stamp.h"
#include "peer_watch.h"

namespace arbiter {
namespace {

struct Workspace {
  const arbiter_backend_v1_t* module = nullptr;
  const arbiter_backend_faults_v1_t* faults = nullptr;  // nullptr: cannot be aborted
  arbiter_workspace* handle = nullptr;
  const arbiter_backend_memory_v2_t* memory = nullptr;  // nullptr: no registered memory
  WorkspaceFootprint footprint;  // sized by the module from the spec it was made with
};

// One registered allocation of this rank (Communicator::alloc_registered).
struct RegisteredArea {
  const std::byte* data;
  std::uint64_t bytes;
  Backend backend;
  std::uint64_t serial;  // the same on every rank: alloc_registered() calls before it
};

// Every communicator's registered areas in this process, to name the misuse
// of passing one communicator's memory to another. Consulted only when a
// call's input is not in its own communicator's areas and some other
// communicator has areas (`g_registered_count` counts them all).
std::mutex g_registered_mutex;
std::vector<std::pair<const void*, RegisteredArea>> g_registered;
std::atomic<std::size_t> g_registered_count{0};

// What a module said about its failure. The ABI promises a non-NULL
// last_error(); a module that breaks the promise gets a message, not a crash.
std::string module_error(const arbiter_backend_v1_t& m) {
  const char* e = m.last_error != nullptr ? m.last_error() : nullptr;
  if (e != nullptr && *e != '\0') return e;
  return std::string(m.name != nullptr ? m.name : "the module") +
         " gave no reason (its last_error() returned " + (e == nullptr ? "NULL" : "\"\"") + ")";
}

// A module's status as the caller sees it: ARBITER_OK, or an ABI status with
// the module's message in `error`. A code the ABI does not define is
// ARBITER_INTERNAL (the module is broken), saying so.
arbiter_status module_status(std::int32_t status, const arbiter_backend_v1_t& m,
                             std::string& error) {
  if (status == ARBITER_OK) return ARBITER_OK;
  error = module_error(m);
  if (status > ARBITER_OK && status <= ARBITER_MISMATCH) return static_cast<arbiter_status>(status);
  error = std::string(m.name != nullptr ? m.name : "the module") + " returned status " +
          std::to_string(status) + ", which arbiter_backend.h does not define: " + error;
  return ARBITER_INTERNAL;
}

std::string oob_error(const arbiter_oob& oob) {
  const char* e = oob.last_error ? oob.last_error(oob.ctx) : nullptr;
  return e && *e ? e : "no reason given";
}

template <class T>
std::vector<T> allgather(const arbiter_oob& oob, const T& mine, std::chrono::milliseconds timeout,
                         const char* what) {
  std::vector<T> all(static_cast<std::size_t>(oob.size));
  if (oob.allgather(oob.ctx, &mine, all.data(), sizeof(T), timeout.count()) != ARBITER_OK) {
    throw CommunicatorError(std::string("exchanging ") + what + " failed: " + oob_error(oob));
  }
  return all;
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The reason the registry recorded for the module named like `b`.
std::string why_unavailable(const Registry& registry, Backend b) {
  for (const ModuleInfo& m : registry.modules()) {
    if (m.name == backend_name(b)) return "unavailable: " + m.reason;
  }
  return "no module found (see `arbiter plugins`)";
}

constexpr const char* kSharedGpuVariable = "ARBITER_TEST_SHARED_GPU";
constexpr const char* kSharedGpuDrop =
    "dropped by the shared-GPU test mode (ARBITER_TEST_SHARED_GPU=1): this module cannot run "
    "ranks of different processes on one GPU (NCCL refuses it)";

// The shared-GPU test mode: "1" is on; unset or empty is off.
bool shared_gpu_test_from_environment() {
  const char* v = std::getenv(kSharedGpuVariable);
  if (v == nullptr || *v == '\0') return false;
  if (std::string_view(v) == "1") return true;
  throw CommunicatorError(std::string(kSharedGpuVariable) + " is \"" + v +
                          "\": the shared-GPU test mode (arbiter's tests and examples on fewer "
                          "GPUs than ranks) is switched on by exactly 1; unset it otherwise");
}

constexpr const char* kCheckCallsVariable = "ARBITER_CHECK_CALLS";

// The check mode from the environment: "1" on; unset, empty or "0" off.
bool check_calls_from_environment() {
  const char* v = std::getenv(kCheckCallsVariable);
  if (v == nullptr || *v == '\0' || std::string_view(v) == "0") return false;
  if (std::string_view(v) == "1") return true;
  throw CommunicatorError(std::string(kCheckCallsVariable) + " is \"" + v +
                          "\": the check mode (every call's signature all-gathered through the "
                          "oob before it runs) is switched on by 1 and off by 0 or unset");
}

// "residual_rmsnorm_fp4 (NVFP4)": the name, and what NVFP4 users search for.
std::string pattern_label(std::uint32_t p) {
  if (p >= kPatternCount) return "pattern " + std::to_string(p);
  std::string name(pattern_name(static_cast<Pattern>(p)));
  return p == static_cast<std::uint32_t>(Pattern::kResidualRmsnormFp4) ? name + " (NVFP4)" : name;
}

std::string pattern_names(std::uint32_t mask) {
  std::string out;
  for (int p = 0; p < kPatternCount; ++p) {
    if (!((mask >> p) & 1u)) continue;
    if (!out.empty()) out += ", ";
    out += pattern_name(static_cast<Pattern>(p));
  }
  return out.empty() ? "none" : out;
}

// What every rank must agree on before any workspace exists, exchanged once.
struct RankFacts {
  std::uint64_t fingerprint;
  std::uint16_t capability;
  std::uint8_t shared_gpu_test;
  std::uint8_t dtype;
  std::uint32_t hidden;
  std::uint32_t max_tokens;
  std::uint32_t pattern_mask;
  std::uint32_t nodes;
  std::uint32_t topology;                 // nvlink_domain | multicast << 1
  std::uint32_t available;                // bit (1 << Backend): modules this rank loaded
  std::uint32_t patterns[kBackendCount];  // each available module's caps.pattern_mask
  std::uint32_t flags[kBackendCount];     // and its caps.flags
  std::uint8_t check_calls;
  char builds[kBackendCount][48];  // each available module's build ("" without one)
  ProcessIdentity process;         // differs by rank: not compared
  // Last, and 0 when all is well: the fields above keep their offsets, so
  // the builds' comparison still names a peer of an earlier build.
  std::uint8_t search_path_failed;  // some plugin search path entry could not be searched
};

std::string build_text(const char (&build)[48]) {
  const std::string text(build, strnlen(build, sizeof build));
  return text.empty() ? "a build that does not say (no faults companion)" : "build " + text;
}

// What every rank must still agree on once the workspaces exist.
struct RankOutcome {
  std::uint32_t usable;
  std::uint32_t patterns[kBackendCount];
};

// The first field on which some rank differs from rank 0, as an error.
// `registry` and `self` add this rank's own reason where it lacks a module.
void check_agreement(const std::vector<RankFacts>& all, const Registry& registry, int self) {
  // Before any comparison: a skipped entry may be why modules differ.
  if (!registry.search_errors().empty()) throw CommunicatorError(registry.search_error_message());
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].search_path_failed) {
      throw CommunicatorError("rank " + std::to_string(r) +
                              " cannot search its plugin search path (ARBITER_PLUGIN_PATH, or "
                              "DiscoverOptions::search_path): an entry does not exist or cannot "
                              "be read; its own error names it");
    }
  }
  const RankFacts& a = all[0];
  for (std::size_t r = 1; r < all.size(); ++r) {
    const RankFacts& b = all[r];
    const std::string who = "rank " + std::to_string(r) + " has ";
    auto differ = [&](const std::string& what, const std::string& theirs, const std::string& ours,
                      const std::string& fix) {
      throw CommunicatorError("ranks differ in " + what + ": " + who + theirs + ", rank 0 has " +
                              ours + "; " + fix);
    };
    if (b.fingerprint != a.fingerprint) {
      throw CommunicatorError("tuning tables differ across ranks: " + who + "fingerprint " +
                              hex(b.fingerprint) + ", rank 0 has " + hex(a.fingerprint) +
                              "; give every rank the same ARBITER_CONFIG and ARBITER_BACKENDS");
    }
    if (b.capability != a.capability) {
      differ("their devices", "capability " + std::to_string(b.capability),
             std::to_string(a.capability), "an all-reduce group runs on one kind of device");
    }
    if (b.shared_gpu_test != a.shared_gpu_test) {
      differ("the shared-GPU test mode", b.shared_gpu_test ? "it on" : "it off",
             a.shared_gpu_test ? "it on" : "it off",
             "set ARBITER_TEST_SHARED_GPU=1 on every rank or on none");
    }
    const std::string same = "every rank must create the communicator with the same options";
    if (b.hidden != a.hidden) {
      differ("hidden", std::to_string(b.hidden), std::to_string(a.hidden), same);
    }
    if (b.dtype != a.dtype) {
      differ("dtype", std::string(dtype_name(static_cast<Dtype>(b.dtype))),
             std::string(dtype_name(static_cast<Dtype>(a.dtype))), same);
    }
    if (b.max_tokens != a.max_tokens) {
      differ("max_tokens", std::to_string(b.max_tokens), std::to_string(a.max_tokens), same);
    }
    if (b.pattern_mask != a.pattern_mask) {
      differ("the patterns asked for", pattern_names(b.pattern_mask), pattern_names(a.pattern_mask),
             same);
    }
    if (b.nodes != a.nodes || b.topology != a.topology) {
      auto topo = [](const RankFacts& f) {
        return std::to_string(f.nodes) + " node(s), NVLink domain " +
               ((f.topology & 1u) ? "yes" : "no") + ", multicast " +
               ((f.topology & 2u) ? "yes" : "no");
      };
      differ("the topology", topo(b), topo(a), same);
    }
    if (b.check_calls != a.check_calls) {
      differ("the check mode", b.check_calls ? "it on" : "it off",
             a.check_calls ? "it on" : "it off",
             "set ARBITER_CHECK_CALLS (or options.check_calls) alike on every rank");
    }
    for (int i = 0; i < kBackendCount; ++i) {
      const bool has_a = (a.available >> i) & 1u;
      const bool has_b = (b.available >> i) & 1u;
      const std::string name(backend_name(static_cast<Backend>(i)));
      if (has_a != has_b) {
        std::string fix =
            "install the same arbiter and backend modules on every rank (`arbiter plugins` on "
            "each says what it loads and why not)";
        const int lacking = has_a ? static_cast<int>(r) : 0;
        if (lacking == self) {
          fix += "; here, " + name + " is " + why_unavailable(registry, static_cast<Backend>(i));
        }
        differ("the backends they loaded",
               "module " + name + (has_b ? " available" : " unavailable"),
               has_a ? "it available" : "it unavailable", fix);
      }
      if (has_a && std::strncmp(a.builds[i], b.builds[i], sizeof a.builds[i]) != 0) {
        differ("the build of module " + name, build_text(b.builds[i]), build_text(a.builds[i]),
               "every rank must load the same build of each module (install the same arbiter "
               "everywhere; ARBITER_PLUGIN_PATH may point some ranks elsewhere)");
      }
    }
  }
}

WorkspaceFootprint sized_footprint(const Registry& registry, Backend backend,
                                   const arbiter_workspace_spec& spec) {
  WorkspaceFootprint figure;
  figure.backend = backend;
  const ModuleInfo* info = registry.info(backend);
  arbiter_footprint sized{};
  // The module just created a workspace from this spec, so its sizing of
  // the same spec succeeds; a module without the companion stays unknown.
  if (info == nullptr || info->footprint == nullptr ||
      info->footprint->footprint(&spec, &sized) != ARBITER_OK) {
    return figure;
  }
  figure.known = true;
  figure.device_bytes = sized.device_bytes;
  figure.host_bytes = sized.host_bytes;
  figure.shared_bytes = sized.shared_bytes;
  std::copy(std::begin(sized.max_message_bytes), std::end(sized.max_message_bytes),
            figure.max_message_bytes);
  figure.note = sized.note != nullptr ? sized.note : "";
  return figure;
}

// ARBITER_RUN_REFUSED is the host's own (join_refused()): a caller's call
// that carries it would be taken for a refusal and run nothing.
bool refuse_host_flags(const arbiter_allreduce_args& args, Communicator::Result& result) {
  if ((args.flags & ARBITER_RUN_REFUSED) == 0) return false;
  result.status = ARBITER_INVALID_ARGUMENT;
  result.error =
      "flags: ARBITER_RUN_REFUSED is arbiter's own (a refused call joined to tell the peers); "
      "a caller that refused a call itself calls arbiter_comm_join_refused";
  return true;
}

}  // namespace

struct Communicator::Impl {
  const arbiter_oob& oob;
  // The tables as loaded (for explaining a refusal), and as used: without
  // the backends that have no workspace.
  Policy tables_policy;
  Policy policy;
  // `policy` without, further, the backends whose workspace lacks the
  // pattern: decide() stays on the policy's fast path for every pattern.
  std::vector<Policy> pattern_policy;
  CommunicatorOptions options;
  std::uint32_t asked_patterns = 0;  // options.pattern_mask, 0 read as all
  bool shared_gpu_test = false;
  Workspace workspaces[kBackendCount];
  std::uint32_t usable = 0;
  // Patterns each backend's workspace runs (0 without one).
  std::array<std::uint32_t, kBackendCount> patterns{};
  // Bit (1 << Backend): modules without ARBITER_CAPS_RESIDUAL_OPTIONAL on
  // some rank. A norm call without residual_in is never sent to them.
  std::uint32_t residual_required = 0;
  // Bit (1 << Backend): modules with ARBITER_CAPS_JOINS_REFUSALS on every
  // rank (join_refused()).
  std::uint32_t joins_refusals = 0;
  // Backends the policy might pick that have no workspace; after creation the
  // policy no longer allows them.
  std::uint32_t unusable_candidates = 0;
  std::vector<Backend> candidates;
  std::vector<std::string> dropped;
  // Why a backend has no workspace (for run_on); empty for usable ones.
  std::array<std::string, kBackendCount> no_workspace;

  // Faults (communicator.h). `aborted` may be set from any thread; the rest
  // belongs to the rank's thread.
  std::atomic<bool> aborted{false};
  bool faulted = false;
  arbiter_status fault_status = ARBITER_OK;
  std::string fault_error;
  bool check_calls = false;
  std::uint64_t calls = 0;  // allreduce_fusion() and run_on() calls so far
  // Whether the current call reached a module's run() (run_in_slices()):
  // a module joins its own refusals; the host joins those made above it.
  bool module_entered = false;
  std::vector<RegisteredArea> registered;  // this rank's registered allocations
  std::uint64_t registered_made = 0;       // alloc_registered() calls that succeeded
  // GPU communicators: the board where the ranks on this host post their
  // faults (fault_board.h), and the watcher of those peers' processes and
  // posts (peer_watch.h). The watcher sets `failed_peer_error`, then
  // `failed_peer` (once, from its thread).
  std::vector<ProcessIdentity> processes;
  std::unique_ptr<FaultBoard> board;
  std::unique_ptr<PeerWatch> peer_watch;
  std::atomic<std::int32_t> failed_peer{-1};
  std::string failed_peer_error;
  const common::FaultInjection& faults = common::FaultInjection::get();

  Impl(const arbiter_oob& o, Policy p, const CommunicatorOptions& opt)
      : oob(o), tables_policy(p), policy(std::move(p)), options(opt) {}

  // The process that created the communicator, and whether this is still
  // it: a forked child's copy belongs to the parent.
  const ForkStamp made;
  bool forked() const { return made.forked(); }

  Request request_for(const arbiter_allreduce_args& args, std::uint32_t excluded) const;
  // A norm pattern called without residual_in (a first block).
  static bool without_residual(const arbiter_allreduce_args& args) {
    return common::raw_enum(args.pattern) != ARBITER_PATTERN_ALLREDUCE &&
           args.residual_in == nullptr;
  }
  std::uint64_t capacity(Backend b, Algorithm algorithm) const;
  Decision decide(const arbiter_allreduce_args& args, std::uint32_t excluded) const;
  std::int32_t run_in_slices(Backend b, arbiter_allreduce_args call, void* stream,
                             std::string& error);
  // This rank's registered allocation holding `p`, or nullptr.
  const RegisteredArea* registered_area(const void* p) const {
    const auto* b = static_cast<const std::byte*>(p);
    for (const RegisteredArea& a : registered) {
      if (b >= a.data && b < a.data + a.bytes) return &a;
    }
    return nullptr;
  }
  // Whether `input` lies in memory that backend `b` registered: its module
  // streams such a call itself (run_registered), so no per-call capacity of
  // its workspace bounds it.
  bool streamed_by(const void* input, Backend b) const {
    const RegisteredArea* area = registered_area(input);
    return area != nullptr && area->backend == b;
  }
  void forget_registered(const void* data) {
    std::lock_guard lock(g_registered_mutex);
    for (auto it = g_registered.begin(); it != g_registered.end(); ++it) {
      if (it->first == this && it->second.data == data) {
        g_registered.erase(it);
        g_registered_count.fetch_sub(1, std::memory_order_relaxed);
        return;
      }
    }
  }

  Request request_for(Pattern pattern) const {
    return request_of(options, static_cast<std::uint32_t>(oob.size), pattern);
  }

  Backend fallback() const {
    return policy.tables().fallback[static_cast<int>(options.capability.device())];
  }

  void drop(Backend b, const std::string& why, bool say = true) {
    no_workspace[static_cast<int>(b)] = why;
    dropped.push_back(std::string(backend_name(b)) + ": " + why);
    if (say && oob.rank == 0) std::cerr << "arbiter: backend " << dropped.back() << "\n";
  }

  // Why no backend runs `args` (declined[b]: what backend b said when it
  // declined the call). Only on the error path: it allocates.
  std::string refusal(const arbiter_allreduce_args& args, std::uint32_t excluded,
                      const std::array<std::string, kBackendCount>& declined) const;

  void create(const Registry& registry);
  void watch_peers();
  void open_board();
  // What every later call says after the watch saw `fault`.
  std::string fault_message(const PeerFault& fault) const;
  // Tells the peers on this host that this rank faulted (once; any thread).
  void post_fault(arbiter_status status, std::optional<std::uint64_t> call) noexcept {
    if (board) board->post(oob.rank, status, call);
  }
  void destroy();
  void abort_workspaces() noexcept;

  // Before a call: OK, or the status every call gets once the communicator
  // is unusable (into `result`).
  bool refuse_if_faulted(Result& result) const;
  // After a call (`call`: its number) or an allocation (none): a status
  // that leaves the group unusable is remembered, and posted for the peers.
  void note(Result& result, std::optional<std::uint64_t> call);
  // The check mode's exchange of call `call`'s signature; false (and
  // `result` set) when the call is refused or the exchange failed.
  // `refused`: this rank refused the call and joins the exchange only to say
  // so (join_refused()); `args` is then not read.
  bool check_call(const arbiter_allreduce_args& args, std::uint64_t call, Result& result,
                  bool refused = false);
  // A call this rank refused before any module saw it still takes part in
  // the call, so that the peers' call is refused too (ARBITER_MISMATCH
  // naming this rank) instead of pairing with this rank's next call: through
  // the check mode's exchange when the refusal came before it (`checked`
  // false), else through the fallback backend's module when it joins
  // refusals (shm: every CPU call runs there). Elsewhere (GPU modules
  // without the check mode) the peers wait for their deadline, as before.
  // ARBITER_OK once the peers were told (or none can be), else why joining
  // failed, in `why`.
  [[nodiscard]] arbiter_status join_refused(std::uint64_t call, bool checked, std::string& why);
  // After a call: when this rank refused it before any module saw it
  // (`result`), joins it. A join that fails becomes the call's status (the
  // communicator is then unusable; note() records it), after the refusal.
  void join_if_refused(Result& result, std::uint64_t call, bool checked) noexcept;
  Result dispatch(const arbiter_allreduce_args& args, void* stream);
};

void Communicator::Impl::create(const Registry& registry) {
  const auto timeout = options.timeout;
  constexpr std::uint32_t kAll = CommunicatorOptions::kAllPatterns;
  if ((options.pattern_mask & ~kAll) != 0) {
    throw CommunicatorError("pattern_mask " + std::to_string(options.pattern_mask) +
                            " has bits that name no pattern (bit 0 allreduce ... bit " +
                            std::to_string(kPatternCount - 1) + " residual_rmsnorm_fp4)");
  }
  asked_patterns = options.pattern_mask == 0 ? kAll : options.pattern_mask;
  // Modules probed for the other kind of device would all be "unavailable"
  // with reasons about that device: say what to change instead.
  const bool cpu = options.capability.is_cpu();
  if (cpu != (registry.probed().device_kind == ARBITER_DEVICE_CPU)) {
    throw CommunicatorError(
        std::string("the registry's modules were probed for a ") + (cpu ? "GPU" : "CPU") +
        " rank (DiscoverOptions::probe), this communicator is for a " + (cpu ? "CPU" : "GPU") +
        " rank: discover with probe = " +
        (cpu ? "{ARBITER_DEVICE_CPU, -1}" : "{ARBITER_DEVICE_GPU, local_rank}") +
        " (DiscoverOptions::from_environment() probes the GPU of LOCAL_RANK)");
  }
  // The mode concerns GPU modules only; CPU ranks ignore it (but not a
  // value that means nothing).
  const bool mode = shared_gpu_test_from_environment();
  shared_gpu_test = mode && !options.capability.is_cpu();
  check_calls = options.check_calls || check_calls_from_environment();
  if (!faults.error().ok()) throw CommunicatorError(faults.error().message());
  faults.at("create.facts", oob.rank, 0);

  // 1. Every rank decides identically only with identical tables, options
  // and backends: one exchange of everything that must agree.
  RankFacts mine;
  std::memset(&mine, 0, sizeof mine);  // padding too: the bytes go to every rank
  mine.fingerprint = policy.fingerprint();
  mine.capability = options.capability.code();
  mine.shared_gpu_test = shared_gpu_test ? 1 : 0;
  mine.dtype = static_cast<std::uint8_t>(options.dtype);
  mine.hidden = options.hidden;
  mine.max_tokens = options.max_tokens;
  mine.pattern_mask = asked_patterns;
  mine.nodes = options.nodes;
  mine.topology = (options.nvlink_domain ? 1u : 0u) | (options.multicast ? 2u : 0u);
  mine.available = registry.available_mask();
  mine.check_calls = check_calls ? 1 : 0;
  mine.search_path_failed = registry.search_errors().empty() ? 0 : 1;
  mine.process = ProcessIdentity::own();
  for (int i = 0; i < kBackendCount; ++i) {
    if (const ModuleInfo* m = registry.info(static_cast<Backend>(i)); m && m->available) {
      mine.patterns[i] = m->caps.pattern_mask;
      mine.flags[i] = m->caps.flags;
      std::snprintf(mine.builds[i], sizeof mine.builds[i], "%s", m->build.c_str());
    }
  }
  const auto facts = allgather(oob, mine, timeout, "what every rank must agree on");
  check_agreement(facts, registry, oob.rank);
  // After the exchange, so that every rank says it (a rank that differs is
  // named above). The fused modules size their buffers by tokens x hidden:
  // without it they could make no workspace, and every call would quietly
  // go unfused.
  if (options.hidden == 0) {
    throw CommunicatorError(
        "hidden is 0: pass the model's hidden size (the elements per token of the widest call); "
        "the workspaces and the slicing of large calls are sized from it");
  }
  for (const RankFacts& f : facts) processes.push_back(f.process);
  faults.at("create.workspaces", oob.rank, 0);
  // 2. The same backends on every rank: AND of what each could load, and of
  // the patterns and flags each module reported.
  const std::uint32_t local = mine.available;
  std::uint32_t common = local;
  std::array<std::uint32_t, kBackendCount> common_patterns{};
  std::array<std::uint32_t, kBackendCount> common_flags{};
  for (int i = 0; i < kBackendCount; ++i) {
    common_patterns[i] = mine.patterns[i];
    common_flags[i] = mine.flags[i];
  }
  for (const RankFacts& f : facts) {
    common &= f.available;
    for (int i = 0; i < kBackendCount; ++i) {
      common_patterns[i] &= f.patterns[i];
      common_flags[i] &= f.flags[i];
    }
  }
  for (int i = 0; i < kBackendCount; ++i) {
    if (!(common_flags[i] & ARBITER_CAPS_RESIDUAL_OPTIONAL)) residual_required |= 1u << i;
    if (common_flags[i] & ARBITER_CAPS_JOINS_REFUSALS) joins_refusals |= 1u << i;
  }
  const Tables& t = policy.tables();
  const Backend fallback = this->fallback();
  const Topology topo = topology_of(request_for(Pattern::kAllreduce));

  // 3. Workspaces, sized from the policy's caps, for the backends it may pick.
  const WorkspacePlan plan = plan_workspaces(policy, options, static_cast<std::uint32_t>(oob.size));
  for (const PlannedWorkspace& w : plan.workspaces) candidates.push_back(w.backend);
  for (int i = 0; i < kBackendCount; ++i) {
    no_workspace[i] = "not a candidate here (neither in the tables' " +
                      std::string(topology_name(topo)) +
                      " preference list nor the fallback, or nothing is fused at this world "
                      "size)";
  }
  std::uint32_t mode_dropped = 0;
  // Backends that run none of the patterns asked for: such calls are
  // refused per call, naming each backend's reason; creation goes on.
  std::uint32_t pattern_dropped = 0;
  for (const PlannedWorkspace& planned : plan.workspaces) {
    const Backend b = planned.backend;
    const int i = static_cast<int>(b);
    if (!planned.allowed) {  // the tables never pick it
      no_workspace[i] =
          "not allowed by the tables (allowed: " + backend_mask_names(t.allowed_mask) +
          "; see `enabled:` and ARBITER_BACKENDS)";
      continue;
    }
    if (!((common >> i) & 1u)) {
      unusable_candidates |= 1u << i;
      drop(b, (local >> i) & 1u ? "unavailable on another rank" : why_unavailable(registry, b));
      continue;
    }
    if (shared_gpu_test && !(common_flags[i] & ARBITER_CAPS_SHARES_GPU)) {
      unusable_candidates |= 1u << i;
      mode_dropped |= 1u << i;
      drop(b, kSharedGpuDrop, false);
      continue;
    }
    // Only what the module runs on every rank's device; the rest is refused
    // per call (refusal()).
    const std::uint32_t asked = asked_patterns & common_patterns[i];
    if (asked == 0) {
      unusable_candidates |= 1u << i;
      pattern_dropped |= 1u << i;
      drop(b, "runs none of the patterns asked for (" + pattern_names(asked_patterns) +
                  "; it runs " + pattern_names(common_patterns[i]) + " on this device)");
      continue;
    }
    // The module's own admission rules (its caps); the tables only narrow
    // them. The same on every rank: the builds agree and so do the world
    // size and dtype. A mask has no bit for world sizes from 64.
    if (const ModuleInfo* info = registry.info(b); info != nullptr) {
      const auto ws = static_cast<std::uint32_t>(oob.size);
      const auto dtype = static_cast<std::uint32_t>(options.dtype);
      if (ws < 64 && !((info->caps.world_size_mask >> ws) & 1u)) {
        unusable_candidates |= 1u << i;
        drop(b, "its module does not run world size " + std::to_string(ws) +
                    " (caps.world_size_mask)");
        continue;
      }
      if (dtype >= 32 || !((info->caps.dtype_mask >> dtype) & 1u)) {
        unusable_candidates |= 1u << i;
        drop(b, std::string("its module does not run ") +
                    common::dtype_text(static_cast<arbiter_dtype>(dtype)) + " (caps.dtype_mask)");
        continue;
      }
    }
    arbiter_workspace_spec spec = planned.spec;
    spec.rank = oob.rank;
    spec.pattern_mask = asked;
    spec.timeout_ms = timeout.count();
    const arbiter_backend_v1_t* module = registry.backend(b);
    arbiter_workspace* handle = nullptr;
    // Collective; the module fails on every rank when it fails on any.
    std::string why;
    const arbiter_status status =
        module_status(module->workspace_create(&oob, &spec, &handle), *module, why);
    if (status == ARBITER_TIMEOUT || status == ARBITER_PEER_FAILED) {
      // The group itself failed (a rank is gone or late): no later exchange
      // can succeed, so creation stops here, naming the step.
      faulted = true;
      destroy();
      throw CommunicatorError("creating the " + std::string(backend_name(b)) +
                              " workspace failed: " + why);
    }
    if (status != ARBITER_OK || handle == nullptr) {
      unusable_candidates |= 1u << i;
      drop(b, "workspace creation failed: " +
                  (status != ARBITER_OK
                       ? why
                       : std::string(module->name) + " returned ARBITER_OK without a workspace"));
      continue;
    }
    workspaces[i] = {module, registry.faults(b), handle, registry.memory(b),
                     sized_footprint(registry, b, spec)};
    usable |= 1u << i;
    patterns[i] = asked;
    no_workspace[i].clear();
  }
  // 4. Every rank made the same workspaces (each module's creation is
  // collective and all-or-nothing, but a module is someone else's code).
  faults.at("create.checked", oob.rank, 0);
  RankOutcome outcome{};
  outcome.usable = usable;
  std::copy(patterns.begin(), patterns.end(), outcome.patterns);
  std::vector<RankOutcome> outcomes;
  try {
    outcomes = allgather(oob, outcome, timeout, "the workspaces each rank made");
  } catch (const CommunicatorError&) {
    abort_workspaces();  // a peer is gone: tear down without waiting on it
    destroy();
    throw;
  }
  for (std::size_t r = 1; r < outcomes.size(); ++r) {
    if (std::memcmp(&outcomes[r], &outcomes[0], sizeof(RankOutcome)) != 0) {
      abort_workspaces();
      destroy();
      throw CommunicatorError("ranks differ in the workspaces they made: rank " +
                              std::to_string(r) + " has " + backend_mask_names(outcomes[r].usable) +
                              ", rank 0 has " + backend_mask_names(outcomes[0].usable) +
                              " (or their patterns differ); a module's creation was not "
                              "collective. Report it with `arbiter plugins` from each rank");
    }
  }
  const bool fallback_usable =
      fallback != Backend::kNone && ((usable >> static_cast<int>(fallback)) & 1u);
  const bool fallback_dropped_by_mode =
      fallback != Backend::kNone && ((mode_dropped >> static_cast<int>(fallback)) & 1u);
  // No backend runs any pattern asked for (NVFP4 alone on CPU ranks): as
  // for any pattern no backend runs, its calls are refused and creation goes
  // on. A fallback that runs none while a fused backend runs some still
  // stops creation: calls above the fused cap would have nowhere to go.
  std::uint32_t runnable = 0;
  for (int i = 0; i < kBackendCount; ++i) {
    if ((usable >> i) & 1u) runnable |= patterns[i];
  }
  const bool nothing_runs_asked = fallback != Backend::kNone &&
                                  ((pattern_dropped >> static_cast<int>(fallback)) & 1u) &&
                                  (runnable & asked_patterns) == 0;
  if (!fallback_usable && !fallback_dropped_by_mode && !nothing_runs_asked) {
    destroy();
    // Why: its own reason (not allowed, unavailable, creation failed), else
    // the last backend dropped.
    const std::string& why =
        fallback == Backend::kNone ? std::string() : no_workspace[static_cast<int>(fallback)];
    throw CommunicatorError(
        std::string("the fallback backend ") + std::string(backend_name(fallback)) +
        " is not usable on every rank, so calls the fused backends cannot "
        "take would have nowhere to go: " +
        (!why.empty()      ? std::string(backend_name(fallback)) + ": " + why
         : dropped.empty() ? std::string("no backend was dropped")
                           : "backends dropped: " + dropped.back()) +
        // A missing module's reason says it already.
        (why.find("see `arbiter plugins`") == std::string::npos ? " (see `arbiter plugins`)" : ""));
  }
  if (shared_gpu_test && oob.rank == 0) {
    std::cerr << "arbiter: shared-GPU test mode (" << kSharedGpuVariable
              << "=1, for arbiter's tests and examples): ranks of different processes may "
                 "share one GPU; dropped: "
              << (mode_dropped ? backend_mask_names(mode_dropped) : std::string("none"))
              << (fallback_dropped_by_mode
                      ? "; calls the fused backends cannot take (above the fused cap) are refused"
                      : "")
              << "\n";
  }
  // Decide with the dropped backends no longer allowed, so every call takes
  // the policy's fast path instead of excluding them one call at a time.
  policy = policy.without_backends(unusable_candidates);
  for (int p = 0; p < kPatternCount; ++p) {
    std::uint32_t lacking = 0;
    for (int i = 0; i < kBackendCount; ++i) {
      if (((usable >> i) & 1u) && !((patterns[i] >> p) & 1u)) lacking |= 1u << i;
    }
    pattern_policy.push_back(lacking ? policy.without_backends(lacking) : policy);
  }
  watch_peers();
}

void Communicator::Impl::watch_peers() {
  // CPU ranks run shm, whose calls wait on the host and watch there.
  if (options.capability.is_cpu() || usable == 0) return;
  open_board();
  peer_watch =
      std::make_unique<PeerWatch>(oob.rank, processes, board.get(), [this](const PeerFault& fault) {
        failed_peer_error = fault_message(fault);
        failed_peer.store(fault.rank, std::memory_order_release);
        abort_workspaces();
      });
}

std::string Communicator::Impl::fault_message(const PeerFault& fault) const {
  const std::string rank = "rank " + std::to_string(fault.rank);
  std::string what;
  if (!fault.post) {
    what = rank + " died (its process, pid " +
           std::to_string(processes[static_cast<std::size_t>(fault.rank)].pid) +
           " on this host, exited; its launcher knows its exit status)";
  } else if (fault.post->status == ARBITER_ABORTED && !fault.post->call) {
    what = rank + " aborted the communicator (abort())";
  } else {
    what = rank + "'s " +
           (fault.post->call ? "call " + std::to_string(*fault.post->call)
                             : std::string("allocation of registered memory")) +
           " " + fault_words(fault.post->status) +
           ", which leaves the communicator unusable on every rank";
  }
  return what +
         ": this rank's kernels were told to stop waiting on it (the abort flag), so the "
         "outputs of calls still running are unspecified; destroy the communicator, and create a "
         "new one over the group";
}

// The lowest rank on each host creates the board and the others there map
// it; then everyone meets once more, and the creator unlinks the name. A
// rank that cannot create or map it is told on stderr, and its peers' faults
// reach it at its kernels' deadline, as without a board: the board is a
// faster path, never a reason to refuse a communicator.
void Communicator::Impl::open_board() {
  struct BoardName {
    char name[48];
  };
  const auto self = static_cast<std::size_t>(oob.rank);
  std::size_t creator = self;
  bool alone = true;
  for (std::size_t r = 0; r < processes.size(); ++r) {
    if (r == self || !processes[self].beside(processes[r])) continue;
    alone = false;
    creator = std::min(creator, r);
  }
  std::string error;
  BoardName mine{};
  if (!alone && creator == self) {
    board = FaultBoard::create(static_cast<std::uint32_t>(oob.size), error);
    if (board) std::snprintf(mine.name, sizeof mine.name, "%s", board->name().c_str());
  }
  std::vector<BoardName> names;
  try {
    names = allgather(oob, mine, options.timeout, "the name of the host's fault board");
    if (!alone && creator != self) {
      const BoardName& theirs = names[creator];
      const std::string name(theirs.name, strnlen(theirs.name, sizeof theirs.name));
      if (name.empty()) {
        error = "rank " + std::to_string(creator) + " could not create it";
      } else {
        board = FaultBoard::open(name, static_cast<std::uint32_t>(oob.size), error);
      }
    }
    if (oob.barrier(oob.ctx, options.timeout.count()) != ARBITER_OK) {
      throw CommunicatorError("the barrier after mapping the host's fault board failed: " +
                              oob_error(oob));
    }
  } catch (...) {
    abort_workspaces();  // a peer is gone: tear down without waiting on it
    destroy();
    throw;
  }
  if (board) board->unlink();
  if (!alone && !board) {
    std::cerr << "arbiter: rank " << oob.rank << ": no fault board (" << error
              << "): an abort() or a failed call on a peer of this host reaches this rank's "
                 "kernels at their deadline (ARBITER_KERNEL_TIMEOUT_MS), not within 100 ms\n";
  }
}

void Communicator::Impl::abort_workspaces() noexcept {
  for (const Workspace& w : workspaces) {
    if (w.handle != nullptr && w.faults != nullptr && w.faults->abort != nullptr) {
      w.faults->abort(w.handle);
    }
  }
}

void Communicator::Impl::destroy() {
  peer_watch.reset();  // first: it may abort the workspaces
  board.reset();       // unlinked already, unless creation failed in between
  // Collective, in backend order on every rank; after a fault or an abort,
  // local: every workspace is aborted first, so no module waits on a peer.
  if (faulted || aborted.load(std::memory_order_acquire) ||
      failed_peer.load(std::memory_order_acquire) >= 0) {
    abort_workspaces();
  }
  // The modules free registered memory with their workspaces.
  for (const RegisteredArea& a : registered) forget_registered(a.data);
  registered.clear();
  for (Workspace& w : workspaces) {
    if (w.handle) w.module->workspace_destroy(w.handle);
    w = {};
  }
  usable = 0;
}

bool Communicator::Impl::refuse_if_faulted(Result& result) const {
  if (forked()) [[unlikely]] {
    result.status = ARBITER_INVALID_ARGUMENT;
    result.error = "this communicator was created in process " + std::to_string(made.pid) +
                   ", which has since forked; this child cannot use it (its calls would pair "
                   "with the parent's): create a new communicator in the child";
    return true;
  }
  // This rank's own abort() first: its watchdog knows why it called it.
  if (aborted.load(std::memory_order_acquire)) {
    result.status = ARBITER_ABORTED;
    result.error =
        "the communicator was aborted (abort()); destroy it, and create a new one over the "
        "survivors' group";
    return true;
  }
  if (failed_peer.load(std::memory_order_acquire) >= 0) {
    result.status = ARBITER_PEER_FAILED;
    result.error = failed_peer_error;
    return true;
  }
  if (!faulted) return false;
  result.status = fault_status;
  result.error =
      "an earlier call failed and left this communicator unusable (destroy it; the survivors "
      "can create a new one over their own group): " +
      fault_error;
  return true;
}

void Communicator::Impl::note(Result& result, std::optional<std::uint64_t> call) {
  // A call that failed because the watcher aborted it (a peer died while it
  // waited) says why.
  if (result.status != ARBITER_OK && failed_peer.load(std::memory_order_acquire) >= 0) {
    result.status = ARBITER_PEER_FAILED;
    result.error = failed_peer_error;
  }
  switch (result.status) {
    case ARBITER_TIMEOUT:
    case ARBITER_PEER_FAILED:
    case ARBITER_ABORTED:
    case ARBITER_INTERNAL:
      if (!faulted) {
        faulted = true;
        fault_status = result.status;
        fault_error = result.error;
        // Peers' kernels may wait on this rank's: tell those on this host.
        // Not when a peer's fault caused it (they know).
        if (failed_peer.load(std::memory_order_acquire) < 0) post_fault(result.status, call);
      }
      break;
    default:
      break;
  }
}

bool Communicator::Impl::check_call(const arbiter_allreduce_args& args, std::uint64_t call,
                                    Result& result, bool refused) {
  struct Record {
    common::CallSignature signature;
    std::uint64_t call;
    // Where the input lies: 0 for ordinary memory, else the allocation (its
    // serial + 1) and the offset. Every rank must pass the same: a module
    // reads the peers' inputs at this rank's offset.
    std::uint64_t allocation;
    std::uint64_t offset;
  };
  Record mine{};
  if (const RegisteredArea* area = refused ? nullptr : registered_area(args.input);
      area != nullptr) {
    mine.allocation = area->serial + 1;
    mine.offset =
        static_cast<std::uint64_t>(static_cast<const std::byte*>(args.input) - area->data);
  }
  // Known values only: an unknown pattern, dtype or algorithm is refused
  // per rank below (the signature reads them as plain numbers).
  mine.signature = refused ? common::refused_call()
                           : common::signature_of(args, /*read_scale=*/false,
                                                  /*with_algorithm=*/false);
  mine.call = call;
  std::vector<Record> all(static_cast<std::size_t>(oob.size));
  if (const std::int32_t rc =
          oob.allgather(oob.ctx, &mine, all.data(), sizeof(Record), options.timeout.count());
      rc != ARBITER_OK) {
    result.status = rc > ARBITER_OK && rc <= ARBITER_MISMATCH ? static_cast<arbiter_status>(rc)
                                                              : ARBITER_INTERNAL;
    if (result.status == ARBITER_UNSUPPORTED || result.status == ARBITER_MISMATCH) {
      result.status = ARBITER_PEER_FAILED;
    }
    result.error = "check mode: exchanging the signature of call " + std::to_string(call) +
                   " through the oob failed: " + oob_error(oob);
    return false;
  }
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r].call != all[0].call) {
      // Calls are paired by their order: a rank made a call the others did
      // not, and every later pair would be off by as much.
      result.status = ARBITER_MISMATCH;
      result.error = "check mode: rank " + std::to_string(r) + " is at call " +
                     std::to_string(all[r].call) + ", rank 0 at call " +
                     std::to_string(all[0].call) +
                     " (a rank made calls the others did not); the communicator is no longer "
                     "usable";
      faulted = true;
      fault_status = ARBITER_MISMATCH;
      fault_error = result.error;
      return false;
    }
    std::string difference =
        common::call_difference(all[0].signature, 0, all[r].signature, static_cast<int>(r));
    if (difference.empty() &&
        (all[r].allocation != all[0].allocation || all[r].offset != all[0].offset)) {
      const auto where = [](const Record& rec) {
        return rec.allocation == 0
                   ? std::string("unregistered memory")
                   : "registered allocation #" + std::to_string(rec.allocation - 1) +
                         " at offset " + std::to_string(rec.offset);
      };
      difference = "the input's memory: rank " + std::to_string(r) + " has " + where(all[r]) +
                   ", rank 0 has " + where(all[0]) +
                   " (every rank passes the same registered allocation at the same offset, or "
                   "none does)";
    }
    if (!difference.empty()) {
      result.status = ARBITER_MISMATCH;
      result.error = "check mode: " + common::mismatch_message(difference, call);
      return false;
    }
  }
  return true;
}

Communicator::Communicator(const arbiter_oob& oob, Policy policy, const Registry& registry,
                           const CommunicatorOptions& options)
    : impl_(std::make_unique<Impl>(oob, std::move(policy), options)) {
  if (oob.size < 1 || oob.rank < 0 || oob.rank >= oob.size || !oob.allgather || !oob.barrier ||
      !oob.broadcast) {
    throw CommunicatorError("invalid oob: rank " + std::to_string(oob.rank) + " of " +
                            std::to_string(oob.size) + ", or a NULL function");
  }
  impl_->create(registry);
}

Communicator::~Communicator() {
  // A forked child's copy: destroying it would run the parent's collective
  // teardown with the parent's peers, and join threads the child does not
  // have. Its memory is the child's own copy; left as it is.
  if (impl_->forked()) {
    static_cast<void>(impl_.release());
    return;
  }
  impl_->faults.at("destroy", impl_->oob.rank, 0);
  impl_->destroy();
}

void Communicator::abort() noexcept {
  // A forked child would abort its parent's communicator (shared memory).
  if (impl_->forked()) return;
  impl_->aborted.store(true, std::memory_order_release);
  // A watchdog that aborts because a peer's fault reached this rank posts
  // an echo, so that the peers still name the rank where it began.
  impl_->post_fault(impl_->failed_peer.load(std::memory_order_acquire) >= 0 ? ARBITER_PEER_FAILED
                                                                            : ARBITER_ABORTED,
                    std::nullopt);
  impl_->abort_workspaces();
}

bool Communicator::faulted() const {
  return impl_->faulted || impl_->aborted.load(std::memory_order_acquire) ||
         impl_->failed_peer.load(std::memory_order_acquire) >= 0;
}

bool Communicator::check_calls() const { return impl_->check_calls; }

Request Communicator::Impl::request_for(const arbiter_allreduce_args& args,
                                        std::uint32_t excluded) const {
  Request r = request_for(static_cast<Pattern>(args.pattern));
  r.dtype = static_cast<Dtype>(args.dtype);
  r.tokens = args.tokens;
  r.hidden = args.hidden;
  r.residual_replicated = (args.flags & ARBITER_RUN_RESIDUAL_REPLICATED) != 0;
  // Tables may key on it; the zero-copy call itself is run_in_slices' part.
  r.buffers_registered = registered_area(args.input) != nullptr;
  r.message_bytes = Request::message_bytes_of(args.tokens, args.hidden, r.dtype);
  r.excluded_backends = excluded;
  return r;
}

std::uint64_t Communicator::Impl::capacity(Backend b, Algorithm algorithm) const {
  const Workspace& w = workspaces[static_cast<int>(b)];
  return w.module && w.module->max_message_bytes
             ? w.module->max_message_bytes(w.handle, static_cast<arbiter_algorithm>(algorithm))
             : ~std::uint64_t{0};
}

Decision Communicator::Impl::decide(const arbiter_allreduce_args& args,
                                    std::uint32_t excluded) const {
  // As stored: a C caller may have written any int (UBSan's enum check).
  const auto p = static_cast<std::uint32_t>(common::raw_enum(args.pattern));
  // A pattern not asked for at creation has no workspace sized for it.
  if (p >= kPatternCount || !((asked_patterns >> p) & 1u)) return Decision{};
  const Policy& chooser = pattern_policy[p];
  Request r = request_for(args, excluded);
  const Backend fallback = this->fallback();
  for (int attempt = 0; attempt <= kBackendCount; ++attempt) {
    const Decision d = chooser.decide(r);
    // Never send a message larger than a fused workspace's per-call capacity;
    // the fallback instead runs it in slices (see run_in_slices). A
    // registered input on its own backend has no such bound, as large as the
    // tables' registered cells let it be, while the workspace was sized from
    // the copied ones.
    if (d.backend == Backend::kNone || d.backend == fallback ||
        r.message_bytes <= capacity(d.backend, d.algorithm) ||
        (r.buffers_registered && streamed_by(args.input, d.backend))) {
      return d;
    }
    r.excluded_backends |= 1u << static_cast<int>(d.backend);
  }
  return Decision{};
}

// Runs `args` on `b`, in slices of whole tokens when the message is larger
// than the workspace takes in one call. Every output is per token, so slices
// compute exactly what one call would (NVFP4 scale layouts excepted: those
// calls are never sliced).
std::int32_t Communicator::Impl::run_in_slices(Backend b, arbiter_allreduce_args call, void* stream,
                                               std::string& error) {
  const Workspace& w = workspaces[static_cast<int>(b)];
  const std::uint64_t token_bytes =
      Request::message_bytes_of(1, call.hidden, static_cast<Dtype>(call.dtype));
  // A registered input on its own backend: the zero-copy call, which the
  // module streams itself.
  if (const RegisteredArea* area = registered_area(call.input); area != nullptr) {
    const std::uint64_t bytes = std::uint64_t{call.tokens} * token_bytes;
    const auto offset =
        static_cast<std::uint64_t>(static_cast<const std::byte*>(call.input) - area->data);
    if (bytes > area->bytes - offset) {
      error = "the input (" + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
              ") crosses the end of its registered allocation of " + std::to_string(area->bytes) +
              " bytes; pass a view that lies inside it";
      return ARBITER_INVALID_ARGUMENT;
    }
    if (area->backend == b && w.memory != nullptr) {
      module_entered = true;
      return module_status(w.memory->run_registered(w.handle, &call, stream), *w.module, error);
    }
  } else if (g_registered_count.load(std::memory_order_relaxed) > registered.size()) {
    std::lock_guard lock(g_registered_mutex);
    for (const auto& [owner, other] : g_registered) {
      const auto* p = static_cast<const std::byte*>(call.input);
      if (owner != this && p >= other.data && p < other.data + other.bytes) {
        error =
            "the input lies in memory registered with another communicator; allocate it with "
            "this communicator's (arbiter_comm_alloc, alloc_registered(), Python's empty()), or "
            "copy it into unregistered memory";
        return ARBITER_INVALID_ARGUMENT;
      }
    }
  }
  const std::uint64_t cap = capacity(b, static_cast<Algorithm>(call.algorithm));
  const std::uint64_t per_slice = token_bytes == 0 ? call.tokens : cap / token_bytes;
  if (std::uint64_t{call.tokens} * token_bytes <= cap || per_slice >= call.tokens) {
    module_entered = true;
    return module_status(w.module->run(w.handle, &call, stream), *w.module, error);
  }
  if (per_slice == 0 || call.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    error = "one token of " + std::to_string(token_bytes) + " bytes does not fit the " +
            std::string(backend_name(b)) + " workspace (" + std::to_string(cap) +
            " bytes per call); create the communicator with the real hidden size";
    return ARBITER_UNSUPPORTED;
  }
  std::int32_t status = ARBITER_OK;
  module_entered = true;
  common::for_each_token_slice(call, per_slice, [&](const arbiter_allreduce_args& slice) {
    status = module_status(w.module->run(w.handle, &slice, stream), *w.module, error);
    return status == ARBITER_OK;
  });
  return status;
}

Decision Communicator::decide(const arbiter_allreduce_args& args) const noexcept {
  return impl_->decide(args, 0);
}

Communicator::Result Communicator::allreduce_fusion(const arbiter_allreduce_args& args,
                                                    void* stream) noexcept {
  Result result;
  const std::uint64_t call = impl_->calls++;
  impl_->module_entered = false;
  bool checked = false;
  try {
    if (impl_->faults.armed()) impl_->faults.at("call.start", impl_->oob.rank, call);
    if (impl_->refuse_if_faulted(result)) return result;
    if (!refuse_host_flags(args, result)) {
      if (impl_->check_calls && !impl_->check_call(args, call, result)) {
        impl_->note(result, call);
        return result;
      }
      checked = true;
      result = impl_->dispatch(args, stream);
    }
  } catch (const std::exception& e) {
    result.status = ARBITER_INTERNAL;
    result.error = e.what();
  }
  impl_->join_if_refused(result, call, checked);
  impl_->note(result, call);
  return result;
}

Communicator::Result Communicator::join_refused_call() noexcept {
  Result result;
  const std::uint64_t call = impl_->calls++;
  try {
    if (impl_->refuse_if_faulted(result)) return result;
    std::string why;
    result.status = impl_->join_refused(call, /*checked=*/false, why);
    if (result.status != ARBITER_OK) {
      result.error = "joining call " + std::to_string(call) +
                     " (refused on this rank) to tell the peers failed: " + why;
    }
  } catch (const std::exception& e) {
    result.status = ARBITER_INTERNAL;
    result.error = e.what();
  }
  impl_->note(result, call);
  return result;
}

void Communicator::Impl::join_if_refused(Result& result, std::uint64_t call,
                                         bool checked) noexcept {
  if (result.status == ARBITER_OK || module_entered) return;
  try {
    std::string why;
    const arbiter_status joined = join_refused(call, checked, why);
    if (joined == ARBITER_OK) return;
    result.error += "; then joining the call to tell the peers " +
                    std::string(fault_words(joined)) + ": " + why;
    result.status = joined;
  } catch (...) {
    // Out of memory: the refusal stands; the peers learn of it at their
    // deadline.
  }
}

arbiter_status Communicator::Impl::join_refused(std::uint64_t call, bool checked,
                                                std::string& why) {
  if (oob.size == 1) return ARBITER_OK;
  if (check_calls && !checked) {
    Result exchanged;
    if (check_call(arbiter_allreduce_args{}, call, exchanged, /*refused=*/true)) {
      return ARBITER_OK;
    }
    // A difference the peers saw as this one: told. Anything else (the
    // exchange failed, or the ranks' calls are out of step) is a fault.
    if (exchanged.status == ARBITER_MISMATCH && !faulted) return ARBITER_OK;
    why = exchanged.error;
    return exchanged.status;
  }
  const int f = static_cast<int>(fallback());
  const Workspace& w = workspaces[f];
  if (!((usable >> f) & 1u) || !((joins_refusals >> f) & 1u) || w.module == nullptr) {
    return ARBITER_OK;
  }
  arbiter_allreduce_args refused{};
  refused.flags = ARBITER_RUN_REFUSED;
  return module_status(w.module->run(w.handle, &refused, nullptr), *w.module, why);
}

Communicator::Result Communicator::Impl::dispatch(const arbiter_allreduce_args& args,
                                                  void* stream) {
  Result result;
  {
    std::array<std::string, kBackendCount> declined;  // empty unless one declines
    // A value that names no pattern or dtype is the caller's bug, not a
    // shape that no backend runs here. Checked before anything reads the
    // field as its enum type (undefined for such a value).
    if (const std::int64_t p = common::raw_enum(args.pattern); p < 0 || p >= kPatternCount) {
      result.status = ARBITER_INVALID_ARGUMENT;
      result.error = refusal(args, 0, declined);
      return result;
    }
    if (const std::int64_t dtype = common::raw_enum(args.dtype); !common::is_valid_dtype(dtype)) {
      result.status = ARBITER_INVALID_ARGUMENT;
      // As the C caller wrote it (an int in an enum field).
      result.error = "unknown dtype " + std::to_string(static_cast<std::int32_t>(dtype)) +
                     " (0 fp16, 1 bf16, 2 fp32)";
      return result;
    }
    // A norm call without residual_in skips the modules that need one; the
    // policy takes its next choice (refusal() says why, if none is left).
    std::uint32_t excluded = without_residual(args) ? residual_required : 0;
    for (int attempt = 0; attempt <= kBackendCount; ++attempt) {
      const Decision d = decide(args, excluded);
      result.decision = d;
      if (d.backend == Backend::kNone) {
        // Depends only on the call's shape and what every rank shares: every
        // rank refuses alike, before anything is enqueued.
        result.status = ARBITER_UNSUPPORTED;
        result.error = refusal(args, excluded, declined);
        return result;
      }
      arbiter_allreduce_args call = args;
      call.algorithm = static_cast<arbiter_algorithm>(d.algorithm);
      const std::int32_t status = run_in_slices(d.backend, call, stream, result.error);
      if (status != ARBITER_UNSUPPORTED) {
        result.status = static_cast<arbiter_status>(status);
        return result;
      }
      // The backend declined this shape (the same way on every rank): the
      // policy's next choice.
      declined[static_cast<int>(d.backend)] = std::move(result.error);
      result.error.clear();
      excluded |= 1u << static_cast<int>(d.backend);
    }
    result.status = ARBITER_INTERNAL;
    result.error = "no backend accepted the call";
  }
  return result;
}

Communicator::Result Communicator::run_on(Backend backend, Algorithm algorithm,
                                          const arbiter_allreduce_args& args,
                                          void* stream) noexcept {
  Result result;
  const std::uint64_t call = impl_->calls++;
  impl_->module_entered = false;
  bool checked = false;
  try {
    if (impl_->refuse_if_faulted(result)) return result;
    // First, before any local refusal: the exchange is collective.
    if (!refuse_host_flags(args, result)) {
      if (impl_->check_calls && !impl_->check_call(args, call, result)) {
        impl_->note(result, call);
        return result;
      }
      checked = true;
    }
    // A refusal here still reaches the peers (join_if_refused(), below).
    if (checked)
      [&] {
        const int i = static_cast<int>(backend);
        if (i < 0 || i >= kBackendCount || static_cast<int>(algorithm) > 2) {
          result.status = ARBITER_INVALID_ARGUMENT;
          result.error = "run_on: unknown backend or algorithm";
          return;
        }
        const bool unfused = backend == impl_->fallback() && algorithm == Algorithm::kNative;
        result.decision.backend = backend;
        result.decision.algorithm = algorithm;
        result.decision.fused = !unfused;
        const std::string name(backend_name(backend));
        // Every check below reads only the shape and what every rank shares.
        if (!((impl_->usable >> i) & 1u)) {
          result.status = ARBITER_UNSUPPORTED;
          result.error = name + " has no workspace: " + impl_->no_workspace[i];
          return;
        }
        const auto p = static_cast<std::uint32_t>(common::raw_enum(args.pattern));
        if (p >= kPatternCount || !((impl_->patterns[i] >> p) & 1u)) {
          result.status = ARBITER_UNSUPPORTED;
          result.error = name + "'s workspace does not run " + pattern_label(p) + " (it runs " +
                         pattern_names(impl_->patterns[i]) + ")";
          return;
        }
        if (impl_->without_residual(args) && ((impl_->residual_required >> i) & 1u)) {
          result.status = ARBITER_UNSUPPORTED;
          result.error = name + " needs residual_in for " + pattern_label(p) +
                         " (its module does not set ARBITER_CAPS_RESIDUAL_OPTIONAL): pass a "
                         "residual tensor, or run it on a backend that accepts none";
          return;
        }
        arbiter_allreduce_args call_args = args;
        call_args.algorithm = static_cast<arbiter_algorithm>(algorithm);
        const std::uint64_t bytes =
            Request::message_bytes_of(args.tokens, args.hidden, static_cast<Dtype>(args.dtype));
        const std::uint64_t capacity = impl_->capacity(backend, algorithm);
        if (!unfused && bytes > capacity && !impl_->streamed_by(args.input, backend)) {
          result.status = ARBITER_UNSUPPORTED;
          result.error = "a message of " + std::to_string(bytes) + " bytes exceeds the " + name +
                         " workspace's " + std::string(algorithm_name(algorithm)) +
                         " capacity of " + std::to_string(capacity) +
                         " bytes per call (create the communicator with a larger "
                         "fused_workspace_bytes)";
          return;
        }
        result.status = static_cast<arbiter_status>(
            impl_->run_in_slices(backend, call_args, stream, result.error));
      }();
  } catch (const std::exception& e) {
    result.status = ARBITER_INTERNAL;
    result.error = e.what();
  }
  impl_->join_if_refused(result, call, checked);
  impl_->note(result, call);
  return result;
}

std::string Communicator::Impl::refusal(
    const arbiter_allreduce_args& args, std::uint32_t excluded,
    const std::array<std::string, kBackendCount>& declined) const {
  const auto p = static_cast<std::uint32_t>(common::raw_enum(args.pattern));
  if (p >= kPatternCount) {
    return "unknown pattern " + std::to_string(static_cast<std::int32_t>(p)) +
           " (0 allreduce ... " + std::to_string(kPatternCount - 1) + " residual_rmsnorm_fp4)";
  }
  const std::string pname = pattern_label(p);
  const std::uint64_t bytes =
      Request::message_bytes_of(args.tokens, args.hidden, static_cast<Dtype>(args.dtype));
  std::string out = "no backend can run this " + pname + " call (" + std::to_string(bytes) +
                    " bytes) on capability " + capability_name(options.capability) + " with " +
                    std::to_string(oob.size) + " rank(s)";
  if (!((asked_patterns >> p) & 1u)) {
    return out + ": the communicator was created for " + pattern_names(asked_patterns) +
           " only; create it with " + pname + " in pattern_mask (Python: patterns=)";
  }
  // What the tables alone would choose, then why each candidate cannot.
  const Decision d = tables_policy.decide(request_for(args, 0));
  std::string why;
  switch (d.reason) {
    case Reason::kFused:
      break;
    case Reason::kAboveCap:
      why = "above the fused cap of " + std::to_string(d.cap) + " bytes";
      break;
    case Reason::kNoFusionCell:
      why = "no fusion cell for this capability and world size";
      break;
    case Reason::kFusionOff:
      why = "fusion is off in the matching cell";
      break;
    case Reason::kNoEligibleBackend:
      why = "no preferred backend is eligible for it";
      break;
    case Reason::kNoBackend:
      why = "no backend of the tables is eligible for it";
      break;
    case Reason::kInvalidRequest:
      why = "an invalid request";
      break;
  }
  if (d.fused) {
    out += ": the tables choose " + std::string(backend_name(d.backend)) + " " +
           std::string(algorithm_name(d.algorithm));
  } else if (d.backend != Backend::kNone) {
    out += ": the tables send it to the fallback " + std::string(backend_name(d.backend)) + " (" +
           why + ")";
  } else {
    out += ": " + why;
  }
  for (Backend b : candidates) {
    const int i = static_cast<int>(b);
    out += "; " + std::string(backend_name(b)) + ": ";
    if (!((usable >> i) & 1u)) {
      out += no_workspace[i];
    } else if (!((patterns[i] >> p) & 1u)) {
      out +=
          "does not run " + pname + " on this device (it runs " + pattern_names(patterns[i]) + ")";
    } else if (without_residual(args) && ((residual_required >> i) & 1u)) {
      out += "needs residual_in for " + pname +
             " (its module does not set ARBITER_CAPS_RESIDUAL_OPTIONAL): pass a residual "
             "tensor, or load a module that accepts none";
    } else if (!declined[i].empty()) {
      out += "declined the call: " + declined[i];
    } else if ((excluded >> i) & 1u) {
      out += "declined the call";
    } else {
      out += "not chosen by the tables for this call";
    }
  }
  return out;
}

Communicator::Result Communicator::alloc_registered(std::uint64_t bytes, void** data) noexcept {
  Result result;
  try {
    if (data != nullptr) *data = nullptr;
    if (impl_->refuse_if_faulted(result)) return result;
    if (data == nullptr) {
      result.status = ARBITER_INVALID_ARGUMENT;
      result.error = "alloc_registered: data is NULL";
      return result;
    }
    // 0 bytes goes to the module, which refuses it on every rank at once
    // (refused here alone, the peers would wait out their deadline).
    // The same backend on every rank: candidates and workspaces agree.
    for (Backend b : impl_->candidates) {
      const Workspace& w = impl_->workspaces[static_cast<int>(b)];
      if (w.handle == nullptr || w.memory == nullptr) continue;
      void* local = nullptr;
      const arbiter_status status =
          module_status(w.memory->alloc(w.handle, bytes, &local), *w.module, result.error);
      if (status != ARBITER_OK) {
        result.status = status;
        // A collective that timed out leaves the ranks out of step: later
        // calls fail at once, as after a failed call. Not ARBITER_PEER_FAILED:
        // modules also return it on every other rank when one rank's own
        // allocation failed (the ranks still in step, and that rank told
        // UNAVAILABLE); a peer that is really gone fails the next call.
        if (result.status != ARBITER_PEER_FAILED) impl_->note(result, std::nullopt);
        return result;
      }
      const RegisteredArea area{static_cast<const std::byte*>(local), bytes, b,
                                impl_->registered_made++};
      impl_->registered.push_back(area);
      {
        std::lock_guard lock(g_registered_mutex);
        g_registered.emplace_back(impl_.get(), area);
        g_registered_count.fetch_add(1, std::memory_order_relaxed);
      }
      result.decision.backend = b;
      *data = local;
      return result;
    }
    result.status = ARBITER_UNSUPPORTED;
    result.error =
        "no backend of this communicator allocates registered memory (ABI v2; `arbiter plugins` "
        "says which modules do); use ordinary memory";
  } catch (const std::exception& e) {
    result.status = ARBITER_INTERNAL;
    result.error = e.what();
  }
  return result;
}

Communicator::Result Communicator::free_registered(void* data) noexcept {
  Result result;
  try {
    auto& areas = impl_->registered;
    const auto at = std::find_if(areas.begin(), areas.end(),
                                 [&](const RegisteredArea& a) { return a.data == data; });
    if (at == areas.end()) {
      result.status = ARBITER_INVALID_ARGUMENT;
      result.error =
          "free_registered: not the start of a registered allocation of this communicator "
          "(freed twice, a view into one, or another communicator's)";
      return result;
    }
    const Workspace& w = impl_->workspaces[static_cast<int>(at->backend)];
    const arbiter_status status =
        module_status(w.memory->free(w.handle, data), *w.module, result.error);
    if (status != ARBITER_OK) {
      result.status = status;
      return result;
    }
    impl_->forget_registered(data);
    areas.erase(at);
  } catch (const std::exception& e) {
    result.status = ARBITER_INTERNAL;
    result.error = e.what();
  }
  return result;
}

const Policy& Communicator::policy() const { return impl_->policy; }
int Communicator::rank() const { return impl_->oob.rank; }
int Communicator::world_size() const { return impl_->oob.size; }
std::uint32_t Communicator::usable_mask() const { return impl_->usable; }
std::uint32_t Communicator::pattern_mask() const {
  std::uint32_t mask = 0;
  for (std::uint32_t m : impl_->patterns) mask |= m;
  return mask;
}
std::uint32_t Communicator::patterns_of(Backend backend) const {
  const int i = static_cast<int>(backend);
  return i >= 0 && i < kBackendCount ? impl_->patterns[i] : 0;
}
bool Communicator::shared_gpu_test() const { return impl_->shared_gpu_test; }
const WorkspaceFootprint& Communicator::footprint_of(Backend backend) const {
  static const WorkspaceFootprint kNoWorkspace;
  const int i = static_cast<int>(backend);
  if (i < 0 || i >= kBackendCount || !((impl_->usable >> i) & 1u)) return kNoWorkspace;
  return impl_->workspaces[i].footprint;
}

std::vector<WorkspaceFootprint> Communicator::footprint() const {
  std::vector<WorkspaceFootprint> figures;
  for (int i = 0; i < kBackendCount; ++i) {
    if ((impl_->usable >> i) & 1u) figures.push_back(impl_->workspaces[i].footprint);
  }
  return figures;
}
const std::vector<std::string>& Communicator::dropped() const { return impl_->dropped; }

}  // namespace arbiter
