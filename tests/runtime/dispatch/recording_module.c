/* A GPU backend module that runs nothing and counts what it is asked to run,
 * so the communicator's dispatch can be checked on a CPU machine. Built once
 * per name (RECORDING_NAME: "mnnvl", "nccl", "trtllm"; RECORDING_FLAGS: its
 * caps flags); probe() claims a GPU of capability 103 (GB300) and every
 * pattern, or those of RECORDING_<NAME>_PATTERNS (a decimal mask) when set;
 * RECORDING_<NAME>_FLAGS (decimal) replaces its caps flags, and
 * RECORDING_<NAME>_WORLD_SIZES (a decimal mask) its world sizes. A module
 * that breaks the ABI: RECORDING_<NAME>_STATUS makes every run() return that
 * number, and RECORDING_NULL_ERROR=1 makes last_error() return NULL. Without
 * ARBITER_CAPS_RESIDUAL_OPTIONAL its run() refuses residual_in NULL for the
 * norm patterns, as a v1 module from before that flag may.
 * Like a real module it refuses to be asked for a pattern its caps lack.
 * It has a faults companion whose build is RECORDING_BUILD and whose
 * abort() is counted. The counts are read through exported functions.
 * RECORDING_BLOCK_AT=N makes the N-th run() since load (0-based) wait, as a
 * kernel waits on a peer that never comes, until abort() or 10 s: it then
 * returns ARBITER_ABORTED, or ARBITER_TIMEOUT. On the rank that
 * RECORDING_FAIL_RANK names, that run() fails at once instead, as a launch
 * that fails: ARBITER_INTERNAL. Built with RECORDING_MEMORY, it also says
 * how large a message run() takes (the spec's max_message_bytes, as trtllm
 * sizes its buffers) and speaks ABI v2: alloc() gives private host memory,
 * and run_registered() counts calls of any size, as trtllm streams them. */
#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "arbiter_backend.h"

#define EXPORT __attribute__((visibility("default")))

struct arbiter_workspace {
  int rank;
  uint64_t max_message_bytes;
};

static atomic_long g_runs[3]; /* by arbiter_algorithm */
static atomic_long g_bytes;
static atomic_long g_fp4_runs;
static atomic_long g_aborts;
static atomic_long g_run_count;
static atomic_long g_registered_runs;
static atomic_uint g_asked; /* spec->pattern_mask of the last creation */
static uint32_t g_patterns = 15;
static char g_error[128];

static uint32_t g_flags = RECORDING_FLAGS;

/* RECORDING_<NAME><suffix>, or NULL when unset. */
static const char* from_environment(const char* suffix) {
  char variable[64] = "RECORDING_";
  size_t n = sizeof "RECORDING_" - 1;
  for (const char* c = RECORDING_NAME; *c && n + 1 < sizeof variable; ++c) {
    variable[n++] = (char)toupper((unsigned char)*c);
  }
  snprintf(variable + n, sizeof variable - n, "%s", suffix);
  return getenv(variable);
}

/* RECORDING_<NAME><suffix> as a decimal number, or `otherwise` when unset. */
static uint32_t number_from_environment(const char* suffix, uint32_t otherwise) {
  const char* value = from_environment(suffix);
  return value ? (uint32_t)strtoul(value, NULL, 10) : otherwise;
}

static int32_t probe(const arbiter_probe_args* args, arbiter_backend_caps* caps) {
  if (args->device_kind != ARBITER_DEVICE_GPU) return ARBITER_UNAVAILABLE;
  g_patterns = number_from_environment("_PATTERNS", 15u);
  g_flags = number_from_environment("_FLAGS", RECORDING_FLAGS);
  caps->device_kind = ARBITER_DEVICE_GPU;
  caps->capability = 103;
  const char* sizes = from_environment("_WORLD_SIZES");
  caps->world_size_mask = sizes ? (uint64_t)strtoull(sizes, NULL, 10) : ~(uint64_t)1;
  caps->dtype_mask = 7;
  caps->pattern_mask = g_patterns;
  caps->algorithm_mask = 7;
  caps->flags = g_flags;
  return ARBITER_OK;
}

static int32_t create(const arbiter_oob* oob, const arbiter_workspace_spec* spec,
                      arbiter_workspace** out) {
  /* As the fused modules do: a workspace is sized by these. */
  if (spec->max_tokens == 0 || spec->hidden == 0 || spec->max_message_bytes == 0) {
    snprintf(g_error, sizeof g_error,
             "%s: max_tokens %u, hidden %u and max_message_bytes %llu "
             "must all be > 0",
             RECORDING_NAME, spec->max_tokens, spec->hidden,
             (unsigned long long)spec->max_message_bytes);
    return ARBITER_INVALID_ARGUMENT;
  }
  if (spec->pattern_mask & ~g_patterns) {
    snprintf(g_error, sizeof g_error, "%s: asked for pattern_mask %u, runs %u", RECORDING_NAME,
             spec->pattern_mask, g_patterns);
    return ARBITER_UNSUPPORTED;
  }
  atomic_store(&g_asked, spec->pattern_mask);
  if (oob->barrier(oob->ctx, 10000) != ARBITER_OK) return ARBITER_TIMEOUT;
  *out = malloc(sizeof **out);
  (*out)->rank = oob->rank;
  (*out)->max_message_bytes = spec->max_message_bytes;
  return ARBITER_OK;
}

