// What the workspace (workspace_create.cpp) and registered memory
// (registered.cpp) exchanges share: their shared-memory objects
// (arbiter/common/shm_object.h, also the runtime's fault board) and a few
// text helpers.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "arbiter/common/shm_object.h"
#include "arbiter_backend.h"
#include "status.h"

namespace arbiter::shm {

using common::create_shm_object;
using common::errno_text;
using common::map_shm_object;

// An oob call that failed with `code`: its status (an unknown code is
// ARBITER_INTERNAL) and "WHO: oob STEP failed (code C): REASON".
Status oob_failed(const arbiter_oob& oob, std::int32_t code, const char* who, const char* step);

// `text` into a fixed field, cut to fit, always terminated.
template <std::size_t N>
void copy_text(char (&destination)[N], const std::string& text) {
  const std::size_t length = text.size() < N - 1 ? text.size() : N - 1;
  std::memcpy(destination, text.data(), length);
  destination[length] = '\0';
}

// A fixed field's text, up to its terminator.
template <std::size_t N>
std::string read_text(const char (&source)[N]) {
  return std::string(source, strnlen(source, N));
}

}  // namespace arbiter::shm
