// Which process made something: a communicator or a joined group that a
// fork() copies into a child belongs to the parent, whose peers would pair
// the child's messages with the parent's. Host only.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

namespace arbiter {

// Bumped in the child of every fork() once fork_generation() has run.
extern std::atomic<std::uint64_t> g_fork_generation;

// Installs the fork handler on the first call; the generation now.
std::uint64_t fork_generation();

// Taken where the thing is made.
struct ForkStamp {
  std::uint64_t generation = fork_generation();
  pid_t pid;  // of the maker

  ForkStamp();
  // True in a forked child: a relaxed load, for hot paths.
  bool forked() const { return g_fork_generation.load(std::memory_order_relaxed) != generation; }
};

}  // namespace arbiter
