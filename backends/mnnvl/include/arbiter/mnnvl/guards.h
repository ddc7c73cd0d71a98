// Host-side admission of one run() call against an mnnvl workspace, checked
// before anything is enqueued. A call refused here changes nothing: the host
// then tries its next choice (ARBITER_UNSUPPORTED) or reports a caller bug
// (ARBITER_INVALID_ARGUMENT). Every message starts with "mnnvl: " and names
// the numbers involved.
//
// What the mnnvl-specific checks prevent:
//  - one-shot above a ws-th of one buffer, two-shot above M or with scatter
//    rows beyond the scatter area: an out-of-bounds store into every peer's
//    memory through the multicast mapping (illegal memory access; checks use
//    one buffer, never the whole workspace);
//  - a dtype other than the workspace's: the workspace was sized for it;
//  - NVFP4 below capability 100: the quantiser would compile to a silent
//    no-op on SM90 (FlashInfer), so it is refused instead.
// The shared checks (pattern, algorithm, dtype, NVFP4, hidden, buffers and
// their alignment) are arbiter/common/call_checks.h.
#pragma once

#include <cstdint>
#include <string>

#include "arbiter/common/call_checks.h"
#include "arbiter/common/launch_config.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/status.h"
#include "arbiter/mnnvl/workspace_layout.h"
#include "arbiter_backend.h"

namespace arbiter::mnnvl {

using common::Result;
using common::Status;

// REQUIRES: layout came from make_workspace_layout. `capability` is the
// device's major * 10 + minor (90 for H100/H200, 100 for B200, 103 for B300).
inline Status check_call(const WorkspaceLayout& layout, const arbiter_allreduce_args* args,
                         std::uint32_t capability) {
  const auto n = [](auto v) { return std::to_string(v); };
  const auto refuse = [](arbiter_status code, const std::string& message) {
    return Status(code, "mnnvl: " + message);
  };
  const auto prefixed = [](const Status& s) { return Status(s.code(), "mnnvl: " + s.message()); };
  if (args == nullptr) return refuse(ARBITER_INVALID_ARGUMENT, "args is NULL");
  const arbiter_allreduce_args& a = *args;
  if (!is_supported_world_size(layout.world_size)) {
    return refuse(ARBITER_UNSUPPORTED, "world size " + n(layout.world_size) + " is not in 2..64");
  }
  if (Status s = common::check_call_kind(a); !s.ok()) return prefixed(s);
  if (a.dtype != layout.dtype) {
    return refuse(ARBITER_UNSUPPORTED, "dtype " + n(static_cast<std::int32_t>(a.dtype)) +
                                           " differs from the workspace's dtype " +
                                           n(static_cast<std::int32_t>(layout.dtype)) +
                                           " (the workspace was sized for that dtype)");
  }
  if (Status s = common::check_nvfp4(a, capability); !s.ok()) return prefixed(s);
  if (a.tokens == 0) return refuse(ARBITER_INVALID_ARGUMENT, "tokens is 0");
  if (Status s = common::check_hidden(a.hidden, a.dtype); !s.ok()) return prefixed(s);

  // check_hidden: row_bytes <= 8 CTAs x 1024 threads x 16 bytes = 2^17.
  const std::uint64_t elt = common::dtype_size(a.dtype);
  const std::uint64_t row_bytes = std::uint64_t{a.hidden} * elt;
  const std::uint64_t message_bytes = a.tokens * row_bytes;  // < 2^49
  const std::uint64_t capacity = per_call_capacity(layout, a.algorithm);
  if (a.algorithm == ARBITER_ALGORITHM_ONESHOT) {
    if (message_bytes > capacity) {
      return refuse(ARBITER_UNSUPPORTED,
                    "one-shot needs tokens x hidden x world size x element size <= the buffer (" +
                        n(a.tokens) + " x " + n(a.hidden) + " x " + n(layout.world_size) + " x " +
                        n(elt) + " = " + n(oneshot_bytes(layout.world_size, message_bytes)) +
                        " bytes > " + n(layout.buffer_bytes) + " bytes); use two-shot");
    }
  } else {
    if (message_bytes > capacity) {
      return refuse(ARBITER_UNSUPPORTED,
                    "a message of " + n(message_bytes) + " bytes (" + n(a.tokens) + " tokens x " +
                        n(a.hidden) + " x " + n(elt) +
                        " bytes) exceeds the workspace's two-shot capacity of " + n(capacity) +
                        " bytes per call; send fewer tokens per call or create the workspace "
                        "with a larger max_message_bytes");
    }
    const std::uint64_t scatter = twoshot_scatter_bytes(layout.world_size, a.tokens, row_bytes);
    if (scatter > layout.scatter_bytes) {
      return refuse(ARBITER_UNSUPPORTED,
                    "two-shot scatters world size x ceil(tokens / world size) x row bytes (" +
                        n(layout.world_size) + " x " +
                        n(twoshot_rows_per_rank(a.tokens, layout.world_size)) + " x " +
                        n(row_bytes) + " = " + n(scatter) + " bytes) into a scatter area of " +
                        n(layout.scatter_bytes) + " bytes (rows wider than the workspace's " +
                        n(layout.row_bytes) + "); send fewer tokens per call or use one-shot");
    }
  }
  if (Status s = common::check_call_buffers(a); !s.ok()) return prefixed(s);
  return Status();
}

}  // namespace arbiter::mnnvl
