// A communicator: the ranks of one all-reduce group, agreed on one policy and
// one set of backends, with a workspace per backend the policy may choose.
//
// Creation and destruction are collective over the oob (every rank, same
// order). allreduce_fusion() decides with the policy and dispatches; a backend
// that failed to initialise, or whose workspace is too small for a message,
// is skipped for the policy's next choice (finally the fallback).
//
// Patterns: each backend is asked only for the patterns it runs on every
// rank's device (its probe's caps), among those the options ask for. A
// pattern that no usable backend runs (NVFP4 below capability 100, say) does
// not stop creation; its calls are refused, on every rank alike, with an
// error naming the pattern, the capability and why each backend cannot.
//
// World size 1 works like any other: nothing is fused (the tables have no
// cell below 2 ranks), and the fallback runs the epilogue on this rank.
//
// Shared-GPU test mode (ARBITER_TEST_SHARED_GPU=1, for arbiter's own tests
// and examples on a machine with fewer GPUs than ranks): the GPU modules
// accept ranks of different processes on one GPU, and creation drops every
// backend that cannot (NCCL refuses two ranks on one GPU), saying so once on
// rank 0. The fallback may then be missing: calls the fused backends cannot
// take are refused per call, with the mode named in the error. Every rank
// must run in the mode, or none.
//
// Faults. A call that fails with ARBITER_TIMEOUT, ARBITER_PEER_FAILED,
// ARBITER_ABORTED or ARBITER_INTERNAL leaves the communicator unusable:
// every later call returns at once with that status and the first error,
// and the destructor no longer waits on any peer (it aborts every workspace
// first, so a dead rank cannot hold up teardown). The shm backend notices a
// dead peer process on this host within milliseconds while a call waits,
// and names it. A GPU communicator, whose kernels rather than the host wait
// on peers, watches from a thread (peer_watch.h, every 100 ms) the peers'
// processes on this host and the host's fault board, where each rank posts
// its abort() or the failure that left it unusable (fault_board.h): when a
// peer dies or posts, it aborts every workspace (the kernels stop waiting)
// and later calls return ARBITER_PEER_FAILED naming the rank. abort(), from
// any thread, makes a waiting call return ARBITER_ABORTED (shm: within a
// few milliseconds) and its peers ARBITER_PEER_FAILED (GPU peers on this
// host: within 100-200 ms); GPU kernels waiting on a peer stop waiting.
// After a fault the survivors create a new communicator over their own group.
//
// Calls that differ across ranks. Every rank must make the same calls in
// the same order (only the data differs). A call whose signature differs on
// some rank (tokens, hidden, pattern, dtype, eps, weight_bias, flags, which
// buffers are given: arbiter/common/call_signature.h) is refused on every
// rank with ARBITER_MISMATCH, naming the field and the ranks, before any
// output is written; the communicator stays usable. The shm backend always
// checks, at no measurable cost (the signature rides on the flag its
// algorithms exchange anyway). For the GPU backends the check is a mode
// (options.check_calls, or ARBITER_CHECK_CALLS=1): before each call every
// rank all-gathers the call's signature through the oob, one exchange per
// call (tens of microseconds through the UCX bootstrap), which is why it
// is off by default; arbiter's own test suites switch it on. Under CUDA
// graph capture the check runs once, at capture. What a refused, failed or
// aborted call leaves in its outputs: refused (ARBITER_MISMATCH,
// ARBITER_UNSUPPORTED, ARBITER_INVALID_ARGUMENT): untouched; failed or
// aborted: unspecified.
//
// Thread-safety: one thread at a time per communicator (the rank's), except
// abort(), which any thread may call while the communicator exists.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "arbiter/footprint.h"
#include "arbiter/policy.h"
#include "arbiter/registry.h"
#include "arbiter_backend.h"

namespace arbiter {

struct CommunicatorOptions {
  Capability capability;  // this rank's device; every rank must agree
  std::uint32_t nodes = 1;
  // NVLink among all ranks: the default, right for one node; across nodes
  // only for a multi-node NVLink domain (an NVL72 rack). C and Python
  // default to auto: NVLink on one node, none across nodes.
  bool nvlink_domain = true;
  bool multicast = false;
  int device = -1;  // CUDA ordinal (LOCAL_RANK, never RANK); -1 for CPU ranks
  // The largest call the framework will make, to size fallback workspaces;
  // 0 (unknown): workspaces hold what the tables fuse, and the fallback runs
  // larger calls in slices.
  std::uint32_t max_tokens = 0;
  // Elements per token of the widest call; creation refuses 0 (workspaces
  // are sized from it). A call may pass a narrower hidden.
  std::uint32_t hidden = 0;
  Dtype dtype = Dtype::kBf16;
  // The patterns calls will use: bit (1 << Pattern); 0 or kAllPatterns (the
  // default) asks for every pattern. Fused workspaces are sized for the
  // largest fused cap among them; a call of another pattern is refused.
  std::uint32_t pattern_mask = kAllPatterns;
  static constexpr std::uint32_t kAllPatterns = (1u << kPatternCount) - 1;
  std::chrono::milliseconds timeout{60000};
  // 0 (the default): fused workspaces hold the policy's max_fused_bytes, as
  // a framework needs. N > 0: every workspace holds at least N bytes per
  // rank per call, and the fused backends of the topology's preference list
  // get one even where the tables fuse nothing (no cell, or `off`), so that
  // run_on() can measure what a table lacks (`arbiter bench`). Memory grows
  // with N for trtllm (three one-shot stages of world size x N per GPU); shm
  // stops at (3 x world size + 5) x 1 MiB in /dev/shm and streams the rest.
  std::uint64_t fused_workspace_bytes = 0;
  // The check mode (see above): each call's signature is all-gathered
  // through the oob before it runs. Also on when ARBITER_CHECK_CALLS=1.
  // Every rank must agree (creation checks).
  bool check_calls = false;
};

// Thrown by the constructor; every rank throws (creation is all or nothing).
class CommunicatorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  // Collective. `oob` and `registry` must outlive the communicator.
  Communicator(const arbiter_oob& oob, Policy policy, const Registry& registry,
               const CommunicatorOptions& options);
  ~Communicator();  // collective: destroys every workspace
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  struct Result {
    arbiter_status status = ARBITER_OK;
    Decision decision;  // what ran (its trace is empty)
    std::string error;  // when status != ARBITER_OK
  };
  // One fused all-reduce; args.algorithm is ignored (the policy picks it).
  // Never throws.
  Result allreduce_fusion(const arbiter_allreduce_args& args, void* stream) noexcept;

