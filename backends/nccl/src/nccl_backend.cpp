// C entry points of the nccl backend (libarbiter-nccl.so).
//
// run() = ncclAllReduce(sum) on the caller's stream, then, for the norm
// patterns, one kernel of ours (epilogue.cuh) for residual add + RMSNorm
// (+ FP8, or NVFP4 from capability 100 on). Calls are admitted on the host
// first (arbiter/nccl/call_rules.h). Every entry point catches everything
// and maps it to an ABI code.
//
// Creation and teardown are bounded by spec->timeout_ms: the communicator is
// created non-blocking and polled against that deadline, so a peer that dies
// during ncclCommInitRank cannot hang the others forever. The same deadline
// bounds a collective that NCCL reports as still being enqueued
// (ncclInProgress, e.g. while it connects lazily to peers) and the finalise
// of workspace_destroy (then the communicator is aborted; NCCL makes abort
// and destroy blocking even for non-blocking communicators). timeout_ms <= 0
// means no deadline. Each wait gets the whole timeout: creation can take up
// to three of them (two oob exchanges and the NCCL init). What no deadline
// covers is a peer that dies after a collective was enqueued: the GPU work
// then waits on the stream, as in any NCCL program.
//
// abort() (the faults companion) may come from any thread while run() is in
// NCCL on the rank's own: it marks the workspace aborted (run() and a
// pending settle loop stop at once), then, holding the workspace's mutex
// (so that no other NCCL call on the communicator is in flight),
// ncclCommAbort()s it: NCCL's kernels poll NCCL's own host-mapped abort
// flag and exit, the communicator is freed, and every later run() returns
// ARBITER_ABORTED. Teardown is then local.
//
// run() allocates nothing itself, but NCCL connects to peers lazily on the
// first collective of each algorithm (NCCL_RUNTIME_CONNECT=1, the default),
// which allocates: run every shape once before CUDA-graph capture, or set
// NCCL_RUNTIME_CONNECT=0.
#include <nccl.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "arbiter/common/collective.h"
#include "arbiter/common/cuda_host.h"
#include "arbiter/common/deadline.h"
#include "arbiter/nccl/call_rules.h"
#include "arbiter_backend.h"
#include "epilogue_launch.h"

// One rank's communicator and scratch. Used by one thread at a time.
struct arbiter_workspace {
  ncclComm_t comm = nullptr;
  int device = 0;
  int32_t world_size = 0;
  int32_t rank = 0;
  uint32_t pattern_mask = 0;
  // Patterns every rank's device can run (the norm ones need a kernel built
  // for it, NVFP4 also capability >= 100).
  uint32_t device_patterns = 0;
  uint32_t capability = 0;      // this rank's device
  uint32_t min_capability = 0;  // the lowest over the ranks
  int64_t timeout_ms = 0;
  // Destination of the sum when neither allreduce_out nor residual_out can
  // take it (both are residual_in, or absent), and where the epilogue keeps
  // x when the caller gave no residual_out; messages larger than it run in
  // chunks of whole tokens, on every rank alike.
  void* scratch = nullptr;
  uint64_t scratch_bytes = 0;
  // Set when NCCL reported an error: the communicator is aborted, never
  // finalised, and run() refuses to use it.
  bool broken = false;
  std::string broken_reason;
  // abort() from any thread: set first, then the communicator is aborted
  // under `mutex`, which run() holds while it calls NCCL.
  std::atomic<bool> aborted{false};
  std::mutex mutex;
};

