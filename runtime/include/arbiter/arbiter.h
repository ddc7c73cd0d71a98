/* arbiter C API: the policy and the communicator for frameworks that are not
 * C++ (Python through ctypes, Rust, Go, ...).
 *
 * Every function returns an arbiter_status; on failure the message is in
 * arbiter_last_error() (per thread, valid until the next call on that
 * thread). No function throws or aborts on bad input. Objects are opaque and
 * freed with their _free/_destroy function.
 */
#ifndef ARBITER_ARBITER_H_
#define ARBITER_ARBITER_H_

#include <stddef.h>
#include <stdint.h>

#include "arbiter_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct arbiter_policy arbiter_policy;
typedef struct arbiter_comm arbiter_comm;

/* Message of the last failure on this thread ("" before any). Read it only
 * after a call that failed: a call that succeeds need not clear it (the hot
 * path, arbiter_decide(_ex) and arbiter_max_fused_bytes(_ex), never does: a
 * thread-local write would cost more than the decision). */
const char* arbiter_last_error(void);

/* The version of this library, e.g. "0.1.0" (the project version; the
 * `arbiter` program's --version and the Python package's __version__). */
const char* arbiter_version(void);

/* The embedded default tables, layered with ARBITER_CONFIG and restricted by
 * ARBITER_BACKENDS. */
int32_t arbiter_policy_from_environment(arbiter_policy** out);
/* The embedded defaults <- site_files[0..count) (in order), with
 * backends_env as ARBITER_BACKENDS would be (NULL: unrestricted). Every
 * problem is in the error message, one "FILE:LINE:COL: error: ..." a line. */
int32_t arbiter_policy_load(const char* const* site_files, size_t count, const char* backends_env,
                            arbiter_policy** out);
void arbiter_policy_free(arbiter_policy* policy);

typedef struct arbiter_request {
  /* major*10+minor (90, 100, 103); 0 for CPU ranks. */
  uint32_t capability;
  uint32_t world_size;
  uint32_t nodes;         /* 0 is read as 1 */
  uint32_t nvlink_domain; /* bool */
  uint32_t multicast;     /* bool */
  arbiter_dtype dtype;
  arbiter_pattern pattern;
  /* bool: every rank passes the same residual_in (as
   * ARBITER_RUN_RESIDUAL_REPLICATED says to a module); tables may key on it.
   * Ignored for pattern allreduce, which has no residual. Sits in what was
   * padding before message_bytes: the struct keeps its size and layout. */
  uint32_t residual_replicated;
  uint64_t message_bytes; /* 0: computed from tokens x hidden x element size */
  uint32_t tokens;        /* 0: unknown */
  uint32_t hidden;
} arbiter_request;

/* Values of backend: 0 trtllm, 1 mnnvl, 2 nccl, 3 shm, 255 none. */
typedef struct arbiter_decision {
  uint32_t backend;
  arbiter_algorithm algorithm;
  uint32_t fused;  /* bool */
  uint32_t reason; /* 0 fused, 1 no fusion cell, 2 off, 3 above cap, 4 no eligible
                      backend, 5 no backend, 6 invalid request */
  uint64_t cap;    /* UINT64_MAX when no cap applied */
} arbiter_decision;

const char* arbiter_backend_name(uint32_t backend);

/* No allocation; safe from any thread. */
int32_t arbiter_decide(const arbiter_policy* policy, const arbiter_request* request,
                       arbiter_decision* out);
/* *has_cap = 0 when nothing would be fused at any size. */
int32_t arbiter_max_fused_bytes(const arbiter_policy* policy, const arbiter_request* request,
                                uint64_t* cap, int32_t* has_cap);
uint64_t arbiter_policy_fingerprint(const arbiter_policy* policy);
/* The explained decision as text (json = 0) or one JSON object (json = 1),
 * NUL-terminated into buf; *needed gets the size required (with the NUL).
 * Returns ARBITER_INVALID_ARGUMENT, with *needed set, when buf is too small. */
