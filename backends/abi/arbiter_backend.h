/* arbiter backend plugin ABI.
 *
 * A backend module is a shared library that exports one struct per ABI
 * version it speaks, under the versioned symbol `arbiter_backend_v<N>`
 * (e.g. `arbiter_backend_v1`). The host looks for the newest version it
 * knows first. The structs of past versions are frozen: a new version adds a
 * new struct, never edits an old one. Enums have explicit values and only
 * ever grow.
 *
 * Plain C: fixed-width integers, opaque handles, explicit lengths, a status
 * code plus a message. No exception or C++ type crosses this boundary; a
 * module catches everything at its entry points.
 *
 * Threading: probe() may be called from any thread. A workspace is used by
 * one thread at a time (the rank's), and run() is asynchronous on `stream`
 * for GPU backends, synchronous for host backends; only the faults
 * companion's abort() may come from another thread. last_error() is
 * per-thread.
 */
#ifndef ARBITER_BACKEND_H_
#define ARBITER_BACKEND_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ARBITER_BACKEND_ABI_VERSION 1
#define ARBITER_BACKEND_SYMBOL_V1 "arbiter_backend_v1"

/* Status codes. */
typedef enum arbiter_status {
  ARBITER_OK = 0,
  /* This call cannot run on this backend (shape, size, pattern, ...): the
   * host tries its next choice. Nothing was changed. */
  ARBITER_UNSUPPORTED = 1,
  /* Bad arguments: a bug in the caller. */
  ARBITER_INVALID_ARGUMENT = 2,
  /* The backend cannot work here (no driver, no device, no peer access). */
  ARBITER_UNAVAILABLE = 3,
  /* A wait passed its deadline. */
  ARBITER_TIMEOUT = 4,
  /* Another rank failed, so this one did too (collective calls). */
  ARBITER_PEER_FAILED = 5,
  /* Anything else. */
  ARBITER_INTERNAL = 6,
  /* This rank's workspace (or communicator) was aborted: a waiting call
   * stopped waiting, and every later call returns this at once. The outputs
   * of the call that was aborted hold unspecified values. */
  ARBITER_ABORTED = 7,
  /* The ranks made different calls (token count, pattern, eps, buffers
   * given, ...): refused on every rank, before any output was written; the
   * workspace stays usable. A bug in the caller, on some rank. */
  ARBITER_MISMATCH = 8
} arbiter_status;

/* Values equal arbiter::Dtype, Pattern, Algorithm and DeviceKind. */
typedef enum arbiter_dtype {
  ARBITER_DTYPE_FP16 = 0,
  ARBITER_DTYPE_BF16 = 1,
  ARBITER_DTYPE_FP32 = 2
} arbiter_dtype;

typedef enum arbiter_pattern {
  ARBITER_PATTERN_ALLREDUCE = 0,
  ARBITER_PATTERN_RESIDUAL_RMSNORM = 1,
  ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8 = 2,
  ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4 = 3
} arbiter_pattern;

typedef enum arbiter_algorithm {
  ARBITER_ALGORITHM_ONESHOT = 0,
  ARBITER_ALGORITHM_TWOSHOT = 1,
  ARBITER_ALGORITHM_NATIVE = 2
} arbiter_algorithm;

typedef enum arbiter_device_kind {
  ARBITER_DEVICE_GPU = 0,
  ARBITER_DEVICE_CPU = 1
} arbiter_device_kind;

/* Out-of-band exchange, provided by the host (UCX bootstrap, or a framework's
 * own group such as torch.distributed). Collective: every rank of the group
 * calls each function in the same order. Every call returns within
 * timeout_ms (then ARBITER_TIMEOUT) and names the ranks that did not arrive
 * in last_error(). The group must be exactly the all-reduce group. */
typedef struct arbiter_oob {
  void* ctx;
  int32_t rank;
  int32_t size;
  /* recv holds size * bytes: rank r's `bytes` at offset r * bytes. */
  int32_t (*allgather)(void* ctx, const void* send, void* recv, size_t bytes, int64_t timeout_ms);
  /* buf (bytes long) of rank `root` is copied to every rank's buf. */
  int32_t (*broadcast)(void* ctx, void* buf, size_t bytes, int32_t root, int64_t timeout_ms);
  int32_t (*barrier)(void* ctx, int64_t timeout_ms);
  /* Message of the last failed call on this thread; never NULL. */
  const char* (*last_error)(void* ctx);
} arbiter_oob;

