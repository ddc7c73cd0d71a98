// libarbiter_bootstrap_ucx.so: the table the runtime loads (bootstrap_ucx_abi.h)
// over StarGroup. Nothing but `arbiter_bootstrap_ucx_v1` is exported.
#include <exception>
#include <string>

#include "bootstrap_group.h"
#include "bootstrap_ucx_abi.h"
#include "module_dir.h"

namespace arbiter::bootstrap {
namespace {

thread_local std::string t_last_error;

int32_t record(arbiter_status code, std::string message) {
  if (code != ARBITER_OK) t_last_error = std::move(message);
  return code;
}

int32_t record(const BootstrapStatus& status) { return record(status.code, status.message); }

// No exception leaves the library.
template <class F>
int32_t guarded(F&& call) {
  try {
    return call();
  } catch (const BootstrapError& e) {
    return record(e.code(), e.what());
  } catch (const std::exception& e) {
    return record(ARBITER_INTERNAL, std::string("bootstrap: ") + e.what());
  } catch (...) {
    return record(ARBITER_INTERNAL, "bootstrap: unknown exception");
  }
}

StarGroup* as_group(void* group) { return static_cast<StarGroup*>(group); }

int32_t join(const arbiter_bootstrap_ucx_options* o, void** group) {
  return guarded([&] {
    BootstrapOptions options;
    options.rank = o->rank;
    options.world_size = o->world_size;
    options.local_rank = o->local_rank;
    options.master_addr = o->master_addr ? o->master_addr : "";
    options.master_port = o->master_port;
    options.job_token = o->job_token ? o->job_token : "";
    options.timeout = std::chrono::milliseconds(o->timeout_ms);
    confine_ucx_modules();
    *group = StarGroup::join(options).release();
    return int32_t{ARBITER_OK};
  });
}

int32_t allgather(void* group, const void* send, void* recv, size_t bytes, int64_t timeout_ms) {
  return guarded([&] {
    return record(
        as_group(group)->allgather(send, recv, bytes, std::chrono::milliseconds(timeout_ms)));
  });
}

int32_t broadcast(void* group, void* buf, size_t bytes, int32_t root, int64_t timeout_ms) {
  return guarded([&] {
    return record(
        as_group(group)->broadcast(buf, bytes, root, std::chrono::milliseconds(timeout_ms)));
  });
}

int32_t barrier(void* group, int64_t timeout_ms) {
  return guarded(
      [&] { return record(as_group(group)->barrier(std::chrono::milliseconds(timeout_ms))); });
}

void leave(void* group) {
  try {
    delete as_group(group);
  } catch (...) {
    // The destructor only logs; nothing to report to a caller that is leaving.
  }
}

const char* last_error() { return t_last_error.c_str(); }

}  // namespace
}  // namespace arbiter::bootstrap

extern "C" __attribute__((visibility("default")))
const arbiter_bootstrap_ucx_v1_t arbiter_bootstrap_ucx_v1 = {
    ARBITER_BOOTSTRAP_UCX_VERSION, ARBITER_VERSION,
    arbiter::bootstrap::join,      arbiter::bootstrap::allgather,
    arbiter::bootstrap::broadcast, arbiter::bootstrap::barrier,
    arbiter::bootstrap::leave,     arbiter::bootstrap::last_error};
