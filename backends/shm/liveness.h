// Whether the peer processes of a workspace are still alive, asked only
// while a call waits (backoff.h), never on its fast path.
//
// Every rank of a shm workspace runs on this host, so each opens a pidfd
// for every peer when the workspace is created: the pidfd names that
// process for good (a pid may be reused; the pidfd is not), and becomes
// readable when the process exits, so one poll() with a zero timeout says
// whether any peer is gone. Where pidfd_open is refused (kernels before 5.3,
// some seccomp profiles) the peer's /proc entry is read instead: gone, a
// zombie, or a process started at another time than the one seen at
// creation means dead. Peers in another pid namespace (containers sharing
// /dev/shm but not pids) are not watched: their calls end at the deadline,
// as before.
//
// A peer that is not this process's child has no exit status to give:
// only its parent (the launcher) learns its exit code or signal.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace arbiter::shm {

class Liveness {
 public:
  Liveness() = default;
  // pids[r] and namespaces[r] of every rank (this one's included, skipped).
  Liveness(std::int32_t self, const std::vector<std::int32_t>& pids,
           const std::vector<std::uint64_t>& namespaces);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // The lowest rank whose process has exited, or -1. A syscall or a few:
  // call it only while waiting.
  std::int32_t first_dead() const;
  // How many peers are watched (by pidfd or /proc).
  std::size_t watched() const { return peers_.size(); }

  // This process's pid namespace (0 when it cannot be read).
  static std::uint64_t own_pid_namespace();

 private:
  struct Peer {
    std::int32_t rank;
    pid_t pid;
    int pidfd;                // -1: watched through /proc
    std::uint64_t starttime;  // /proc/PID/stat field 22, when pidfd is -1
  };
  std::vector<Peer> peers_;
};

}  // namespace arbiter::shm
