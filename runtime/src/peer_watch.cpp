#include "peer_watch.h"

#include <unistd.h>

#include <chrono>

namespace arbiter {

namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(100);

// FNV-1a of the kernel's boot_id: the same for every process of this boot
// of this host (containers included), different on another host.
std::uint64_t host_of_this_boot() {
  const std::string id = common::Liveness::boot_id();
  if (id.empty()) return 0;
  std::uint64_t h = 14695981039346656037ull;
  for (const char c : id) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

// The pids and namespaces Liveness watches: peers on this host in this pid
// namespace; every other rank gets namespace 0, which it skips.
common::Liveness liveness_for(std::int32_t self, const std::vector<ProcessIdentity>& ranks) {
  const ProcessIdentity mine = ProcessIdentity::own();
  std::vector<std::int32_t> pids(ranks.size());
  std::vector<std::uint64_t> namespaces(ranks.size(), 0);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    pids[r] = ranks[r].pid;
    // Ranks that share this process (threads, loopback tests) are not peers
    // to watch.
    if (mine.beside(ranks[r]) && ranks[r].pid != mine.pid) namespaces[r] = mine.pid_namespace;
  }
  return common::Liveness(self, pids, namespaces);
}

}  // namespace

ProcessIdentity ProcessIdentity::own() {
  static const ProcessIdentity cached = [] {
    ProcessIdentity id;
    id.pid_namespace = common::Liveness::own_pid_namespace();
    id.host = host_of_this_boot();
    return id;
  }();
  ProcessIdentity id = cached;
  id.pid = static_cast<std::int32_t>(getpid());  // not cached: a fork has its own
  return id;
}

PeerWatch::PeerWatch(std::int32_t self, const std::vector<ProcessIdentity>& ranks,
                     const FaultBoard* board, std::function<void(const PeerFault&)> on_fault)
    : liveness_(liveness_for(self, ranks)), board_(board), on_fault_(std::move(on_fault)) {
  if (board_ != nullptr) {
    // Ranks in this process post there too (an abort() in one thread).
    const ProcessIdentity mine = ProcessIdentity::own();
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      if (static_cast<std::int32_t>(r) != self && mine.beside(ranks[r])) {
        board_peers_.push_back(static_cast<std::int32_t>(r));
      }
    }
  }
  if (liveness_.watched() > 0 || !board_peers_.empty()) thread_ = std::thread([this] { loop(); });
}

PeerWatch::~PeerWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PeerWatch::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, kPollInterval, [this] { return stop_; })) {
    // A post where the fault began first (a rank that aborted and then
    // exited is named for the abort), then a dead process, then an echo
    // (ARBITER_PEER_FAILED: a rank that heard of someone else's fault).
    std::optional<FaultBoard::Post> post;
    if (!board_peers_.empty()) post = board_->posted(board_peers_);
    PeerFault fault;
    if (post && post->status != ARBITER_PEER_FAILED) {
      fault = {post->rank, post};
    } else if (const std::int32_t dead = liveness_.first_dead(); dead >= 0) {
      fault.rank = dead;
    } else if (post) {
      fault = {post->rank, post};
    }
    if (fault.rank >= 0) {
      lock.unlock();
      on_fault_(fault);
      return;
    }
  }
}

}  // namespace arbiter
