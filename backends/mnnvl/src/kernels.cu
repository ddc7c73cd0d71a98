// mnnvl fused all-reduce kernels: Lamport protocols over a multicast
// mapping, with no barrier at all. Three buffers rotate; a call writes buffer
// b (the control block's), resets this rank's own buffer (b + 2) % 3 to the
// sentinel over what the call before wrote there, and polls its own copy of
// buffer b. The sentinel is the 32-bit word 0x80000000 compared on raw bits;
// payloads are sanitised (-0.0 -> +0.0 per element), so no payload word can
// equal it (for 16-bit types it would need a -0.0 high half).
//
// One-shot: each rank stores its message once through the multicast address
// into slot [rank] of buffer b (rank-major: rank r's bytes at r x message
// bytes), then polls slots 0..ws-1 of its own copy and sums them in rank
// order in fp32.
// Two-shot: token t belongs to rank t % ws. Each rank stores token t into
// row [rank][t / ws] of the owner's scatter area (unicast); the owner polls
// its rows of every rank, sums in rank order, rounds to the dtype and stores
// the sum through the multicast address into row t of every rank's broadcast
// area; every rank polls its broadcast area and runs the epilogue.
// Why three buffers suffice, and why the clear is safe: a rank reaches call
// k + 2 only after every owner broadcast its tokens of call k + 1, which each
// does after finishing call k; so nobody writes buffer (k + 2) % 3 of a rank
// before that rank's call k, which resets it, is over. Every word written
// into a rank's buffer during a call is polled by that rank in that call.
#include <cuda_runtime.h>

#include <cstdint>

#include "arbiter/common/cuda/device_ops.cuh"
#include "arbiter/common/cuda/fused_epilogue.cuh"
#include "arbiter/common/cuda/kernel_launch.cuh"
#include "arbiter/common/stages.h"
#include "kernels.h"