namespace {

using arbiter::common::cuda_message;
using arbiter::common::device_capability;
using arbiter::common::DeviceScope;
using arbiter::common::put_reason;
using arbiter::common::reason_of;
using arbiter::nccl::element_bytes;
using arbiter::nccl::known_dtype;
using arbiter::nccl::kSupportedDtypes;
using arbiter::nccl::kSupportedPatterns;
using arbiter::nccl::scratch_bytes_for;

// ncclConfig_t.blocking and ncclCommGetAsyncError: NCCL 2.14.
constexpr int kMinNcclVersion = 21400;

thread_local std::string t_last_error;

struct Status {
  int32_t code = ARBITER_OK;
  std::string message;
  bool ok() const { return code == ARBITER_OK; }
};

Status error(int32_t code, std::string message) { return Status{code, std::move(message)}; }

Status from_common(const arbiter::common::Status& s) { return Status{s.code(), s.message()}; }

int32_t report(const Status& s) {
  if (!s.ok()) t_last_error = "nccl: " + s.message;
  return s.code;
}

std::string nccl_message(const char* what, ncclResult_t r, ncclComm_t comm) {
  std::string m = std::string(what) + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') m += std::string(" (") + last + ")";
  return m;
}

class Deadline {
 public:
  // timeout_ms <= 0: no deadline.
  explicit Deadline(int64_t timeout_ms)
      : bounded_(timeout_ms > 0), end_(arbiter::common::deadline_after(timeout_ms)) {}
  bool passed() const { return bounded_ && std::chrono::steady_clock::now() >= end_; }

 private:
  bool bounded_;
  std::chrono::steady_clock::time_point end_;
};

// Polls a non-blocking communicator until `r` is no longer ncclInProgress.
// Returns ncclInProgress when the deadline passed first, or `aborted` (if
// given) was set.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, const Deadline& deadline,
                    const std::atomic<bool>* aborted = nullptr) {
  for (int polls = 0; r == ncclInProgress; ++polls) {
    if (deadline.passed()) return ncclInProgress;
    if (aborted != nullptr && aborted->load(std::memory_order_acquire)) return ncclInProgress;
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    const ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) return q;
  }
  return r;
}

ncclDataType_t nccl_dtype(arbiter_dtype d) {
  switch (d) {
    case ARBITER_DTYPE_FP16:
      return ncclFloat16;
    case ARBITER_DTYPE_BF16:
      return ncclBfloat16;
    default:
      return ncclFloat32;
  }
}

#ifndef ARBITER_NCCL_KERNEL_ARCHS
#define ARBITER_NCCL_KERNEL_ARCHS ""
#endif

uint32_t patterns_for(uint32_t capability) {
  return arbiter::nccl::patterns_for(capability, ARBITER_NCCL_KERNEL_ARCHS);
}

// ---------------------------------------------------------------- probe

int32_t probe_impl(const arbiter_probe_args* args, arbiter_backend_caps* caps) {
  if (args == nullptr || caps == nullptr) {
    return report(error(ARBITER_INVALID_ARGUMENT, "probe: args and caps must not be NULL"));
  }
  if (args->device_kind != ARBITER_DEVICE_GPU) {
    return report(error(ARBITER_UNAVAILABLE, "serves GPU ranks only"));
  }
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    return report(error(ARBITER_UNAVAILABLE, "no CUDA driver (cudaDriverGetVersion reports none)"));
  }
  int count = 0;  // left unchanged by a failing cudaGetDeviceCount
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return report(error(ARBITER_UNAVAILABLE, std::string("no CUDA device: ") +
                                                 cudaGetErrorString(e) + " (driver " +
                                                 std::to_string(driver / 1000) + "." +
                                                 std::to_string(driver % 1000 / 10) + ")"));
  }
  if (count <= 0) return report(error(ARBITER_UNAVAILABLE, "no CUDA device: none visible"));
  if (args->device < 0 || args->device >= count) {
    return report(error(ARBITER_UNAVAILABLE, "no CUDA device " + std::to_string(args->device) +
                                                 ": " + std::to_string(count) + " visible"));
  }
  uint32_t capability = 0;
  if (const cudaError_t a = device_capability(args->device, &capability); a != cudaSuccess) {
    return report(error(ARBITER_UNAVAILABLE, cuda_message("cudaDeviceGetAttribute", a)));
  }
  int nccl_version = 0;
  const ncclResult_t v = ncclGetVersion(&nccl_version);
  if (v != ncclSuccess || nccl_version < kMinNcclVersion) {
    return report(error(ARBITER_UNAVAILABLE, "libnccl.so.2 reports version " +
                                                 std::to_string(nccl_version) +
                                                 "; need >= " + std::to_string(kMinNcclVersion)));
  }
  *caps = arbiter_backend_caps{};
  caps->device_kind = ARBITER_DEVICE_GPU;
  caps->capability = capability;
  caps->world_size_mask = arbiter::nccl::kWorldSizeMask;
  caps->dtype_mask = kSupportedDtypes;
  // Plain all-reduce needs only NCCL; the norm patterns need our kernel,
  // NVFP4 also capability >= 100.
  caps->pattern_mask = patterns_for(capability);
  caps->algorithm_mask = 1u << ARBITER_ALGORITHM_NATIVE;
  caps->flags = ARBITER_CAPS_RESIDUAL_OPTIONAL;
  return ARBITER_OK;
}

