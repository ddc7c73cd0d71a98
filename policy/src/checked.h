// Internal invariants that must never fail. Checked in debug builds and in
// builds compiled with -DARBITER_CHECKED (the sanitizer and fuzz builds of
// scripts/test-hardening.sh); compiled out of release builds, where the code
// after the check must still do something safe.
#pragma once

#include <cstdio>
#include <cstdlib>

#if !defined(NDEBUG) || defined(ARBITER_CHECKED)
#define ARBITER_INVARIANT(condition, what)                                                   \
  do {                                                                                       \
    if (!(condition)) {                                                                      \
      std::fprintf(stderr, "%s:%d: arbiter invariant broken: %s (%s)\n", __FILE__, __LINE__, \
                   (what), #condition);                                                      \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
#else
#define ARBITER_INVARIANT(condition, what) \
  do {                                     \
  } while (0)
#endif
