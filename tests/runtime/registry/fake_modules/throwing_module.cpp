// A fake backend module whose probe throws a C++ exception across the C
// ABI (a bug the loader must survive: it costs this module only).
#include <stdexcept>

#include "fake_backend.h"

namespace {

std::int32_t probe_throws(const arbiter_probe_args*, arbiter_backend_caps*) {
  throw std::runtime_error("the fake probe exploded");
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const arbiter_backend_v1_t arbiter_backend_v1 = {
    1, "shm", probe_throws, fake_create, nullptr, fake_run, fake_destroy, fake_last_error};
