/* A GPU backend module that runs nothing and counts what it is asked to run,
 * so the communicator's dispatch can be checked on a CPU machine. Built once
 * per name (RECORDING_NAME: "mnnvl", "nccl", "trtllm"); probe() claims a GPU of
 * capability 103 (GB300). The counts are read through an exported function. */
#include <stdatomic.h>
#include <stdlib.h>

#include "arbiter_backend.h"

#define EXPORT __attribute__((visibility("default")))

struct arbiter_workspace {
  int rank;
};

static atomic_long g_runs[3]; /* by arbiter_algorithm */
static atomic_long g_bytes;

static int32_t probe(const arbiter_probe_args* args, arbiter_backend_caps* caps) {
  if (args->device_kind != ARBITER_DEVICE_GPU) return ARBITER_UNAVAILABLE;
  caps->device_kind = ARBITER_DEVICE_GPU;
  caps->capability = 103;
  caps->world_size_mask = ~(uint64_t)3;
  caps->dtype_mask = 7;
  caps->pattern_mask = 15;
  caps->algorithm_mask = 7;
  caps->flags = 0;
  return ARBITER_OK;
}

static int32_t create(const arbiter_oob* oob, const arbiter_workspace_spec* spec,
                      arbiter_workspace** out) {
  (void)spec;
  if (oob->barrier(oob->ctx, 10000) != ARBITER_OK) return ARBITER_TIMEOUT;
  *out = malloc(sizeof **out);
  (*out)->rank = oob->rank;
  return ARBITER_OK;
}

static int32_t run(arbiter_workspace* ws, const arbiter_allreduce_args* args, void* stream) {
  (void)ws;
  (void)stream;
  atomic_fetch_add(&g_runs[args->algorithm], 1);
  atomic_fetch_add(&g_bytes, (long)args->tokens * args->hidden * (args->dtype == 2 ? 4 : 2));
  return ARBITER_OK;
}

static void destroy(arbiter_workspace* ws) { free(ws); }

static const char* last_error(void) { return ""; }

EXPORT const arbiter_backend_v1_t arbiter_backend_v1 = {
    ARBITER_BACKEND_ABI_VERSION, RECORDING_NAME, probe, create, 0, run, destroy, last_error};

/* Calls per algorithm since load; bytes in all. */
EXPORT long recording_runs(int algorithm) { return atomic_load(&g_runs[algorithm]); }
EXPORT long recording_bytes(void) { return atomic_load(&g_bytes); }
