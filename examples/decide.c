/* arbiter-example-c: the policy through the C API, from C.
 *
 *   arbiter-example-c                 tables from the environment (ARBITER_CONFIG,
 *                                     ARBITER_BACKENDS), like every other consumer
 *   arbiter-example-c SITE.yaml...    the embedded defaults <- these site files
 *
 * Against an installed arbiter:
 *   cc decide.c $(pkg-config --cflags --libs arbiter) -o decide
 *
 * Prints the tables' fingerprint (equal to what `arbiter decide --json` and
 * the Python module report for the same layers), the fused cap of a GB300
 * NVL72 job (ws=16 on 4 nodes) and the explained decision for 64 MiB. Exits
 * 1 with arbiter_last_error() when the tables do not load.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <arbiter/arbiter.h>

static int fail(const char* what) {
  fprintf(stderr, "arbiter-example-c: %s failed:\n%s\n", what, arbiter_last_error());
  return 1;
}

int main(int argc, char** argv) {
  arbiter_policy* policy = NULL;
  int32_t status = argc > 1
                       ? arbiter_policy_load((const char* const*)(argv + 1), (size_t)(argc - 1),
                                             getenv("ARBITER_BACKENDS"), &policy)
                       : arbiter_policy_from_environment(&policy);
  if (status != ARBITER_OK) return fail("loading the tables");

  arbiter_request request = {0};
  request.capability = 103;
  request.world_size = 16;
  request.nodes = 4;
  request.nvlink_domain = 1;
  request.multicast = 1;
  request.dtype = ARBITER_DTYPE_BF16;
  request.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;

  uint64_t cap = 0;
  int32_t has_cap = 0;
  if (arbiter_max_fused_bytes(policy, &request, &cap, &has_cap) != ARBITER_OK) {
    arbiter_policy_free(policy);
    return fail("arbiter_max_fused_bytes");
  }
  printf("fingerprint %016" PRIx64 "\n", arbiter_policy_fingerprint(policy));
  if (has_cap) {
    printf("max_fused_bytes %" PRIu64 "\n", cap);
  } else {
    printf("max_fused_bytes none\n");
  }

  request.message_bytes = 64ull << 20;
  arbiter_decision decision;
  if (arbiter_decide(policy, &request, &decision) != ARBITER_OK) {
    arbiter_policy_free(policy);
    return fail("arbiter_decide");
  }
  static const char* const kAlgorithms[] = {"oneshot", "twoshot", "native"};
  printf("decide 64 MiB: %s %s %s\n", arbiter_backend_name(decision.backend),
         kAlgorithms[decision.algorithm], decision.fused ? "fused" : "unfused");

  /* The first call asks for the size; the second renders. */
  size_t needed = 0;
  arbiter_explain(policy, &request, 0, NULL, 0, &needed);
  char* text = needed ? malloc(needed) : NULL;
  if (!text || arbiter_explain(policy, &request, 0, text, needed, &needed) != ARBITER_OK) {
    free(text);
    arbiter_policy_free(policy);
    return fail("arbiter_explain");
  }
  fputs(text, stdout);
  free(text);
  arbiter_policy_free(policy);
  return 0;
}
