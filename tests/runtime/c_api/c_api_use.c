/* Compiled as C: the public headers must be plain C. Decides one call and
 * writes the backend name, or returns the error status. */
#include <stdio.h>
#include <string.h>

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

/* One rank of the registered-memory test, through the C API only. Allocates
 * registered memory, runs the same all-reduce from ordinary memory and from
 * the registered one, and checks the bits agree; a bad free must be refused
 * with a message. Returns 0, or a line saying what went wrong in why. */
static int c_fail(char* why, size_t size, const char* what) {
  snprintf(why, size, "%s: %s", what, arbiter_last_error());
  return 1;
}

int c_registered_rank(const arbiter_oob* oob, char* why, size_t size) {
  enum { kTokens = 64, kHidden = 1024, kCount = kTokens * kHidden };
  arbiter_policy* policy = 0;
  arbiter_comm* comm = 0;
  arbiter_comm_options o = {0};
  arbiter_allreduce_args a = {0};
  uint16_t* registered = 0;
  static _Thread_local uint16_t plain[kCount], out_plain[kCount], out_registered[kCount];
  int failed = 0;
  size_t i;
  uint32_t tokens;
  const uint32_t sizes[] = {1, 3, kTokens};

  if (arbiter_policy_from_environment(&policy) != ARBITER_OK) return c_fail(why, size, "policy");
  o.hidden = kHidden;
  o.max_tokens = kTokens;
  o.dtype = ARBITER_DTYPE_BF16;
  o.device = -1;
  o.timeout_ms = 20000; /* a rank that fails early leaves its peer waiting this long */
  if (arbiter_comm_create(oob, policy, &o, &comm) != ARBITER_OK) {
    arbiter_policy_free(policy);
    return c_fail(why, size, "create");
  }
  arbiter_policy_free(policy);
  if (arbiter_comm_alloc(comm, sizeof plain, (void**)&registered) != ARBITER_OK) {
    failed = c_fail(why, size, "alloc");
    goto out;
  }
  if ((uintptr_t)registered % 4096 != 0) {
    snprintf(why, size, "alloc: %p is not page-aligned", (void*)registered);
    failed = 1;
    goto out;
  }
  for (i = 0; i < kCount; ++i) {
    /* bf16 values near 1.0 that differ by rank and place. */
    plain[i] = (uint16_t)(0x3C00 + (i * 7 + (size_t)oob->rank * 3) % 200);
    registered[i] = plain[i];
  }
  a.pattern = ARBITER_PATTERN_ALLREDUCE;
  a.dtype = ARBITER_DTYPE_BF16;
  a.hidden = kHidden;
  for (i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    tokens = sizes[i];
    a.tokens = tokens;
    a.input = plain;
    a.allreduce_out = out_plain;
    if (arbiter_comm_allreduce_fusion(comm, &a, 0, 0) != ARBITER_OK) {
      failed = c_fail(why, size, "ordinary call");
      goto out;
    }
    a.input = registered;
    a.allreduce_out = out_registered;
    if (arbiter_comm_allreduce_fusion(comm, &a, 0, 0) != ARBITER_OK) {
      failed = c_fail(why, size, "registered call");
      goto out;
    }
    if (memcmp(out_plain, out_registered, (size_t)tokens * kHidden * 2) != 0) {
      snprintf(why, size, "registered and ordinary calls differ at %u tokens", tokens);
      failed = 1;
      goto out;
    }
  }
  /* A pointer inside the allocation is not what alloc returned. */
  if (arbiter_comm_free(comm, registered + 1024) != ARBITER_INVALID_ARGUMENT ||
      arbiter_last_error()[0] == '\0') {
    snprintf(why, size, "freeing a pointer inside the allocation was not refused with a message");
    failed = 1;
    goto out;
  }
  if (arbiter_comm_free(comm, registered) != ARBITER_OK) {
    failed = c_fail(why, size, "free");
    goto out;
  }
  if (arbiter_comm_free(comm, registered) != ARBITER_INVALID_ARGUMENT) {
    snprintf(why, size, "a second free was not refused");
    failed = 1;
    goto out;
  }
  if (arbiter_comm_free(comm, 0) != ARBITER_INVALID_ARGUMENT ||
      arbiter_comm_alloc(0, 4096, (void**)&registered) != ARBITER_INVALID_ARGUMENT) {
    snprintf(why, size, "NULL arguments were not refused");
    failed = 1;
    goto out;
  }
  /* A second allocation left for arbiter_comm_destroy to free. */
  if (arbiter_comm_alloc(comm, 4096, (void**)&registered) != ARBITER_OK) {
    failed = c_fail(why, size, "second alloc");
    goto out;
  }
out:
  arbiter_comm_destroy(comm);
  return failed;
}
