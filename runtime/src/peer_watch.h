// Watches, from a thread of its own, whether the processes of a GPU
// communicator's peers on this host are alive.
//
// A GPU call returns once its kernels are enqueued; the kernels, not the
// host, wait on peers, so nothing on the host would notice a dead peer
// before the kernels' own deadline (ARBITER_KERNEL_TIMEOUT_MS, 10 minutes by
// default). The shm module needs no watcher: its calls wait on the host and
// ask there (arbiter/common/liveness.h). The thread sleeps on a condition
// variable and wakes every 100 ms for one poll() of the peers' pidfds (or a
// /proc read where pidfd_open is refused); it touches nothing a call uses.
// When a peer has exited it calls `on_death(rank)` once and stops watching.
// Peers on other hosts, or in another pid namespace, are not watched: their
// faults end at the deadline, as before.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/common/liveness.h"

namespace arbiter {

// Where a rank's process runs, as the peers need it to watch that process.
struct ProcessIdentity {
  std::int32_t pid = 0;
  std::uint64_t pid_namespace = 0;  // 0: unknown
  std::uint64_t host = 0;           // a hash of this boot's kernel boot_id; 0: unknown

  static ProcessIdentity own();
};

class PeerWatch {
 public:
  // `ranks[r]` for every rank of the group (this one's included).
  PeerWatch(std::int32_t self, const std::vector<ProcessIdentity>& ranks,
            std::function<void(std::int32_t rank)> on_death);
  // Stops the thread (at most one poll later); never waits on a peer.
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // How many peers are watched; 0 means no thread runs.
  std::size_t watched() const { return liveness_.watched(); }

 private:
  void loop();

  common::Liveness liveness_;
  std::function<void(std::int32_t)> on_death_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace arbiter
