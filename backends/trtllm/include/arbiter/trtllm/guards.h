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
#pragma once

#include <cstdint>
#include <string>

#include "arbiter/common/numeric.h"
#include "arbiter/common/status.h"
#include "arbiter/trtllm/launch_config.h"
#include "arbiter/trtllm/workspace_layout.h"
#include "arbiter_backend.h"

namespace arbiter::trtllm {

using common::Result;
using common::Status;

inline constexpr std::uint32_t kMinNvfp4Capability = 100;

inline const char* algorithm_name(arbiter_algorithm algorithm) {
  switch (algorithm) {
    case ARBITER_ALGORITHM_ONESHOT:
      return "one-shot";
    case ARBITER_ALGORITHM_TWOSHOT:
      return "two-shot";
    case ARBITER_ALGORITHM_NATIVE:
      return "native";
  }
  return "unknown";
}

// REQUIRES: layout came from make_workspace_layout. `capability` is the
// device's major * 10 + minor (90 for H100/H200, 100 for B200).
inline Status check_call(const WorkspaceLayout& layout, const arbiter_allreduce_args* args,
                         std::uint32_t capability) {
  const auto n = [](auto v) { return std::to_string(v); };
  if (args == nullptr) return Status(ARBITER_INVALID_ARGUMENT, "trtllm: args is NULL");
  const arbiter_allreduce_args& a = *args;
  if (!is_supported_world_size(layout.world_size)) {
    return Status(ARBITER_UNSUPPORTED,
                  "trtllm: world size " + n(layout.world_size) + " is not one of 2, 4, 8, 16");
  }
  const std::int32_t pattern = a.pattern;
  if (pattern < ARBITER_PATTERN_ALLREDUCE || pattern > ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    return Status(ARBITER_UNSUPPORTED, "trtllm: pattern " + n(pattern) + " is not supported");
  }
  if (a.algorithm != ARBITER_ALGORITHM_ONESHOT && a.algorithm != ARBITER_ALGORITHM_TWOSHOT) {
    return Status(ARBITER_UNSUPPORTED, "trtllm: algorithm " +
                                           n(static_cast<std::int32_t>(a.algorithm)) +
                                           " is not supported (one-shot or two-shot)");
  }
  if (!common::is_valid_dtype(a.dtype)) {
    return Status(ARBITER_UNSUPPORTED, "trtllm: dtype " + n(static_cast<std::int32_t>(a.dtype)) +
                                           " is not fp16, bf16 or fp32");
  }
  if (a.dtype != layout.dtype) {
    return Status(ARBITER_UNSUPPORTED, "trtllm: dtype " + n(static_cast<std::int32_t>(a.dtype)) +
                                           " differs from the workspace's dtype " +
                                           n(static_cast<std::int32_t>(layout.dtype)) +
                                           " (its one-shot stages hold that dtype's -0.0 pattern)");
  }
  if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    if (capability < kMinNvfp4Capability) {
      return Status(ARBITER_UNSUPPORTED, "NVFP4 needs capability >= " + n(kMinNvfp4Capability) +
                                             " (this device is " + n(capability) + ")");
    }
    if (a.dtype == ARBITER_DTYPE_FP32) {
      return Status(ARBITER_UNSUPPORTED, "NVFP4 needs fp16 or bf16 input, not fp32");
    }
    if (a.hidden % kNvfp4BlockElements != 0) {
      return Status(ARBITER_UNSUPPORTED,
                    "NVFP4 needs hidden % 16 == 0 (hidden is " + n(a.hidden) + ")");
    }
  }
  if (a.tokens == 0) return Status(ARBITER_INVALID_ARGUMENT, "trtllm: tokens is 0");
  if (Status s = check_hidden(a.hidden, a.dtype); !s.ok()) return s;

  const std::uint64_t message_bytes =
      std::uint64_t{a.tokens} * a.hidden * common::dtype_size(a.dtype);  // < 2^50: hidden <= 2^16
  const std::uint64_t capacity = per_call_capacity(layout, a.algorithm);
  if (message_bytes > capacity) {
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

  const auto null = [](const char* name, const char* why) {
    return Status(ARBITER_INVALID_ARGUMENT, std::string("trtllm: ") + name + " is NULL" + why);
  };
  if (a.input == nullptr) return null("input", "");
  if (pattern == ARBITER_PATTERN_ALLREDUCE) {
    if (a.allreduce_out == nullptr) return null("allreduce_out", " (pattern allreduce)");
  } else {
    if (a.residual_in == nullptr) return null("residual_in", " (norm patterns)");
    if (a.gamma == nullptr) return null("gamma", " (norm patterns)");
  }
  if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM && a.norm_out == nullptr) {
    return null("norm_out", " (residual_rmsnorm writes its norm there)");
  }
  if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8 ||
      pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    if (a.quant_out == nullptr) return null("quant_out", " (quantising patterns)");
    if (a.scale == nullptr) return null("scale", " (quantising patterns)");
  }
  if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4 && a.scale_out == nullptr) {
    return null("scale_out", " (NVFP4 writes its block scales there)");
  }
  // Every thread moves 16-byte vectors of these; rows are 16-byte multiples
  // (check_hidden), so an aligned base keeps every vector aligned.
  const struct {
    const char* name;
    const void* pointer;
  } vectors[] = {{"input", a.input},
                 {"allreduce_out", a.allreduce_out},
                 {"residual_in", a.residual_in},
                 {"residual_out", a.residual_out},
                 {"gamma", a.gamma},
                 {"norm_out", a.norm_out}};
  for (const auto& v : vectors) {
    if (reinterpret_cast<std::uintptr_t>(v.pointer) % kVectorBytes != 0) {
      return Status(ARBITER_INVALID_ARGUMENT,
                    std::string("trtllm: ") + v.name + " is not 16-byte aligned");
    }
  }
  return Status();
}

}  // namespace arbiter::trtllm
