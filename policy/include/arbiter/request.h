// One all-reduce call as the policy sees it.
#pragma once

#include <cstdint>
#include <optional>

#include "arbiter/types.h"

namespace arbiter {

struct Request {
  Capability capability;
  std::uint32_t world_size = 0;
  std::uint32_t nodes = 1;
  // All ranks reach each other over NVLink: one NVSwitch node, or a
  // multi-node NVLink domain (GB200/GB300 NVL72).
  bool nvlink_domain = true;
  // NVLink SHARP multicast objects are usable by every rank.
  bool multicast = false;
  Dtype dtype = Dtype::kBf16;
  Pattern pattern = Pattern::kResidualRmsnorm;
  // Every rank passes the same residual (ARBITER_RUN_RESIDUAL_REPLICATED).
  // Meaningless for Pattern::kAllreduce, which has none: residual_of() says
  // what the tables see.
  bool residual_replicated = false;
  // The input lies in memory registered with the communicator (ABI v2), so
  // the backend reads the peers' inputs in place instead of copying.
  bool buffers_registered = false;
  // Per-rank input bytes = tokens x hidden x element size.
  std::uint64_t message_bytes = 0;
  // 0 means unknown; when known, trtllm two-shot needs tokens >= world_size.
  std::uint32_t tokens = 0;
  std::uint32_t hidden = 0;
  // The call is being captured into a CUDA graph. Decisions never allocate,
  // so this changes nothing today; it is part of the request so the trace
  // and future rules can see it.
  bool in_graph_capture = false;
  // Bit (1 << Backend) set: the caller cannot use that backend for this call
  // (its workspace failed to initialise, or is too small). The policy then
  // takes its next choice.
  std::uint32_t excluded_backends = 0;

  // The residual as table keys see it; nullopt for a pattern without one.
  constexpr std::optional<Residual> residual() const {
    if (pattern == Pattern::kAllreduce) return std::nullopt;
    return residual_replicated ? Residual::kReplicated : Residual::kDistinct;
  }

  // The buffers as table keys see them.
  constexpr BufferKind buffers() const {
    return buffers_registered ? BufferKind::kRegistered : BufferKind::kCopied;
  }

  // Fills message_bytes from tokens x hidden x element size.
  static Request with_tokens(Capability capability, std::uint32_t world_size, std::uint32_t tokens,
                             std::uint32_t hidden, Dtype dtype, Pattern pattern) {
    Request r;
    r.capability = capability;
    r.world_size = world_size;
    r.tokens = tokens;
    r.hidden = hidden;
    r.dtype = dtype;
    r.pattern = pattern;
    r.message_bytes = message_bytes_of(tokens, hidden, dtype);
    return r;
  }

  // Per-rank input bytes of tokens x hidden elements of dtype. Saturates at
  // the largest value instead of wrapping around: 2^31 tokens x 2^31 hidden
  // x 4 bytes once came to 0 bytes and was fused; now it is above every cap.
  static constexpr std::uint64_t message_bytes_of(std::uint64_t tokens, std::uint64_t hidden,
                                                  Dtype dtype) {
    constexpr std::uint64_t kMax = ~std::uint64_t{0};
    const auto size = static_cast<std::uint64_t>(element_size(dtype));
    if (hidden != 0 && tokens > kMax / hidden) return kMax;
    if (tokens * hidden > kMax / size) return kMax;
    return tokens * hidden * size;
  }
};

}  // namespace arbiter
