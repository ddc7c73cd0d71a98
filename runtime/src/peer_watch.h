// Watches, from a thread of its own, whether the processes of a GPU
// communicator's peers on this host are alive, and whether one of them
// posted a fault (an abort(), a failed call) on the host's fault board
// (fault_board.h).
//
// A GPU call returns once its kernels are enqueued; the kernels, not the
// host, wait on peers, so nothing on the host would notice a dead peer
// before the kernels' own deadline (ARBITER_KERNEL_TIMEOUT_MS, 10 minutes by
// default). The shm module needs no watcher: its calls wait on the host and
// ask there (arbiter/common/liveness.h). The thread sleeps on a condition
// variable and wakes every 100 ms for one poll() of the peers' pidfds (or a
// /proc read where pidfd_open is refused) and one read of the board's words;
// it touches nothing a call uses. When a peer has exited or posted, it calls
// `on_fault` once and stops watching. Peers on other hosts, or in another
// pid namespace, are not watched: their faults end at the deadline, as
// before.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/common/liveness.h"
#include "fault_board.h"

namespace arbiter {

// Where a rank's process runs, as the peers need it to watch that process.
struct ProcessIdentity {
  std::int32_t pid = 0;
  std::uint64_t pid_namespace = 0;  // 0: unknown
  std::uint64_t host = 0;           // a hash of this boot's kernel boot_id; 0: unknown

  static ProcessIdentity own();
  // Whether `other` runs on this one's host, in its pid namespace (where a
  // pid means the same process, and /dev/shm is likely the same).
  bool beside(const ProcessIdentity& other) const {
    return host != 0 && other.host == host && other.pid_namespace == pid_namespace;
  }
};

// What the watch saw: a peer's process exited, or it posted `post`.
struct PeerFault {
  std::int32_t rank = -1;
  std::optional<FaultBoard::Post> post;  // empty: the process exited
};

class PeerWatch {
 public:
  // `ranks[r]` for every rank of the group (this one's included); `board`
  // (may be null) outlives the watch.
  PeerWatch(std::int32_t self, const std::vector<ProcessIdentity>& ranks, const FaultBoard* board,
            std::function<void(const PeerFault&)> on_fault);
  // Stops the thread (at most one poll later); never waits on a peer.
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // How many peers' processes are watched; with no board, 0 means no
  // thread runs.
  std::size_t watched() const { return liveness_.watched(); }

 private:
  void loop();

  common::Liveness liveness_;
  const FaultBoard* board_;
  std::vector<std::int32_t> board_peers_;  // the other ranks on this host
  std::function<void(const PeerFault&)> on_fault_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace arbiter
