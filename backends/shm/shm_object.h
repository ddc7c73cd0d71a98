// One POSIX shared-memory object that the ranks of a group map: rank 0
// creates it under a fresh name, the others open that name and map it. Used
// for the workspace (workspace_create.cpp) and for each allocation of
// registered memory (registered.cpp), and the few text helpers both
// exchanges need.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "arbiter_backend.h"
#include "status.h"

namespace arbiter::shm {

// Creates and maps an object of `bytes` bytes named `prefix` + 16 random
// hex digits (`name`), its pages reserved (posix_fallocate: a full /dev/shm
// fails here, not with SIGBUS at the first touch; `full_hint` is added to
// that error). On failure nothing is left: no name, no mapping.
Status create_shm_object(const char* prefix, std::uint64_t bytes, const char* full_hint,
                         std::string& name, void** base);

// Opens and maps the whole of object `name`, which must hold `bytes` bytes;
// another size is `wrong_size`: "NAME has N bytes, " + `expected`.
Status map_shm_object(const std::string& name, std::uint64_t bytes, arbiter_status wrong_size,
                      const std::string& expected, void** base);

// `call` and errno's text.
std::string errno_text(const std::string& call);

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
