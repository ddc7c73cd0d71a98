// The boundary of a backend module's C entry points: no exception crosses
// it, and a failure leaves its message in the module's per-thread last error.
#pragma once

#include <cstdint>
#include <exception>
#include <new>
#include <string>

#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::common {

// Stores a failed Status's message, prefixed with the module's name once.
inline std::int32_t report(std::string& last_error, const char* module, const Status& s) {
  if (!s.ok()) {
    const std::string prefix = std::string(module) + ": ";
    last_error = s.message().rfind(module, 0) == 0 ? s.message() : prefix + s.message();
  }
  return s.code();
}

// Runs `body` (returning an ABI status); any exception becomes
// ARBITER_INTERNAL with its message.
template <typename Body>
std::int32_t guarded(std::string& last_error, const char* module, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    last_error = std::string(module) + ": out of host memory";
  } catch (const std::exception& e) {
    try {
      last_error = std::string(module) + ": unexpected exception: " + e.what();
    } catch (...) {
    }
  } catch (...) {
    last_error = std::string(module) + ": unexpected exception";
  }
  return ARBITER_INTERNAL;
}

}  // namespace arbiter::common