int32_t arbiter_explain(const arbiter_policy* policy, const arbiter_request* request, int32_t json,
                        char* buf, size_t size, size_t* needed);

/* A request with what arbiter_request has no room for (its size and layout
 * are fixed). size: sizeof(arbiter_request_ex) as the caller was built;
 * later versions may add fields after the last, and a size larger than this
 * library knows is refused (built against a newer arbiter.h). */
typedef struct arbiter_request_ex {
  arbiter_request request;
  uint32_t size;
  /* bool: the call's input lies in memory registered with a communicator
   * (arbiter_comm_alloc); tables may key on it (`buffers: registered`). */
  uint32_t buffers_registered;
} arbiter_request_ex;

/* arbiter_decide, arbiter_max_fused_bytes and arbiter_explain of an
 * arbiter_request_ex. */
int32_t arbiter_decide_ex(const arbiter_policy* policy, const arbiter_request_ex* request,
                          arbiter_decision* out);
int32_t arbiter_max_fused_bytes_ex(const arbiter_policy* policy, const arbiter_request_ex* request,
                                   uint64_t* cap, int32_t* has_cap);
int32_t arbiter_explain_ex(const arbiter_policy* policy, const arbiter_request_ex* request,
                           int32_t json, char* buf, size_t size, size_t* needed);

/* arbiter_comm_options.nvlink_domain. */
#define ARBITER_NVLINK_AUTO 0u /* one node: NVLink assumed; several nodes: none */
#define ARBITER_NVLINK_YES 1u  /* every rank in one NVLink domain (NVL72 across nodes too) */
#define ARBITER_NVLINK_NO 2u   /* no NVLink between the ranks (PCIe only) */

typedef struct arbiter_comm_options {
  uint32_t capability;    /* of this rank's device; 0 for CPU ranks */
  uint32_t nodes;         /* 0 is read as 1 */
  uint32_t nvlink_domain; /* ARBITER_NVLINK_*; 0 (auto), Python's default too */
  uint32_t multicast;     /* bool */
  int32_t device;         /* CUDA ordinal (LOCAL_RANK); -1 for CPU ranks */
  uint32_t max_tokens;    /* the largest call; 0 (unknown): what the tables fuse */
  /* Elements per token of the widest call, > 0 (else ARBITER_INVALID_ARGUMENT):
   * workspaces are sized from it. A call may pass a narrower hidden (the same
   * on every rank), as `arbiter bench` does. */
  uint32_t hidden;
  arbiter_dtype dtype;
  /* The patterns calls will use: bit arbiter_pattern; 0: every pattern.
   * Each backend is asked only for the patterns its probe says it runs on
   * every rank's device. A pattern that no backend runs here (NVFP4 below
   * capability 100, say) does not fail creation: its calls return
   * ARBITER_UNSUPPORTED on every rank, with the pattern, the capability and
   * why each backend cannot in arbiter_last_error(). So do calls of a
   * pattern outside the mask. Bits above ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4
   * are ARBITER_INVALID_ARGUMENT. */
  uint32_t pattern_mask;
  int64_t timeout_ms; /* 0: 60 s; above 30 days: 30 days (a wait that long is "never");
                         negative: refused */
} arbiter_comm_options;

/* Collective over oob: loads the backend modules (ARBITER_PLUGIN_PATH and
 * the install's plugin folder), checks every rank has the same tables and
 * options, and creates the workspaces. The policy may be freed afterwards;
 * so may the oob struct (it is copied), but not what its ctx points to, nor
 * its functions: the communicator calls them until it is destroyed.
 * A world size of 1 works (the fallback runs the epilogue on this rank).
 * ARBITER_TEST_SHARED_GPU=1 is the shared-GPU test mode of arbiter's own
 * tests and examples: ranks of several processes may share one GPU, and
 * backends that cannot (nccl) are dropped, so calls above the fused cap are
 * refused (communicator.h). */
