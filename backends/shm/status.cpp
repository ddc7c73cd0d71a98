#include "status.h"

namespace arbiter::shm {

namespace {
// Per thread, as the ABI requires; never freed while the thread lives, so
// the pointer last_error() hands out stays valid until the next failure.
thread_local std::string t_last_error;
}  // namespace

std::int32_t report(const Status& status) {
  if (!status.ok()) t_last_error = status.message();
  return status.code();
}

const char* last_error_message() { return t_last_error.c_str(); }

}  // namespace arbiter::shm