/* probe() input: which device this rank would use. */
typedef struct arbiter_probe_args {
  arbiter_device_kind device_kind;
  int32_t device; /* CUDA ordinal (LOCAL_RANK); -1 for CPU ranks */
} arbiter_probe_args;

#define ARBITER_CAPS_SINGLE_NODE_ONLY (1u << 0)
#define ARBITER_CAPS_NEEDS_MULTICAST (1u << 1)
#define ARBITER_CAPS_NEEDS_NVLINK (1u << 2)
/* Ranks of different processes may share one GPU when the test mode
 * ARBITER_TEST_SHARED_GPU=1 is set (slow, correct: their kernels take turns).
 * In that mode the host creates no workspace of a module without it. */
#define ARBITER_CAPS_SHARES_GPU (1u << 3)
/* run() accepts residual_in == NULL for the norm patterns (a first block with
 * no residual): the pre-norm value is then the sum alone. The host never
 * passes NULL to a module without it; v1 modules from before it may refuse. */
#define ARBITER_CAPS_RESIDUAL_OPTIONAL (1u << 4)
/* run() takes ARBITER_RUN_REFUSED (below), and a call the module refuses
 * itself joins its peers the same way. The host sends it only to a module
 * with this flag. */
#define ARBITER_CAPS_JOINS_REFUSALS (1u << 5)

/* What a module can run on this device: its admission rules. The tables can
 * only narrow this (a table never admits a shape the module cannot run). */
typedef struct arbiter_backend_caps {
  arbiter_device_kind device_kind;
  /* SM capability of the probed device (major*10+minor); 0 for CPUs. */
  uint32_t capability;
  /* Bit w set: world size w is supported (w < 64). */
  uint64_t world_size_mask;
  uint32_t dtype_mask;     /* bit arbiter_dtype */
  uint32_t pattern_mask;   /* bit arbiter_pattern, already filtered by capability */
  uint32_t algorithm_mask; /* bit arbiter_algorithm */
  uint32_t flags;          /* ARBITER_CAPS_* */
} arbiter_backend_caps;

/* workspace_create() input. */
typedef struct arbiter_workspace_spec {
  int32_t world_size;
  int32_t rank;
  int32_t device; /* CUDA ordinal (LOCAL_RANK); -1 for CPU ranks */
  uint32_t nodes;
  uint32_t max_tokens;
  uint32_t hidden;
  arbiter_dtype dtype;
  uint32_t pattern_mask;
  /* The largest message the host will send (its policy's max_fused_bytes). */
  uint64_t max_message_bytes;
  int64_t timeout_ms; /* for every oob exchange during creation */
} arbiter_workspace_spec;

typedef struct arbiter_workspace arbiter_workspace; /* opaque, module-owned */

#define ARBITER_RUN_NVFP4_LINEAR_SCALES (1u << 0) /* else 128x4 swizzled */
#define ARBITER_RUN_PDL (1u << 1)                 /* programmatic dependent launch */
/* The caller promises residual_in holds the same values on every rank (as in
 * tensor parallelism, where the residual stream is replicated). A backend
 * may then run each token's epilogue on one rank and copy its outputs to
 * the others. A backend may ignore it; the results are the same either way
 * while the promise holds. If it does not, a rank's outputs for a token may
 * follow another rank's residual_in. */
#define ARBITER_RUN_RESIDUAL_REPLICATED (1u << 2)
/* This rank refused the call before it reached the module (the host's or a
 * binding's own checks) but joins it, so that the peers' call is refused too
 * (ARBITER_MISMATCH, naming this rank) instead of pairing with this rank's
 * next call. Only `flags` is meaningful; no buffer is read or written.
 * Returns ARBITER_OK once every peer has joined, or why the wait failed.
 * Only for modules with ARBITER_CAPS_JOINS_REFUSALS. */
#define ARBITER_RUN_REFUSED (1u << 3)