namespace arbiter::mnnvl {
namespace {

using common::Epilogue;
using namespace common::device;

constexpr unsigned kPollBatch = 4;
constexpr unsigned kSentinelWord = 0x80000000u;

__device__ inline bool has_sentinel_word(const uint4& v) {
  return v.x == kSentinelWord || v.y == kSentinelWord || v.z == kSentinelWord ||
         v.w == kSentinelWord;
}

// One store that lands in every rank's workspace at `offset`.
__device__ inline void store_to_all(const KernelParams& p, std::uint64_t offset, const uint4& v) {
  if (p.multicast != nullptr) {
    asm volatile(
        "multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p.multicast + offset),
        "f"(__uint_as_float(v.x)), "f"(__uint_as_float(v.y)), "f"(__uint_as_float(v.z)),
        "f"(__uint_as_float(v.w))
        : "memory");
  } else {
    for (std::uint32_t q = 0; q < p.world_size; ++q) store_relaxed_system(p.peers[q] + offset, v);
  }
}

// Polls `count` vectors (at `first`, `stride` apart, in this rank's memory)
// until none holds the sentinel, and adds them in order into `sum`. After
// an abort (the host's flag) a wait ends with a zero vector stored where it
// polls (Spin): the outputs are then unspecified.
template <arbiter_dtype kDtype>
__device__ inline void poll_and_sum(const KernelParams& p, const char* first, std::uint64_t stride,
                                    std::uint32_t count, std::uint32_t token,
                                    float (&sum)[Vector<kDtype>::kElements]) {
  constexpr unsigned kN = Vector<kDtype>::kElements;
  Spin spin("mnnvl");
  for (std::uint32_t q0 = 0; q0 < count; q0 += kPollBatch) {
    uint4 v[kPollBatch];
#pragma unroll
    for (unsigned j = 0; j < kPollBatch; ++j) {
      if (q0 + j < count) v[j] = load_volatile(first + (q0 + j) * stride);
    }
#pragma unroll
    for (unsigned j = 0; j < kPollBatch; ++j) {
      if (q0 + j >= count) continue;
      while (has_sentinel_word(v[j])) {
        char* const polled = const_cast<char*>(first) + (q0 + j) * stride;  // this rank's memory
        spin.again(
            p, [&] { store_vector(polled, make_uint4(0, 0, 0, 0)); }, "mnnvl data", q0 + j, token);
        v[j] = load_volatile(polled);
      }
      float f[kN];
      unpack<kDtype>(v[j], f);
#pragma unroll
      for (unsigned k = 0; k < kN; ++k) sum[k] += f[k];
    }
  }
}

// Resets what the call before last wrote into this rank's buffer
// stage_to_clear(buffer) to the sentinel, with every thread of the grid.
__device__ inline void clear_previous(const KernelParams& p, std::uint32_t buffer,
                                      const ClearRanges& clear) {
  char* base = p.peers[p.rank] + p.buffers_offset + common::stage_to_clear(buffer) * p.buffer_bytes;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  const std::uint64_t first = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const uint4 sentinel = make_uint4(kSentinelWord, kSentinelWord, kSentinelWord, kSentinelWord);
  for (std::uint64_t i = first; i < clear.scatter_bytes / 16; i += stride) {
    store_vector(base + i * 16, sentinel);
  }
  for (std::uint64_t i = first; i < clear.broadcast_bytes / 16; i += stride) {
    store_vector(base + p.broadcast_offset + i * 16, sentinel);
  }
}

struct CallState {
  std::uint32_t buffer;
  ClearRanges clear;
};

__device__ inline CallState read_control(const KernelParams& p) {
  __shared__ CallState shared;
  if (threadIdx.x == 0) {
    const volatile ControlBlock* c = p.control;
    shared.buffer = c->buffer;
    shared.clear.scatter_bytes = c->clear.scatter_bytes;
    shared.clear.broadcast_bytes = c->clear.broadcast_bytes;
  }
  __syncthreads();
  return shared;
}

template <arbiter_dtype kDtype, Epilogue kEpilogue>
__global__ void __launch_bounds__(kMaxThreads, 1) oneshot_kernel(const KernelParams p) {
  constexpr unsigned kN = Vector<kDtype>::kElements;
  __shared__ ReductionSmem smem;
  wait_for_previous_grid();
  const CallState state = read_control(p);
  const Lane lane = lane_of(p.epilogue);
  const unsigned clusters = gridDim.x / p.epilogue.cluster_size;
  const unsigned cluster = blockIdx.x / p.epilogue.cluster_size;
  const std::uint64_t row_bytes =
      std::uint64_t{p.epilogue.hidden} * sizeof(typename Vector<kDtype>::Bits);
  const std::uint64_t message_bytes = p.tokens * row_bytes;
  const std::uint64_t lane_bytes = std::uint64_t{lane.vector} * 16;
  const std::uint64_t buffer = p.buffers_offset + state.buffer * p.buffer_bytes;

  if (lane.active) {
    for (std::uint32_t t = cluster; t < p.tokens; t += clusters) {
      const std::uint64_t offset = t * row_bytes + lane_bytes;
      const uint4 v = sanitize<kDtype>(load_vector(static_cast<const char*>(p.input) + offset));
      store_to_all(p, buffer + p.rank * message_bytes + offset, v);
    }
  }
  clear_previous(p, state.buffer, state.clear);

  const char* self = p.peers[p.rank] + buffer;
  for (std::uint32_t t = cluster; t < p.tokens; t += clusters) {
    float sum[kN];
#pragma unroll
    for (unsigned k = 0; k < kN; ++k) sum[k] = 0.0f;
    if (lane.active) {
      poll_and_sum<kDtype>(p, self + t * row_bytes + lane_bytes, message_bytes, p.world_size, t,
                           sum);
    }
    apply_epilogue<kDtype, kEpilogue>(p.epilogue, t, lane, sum, smem);
  }

  arrive(p.control, [&](ControlBlock& control) {
    control.buffer = common::next_stage(state.buffer);
    control.clear = oneshot_clear_ranges(p.world_size, message_bytes);
  });
  allow_dependent_grid();
}

template <arbiter_dtype kDtype, Epilogue kEpilogue>
__global__ void __launch_bounds__(kMaxThreads, 1) twoshot_kernel(const KernelParams p) {
  constexpr unsigned kN = Vector<kDtype>::kElements;
  __shared__ ReductionSmem smem;
  wait_for_previous_grid();
  const CallState state = read_control(p);
  const Lane lane = lane_of(p.epilogue);
  const unsigned clusters = gridDim.x / p.epilogue.cluster_size;
  const unsigned cluster = blockIdx.x / p.epilogue.cluster_size;
  const std::uint64_t row_bytes =
      std::uint64_t{p.epilogue.hidden} * sizeof(typename Vector<kDtype>::Bits);
  const std::uint64_t lane_bytes = std::uint64_t{lane.vector} * 16;
  const std::uint64_t buffer = p.buffers_offset + state.buffer * p.buffer_bytes;
  const std::uint32_t rows_per_owner = (p.tokens + p.world_size - 1) / p.world_size;

  // 1. Scatter: token t to its owner, row [rank][t / ws].
  if (lane.active) {
    for (std::uint32_t t = cluster; t < p.tokens; t += clusters) {
      const uint4 v = sanitize<kDtype>(
          load_vector(static_cast<const char*>(p.input) + t * row_bytes + lane_bytes));
      const std::uint64_t row = std::uint64_t{p.rank} * rows_per_owner + t / p.world_size;
      store_relaxed_system(p.peers[t % p.world_size] + buffer + row * row_bytes + lane_bytes, v);
    }
  }
  clear_previous(p, state.buffer, state.clear);

  // 2. Reduce the owned tokens (t = rank + ws x j) and broadcast the sums.
  const char* self = p.peers[p.rank] + buffer;
  if (lane.active) {
    for (std::uint32_t j = cluster; p.rank + std::uint64_t{j} * p.world_size < p.tokens;
         j += clusters) {
      const std::uint32_t t = p.rank + j * p.world_size;
      float sum[kN];
#pragma unroll
      for (unsigned k = 0; k < kN; ++k) sum[k] = 0.0f;
      poll_and_sum<kDtype>(p, self + j * row_bytes + lane_bytes, rows_per_owner * row_bytes,
                           p.world_size, t, sum);
      store_to_all(p, buffer + p.broadcast_offset + t * row_bytes + lane_bytes,
                   sanitize<kDtype>(pack<kDtype>(sum)));
    }
  }

  // 3. Gather every token's sum from the own broadcast area; epilogue.
  for (std::uint32_t t = cluster; t < p.tokens; t += clusters) {
    float sum[kN];
#pragma unroll
    for (unsigned k = 0; k < kN; ++k) sum[k] = 0.0f;
    if (lane.active) {
      poll_and_sum<kDtype>(p, self + p.broadcast_offset + t * row_bytes + lane_bytes, 0, 1, t, sum);
    }
    apply_epilogue<kDtype, kEpilogue>(p.epilogue, t, lane, sum, smem);
  }

  arrive(p.control, [&](ControlBlock& control) {
    control.buffer = common::next_stage(state.buffer);
    control.clear = twoshot_clear_ranges(p.world_size, p.tokens, row_bytes);
  });
  allow_dependent_grid();
}

__global__ void fill_kernel(uint4* base, std::uint64_t vectors) {
  const uint4 v = make_uint4(kSentinelWord, kSentinelWord, kSentinelWord, kSentinelWord);
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < vectors;
       i += stride) {
    base[i] = v;
  }
}

// One 16-byte store of (magic, rank, ~magic, ~rank) through the multicast
// address at slot [rank]: the workspace-creation probe.
__global__ void probe_kernel(char* multicast, std::uint32_t rank, std::uint32_t magic) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(
                     multicast + std::uint64_t{rank} * 16),
                 "f"(__uint_as_float(magic)), "f"(__uint_as_float(rank)),
                 "f"(__uint_as_float(~magic)), "f"(__uint_as_float(~rank))
                 : "memory");
  }
}

}  // namespace

