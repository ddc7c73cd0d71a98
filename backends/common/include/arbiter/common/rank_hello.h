// The first record the ranks of a GPU module all-gather when they create a
// workspace: where each rank runs (host, process, GPU and its share) and the
// workspace it built, so that every rank reaches the same verdict from the
// same records. A module's own record embeds it (as `rank`) next to
// `status` and `reason` (collective.h reads those). Host only.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "arbiter/common/cuda_host.h"
#include "arbiter/common/gpu_share.h"
#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::common {

struct RankHello {
  std::uint32_t magic;  // the module's build: its records' layout
  std::uint64_t host;
  std::uint64_t process;
  std::int32_t device;
  std::uint32_t capability;
  GpuShare gpu;
  std::uint32_t world_size;
  std::int32_t dtype;
  std::uint64_t message_capacity;
  std::uint64_t total_bytes;
};

// ARBITER_TEST_SHARED_GPU=1: arbiter's multi-process GPU tests run every
// rank on GPU 0 (bench/FUSED.md, "Multi-process GPU tests"), so a module accepts
// ranks of different processes on one GPU; their kernels then take turns in
// time slices, correct but slow. Never for a real job: the runtime refuses
// to create a communicator while it is set.
inline bool test_shared_gpu() {
  const char* value = std::getenv("ARBITER_TEST_SHARED_GPU");
  return value != nullptr && value[0] == '1' && value[1] == '\0';
}

inline RankHello identify_rank(std::uint32_t magic, int device) {
  RankHello h{};
  h.magic = magic;
  h.host = host_identity();
  h.process = process_identity();
  h.device = device;
  return h;
}

// The spec agrees with the oob group and names a GPU.
inline Status check_rank_spec(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                              const char* module) {
  if (spec.world_size != oob.size || spec.rank != oob.rank) {
    return Status(ARBITER_INVALID_ARGUMENT,
                  "spec says rank " + std::to_string(spec.rank) + " of " +
                      std::to_string(spec.world_size) + ", the oob group says rank " +
                      std::to_string(oob.rank) + " of " + std::to_string(oob.size));
  }
  if (spec.device < 0) {
    return Status(ARBITER_INVALID_ARGUMENT, "spec.device is " + std::to_string(spec.device) + "; " +
                                                module + " needs a CUDA ordinal (LOCAL_RANK)");
  }
  return Status();
}

// Records the workspace and the GPU (its capability also into *capability).
template <typename Layout>
Status describe_rank(const Layout& layout, int device, cudaError_t (*query)(std::uint32_t, int*),
                     std::uint32_t* capability, RankHello* hello) {
  hello->world_size = layout.world_size;
  hello->dtype = layout.dtype;
  hello->message_capacity = layout.message_capacity;
  hello->total_bytes = layout.total_bytes;
  if (Status s = describe_gpu(device, query, capability, &hello->gpu); !s.ok()) return s;
  hello->capability = *capability;
  return Status();
}

// Every rank runs this build and built the same workspace on the same kind
// of GPU. Record: has a RankHello `rank`.
template <typename Record>
Status check_same_workspace(const std::vector<Record>& all) {
  const RankHello& a = all[0].rank;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const RankHello& b = all[r].rank;
    const std::string rank = "rank " + std::to_string(r);
    if (b.magic != a.magic) {
      return Status(ARBITER_INVALID_ARGUMENT, rank + " runs a different build of this module");
    }
    if (b.world_size != a.world_size || b.dtype != a.dtype ||
        b.message_capacity != a.message_capacity || b.total_bytes != a.total_bytes) {
      const auto describe = [](const RankHello& h) {
        return "world size " + std::to_string(h.world_size) + ", dtype " + std::to_string(h.dtype) +
               ", message capacity " + std::to_string(h.message_capacity) + " bytes";
      };
      return Status(ARBITER_INVALID_ARGUMENT, "ranks disagree on the workspace: rank 0 has " +
                                                  describe(a) + "; " + rank + " has " +
                                                  describe(b));
    }
    if (b.capability != a.capability) {
      return Status(ARBITER_UNSUPPORTED, rank + " has capability " + std::to_string(b.capability) +
                                             ", rank 0 has " + std::to_string(a.capability));
    }
  }
  return Status();
}

template <typename Record>
DeviceLimits limits_of(const std::vector<Record>& all) {
  std::vector<GpuShare> gpus;
  for (const Record& h : all) gpus.push_back(h.rank.gpu);
  return agreed_limits(gpus);
}

}  // namespace arbiter::common