// ---------------------------------------------------------------- create

// "NCCL" + 1; bump with the layout of Hello or Outcome.
constexpr uint32_t kHelloMagic = 0x4e43434du;
constexpr size_t kReasonBytes = 240;

// Exchanged (all-gathered) before NCCL is touched: whether each rank is
// ready, the spec it was given, and rank 0's NCCL unique id.
struct Hello {
  uint32_t magic;
  int32_t status;
  int32_t world_size;
  uint32_t nodes;
  uint32_t max_tokens;
  uint32_t hidden;
  int32_t dtype;
  uint32_t pattern_mask;
  uint64_t max_message_bytes;
  ncclUniqueId id;
  char reason[kReasonBytes];
};

// Exchanged after the communicator and scratch exist.
struct Outcome {
  int32_t status;
  uint32_t device_patterns;  // what this rank's device can run
  uint32_t capability;       // of this rank's device
  char reason[kReasonBytes];
};

// The verdict every rank reaches alike from the same records.
template <typename Record>
Status verdict(const std::vector<Record>& all, int32_t self) {
  return from_common(arbiter::common::verdict(all, self));
}

std::string describe(const Hello& h) {
  return "world_size " + std::to_string(h.world_size) + ", nodes " + std::to_string(h.nodes) +
         ", max_tokens " + std::to_string(h.max_tokens) + ", hidden " + std::to_string(h.hidden) +
         ", dtype " + std::to_string(h.dtype) + ", pattern_mask " + std::to_string(h.pattern_mask) +
         ", max_message_bytes " + std::to_string(h.max_message_bytes);
}

// Ranks must agree on every field that shapes the scratch, the chunk plan or
// which patterns run(): otherwise one rank would enqueue collectives the
// others never match.
Status agreement(const std::vector<Hello>& all) {
  const Hello& a = all[0];
  for (size_t r = 1; r < all.size(); ++r) {
    const Hello& b = all[r];
    if (b.magic != a.magic) {
      return error(ARBITER_INVALID_ARGUMENT,
                   "rank " + std::to_string(r) + " runs a different build of this module");
    }
    if (b.world_size != a.world_size || b.nodes != a.nodes || b.max_tokens != a.max_tokens ||
        b.hidden != a.hidden || b.dtype != a.dtype || b.pattern_mask != a.pattern_mask ||
        b.max_message_bytes != a.max_message_bytes) {
      return error(ARBITER_INVALID_ARGUMENT, "ranks disagree on the workspace spec: rank 0 has " +
                                                 describe(a) + "; rank " + std::to_string(r) +
                                                 " has " + describe(b));
    }
  }
  return {};
}

Status local_checks(const arbiter_oob& oob, const arbiter_workspace_spec& spec) {
  if (spec.world_size != oob.size || spec.rank != oob.rank) {
    return error(ARBITER_INVALID_ARGUMENT,
                 "spec says rank " + std::to_string(spec.rank) + " of " +
                     std::to_string(spec.world_size) + ", the oob group says rank " +
                     std::to_string(oob.rank) + " of " + std::to_string(oob.size));
  }
  if (spec.device < 0) {
    return error(ARBITER_INVALID_ARGUMENT, "spec.device is " + std::to_string(spec.device) +
                                               "; the nccl backend needs a CUDA ordinal");
  }
  if (!known_dtype(spec.dtype)) {
    return error(ARBITER_UNSUPPORTED, "dtype " + std::to_string(spec.dtype) + " is not supported");
  }
  if ((spec.pattern_mask & ~kSupportedPatterns) != 0) {
    return error(ARBITER_UNSUPPORTED,
                 "pattern_mask " + std::to_string(spec.pattern_mask) +
                     " asks for patterns this backend does not implement (bits 0-3: allreduce, "
                     "residual_rmsnorm, residual_rmsnorm_fp8, residual_rmsnorm_fp4)");
  }
  return {};
}