cudaError_t launch_oneshot(const KernelParams& params, arbiter_dtype dtype, arbiter_pattern pattern,
                           const common::LaunchShape& shape, cudaStream_t stream) {
  const auto kernel = common::select_kernel<KernelParams>(
      dtype, pattern, [](auto d, auto e) -> common::KernelFunction<KernelParams> {
        return oneshot_kernel<decltype(d)::value, decltype(e)::value>;
      });
  return common::launch_kernel(kernel, params, shape, stream);
}

cudaError_t launch_twoshot(const KernelParams& params, arbiter_dtype dtype, arbiter_pattern pattern,
                           const common::LaunchShape& shape, cudaStream_t stream) {
  const auto kernel = common::select_kernel<KernelParams>(
      dtype, pattern, [](auto d, auto e) -> common::KernelFunction<KernelParams> {
        return twoshot_kernel<decltype(d)::value, decltype(e)::value>;
      });
  return common::launch_kernel(kernel, params, shape, stream);
}

cudaError_t launch_fill_sentinel(void* base, std::uint64_t bytes, cudaStream_t stream) {
  const std::uint64_t vectors = bytes / 16;
  if (vectors == 0) return cudaSuccess;
  const std::uint64_t blocks = (vectors + 255) / 256;
  fill_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(
      static_cast<uint4*>(base), vectors);
  return cudaGetLastError();
}

cudaError_t launch_multicast_probe(void* multicast, std::uint32_t rank, std::uint32_t magic,
                                   cudaStream_t stream) {
  probe_kernel<<<1, 32, 0, stream>>>(static_cast<char*>(multicast), rank, magic);
  return cudaGetLastError();
}

cudaError_t query_max_active_clusters(std::uint32_t cluster_size, int* clusters) {
  // Every instantiation has the footprint of its kind: 1024 threads capped at
  // 64 registers by __launch_bounds__, and the same static shared memory.
  // The smaller of the two kernels' residency, so neither outgrows a wave.
  int oneshot = 0;
  int twoshot = 0;
  cudaError_t e = common::max_active_clusters<KernelParams>(
      oneshot_kernel<ARBITER_DTYPE_BF16, Epilogue::kNormFp4>, cluster_size, &oneshot);
  if (e == cudaSuccess) {
    e = common::max_active_clusters<KernelParams>(
        twoshot_kernel<ARBITER_DTYPE_BF16, Epilogue::kNormFp4>, cluster_size, &twoshot);
  }
  *clusters = oneshot < twoshot ? oneshot : twoshot;
  return e;
}

}  // namespace arbiter::mnnvl
