/* Compiled as C: the public headers must be plain C. Decides one call and
 * writes the backend name, or returns the error status. */
#include "arbiter/arbiter.h"

int32_t c_decide_nvl72(uint64_t bytes, arbiter_decision* out) {
  arbiter_policy* policy = 0;
  int32_t status = arbiter_policy_from_environment(&policy);
  if (status != ARBITER_OK) return status;
  arbiter_request r = {0};
  r.capability = 103;
  r.world_size = 16;
  r.nodes = 4;
  r.nvlink_domain = 1;
  r.multicast = 1;
  r.dtype = ARBITER_DTYPE_BF16;
  r.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  r.message_bytes = bytes;
  status = arbiter_decide(policy, &r, out);
  arbiter_policy_free(policy);
  return status;
}