/* One fused all-reduce. Buffers are device pointers for GPU backends, host
 * pointers for host backends; all hold tokens x hidden elements of dtype
 * unless noted. Required: input; allreduce_out for pattern allreduce;
 * gamma for the norm patterns, and residual_in too unless the module sets
 * ARBITER_CAPS_RESIDUAL_OPTIONAL (then NULL means no residual: x = sum, and
 * residual_out, if given, receives the sum); norm_out for
 * residual_rmsnorm; quant_out and scale for the quantising patterns
 * (scale_out too for NVFP4). Everything else may be NULL and is then not
 * written. The norm patterns need eps finite and >= 0, weight_bias finite,
 * scale aligned to a float.
 *
 * Aliasing. In place: allreduce_out, residual_out and norm_out may each be
 * exactly `input` or exactly `residual_in` (the same pointer); the result is
 * the one separate buffers would get (e.g. vLLM's norm_out = input,
 * residual_out = residual_in). Any other overlap is refused with
 * ARBITER_INVALID_ARGUMENT before anything is written: a partial overlap,
 * two outputs sharing memory, an output over gamma or scale, quant_out or
 * scale_out over any other buffer. Inputs may overlap one another. Only
 * the buffers the pattern uses count. Every module honours this alike. */
typedef struct arbiter_allreduce_args {
  arbiter_pattern pattern;
  arbiter_dtype dtype;
  arbiter_algorithm algorithm;
  uint32_t tokens;
  uint32_t hidden;
  uint32_t flags;          /* ARBITER_RUN_* */
  const void* input;       /* this rank's contribution */
  void* allreduce_out;     /* the sum (required for pattern allreduce) */
  const void* residual_in; /* norm patterns */
  void* residual_out;      /* norm patterns: sum + residual_in (or the sum) */
  const void* gamma;       /* hidden elements of dtype */
  float eps;
  float weight_bias;  /* y = x * rsqrt(mean(x^2) + eps) * (gamma + weight_bias) */
  void* norm_out;     /* optional un-quantised norm output */
  void* quant_out;    /* FP8: 1 byte/element; NVFP4: 2 elements/byte */
  void* scale_out;    /* NVFP4 block scale factors (e4m3) */
  const float* scale; /* FP8: per-tensor scale; NVFP4: global scale. Finite and > 0
                       (shm refuses others; GPU modules read it on the device) */
} arbiter_allreduce_args;

typedef struct arbiter_backend_v1_t {
  uint32_t abi_version; /* ARBITER_BACKEND_ABI_VERSION (1) */
  const char* name;     /* "shm", "nccl", ... */
  /* Required. ARBITER_OK and caps filled, or ARBITER_UNAVAILABLE with the
   * reason in last_error() (no driver, no device, ...). */
  int32_t (*probe)(const arbiter_probe_args* args, arbiter_backend_caps* caps);
  /* Required. Collective over oob. Fails on every rank when it fails on any,
   * with the reason. The host keeps `oob` valid until workspace_destroy()
   * returns, so a module may keep the pointer for its teardown. */
  int32_t (*workspace_create)(const arbiter_oob* oob, const arbiter_workspace_spec* spec,
                              arbiter_workspace** out);
  /* Optional (NULL: unlimited). The largest message one run() may take. */
  uint64_t (*max_message_bytes)(const arbiter_workspace* ws, arbiter_algorithm algorithm);
  /* Required. ARBITER_UNSUPPORTED leaves everything unchanged. */
  int32_t (*run)(arbiter_workspace* ws, const arbiter_allreduce_args* args, void* stream);
  /* Required. Collective (every rank, same order); frees everything the
   * workspace holds. May use the oob given at creation. */
  void (*workspace_destroy)(arbiter_workspace* ws);
  /* Required. Message of the last failure on this thread; never NULL. */
  const char* (*last_error)(void);
} arbiter_backend_v1_t;

/* A module defines, with default visibility and C linkage:
 *   const arbiter_backend_v1_t arbiter_backend_v1 = {...};
 * (everything else in the module should be hidden). */