Status exchange_failed(const arbiter_oob& oob, const char* what, int32_t rc) {
  return from_common(arbiter::common::exchange_failed(oob, what, rc));
}

// Tears a workspace down locally: abort when `abort` or the communicator is
// broken, otherwise finalise within the deadline (then abort) and destroy.
void release(arbiter_workspace& ws, bool abort) {
  DeviceScope scope;
  scope.use(ws.device);
  if (ws.comm != nullptr) {
    if (abort || ws.broken) {
      ncclCommAbort(ws.comm);
    } else {
      ncclResult_t r = ncclCommFinalize(ws.comm);
      r = settle(ws.comm, r, Deadline(ws.timeout_ms));
      if (r == ncclSuccess) {
        ncclCommDestroy(ws.comm);
      } else {
        ncclCommAbort(ws.comm);
      }
    }
    ws.comm = nullptr;
  }
  if (ws.scratch != nullptr) {
    cudaFree(ws.scratch);
    ws.scratch = nullptr;
  }
}

// Creates the communicator (non-blocking, polled against the deadline) and
// the scratch. On failure leaves nothing behind but `ws.comm` for release().
Status build(arbiter_workspace& ws, const arbiter_workspace_spec& spec, const ncclUniqueId& id) {
  uint32_t capability = 0;
  if (const cudaError_t e = device_capability(spec.device, &capability); e != cudaSuccess) {
    return error(ARBITER_UNAVAILABLE, cuda_message("cudaDeviceGetAttribute", e));
  }
  ws.capability = capability;
  ws.device_patterns = patterns_for(capability);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const Deadline deadline(spec.timeout_ms);
  ncclResult_t r = ncclCommInitRankConfig(&ws.comm, spec.world_size, id, spec.rank, &config);
  if (ws.comm != nullptr) r = settle(ws.comm, r, deadline);
  if (r == ncclInProgress) {
    ws.broken = true;
    return error(ARBITER_TIMEOUT, "ncclCommInitRank did not finish within " +
                                      std::to_string(spec.timeout_ms) +
                                      " ms (a peer may have died or not joined)");
  }
  if (r != ncclSuccess) {
    ws.broken = true;
    return error(r == ncclRemoteError ? ARBITER_PEER_FAILED : ARBITER_UNAVAILABLE,
                 nccl_message("ncclCommInitRank", r, ws.comm));
  }
  ws.scratch_bytes = scratch_bytes_for(spec);
  if (ws.scratch_bytes != 0) {
    const cudaError_t e = cudaMalloc(&ws.scratch, ws.scratch_bytes);
    if (e != cudaSuccess) {
      ws.scratch = nullptr;
      cudaGetLastError();
      return error(
          ARBITER_UNAVAILABLE,
          cuda_message(
              ("cudaMalloc(" + std::to_string(ws.scratch_bytes) + " bytes of scratch)").c_str(),
              e));
    }
  }
  return {};
}

