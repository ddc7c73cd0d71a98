// Whether the peer processes on this host are still alive, asked only while
// a call waits (the shm module's backoff.h) or from a watcher thread (the
// runtime's peer_watch.h), never on a call's fast path.
//
// Each rank opens a pidfd for every peer on its host when its workspace or
// communicator is created: the pidfd names that
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

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same on every architecture
#endif

namespace arbiter::common {

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
  // This boot of this host's kernel (/proc/sys/kernel/random/boot_id; ""
  // when unreadable): the same for every process on the host, containers
  // included, and different on any other host.
  static std::string boot_id();

 private:
  struct Peer {
    std::int32_t rank;
    pid_t pid;
    int pidfd;                // -1: watched through /proc
    std::uint64_t starttime;  // /proc/PID/stat field 22, when pidfd is -1
  };
  std::vector<Peer> peers_;
};

namespace liveness_detail {

// The state letter and start time (clock ticks after boot) of `pid` from
// /proc; false when the process is gone.
inline bool read_stat(pid_t pid, char* state, std::uint64_t* starttime) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  // Field 2 (comm) may hold spaces and parentheses: the fields after it
  // start after the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  rest >> *state;  // field 3
  for (int f = 4; f <= 21; ++f) rest >> field;
  rest >> *starttime;  // field 22
  return static_cast<bool>(rest);
}

}  // namespace liveness_detail

inline std::uint64_t Liveness::own_pid_namespace() {
  struct stat info {};
  if (stat("/proc/self/ns/pid", &info) != 0) return 0;
  return static_cast<std::uint64_t>(info.st_ino) ^ (static_cast<std::uint64_t>(info.st_dev) << 32);
}

inline std::string Liveness::boot_id() {
  std::string id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> id;
  return id;
}

inline Liveness::Liveness(std::int32_t self, const std::vector<std::int32_t>& pids,
                          const std::vector<std::uint64_t>& namespaces) {
  const std::uint64_t mine = own_pid_namespace();
  for (std::size_t r = 0; r < pids.size(); ++r) {
    if (static_cast<std::int32_t>(r) == self || pids[r] <= 0) continue;
    if (mine == 0 || namespaces[r] != mine) continue;  // its pid means nothing here
    Peer peer{static_cast<std::int32_t>(r), static_cast<pid_t>(pids[r]), -1, 0};
    peer.pidfd = static_cast<int>(syscall(SYS_pidfd_open, peer.pid, 0));
    if (peer.pidfd < 0) {
      char state = 0;
      if (!liveness_detail::read_stat(peer.pid, &state, &peer.starttime))
        peer.starttime = 0;  // already gone
    }
    peers_.push_back(peer);
  }
}

inline Liveness::~Liveness() {
  for (const Peer& peer : peers_) {
    if (peer.pidfd >= 0) close(peer.pidfd);
  }
}

inline std::int32_t Liveness::first_dead() const {
  // Polled 64 at a time: no allocation, whatever the world size.
  constexpr nfds_t kBatch = 64;
  pollfd fds[kBatch];
  std::int32_t ranks[kBatch];
  nfds_t count = 0;
  std::int32_t dead = -1;
  auto note = [&](std::int32_t rank) {
    if (dead < 0 || rank < dead) dead = rank;
  };
  auto poll_batch = [&] {
    if (count > 0 && poll(fds, count, 0) > 0) {
      for (nfds_t i = 0; i < count; ++i) {
        if (fds[i].revents != 0) note(ranks[i]);
      }
    }
    count = 0;
  };
  for (const Peer& peer : peers_) {
    if (peer.pidfd >= 0) {
      fds[count] = {peer.pidfd, POLLIN, 0};
      ranks[count++] = peer.rank;
      if (count == kBatch) poll_batch();
      continue;
    }
    char state = 0;
    std::uint64_t starttime = 0;
    if (peer.starttime == 0 || !liveness_detail::read_stat(peer.pid, &state, &starttime) ||
        state == 'Z' || state == 'X' || starttime != peer.starttime) {
      note(peer.rank);
    }
  }
  poll_batch();
  return dead;
}

}  // namespace arbiter::common