int32_t arbiter_comm_create(const arbiter_oob* oob, const arbiter_policy* policy,
                            const arbiter_comm_options* options, arbiter_comm** out);
/* Collective: joins the other ranks through the UCX bootstrap from the
 * launcher's environment (torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
 * MASTER_ADDR, MASTER_PORT; ARBITER_BOOTSTRAP_PORT and ARBITER_JOB_TOKEN as
 * `arbiter launch` sets them; ARBITER_BOOTSTRAP_TIMEOUT, in seconds, when
 * set, replaces the options' timeout for the join alone), then
 * arbiter_comm_create over that group. The group is joined once per
 * process and shared by every communicator created this way (it stays until
 * the process exits), so create and destroy those from one thread at a
 * time; a later call whose environment names another rank or address fails
 * with ARBITER_INVALID_ARGUMENT. A GPU rank (capability != 0) with
 * options->device < 0 uses LOCAL_RANK. The join waits up to
 * options->timeout_ms (0: 60 s) unless ARBITER_BOOTSTRAP_TIMEOUT says
 * otherwise. UCX is loaded on the first join of several ranks: without a
 * usable UCX this returns ARBITER_UNAVAILABLE saying what to install. */
int32_t arbiter_comm_create_from_environment(const arbiter_policy* policy,
                                             const arbiter_comm_options* options,
                                             arbiter_comm** out);

typedef struct arbiter_comm_info {
  int32_t rank;
  int32_t world_size;
  int32_t device;        /* the CUDA ordinal in use; -1 for CPU ranks */
  uint32_t backend_mask; /* backends with a workspace on every rank: bit backend */
  uint64_t fingerprint;  /* of the tables every rank agreed on */
} arbiter_comm_info;

/* Not collective; no allocation. */
int32_t arbiter_comm_get_info(const arbiter_comm* comm, arbiter_comm_info* out);

/* What one backend's workspace costs this rank, as its module sized it from
 * the spec the workspace was made with (arbiter_backend_v1_footprint in
 * arbiter_backend.h says what each figure counts). */
typedef struct arbiter_comm_footprint {
  int32_t backend; /* arbiter_backend (the policy's numbering) */
  int32_t known;   /* 0: the module predates the footprint companion; figures 0 */
  uint64_t device_bytes;
  uint64_t host_bytes;
  uint64_t shared_bytes; /* memory peers map too (/dev/shm, IPC, multicast) */
  /* By arbiter_algorithm; 0: not offered; UINT64_MAX: any size. */
  uint64_t max_message_bytes[3];
  const char* note; /* what is not counted; "" when nothing; lives with comm */
} arbiter_comm_footprint;

/* Not collective; no allocation. `backend` must have a workspace
 * (arbiter_comm_info.backend_mask), else ARBITER_UNSUPPORTED naming it,
 * *out untouched. */
int32_t arbiter_comm_get_footprint(const arbiter_comm* comm, int32_t backend,
                                   arbiter_comm_footprint* out);

/* One fused all-reduce, decided by the policy; args->algorithm is ignored.
 * `used` (optional) gets the decision that ran. The buffers follow the
 * backend ABI's rules (arbiter_backend.h), in-place use included: an output
 * may be exactly input or residual_in; other overlaps are refused.
 * residual_in may be NULL for the norm patterns (a first block, no residual:
 * residual_out, if given, gets the sum); the call then skips the backends
 * whose module lacks ARBITER_CAPS_RESIDUAL_OPTIONAL, and if none is left it
 * fails with ARBITER_UNSUPPORTED naming them. A pattern or dtype value that
 * names none is ARBITER_INVALID_ARGUMENT; a known one that no backend runs
 * here is ARBITER_UNSUPPORTED. */
int32_t arbiter_comm_allreduce_fusion(arbiter_comm* comm, const arbiter_allreduce_args* args,
                                      void* stream, arbiter_decision* used);