int32_t create_impl(const arbiter_oob* oob, const arbiter_workspace_spec* spec,
                    arbiter_workspace** out) {
  if (out == nullptr) return report(error(ARBITER_INVALID_ARGUMENT, "out is NULL"));
  *out = nullptr;
  if (oob == nullptr || oob->allgather == nullptr || oob->last_error == nullptr) {
    return report(error(ARBITER_INVALID_ARGUMENT, "oob or its allgather/last_error is NULL"));
  }
  if (spec == nullptr) return report(error(ARBITER_INVALID_ARGUMENT, "spec is NULL"));
  if (oob->size <= 0 || oob->rank < 0 || oob->rank >= oob->size) {
    return report(error(ARBITER_INVALID_ARGUMENT, "oob says rank " + std::to_string(oob->rank) +
                                                      " of " + std::to_string(oob->size)));
  }
  const int64_t timeout = spec->timeout_ms;
  DeviceScope scope;

  // 1. Who is ready, with which spec, and rank 0's unique id.
  Hello mine{};
  mine.magic = kHelloMagic;
  mine.world_size = spec->world_size;
  mine.nodes = spec->nodes;
  mine.max_tokens = spec->max_tokens;
  mine.hidden = spec->hidden;
  mine.dtype = spec->dtype;
  mine.pattern_mask = spec->pattern_mask;
  mine.max_message_bytes = spec->max_message_bytes;
  Status local = local_checks(*oob, *spec);
  if (local.ok()) {
    const cudaError_t e = scope.use(spec->device);
    if (e != cudaSuccess) {
      local =
          error(ARBITER_UNAVAILABLE,
                cuda_message(("cudaSetDevice(" + std::to_string(spec->device) + ")").c_str(), e));
    }
  }
  if (local.ok() && oob->rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&mine.id);
    if (r != ncclSuccess)
      local = error(ARBITER_UNAVAILABLE, nccl_message("ncclGetUniqueId", r, nullptr));
  }
  mine.status = local.code;
  put_reason(mine, local.message);
  std::vector<Hello> hellos(static_cast<size_t>(oob->size));
  int32_t rc = oob->allgather(oob->ctx, &mine, hellos.data(), sizeof(Hello), timeout);
  if (rc != ARBITER_OK) return report(exchange_failed(*oob, "allgather", rc));
  Status s = verdict(hellos, oob->rank);
  if (s.ok()) s = agreement(hellos);
  if (!s.ok()) return report(s);

  // 2. The communicator and the scratch.
  auto ws = std::make_unique<arbiter_workspace>();
  ws->device = spec->device;
  ws->world_size = spec->world_size;
  ws->rank = spec->rank;
  ws->pattern_mask = spec->pattern_mask == 0 ? kSupportedPatterns : spec->pattern_mask;
  ws->timeout_ms = timeout;
  const Status built = build(*ws, *spec, hellos[0].id);

  // 3. Everyone learns whether everyone succeeded.
  Outcome outcome{};
  outcome.status = built.code;
  outcome.device_patterns = ws->device_patterns;
  outcome.capability = ws->capability;
  put_reason(outcome, built.message);
  std::vector<Outcome> outcomes(static_cast<size_t>(oob->size));
  rc = oob->allgather(oob->ctx, &outcome, outcomes.data(), sizeof(Outcome), timeout);
  if (rc != ARBITER_OK) {
    release(*ws, true);
    const Status lost = exchange_failed(*oob, "allgather", rc);
    // This rank's own failure (say, an init that timed out because a peer
    // died) explains more than the exchange that followed it.
    if (!built.ok()) return report(error(built.code, built.message + "; then " + lost.message));
    return report(lost);
  }
  s = verdict(outcomes, oob->rank);
  if (!s.ok()) {
    // Abort, not finalise: a finalise would wait for peers that gave up.
    release(*ws, true);
    return report(s);
  }
  // A pattern runs only where every rank can run it, so that no rank
  // refuses a call its peers have already enqueued.
  ws->min_capability = ws->capability;
  for (const Outcome& o : outcomes) {
    ws->device_patterns &= o.device_patterns;
    ws->min_capability = std::min(ws->min_capability, o.capability);
  }
  *out = ws.release();
  return ARBITER_OK;
}

// ---------------------------------------------------------------- run

Status check_args(const arbiter_workspace& ws, const arbiter_allreduce_args& a) {
  arbiter::nccl::CallRules rules;
  rules.pattern_mask = ws.pattern_mask;
  rules.device_patterns = ws.device_patterns;
  rules.capability = ws.capability;
  rules.min_capability = ws.min_capability;
  rules.kernel_archs = ARBITER_NCCL_KERNEL_ARCHS;
  return from_common(arbiter::nccl::check_call(rules, a));
}

