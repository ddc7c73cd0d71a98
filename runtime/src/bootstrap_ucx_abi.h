// The private table between libarbiter_runtime and libarbiter_bootstrap_ucx.so,
// the UCX side of arbiter::Bootstrap (private; never installed).
//
// Why a separate library: the runtime (and so `import arbiter`, the C API and
// the `arbiter` program) must load on a machine without UCX; only a
// standalone group of several ranks needs it. The runtime dlopens this
// library, from the folder it lies in itself, on the first such join
// (bootstrap_ucx_loader.h) and reports a missing UCX there.
//
// Plain C, as for backend modules: no exception or C++ type crosses the
// dlopen. Both sides are built together; `version` and `arbiter_version`
// must match the runtime's, or the runtime refuses the library.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ARBITER_BOOTSTRAP_UCX_VERSION 1u
#define ARBITER_BOOTSTRAP_UCX_SYMBOL "arbiter_bootstrap_ucx_v1"

/* What arbiter::BootstrapOptions holds; the strings are only read during join. */
typedef struct arbiter_bootstrap_ucx_options {
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  const char* master_addr; /* host name or address of rank 0 */
  uint16_t master_port;
  const char* job_token;
  int64_t timeout_ms; /* deadline of the whole join */
} arbiter_bootstrap_ucx_options;

/* Every function returns an arbiter_status; on failure last_error() holds the
 * message (per thread). A group is used by one thread at a time. */
typedef struct arbiter_bootstrap_ucx_v1_t {
  uint32_t version;            /* ARBITER_BOOTSTRAP_UCX_VERSION */
  const char* arbiter_version; /* the project version it was built with */
  /* Initialises UCX and joins the group (world_size > 1); *group on success. */
  int32_t (*join)(const arbiter_bootstrap_ucx_options* options, void** group);
  int32_t (*allgather)(void* group, const void* send, void* recv, size_t bytes, int64_t timeout_ms);
  int32_t (*broadcast)(void* group, void* buf, size_t bytes, int32_t root, int64_t timeout_ms);
  int32_t (*barrier)(void* group, int64_t timeout_ms);
  /* Says goodbye to the other ranks (bounded wait), closes UCX, frees group. */
  void (*leave)(void* group);
  const char* (*last_error)(void);
} arbiter_bootstrap_ucx_v1_t;

#ifdef __cplusplus
}
#endif