/* Faults: an optional companion of arbiter_backend_v1, added after v1 was
 * frozen. A module that has it also defines, with default visibility and C
 * linkage:
 *   const arbiter_backend_faults_v1_t arbiter_backend_v1_faults = {...};
 * A host that predates it never looks for it; a module without it loads and
 * runs as before (its workspaces cannot be aborted, and their teardown after
 * a fault may wait on peers until timeout_ms). Like the v1 struct, this one
 * is frozen: a later companion is a new struct under a new symbol. */
#define ARBITER_BACKEND_FAULTS_SYMBOL_V1 "arbiter_backend_v1_faults"

typedef struct arbiter_backend_faults_v1_t {
  uint32_t faults_version; /* 1 */
  /* Required. The module's build, e.g. "0.1.0 (git 1a2b3c4)": the host
   * refuses to create a communicator whose ranks loaded different builds of
   * a module. Never NULL. */
  const char* module_version;
  /* Optional (NULL: workspaces cannot be aborted).
   * Thread-safe: callable from any thread, any number of times, between
   * workspace_create() returning the workspace and workspace_destroy()
   * being called (never concurrently with the latter), also while run()
   * waits on the workspace's own thread. Never blocks on a peer.
   * Afterwards:
   *  - a run() waiting on a peer returns ARBITER_ABORTED (host backends
   *    within 100 ms); GPU backends' kernels waiting on a peer stop waiting
   *    (they poll a flag in host-mapped memory) and leave unspecified
   *    values in the call's outputs;
   *  - every later run() returns ARBITER_ABORTED at once;
   *  - peers waiting on this rank return ARBITER_PEER_FAILED, naming it,
   *    where the module can tell them (shm: within a second);
   *  - workspace_destroy() is no longer collective: it frees this rank's
   *    resources without waiting on any peer.
   * The host also aborts every workspace before destroying them after a
   * fault (a timeout, a failed or dead peer), so that teardown never waits
   * on a rank that is gone. */
  void (*abort)(arbiter_workspace* ws);
} arbiter_backend_faults_v1_t;

/* Registered memory (ABI v2): an optional companion of arbiter_backend_v1,
 * exported beside it as
 *   const arbiter_backend_memory_v2_t arbiter_backend_v2_memory = {...};
 * A module that has it speaks ABI v2 (`arbiter plugins` says so); a host
 * that predates it never looks for it, and a module without it loads and
 * runs as a v1 module. Frozen like the others.
 *
 * Contract:
 *  - Symmetric allocation. alloc() is collective over the workspace's oob
 *    (every rank, same order, same `bytes`) and returns this rank's part;
 *    every rank's part of one allocation has the same size, and a peer can
 *    read this rank's part (the module maps it). Addresses are multiples of
 *    `alignment`. The contents are unspecified (not zeroed).
 *  - A registered call (run_registered) is a run() whose `input` lies in an
 *    allocation of this workspace, wholly (tokens x hidden elements), at the
 *    same offset from its part's start on every rank. The module reads the
 *    peers' inputs in place: no copy-in. Outputs and the other inputs may be
 *    any memory, registered or not. The results are the bits run() gives.
 *    max_message_bytes does not bound a registered call (the workspace was
 *    sized for copied ones, and the tables may fuse registered ones larger):
 *    the module runs it, in slices if it must, or returns
 *    ARBITER_UNSUPPORTED with nothing written, the same on every rank, and
 *    the host takes its next choice.
 *    Every rank of a call must take the same path: if one rank calls run()
 *    and another run_registered(), or their offsets or allocations differ,
 *    the call is refused on every rank with ARBITER_MISMATCH, before any
 *    output is written. (A GPU module, whose run_registered only enqueues,
 *    cannot see its peers' calls: it checks in its kernels instead and
 *    stops them, a CUDA error, where the ranks' allocations, offsets or
 *    shapes differ; the host's check mode refuses such calls before
 *    launch.) An
 *    input not wholly inside one allocation of this workspace is
 *    ARBITER_INVALID_ARGUMENT, nothing written.
 *  - On return from run_registered every peer has finished reading this
 *    rank's input: the caller may overwrite it at once (the module adds the
 *    synchronisation that needs, e.g. one barrier at the end of one-shot).
 *  - Reuse: an allocation serves any number of calls, with any offsets.
 *  - Lifetime: free() is local and never waits on a peer. It unmaps this
 *    rank's view; peers' views stay valid (the memory lives until the last
 *    rank frees it or destroys its workspace), so a rank that frees early
 *    never faults a peer, but it can no longer make registered calls with
 *    that allocation, and a peer's registered call on it then pairs with
 *    this rank's next call: refused as a mismatch, or ARBITER_TIMEOUT if
 *    this rank makes none. workspace_destroy() frees every allocation left;
 *    pointers into them dangle afterwards.
 *  - Abort: an aborted workspace refuses alloc() and run_registered() with
 *    ARBITER_ABORTED; free() still works and never waits.
 *  - Threading: as run(): the workspace's own thread only. */