// One ncclAllReduce, waited out when NCCL says it is still being enqueued.
Status all_reduce(arbiter_workspace& ws, const void* send, void* recv, size_t count,
                  arbiter_dtype dtype, cudaStream_t stream) {
  ncclResult_t r = ncclAllReduce(send, recv, count, nccl_dtype(dtype), ncclSum, ws.comm, stream);
  r = settle(ws.comm, r, Deadline(ws.timeout_ms), &ws.aborted);
  if (r == ncclSuccess) return {};
  if (ws.aborted.load(std::memory_order_acquire)) {
    return error(ARBITER_ABORTED, "aborted (abort()) while ncclAllReduce was being enqueued");
  }
  ws.broken = true;
  Status s = r == ncclInProgress
                 ? error(ARBITER_TIMEOUT, "ncclAllReduce was still being enqueued after " +
                                              std::to_string(ws.timeout_ms) + " ms")
                 : error(r == ncclRemoteError ? ARBITER_PEER_FAILED : ARBITER_INTERNAL,
                         nccl_message("ncclAllReduce", r, ws.comm));
  ws.broken_reason = s.message;
  return s;
}

int32_t run_impl(arbiter_workspace* ws, const arbiter_allreduce_args* args, void* stream_ptr) {
  if (ws == nullptr || args == nullptr) {
    return report(error(ARBITER_INVALID_ARGUMENT, "run: workspace and args must not be NULL"));
  }
  const arbiter_allreduce_args& a = *args;
  // abort() waits for NCCL calls on the communicator to end (NCCL allows
  // one thread on a communicator at a time). Held around NCCL calls only: a
  // launch of our own kernel can block while the stream is full behind an
  // NCCL kernel that waits for a dead peer, and abort() must then still
  // reach ncclCommAbort, which frees that kernel. A launch that blocks
  // inside ncclAllReduce itself (NCCL launches on the caller's thread once
  // connected) still holds abort() off until the stream drains.
  std::unique_lock<std::mutex> lock(ws->mutex);
  const auto aborted = [] {
    return report(error(ARBITER_ABORTED,
                        "the workspace was aborted (abort(): ncclCommAbort); destroy it and "
                        "create a new one"));
  };
  if (ws->aborted.load(std::memory_order_acquire) || ws->comm == nullptr) return aborted();
  Status s = check_args(*ws, a);
  if (!s.ok()) return report(s);
  if (ws->broken) {
    return report(error(ARBITER_INTERNAL,
                        "workspace unusable after an earlier NCCL failure: " + ws->broken_reason));
  }
  const uint64_t elt = element_bytes(a.dtype);
  const uint64_t row_bytes = uint64_t{a.hidden} * elt;
  uint64_t total_bytes = 0;
  if (__builtin_mul_overflow(row_bytes, uint64_t{a.tokens}, &total_bytes)) {
    return report(error(ARBITER_INVALID_ARGUMENT, "tokens x hidden overflows"));
  }
  if (a.tokens == 0) return ARBITER_OK;  // same on every rank: nothing to enqueue

  auto stream = static_cast<cudaStream_t>(stream_ptr);
  DeviceScope scope;
  if (const cudaError_t e = scope.use(ws->device); e != cudaSuccess) {
    return report(error(ARBITER_INTERNAL, cuda_message("cudaSetDevice", e)));
  }
  // One rank: the sum is the input, and NCCL has nothing to exchange (TP=1
  // runs the epilogue alone, one launch instead of two per chunk).
  const bool single = ws->world_size == 1;
  if (a.pattern == ARBITER_PATTERN_ALLREDUCE) {
    if (single) {
      if (a.allreduce_out == a.input) return ARBITER_OK;
      const cudaError_t e =
          cudaMemcpyAsync(a.allreduce_out, a.input, total_bytes, cudaMemcpyDeviceToDevice, stream);
      return e == cudaSuccess ? ARBITER_OK
                              : report(error(ARBITER_INTERNAL, cuda_message("cudaMemcpyAsync", e)));
    }
    return report(
        all_reduce(*ws, a.input, a.allreduce_out, uint64_t{a.tokens} * a.hidden, a.dtype, stream));
  }
  // Where the sum lands: allreduce_out when asked for, unless it is
  // residual_in (in place, aliasing.h: the epilogue must still read the
  // residual there, and then writes allreduce_out itself); else residual_out
  // (the epilogue then updates it in place), else the scratch when
  // residual_out is residual_in too or not given. The epilogue keeps x in
  // residual_out, or in the scratch when the caller gave none (over the sum
  // there, element by element, or beside a sum in allreduce_out). The choice
  // is local; the chunk plan below depends only on values every rank shares.
  const uint64_t chunk_tokens = ws->scratch_bytes / row_bytes;
  if (chunk_tokens == 0) {
    return report(error(ARBITER_UNSUPPORTED, "one token (" + std::to_string(row_bytes) +
                                                 " bytes) exceeds the workspace scratch (" +
                                                 std::to_string(ws->scratch_bytes) + " bytes)"));
  }
  enum class Dest { kAllreduceOut, kResidualOut, kScratch };
  const bool allreduce_out_is_residual = a.allreduce_out == a.residual_in;
  Dest dest = Dest::kScratch;
  if (a.allreduce_out != nullptr && !allreduce_out_is_residual) {
    dest = Dest::kAllreduceOut;
  } else if (a.residual_out != nullptr && a.residual_out != a.residual_in) {
    dest = Dest::kResidualOut;
  }
  auto at = [](const void* p, uint64_t offset) -> char* {
    return p == nullptr ? nullptr : const_cast<char*>(static_cast<const char*>(p)) + offset;
  };
  arbiter::nccl::EpilogueParams e;
  e.dtype = a.dtype;
  e.epilogue = arbiter::common::epilogue_of(a.pattern);
  const bool fp8 = e.epilogue == arbiter::common::Epilogue::kNormFp8;
  const bool fp4 = e.epilogue == arbiter::common::Epilogue::kNormFp4;
  e.hidden = a.hidden;
  e.gamma = a.gamma;
  e.eps = a.eps;
  e.weight_bias = a.weight_bias;
  e.scale = fp8 || fp4 ? a.scale : nullptr;
  // NVFP4 scale factors are addressed by the call's row (first_token below),
  // so a chunk may start anywhere, also inside a 128-row swizzle tile.
  e.scale_out = fp4 ? a.scale_out : nullptr;
  e.linear_scales = (a.flags & ARBITER_RUN_NVFP4_LINEAR_SCALES) != 0;
  e.pdl = (a.flags & ARBITER_RUN_PDL) != 0;
  for (uint64_t t0 = 0; t0 < a.tokens; t0 += chunk_tokens) {
    const uint64_t n = std::min<uint64_t>(chunk_tokens, a.tokens - t0);
    if (!lock.owns_lock()) {
      lock.lock();
      if (ws->aborted.load(std::memory_order_acquire) || ws->comm == nullptr) return aborted();
    }
    const uint64_t off = t0 * row_bytes;
    if (single) {
      // The epilogue reads the input as the sum (each thread reads an
      // element before it writes it, so any in-place output is safe) and
      // copies it to allreduce_out unless that is the input itself.
      e.sum = at(a.input, off);
      e.allreduce_out = a.allreduce_out == a.input ? nullptr : at(a.allreduce_out, off);
    } else {
      void* sum = dest == Dest::kAllreduceOut  ? at(a.allreduce_out, off)
                  : dest == Dest::kResidualOut ? at(a.residual_out, off)
                                               : ws->scratch;
      s = all_reduce(*ws, at(a.input, off), sum, n * a.hidden, a.dtype, stream);
      if (!s.ok()) return report(s);
      e.sum = sum;
      e.allreduce_out = dest == Dest::kAllreduceOut ? nullptr : at(a.allreduce_out, off);
    }
    e.tokens = static_cast<uint32_t>(n);
    e.residual_in = at(a.residual_in, off);
    e.residual_out = a.residual_out != nullptr ? at(a.residual_out, off) : ws->scratch;
    e.norm_out = at(a.norm_out, off);
    // FP8: a byte per element; NVFP4: two elements a byte (hidden % 16 == 0).
    e.quant_out = fp8   ? at(a.quant_out, t0 * a.hidden)
                  : fp4 ? at(a.quant_out, t0 * a.hidden / 2)
                        : nullptr;
    e.first_token = static_cast<uint32_t>(t0);
    lock.unlock();
    const cudaError_t err = arbiter::nccl::launch_residual_rmsnorm(e, stream);
    if (err != cudaSuccess) {
      return report(error(ARBITER_INTERNAL, cuda_message("epilogue kernel launch", err)));
    }
  }
  return ARBITER_OK;
}

