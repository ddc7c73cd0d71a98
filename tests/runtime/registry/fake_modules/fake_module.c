/* A fake backend module; FAKE_KIND selects how it is broken:
 *   1 good (serves "trtllm")      2 wrong abi_version in the v1 struct
 *   3 no entry symbol at all      4 only a future arbiter_backend_v2
 *   5 probe fails                 6 name the policy does not know
 *   7 a required entry is NULL    8 probe answers for a CPU when asked
 *                                   about a GPU */
#include "fake_backend.h"

#define EXPORT __attribute__((visibility("default")))

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
                                                                         : "trtllm",
                                                        FAKE_KIND == 5   ? fake_probe_fails
                                                        : FAKE_KIND == 8 ? fake_probe_cpu
                                                                         : fake_probe_ok,
                                                        fake_create,
                                                        0,
                                                        FAKE_KIND == 7 ? 0 : fake_run,
                                                        fake_destroy,
                                                        fake_last_error};
#endif
