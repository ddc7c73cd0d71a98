/* A fake backend module; FAKE_KIND selects how it is broken:
 *   1 good (serves "trtllm")      2 wrong abi_version in the v1 struct
 *   3 no entry symbol at all      4 only a future arbiter_backend_v2
 *   5 probe fails                 6 name the policy does not know
 *   7 a required entry is NULL    8 probe answers for a CPU when asked
 *                                   about a GPU
 *   9 probe answers a device kind that names none
 *  10 crashes (SIGSEGV) in its constructor, 11 in probe()
 *  12 good, but installs a SIGSEGV handler of its own when loaded */
#include <signal.h>

#include "fake_backend.h"

#define EXPORT __attribute__((visibility("default")))

#if FAKE_KIND == 10
__attribute__((constructor)) static void fake_crash_on_load(void) { raise(SIGSEGV); }
#elif FAKE_KIND == 12
static void fake_own_handler(int sig) { (void)sig; }
__attribute__((constructor)) static void fake_install_handler(void) {
  signal(SIGSEGV, fake_own_handler);
}
#endif
static __attribute__((unused)) int32_t fake_probe_odd(const arbiter_probe_args* a,
                                                      arbiter_backend_caps* c) {
  fake_probe_ok(a, c);
  c->device_kind = (arbiter_device_kind)77;
  return ARBITER_OK;
}
static __attribute__((unused)) int32_t fake_probe_crash(const arbiter_probe_args* a,
                                                        arbiter_backend_caps* c) {
  (void)a;
  (void)c;
  raise(SIGSEGV);
  return ARBITER_OK;
}

#if FAKE_KIND == 3
EXPORT int not_an_arbiter_module = 1;
#elif FAKE_KIND == 4
EXPORT const arbiter_backend_v1_t arbiter_backend_v2 = {
    2, "trtllm", fake_probe_ok, fake_create, 0, fake_run, fake_destroy, fake_last_error};
#else
EXPORT const arbiter_backend_v1_t arbiter_backend_v1 = {FAKE_KIND == 2 ? 7 : 1,
                                                        FAKE_KIND == 6   ? "frobnicator"
                                                        : FAKE_KIND == 5 ? "mnnvl"
                                                        : FAKE_KIND == 8 ? "nccl"
                                                        : FAKE_KIND == 9 ? "mnnvl"
                                                                         : "trtllm",
                                                        FAKE_KIND == 5   ? fake_probe_fails
                                                        : FAKE_KIND == 8  ? fake_probe_cpu
                                                        : FAKE_KIND == 9  ? fake_probe_odd
                                                        : FAKE_KIND == 11 ? fake_probe_crash
                                                                          : fake_probe_ok,
                                                        fake_create,
                                                        0,
                                                        FAKE_KIND == 7 ? 0 : fake_run,
                                                        fake_destroy,
                                                        fake_last_error};
#endif
