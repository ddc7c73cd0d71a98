// Host-side admission of one run() call against a workspace, checked before
// anything is enqueued. A call refused here changes nothing: the host then
// tries its next choice (ARBITER_UNSUPPORTED) or reports a caller bug
// (ARBITER_INVALID_ARGUMENT). The message names the numbers involved.
//
// What each check prevents:
//  - message bytes above the per-call capacity: an out-of-bounds peer store
//    (illegal memory access, whole-node Xid wedges in the field);
//  - a dtype other than the workspace's: the one-shot stages hold that
//    dtype's -0.0 pattern, so another dtype's readers hang or read garbage;
//  - NVFP4 below capability 100: the quantiser would compile to a silent
//    no-op on SM90 (FlashInfer), so it is refused instead;
//  - two-shot with fewer tokens than ranks: empty token slices.
// The checks every fused backend shares (pattern, algorithm, dtype, NVFP4,
// buffers and their alignment) are arbiter/common/call_checks.h.
#pragma once

#include <cstdint>
#include <string>

#include "arbiter/common/call_checks.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/status.h"
#include "arbiter/trtllm/launch_config.h"
#include "arbiter/trtllm/workspace_layout.h"
#include "arbiter_backend.h"

namespace arbiter::trtllm {

using common::Result;
using common::Status;

using common::algorithm_name;
using common::kMinNvfp4Capability;

// The most tokens one registered call may carry (copied calls are bounded
// by the workspace's capacity, far below it).
inline constexpr std::uint32_t kMaxRegisteredTokens = std::uint32_t{1} << 31;

// REQUIRES: layout came from make_workspace_layout. `capability` is the
// device's major * 10 + minor (90 for H100/H200, 100 for B200). A
// `registered` call has no per-call capacity (at most kMaxRegisteredTokens):
// one-shot reads the inputs in place, and run_registered slices a two-shot
// call itself.
inline Status check_call(const WorkspaceLayout& layout, const arbiter_allreduce_args* args,
                         std::uint32_t capability, bool registered = false) {
  const auto n = [](auto v) { return std::to_string(v); };
  if (args == nullptr) return Status(ARBITER_INVALID_ARGUMENT, "trtllm: args is NULL");
  const arbiter_allreduce_args& a = *args;
  if (!is_supported_world_size(layout.world_size)) {
    return Status(ARBITER_UNSUPPORTED,
                  "trtllm: world size " + n(layout.world_size) + " is not one of 2, 4, 8, 16");
  }
  if (Status s = common::check_call_kind(a); !s.ok()) return s;
  if (a.dtype != layout.dtype) {
    return Status(ARBITER_UNSUPPORTED, "trtllm: dtype " + n(static_cast<std::int32_t>(a.dtype)) +
                                           " differs from the workspace's dtype " +
                                           n(static_cast<std::int32_t>(layout.dtype)) +
                                           " (its one-shot stages hold that dtype's -0.0 pattern)");
  }
  if (Status s = common::check_nvfp4(a, capability); !s.ok()) return s;
  if (a.tokens == 0) return Status(ARBITER_INVALID_ARGUMENT, "trtllm: tokens is 0");
  if (Status s = check_hidden(a.hidden, a.dtype); !s.ok()) return s;

  const std::uint64_t message_bytes =
      std::uint64_t{a.tokens} * a.hidden * common::dtype_size(a.dtype);  // < 2^50: hidden <= 2^16
  const std::uint64_t capacity = per_call_capacity(layout, a.algorithm);
  // A registered call is bounded by its allocation, not the capacity; the
  // kernels count tokens (and tokens + clusters) in 32 bits.
  if (registered && a.tokens > kMaxRegisteredTokens) {
    return Status(ARBITER_UNSUPPORTED, "trtllm: a registered call of " + n(a.tokens) +
                                           " tokens; at most " + n(kMaxRegisteredTokens) +
                                           " per call (split it)");
  }
  if (!registered && message_bytes > capacity) {
    return Status(ARBITER_UNSUPPORTED, std::string("trtllm: a message of ") + n(message_bytes) +
                                           " bytes (" + n(a.tokens) + " tokens x " + n(a.hidden) +
                                           " x " + n(common::dtype_size(a.dtype)) +
                                           " bytes) exceeds the workspace's " +
                                           algorithm_name(a.algorithm) + " capacity of " +
                                           n(capacity) + " bytes per call");
  }
  if (a.algorithm == ARBITER_ALGORITHM_TWOSHOT && a.tokens < layout.world_size) {
    return Status(ARBITER_UNSUPPORTED, "trtllm: two-shot needs tokens >= world size (" +
                                           n(a.tokens) + " tokens, world size " +
                                           n(layout.world_size) + "); use one-shot");
  }
  return common::check_call_buffers(a);
}

}  // namespace arbiter::trtllm
