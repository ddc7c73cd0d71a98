/* A backend module named "nccl" that needs libnccl.so.2 (DT_NEEDED, no
 * RUNPATH), as the real one does; its probe asks the NCCL it got for its
 * version, so it loads only when the runtime found one first. */
#include "fake_backend.h"

int ncclGetVersion(int* version);

static int32_t probe_with_nccl(const arbiter_probe_args* a, arbiter_backend_caps* c) {
  int version = 0;
  if (ncclGetVersion(&version) != 0 || version == 0) return ARBITER_UNAVAILABLE;
  return fake_probe_ok(a, c);
}

__attribute__((visibility("default"))) const arbiter_backend_v1_t arbiter_backend_v1 = {
    1, "nccl", probe_with_nccl, fake_create, 0, fake_run, fake_destroy, fake_last_error};