#define ARBITER_BACKEND_MEMORY_SYMBOL_V2 "arbiter_backend_v2_memory"
#define ARBITER_BACKEND_ABI_VERSION_MEMORY 2

typedef struct arbiter_backend_memory_v2_t {
  uint32_t memory_version; /* 2 */
  uint32_t reserved;       /* 0 */
  /* Every allocation's address (on every rank) is a multiple of this. */
  uint64_t alignment;
  /* Required. Collective over the oob given at workspace_create(); fails on
   * every rank when it fails on any. bytes > 0. *local: this rank's part. */
  int32_t (*alloc)(arbiter_workspace* ws, uint64_t bytes, void** local);
  /* Required. Local (see above). `local` exactly as alloc() returned it;
   * anything else is ARBITER_INVALID_ARGUMENT and frees nothing. */
  int32_t (*free)(arbiter_workspace* ws, void* local);
  /* Required. run() with args->input in registered memory (see above). */
  int32_t (*run_registered)(arbiter_workspace* ws, const arbiter_allreduce_args* args,
                            void* stream);
} arbiter_backend_memory_v2_t;

/* Footprint: an optional companion of arbiter_backend_v1 that says what a
 * workspace costs before (or without) creating it, exported as
 *   const arbiter_backend_footprint_v1_t arbiter_backend_v1_footprint = {...};
 * workspace_create() sizes its memory with the same function, so the
 * figure and the workspace cannot disagree. A host that predates it never
 * looks for it; a module without it loads and runs as before (its
 * footprint is unknown). Frozen like the others. */
#define ARBITER_BACKEND_FOOTPRINT_SYMBOL_V1 "arbiter_backend_v1_footprint"
#define ARBITER_ALGORITHM_COUNT 3

/* One rank's share of one workspace, in bytes. Each byte is counted once:
 *  device_bytes: device memory only this rank maps;
 *  host_bytes:   host memory only this rank maps (pinned or not);
 *  shared_bytes: memory this rank allocated or owns that peers map too
 *                (a /dev/shm object, peer-mapped IPC buffers, multicast
 *                and unicast VMM allocations), all buffering stages counted.
 * max_message_bytes[a]: the largest message one run() with algorithm a
 * takes (0: the algorithm is not offered; UINT64_MAX: any size).
 * Memory a system library allocates on its own (NCCL's buffers) is not
 * counted; `note` says so where it applies. */
typedef struct arbiter_footprint {
  uint64_t device_bytes;
  uint64_t host_bytes;
  uint64_t shared_bytes;
  uint64_t max_message_bytes[ARBITER_ALGORITHM_COUNT]; /* by arbiter_algorithm */
  const char* note; /* static text, never NULL ("" when nothing to add) */
} arbiter_footprint;

typedef struct arbiter_backend_footprint_v1_t {
  uint32_t footprint_version; /* 1 */
  uint32_t reserved;          /* 0 */
  /* Required. Pure: no device, no driver call, no oob, no allocation;
   * callable before probe() and on a machine without the device.
   * Inputs: spec as workspace_create() would get it (rank, device and
   * timeout_ms are ignored). Outputs: *out filled, ARBITER_OK; or
   * ARBITER_INVALID_ARGUMENT / ARBITER_UNSUPPORTED with the reason in
   * last_error(), exactly where workspace_create() would refuse the spec
   * before any exchange, and *out untouched. */
  int32_t (*footprint)(const arbiter_workspace_spec* spec, arbiter_footprint* out);
} arbiter_backend_footprint_v1_t;

#ifdef __cplusplus
}
#endif

#endif /* ARBITER_BACKEND_H_ */