// ---------------------------------------------------------------- ABI

template <typename F>
int32_t guarded(F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    t_last_error = "nccl: out of host memory";
  } catch (const std::exception& e) {
    try {
      t_last_error = std::string("nccl: unexpected exception: ") + e.what();
    } catch (...) {
    }
  } catch (...) {
    t_last_error = "nccl: unexpected exception";
  }
  return ARBITER_INTERNAL;
}

int32_t abi_probe(const arbiter_probe_args* args, arbiter_backend_caps* caps) {
  return guarded([&] { return probe_impl(args, caps); });
}

int32_t abi_workspace_create(const arbiter_oob* oob, const arbiter_workspace_spec* spec,
                             arbiter_workspace** out) {
  return guarded([&] { return create_impl(oob, spec, out); });
}

int32_t abi_run(arbiter_workspace* ws, const arbiter_allreduce_args* args, void* stream) {
  return guarded([&] { return run_impl(ws, args, stream); });
}

void abi_workspace_destroy(arbiter_workspace* ws) {
  if (ws == nullptr) return;
  guarded([&] {
    release(*ws, ws->aborted.load(std::memory_order_acquire));
    return ARBITER_OK;
  });
  delete ws;
}

void abi_abort(arbiter_workspace* ws) {
  if (ws == nullptr) return;
  ws->aborted.store(true, std::memory_order_release);
  try {
    const std::lock_guard<std::mutex> lock(ws->mutex);
    if (ws->comm != nullptr) {
      DeviceScope scope;
      scope.use(ws->device);
      ncclCommAbort(ws->comm);  // NCCL's kernels see NCCL's abort flag and exit
      ws->comm = nullptr;
    }
  } catch (...) {
    // std::mutex::lock may throw on a system error; abort() reports nothing.
  }
}

