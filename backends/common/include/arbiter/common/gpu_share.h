// Where a rank runs and how much of its GPU it may use, as the GPU modules
// exchange it when creating a workspace: the host and process a rank lives
// in (so peers on the same host use IPC or file descriptors, and peers in
// the same process use plain pointers), and each rank's share of its GPU
// (ranks of one process on one GPU split it, so that all their CTAs are
// resident at once). Host only.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "arbiter/common/launch_config.h"

namespace arbiter::common {

inline std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The same for every process on this host (the kernel's boot id; the host
// name where that cannot be read), different on another host.
inline std::uint64_t host_identity() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in >> id && !id.empty()) return fnv1a("boot:" + id);
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return fnv1a(std::string("host:") + name);
}

// Different for every process, a fork included (the pid is mixed in at
// every call): peers with the same value share this address space.
inline std::uint64_t process_identity() {
  static const std::uint64_t salt = [] {
    std::random_device random;
    return (std::uint64_t{random()} << 32) ^ random();
  }();
  return salt ^ (static_cast<std::uint64_t>(getpid()) * 0x9E3779B97F4A7C15ull);
}

// Resident clusters are recorded for sizes 2, 4 and 8 (index log2 - 1).
inline constexpr int kClusterSizesQueried = 3;

// One rank's GPU, as all-gathered (trivially copyable).
struct GpuShare {
  unsigned char uuid[16];
  std::uint32_t sm_count;
  std::uint32_t clusters[kClusterSizesQueried];  // resident clusters of 2, 4, 8 CTAs
};

// The launch limits every rank uses: the minimum over ranks of each rank's
// share of its GPU, where ranks with the same GPU (uuid) split it evenly.
// One CTA of up to 1024 threads per SM (the kernels' __launch_bounds__).
inline DeviceLimits agreed_limits(const std::vector<GpuShare>& all) {
  std::uint32_t sm_share = ~0u;
  std::uint32_t cluster_share[kClusterSizesQueried];
  std::fill(cluster_share, cluster_share + kClusterSizesQueried, ~0u);
  for (const GpuShare& g : all) {
    std::uint32_t sharing = 0;
    for (const GpuShare& other : all) {
      sharing += std::memcmp(g.uuid, other.uuid, sizeof g.uuid) == 0 ? 1 : 0;
    }
    sm_share = std::min(sm_share, g.sm_count / sharing);
    for (int i = 0; i < kClusterSizesQueried; ++i) {
      cluster_share[i] = std::min(cluster_share[i], g.clusters[i] / sharing);
    }
  }
  DeviceLimits limits;
  limits.sm_count = sm_share;
  limits.max_threads_per_block = kMaxCtaThreads;
  limits.resident_blocks_per_sm = 1;
  limits.active_clusters[0] = sm_share;
  limits.max_cluster_size = 1;
  // Sizes of which not even one cluster per rank fits are never launched.
  for (int i = 0; i < kClusterSizesQueried && cluster_share[i] >= 1; ++i) {
    limits.active_clusters[i + 1] = cluster_share[i];
    limits.max_cluster_size = 2u << i;
  }
  return limits;
}

}  // namespace arbiter::common
