// What a fuzz target does when an invariant breaks: say which, then abort,
// so libFuzzer (or the replay test) records the input as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>

#define ARBITER_FUZZ_CHECK(condition, what)                                                  \
  do {                                                                                       \
    if (!(condition)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant broken: %s (%s)\n", __FILE__, __LINE__, (what), \
                   #condition);                                                              \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
