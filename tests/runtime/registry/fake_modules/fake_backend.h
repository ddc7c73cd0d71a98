/* Pieces shared by the fake modules the loader tests use. Each fake is one
 * C file compiled with a -D switch that says how it is broken. */
#include "arbiter_backend.h"

static __attribute__((unused)) const char* fake_last_error(void) {
  return "the fake probe says no";
}
static __attribute__((unused)) int32_t fake_probe_ok(const arbiter_probe_args* a,
                                                     arbiter_backend_caps* c) {
  (void)a;
  c->device_kind = ARBITER_DEVICE_GPU;
  c->capability = 90;
  c->world_size_mask = (1ull << 2) | (1ull << 4) | (1ull << 8);
  c->dtype_mask = 7;
  c->pattern_mask = 7;
  c->algorithm_mask = 3;
  c->flags = ARBITER_CAPS_SINGLE_NODE_ONLY;
  return ARBITER_OK;
}
static __attribute__((unused)) int32_t fake_probe_cpu(const arbiter_probe_args* a,
                                                      arbiter_backend_caps* c) {
  fake_probe_ok(a, c);
  c->device_kind = ARBITER_DEVICE_CPU;
  return ARBITER_OK;
}
static __attribute__((unused)) int32_t fake_probe_fails(const arbiter_probe_args* a,
                                                        arbiter_backend_caps* c) {
  (void)a;
  (void)c;
  return ARBITER_UNAVAILABLE;
}
static __attribute__((unused)) int32_t fake_create(const arbiter_oob* o,
                                                   const arbiter_workspace_spec* s,
                                                   arbiter_workspace** w) {
  (void)o;
  (void)s;
  *w = 0;
  return ARBITER_UNAVAILABLE;
}
static __attribute__((unused)) int32_t fake_run(arbiter_workspace* w,
                                                const arbiter_allreduce_args* a, void* s) {
  (void)w;
  (void)a;
  (void)s;
  return ARBITER_UNSUPPORTED;
}
static __attribute__((unused)) void fake_destroy(arbiter_workspace* w) { (void)w; }