/* RECORDING_BLOCK_AT: wait for abort() (1 ms steps, 10 s at most). */
static int32_t wait_for_abort(void) {
  const struct timespec step = {0, 1000000};
  for (int i = 0; i < 10000; ++i) {
    if (atomic_load(&g_aborts) > 0) {
      snprintf(g_error, sizeof g_error, "%s: aborted while waiting on a peer", RECORDING_NAME);
      return ARBITER_ABORTED;
    }
    nanosleep(&step, NULL);
  }
  snprintf(g_error, sizeof g_error, "%s: waited 10 s on a peer", RECORDING_NAME);
  return ARBITER_TIMEOUT;
}

static int32_t run(arbiter_workspace* ws, const arbiter_allreduce_args* args, void* stream) {
  (void)stream;
  const uint32_t status = number_from_environment("_STATUS", 0);
  if (status != 0) return (int32_t)status; /* last_error() says so */
  const char* block_at = getenv("RECORDING_BLOCK_AT");
  if (block_at != NULL && atomic_fetch_add(&g_run_count, 1) == strtol(block_at, NULL, 10)) {
    const char* fail_rank = getenv("RECORDING_FAIL_RANK");
    if (fail_rank != NULL && *fail_rank != '\0' && strtol(fail_rank, NULL, 10) == ws->rank) {
      snprintf(g_error, sizeof g_error, "%s: the launch failed (RECORDING_FAIL_RANK)",
               RECORDING_NAME);
      return ARBITER_INTERNAL;
    }
    return wait_for_abort();
  }
  if (args->pattern != ARBITER_PATTERN_ALLREDUCE && args->residual_in == NULL &&
      !(g_flags & ARBITER_CAPS_RESIDUAL_OPTIONAL)) {
    snprintf(g_error, sizeof g_error, "%s: residual_in is NULL", RECORDING_NAME);
    return ARBITER_INVALID_ARGUMENT;
  }
  if (args->pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) atomic_fetch_add(&g_fp4_runs, 1);
  atomic_fetch_add(&g_runs[args->algorithm], 1);
  atomic_fetch_add(&g_bytes, (long)args->tokens * args->hidden * (args->dtype == 2 ? 4 : 2));
  return ARBITER_OK;
}

static void destroy(arbiter_workspace* ws) { free(ws); }

static const char* last_error(void) {
  if (getenv("RECORDING_NULL_ERROR") != NULL) return NULL;
  /* Constant: every rank thread's run() fails at once. */
  if (from_environment("_STATUS") != NULL) return RECORDING_NAME ": RECORDING_..._STATUS";
  return g_error;
}

static void abort_workspace(arbiter_workspace* ws) {
  (void)ws;
  atomic_fetch_add(&g_aborts, 1);
}

#ifndef RECORDING_BUILD
#define RECORDING_BUILD "recording 1"
#endif

#ifdef RECORDING_MEMORY
static uint64_t max_message_bytes(const arbiter_workspace* ws, arbiter_algorithm algorithm) {
  (void)algorithm;
  return ws->max_message_bytes;
}

static int32_t alloc_memory(arbiter_workspace* ws, uint64_t bytes, void** local) {
  (void)ws;
  *local = aligned_alloc(64, (bytes + 63) / 64 * 64);
  return *local != NULL ? ARBITER_OK : ARBITER_UNAVAILABLE;
}

static int32_t free_memory(arbiter_workspace* ws, void* local) {
  (void)ws;
  free(local);
  return ARBITER_OK;
}

static int32_t run_registered(arbiter_workspace* ws, const arbiter_allreduce_args* args,
                              void* stream) {
  (void)ws;
  (void)stream;
  atomic_fetch_add(&g_registered_runs, 1);
  atomic_fetch_add(&g_bytes, (long)args->tokens * args->hidden * (args->dtype == 2 ? 4 : 2));
  return ARBITER_OK;
}

EXPORT const arbiter_backend_memory_v2_t arbiter_backend_v2_memory = {
    ARBITER_BACKEND_ABI_VERSION_MEMORY, 0, 64, alloc_memory, free_memory, run_registered};
#define RECORDING_MAX_MESSAGE_BYTES max_message_bytes
#else
#define RECORDING_MAX_MESSAGE_BYTES NULL
#endif

EXPORT const arbiter_backend_v1_t arbiter_backend_v1 = {ARBITER_BACKEND_ABI_VERSION,
                                                        RECORDING_NAME,
                                                        probe,
                                                        create,
                                                        RECORDING_MAX_MESSAGE_BYTES,
                                                        run,
                                                        destroy,
                                                        last_error};
EXPORT const arbiter_backend_faults_v1_t arbiter_backend_v1_faults = {1, RECORDING_BUILD,
                                                                      abort_workspace};

/* Calls per algorithm since load; bytes in all. */
EXPORT long recording_runs(int algorithm) { return atomic_load(&g_runs[algorithm]); }
EXPORT long recording_bytes(void) { return atomic_load(&g_bytes); }
EXPORT long recording_fp4_runs(void) { return atomic_load(&g_fp4_runs); }
EXPORT unsigned recording_asked_patterns(void) { return atomic_load(&g_asked); }
EXPORT long recording_aborts(void) { return atomic_load(&g_aborts); }
EXPORT long recording_registered_runs(void) { return atomic_load(&g_registered_runs); }