/* A call refused on one rank is still a call: on CPU ranks (shm)
 * arbiter_comm_allreduce_fusion joins every call it refuses, so that the
 * peers' call is refused too (ARBITER_MISMATCH naming this rank) instead of
 * pairing with this rank's next call and mixing two calls' data. A binding
 * that refuses a call with its own checks, before calling arbiter, calls
 * this in its place. Like a call, it returns once the peers made theirs, or
 * at the deadline (a fault: the communicator is then unusable). GPU ranks
 * join only in the check mode (ARBITER_CHECK_CALLS=1), and only refusals
 * made before its exchange (this function's, the host's argument checks):
 * elsewhere their peers wait for their deadline. ARBITER_OK once the peers
 * were told (or nobody need be). */
int32_t arbiter_comm_join_refused(arbiter_comm* comm);
/* Registered memory (docs/registered-buffers.md). Collective: every rank
 * calls it with the same bytes, in the same order as its other allocs and
 * calls. *data gets this rank's part of memory every rank maps (shm: aligned
 * to a 4096-byte page). A call whose input lies in it, at the same offset on
 * every rank, reads the peers' inputs in place instead of copying them; any
 * other call works as before. On return of such a call the peers have
 * finished reading this rank's input. An input crossing the end of its
 * allocation, or lying in another communicator's, is
 * ARBITER_INVALID_ARGUMENT; a rank passing registered memory where another
 * does not (or another offset) is ARBITER_MISMATCH on every rank, nothing
 * written. ARBITER_UNSUPPORTED when no backend of the communicator has
 * registered memory; nothing allocated then. */
int32_t arbiter_comm_alloc(arbiter_comm* comm, uint64_t bytes, void** data);
/* Local: never waits on a peer, whose views stay mapped until they free
 * theirs. `data` exactly as arbiter_comm_alloc returned it; anything else
 * (a pointer inside it, a second free, NULL) is ARBITER_INVALID_ARGUMENT and
 * frees nothing. Works after arbiter_comm_abort. arbiter_comm_destroy frees
 * what is left: pointers into it dangle afterwards. */
int32_t arbiter_comm_free(arbiter_comm* comm, void* data);

/* Thread-safe: callable from any thread while `comm` exists (not
 * concurrently with arbiter_comm_destroy), e.g. from a framework's watchdog
 * while another thread waits in arbiter_comm_allreduce_fusion. That call
 * returns ARBITER_ABORTED (shm: within a few milliseconds), peers waiting on
 * this rank return ARBITER_PEER_FAILED naming it (shm: within a second; GPU
 * ranks on this host: within 100-200 ms; on other hosts: their deadline),
 * GPU kernels waiting on a peer stop waiting (their outputs are then
 * unspecified), every later call returns ARBITER_ABORTED at once, and
 * arbiter_comm_destroy no longer waits on any peer. Never blocks on a peer.
 *
 * Faults: a call that fails with ARBITER_TIMEOUT, ARBITER_PEER_FAILED,
 * ARBITER_ABORTED or ARBITER_INTERNAL leaves the communicator unusable
 * (every later call fails at once) and its destroy local; a dead peer on
 * the same host is named within a second (shm: by the waiting call; GPU: a
 * watcher thread aborts the kernels and later calls return
 * ARBITER_PEER_FAILED). A call whose tokens,
 * pattern, eps, flags or buffers given differ across ranks returns
 * ARBITER_MISMATCH on every rank, naming the field and the ranks, and
 * writes nothing; the communicator stays usable. The shm backend always
 * checks; for GPU backends ARBITER_CHECK_CALLS=1 (every rank alike)
 * all-gathers each call's signature through the oob first (a debug mode:
 * one exchange per call). */
int32_t arbiter_comm_abort(arbiter_comm* comm);
/* Collective, unless a call failed or arbiter_comm_abort was called: then
 * local, waiting on no peer. */
void arbiter_comm_destroy(arbiter_comm* comm);

#ifdef __cplusplus
}
#endif

#endif /* ARBITER_ARBITER_H_ */