// What workspace_create() allocates for `spec` (scratch_bytes_for, as it
// sizes the scratch); NCCL's own buffers are NCCL's to report.
int32_t abi_footprint(const arbiter_workspace_spec* spec, arbiter_footprint* out) {
  if (spec == nullptr || out == nullptr) {
    return report(error(ARBITER_INVALID_ARGUMENT, "footprint: spec and out must not be NULL"));
  }
  if (!known_dtype(spec->dtype)) {
    return report(
        error(ARBITER_UNSUPPORTED, "dtype " + std::to_string(spec->dtype) + " is not supported"));
  }
  arbiter_footprint f{};
  f.device_bytes = scratch_bytes_for(*spec);                   // private: no peer maps it
  f.max_message_bytes[ARBITER_ALGORITHM_NATIVE] = UINT64_MAX;  // larger calls run in chunks
  f.note =
      "NCCL's own buffers (its communicator's channels and proxy memory) are not counted: "
      "see NCCL_BUFFSIZE and NCCL's documentation";
  *out = f;
  return ARBITER_OK;
}

const char* abi_last_error() { return t_last_error.c_str(); }

}  // namespace

extern "C" __attribute__((visibility("default"))) const arbiter_backend_v1_t arbiter_backend_v1 = {
    ARBITER_BACKEND_ABI_VERSION,
    "nccl",
    abi_probe,
    abi_workspace_create,
    nullptr,  // max_message_bytes: unlimited; larger messages run in chunks
    abi_run,
    abi_workspace_destroy,
    abi_last_error,
};

#ifndef ARBITER_MODULE_VERSION
#define ARBITER_MODULE_VERSION "unknown"
#endif

extern "C" __attribute__((visibility("default")))
const arbiter_backend_faults_v1_t arbiter_backend_v1_faults = {
    1,
    ARBITER_MODULE_VERSION,
    abi_abort,
};

extern "C" __attribute__((visibility("default")))
const arbiter_backend_footprint_v1_t arbiter_backend_v1_footprint = {
    1,
    0,
    abi_footprint,
};