  // A call this rank refused before calling arbiter (a binding's own
  // checks), joined so that the peers' call is refused too; counts as a
  // call. allreduce_fusion() and run_on() join their own refusals.
  // arbiter_comm_join_refused (arbiter.h) says when it reaches the peers.
  Result join_refused_call() noexcept;

  // The decision allreduce_fusion() would take, without running it.
  Decision decide(const arbiter_allreduce_args& args) const noexcept;

  // One call on `backend` with `algorithm`, bypassing the policy: what
  // `arbiter bench` measures. The fallback backend with kNative runs the
  // unfused path (in slices when the message exceeds its workspace, as
  // allreduce_fusion() would); anything else is a fused call and is never
  // sliced. args.algorithm is ignored. result.decision names the backend,
  // algorithm and fused-ness that ran (its reason and cap are not set).
  //
  // ARBITER_UNSUPPORTED, with the reason in result.error, when the backend
  // cannot take the call: it has no workspace here (not allowed by the
  // tables or ARBITER_BACKENDS, unavailable, not a candidate for this
  // topology, or its creation failed: the reason says which), the message
  // exceeds its workspace's per-call capacity, or the module's guards
  // refuse the shape (the module's message). Every such refusal depends only
  // on the call's shape and on what all ranks share (workspaces are created
  // collectively; module guards read the shape and the workspace), so it
  // happens identically on every rank before any rank enqueues anything.
  // A call refused on one rank only is joined (arbiter_comm_join_refused).
  // Collective (every rank, same arguments but the buffers). Never throws.
  Result run_on(Backend backend, Algorithm algorithm, const arbiter_allreduce_args& args,
                void* stream) noexcept;

  // Registered memory (ABI v2, docs/registered-buffers.md). Collective:
  // every rank, same order, same bytes. Allocates `bytes` per rank from the
  // first usable backend whose module has the registered-memory companion
  // (on CPU ranks, shm), in memory every rank maps; *data is this rank's
  // part, aligned to at least 4096 bytes on shm. A call whose input lies in
  // it (at the same offset on every rank) and that the policy sends to that
  // backend reads the peers' inputs in place; any other call works as
  // before. ARBITER_UNSUPPORTED when no backend can; nothing allocated.
  Result alloc_registered(std::uint64_t bytes, void** data) noexcept;
  // Local, never waits on a peer (peers' views stay valid). `data` exactly
  // as alloc_registered() returned it: anything else is
  // ARBITER_INVALID_ARGUMENT, nothing freed. The destructor frees what is
  // left; pointers into it dangle afterwards.
  Result free_registered(void* data) noexcept;

  // Thread-safe: any thread, any number of times, while the communicator
  // exists (not concurrently with its destructor). Aborts every workspace
  // (the modules' arbiter_backend_v1_faults): a call waiting on a peer
  // returns ARBITER_ABORTED, peers waiting on this rank return
  // ARBITER_PEER_FAILED naming it (GPU ranks: those on this host, within
  // 100-200 ms; on other hosts, at their deadline), every later call returns
  // ARBITER_ABORTED at once, and the destructor waits on no peer.
  // Never throws, never blocks on a peer.
  void abort() noexcept;
  // Whether abort() was called or a call failed in a way that left the
  // communicator unusable (see above).
  bool faulted() const;
  // Whether the check mode is on.
  bool check_calls() const;

  const Policy& policy() const;
  int rank() const;
  int world_size() const;
  // Backends with a workspace on every rank: bit (1 << Backend).
  std::uint32_t usable_mask() const;
  // Patterns some usable backend runs on every rank: bit (1 << Pattern).
  std::uint32_t pattern_mask() const;
  // Patterns `backend`'s workspace runs (0 without a workspace).
  std::uint32_t patterns_of(Backend backend) const;
  // Whether the shared-GPU test mode was on at creation.
  bool shared_gpu_test() const;
  // What each usable backend's workspace costs this rank (in Backend
  // order), as its module sized it from the spec it was created with.
  std::vector<WorkspaceFootprint> footprint() const;
  // One backend's figure, kept for the communicator's life (backend.known
  // false and backend kNone when it has no workspace).
  const WorkspaceFootprint& footprint_of(Backend backend) const;
  // Why each backend the policy could choose was dropped, one line each.
  const std::vector<std::string>& dropped() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbiter
